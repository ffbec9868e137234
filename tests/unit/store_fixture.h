/* Shared helpers for the store tests: a small segment, formatted, with one process slot. */
#ifndef KVR_TEST_STORE_FIXTURE_H
#define KVR_TEST_STORE_FIXTURE_H

#include "base/log.h"
#include "core/store.h"

#include <criterion/criterion.h>
#include <stdio.h>

typedef struct {
    kvr_seg_t seg;
    kvr_store_t st;
} fx_t;

static inline void fx_open(fx_t *f, uint64_t memory, uint32_t page_size, uint64_t max_blocks, int no_evict)
{
    kvr_seg_config_t cfg = {0};

    kvr_log_level = KVR_LOG_ERROR;
    cfg.memory = memory;
    cfg.page_size = page_size;
    cfg.max_blocks = max_blocks;
    cfg.hugepages = KVR_HUGEPAGES_OFF;
    cfg.relay_pools = 8; /* as --max-pools' default: room for the namespaces' pools */
    cr_assert_eq(kvr_seg_create(&f->seg, &cfg), KVR_OK);
    cr_assert_eq(kvr_store_format(&f->seg, no_evict), KVR_OK);
    cr_assert_geq(kvr_seg_proc_claim(&f->seg, 0), 0);
    cr_assert_eq(kvr_store_open(&f->st, &f->seg), KVR_OK);
    cr_assert_eq(kvr_store_pool(&f->st, KVR_NS_DEFAULT, "default", "kvrelay", 7, KVR_POOLS_MAX), 0, "pool 0, as the supervisor makes it");
}

/* The same with a disk index of `slots` slots (the disk tier's tests), no eviction switch. */
static inline void fx_open_ssd(fx_t *f, uint64_t memory, uint64_t slots)
{
    kvr_seg_config_t cfg = {.memory = memory, .page_size = 4096, .hugepages = KVR_HUGEPAGES_OFF, .relay_pools = 8, .ssd_slots = slots};

    kvr_log_level = KVR_LOG_ERROR;
    cr_assert_eq(kvr_seg_create(&f->seg, &cfg), KVR_OK);
    cr_assert_eq(kvr_store_format(&f->seg, 0), KVR_OK);
    cr_assert_geq(kvr_seg_proc_claim(&f->seg, 0), 0);
    cr_assert_eq(kvr_store_open(&f->st, &f->seg), KVR_OK);
    cr_assert_eq(kvr_store_pool(&f->st, KVR_NS_DEFAULT, "default", "kvrelay", 7, KVR_POOLS_MAX), 0);
}

/* A second handle on the same segment with its own process slot (a simulated process). */
static inline void fx_second(fx_t *f, kvr_seg_t *seg2, kvr_store_t *st2)
{
    *seg2 = f->seg;
    seg2->slot = -1;
    cr_assert_geq(kvr_seg_proc_claim(seg2, 0), 0);
    cr_assert_eq(kvr_store_open(st2, seg2), KVR_OK);
}

static inline void fx_close(fx_t *f)
{
    kvr_seg_destroy(&f->seg);
}

/* Block bytes derived from the key and length, so any reader can verify every byte. */
static inline void fx_fill(uint8_t *buf, uint64_t len, const char *key)
{
    uint64_t x = 1469598103934665603ull;
    for (const char *k = key; *k; k++)
        x = (x ^ (uint8_t)*k) * 1099511628211ull;
    for (uint64_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
}

static inline int fx_put(fx_t *f, const char *key, uint64_t len)
{
    uint8_t *buf = malloc(len ? len : 1);
    int rc;
    fx_fill(buf, len, key);
    rc = kvr_store_put(&f->st, KVR_NS_DEFAULT, 0, key, strlen(key), buf, len, kvr_store_default_canon(key, strlen(key)));
    free(buf);
    return rc;
}

/* Returns 1 if key is resident with exactly the derived bytes of length len. */
static inline int fx_verify(kvr_store_t *st, const char *key, uint64_t len)
{
    kvr_block_ref_t ref;
    uint8_t *want, *got;
    int ok;

    if (kvr_store_get(st, KVR_NS_DEFAULT, key, strlen(key), &ref) != KVR_OK)
        return 0;
    want = malloc(len ? len : 1);
    got = malloc(len ? len : 1);
    fx_fill(want, len, key);
    ok = ref.length == len && kvr_store_read(st, &ref, 0, got, len) == KVR_OK && memcmp(want, got, len) == 0;
    kvr_store_unpin(st, &ref);
    free(want);
    free(got);
    return ok;
}

#endif
