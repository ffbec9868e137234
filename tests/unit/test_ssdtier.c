/* The disk tier's engine (io/ssdtier.c) on a real file under /var/tmp with a disk index in
 * private memory: demoted blocks read back byte-exact and survive a clean stop and a stop
 * without one; the latest write of a key wins at restart whatever the scan's order; a delete
 * becomes a tombstone that keeps the key dead across restarts; recycling drops the oldest
 * blocks' slots; a flipped byte is a miss, never served; a namespace that is gone is not
 * restored. */
#include "io/ssdtier.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define PAGE   (1ull << 20)
#define PAGES  6
#define SIZE   (KVR_SSD_SUPER_BYTES + PAGES * PAGE)
#define NSLOTS 256
#define LEN    100000 /* a record spans 26 blocks of 4 KiB: 9 in a page of 256 */

static char dir[64], path[128];
static void *region;
static kvr_dindex_t dx;
static int gone_tenant; /* when set, "tenant-a" no longer resolves */

static void setup(void)
{
    strcpy(dir, "/var/tmp/kvr-ssdt-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/ssd", dir);
    region = aligned_alloc(64, KVR_ALIGN_UP(kvr_dindex_bytes(NSLOTS), 64));
    cr_assert_not_null(region);
    kvr_dindex_map(&dx, region, NSLOTS);
    gone_tenant = 0;
}

static void teardown(void)
{
    free(region);
    unlink(path);
    rmdir(dir);
}

TestSuite(ssdtier, .init = setup, .fini = teardown);

static int resolve(void *ctx, const kvr_ssd_rec_t *rec, uint16_t *ns, uint64_t *seed, uint8_t *pool)
{
    (void)ctx;
    if (strcmp(rec->ns, "default") == 0) {
        *ns = 0, *seed = 1111, *pool = 0;
        return KVR_OK;
    }
    if (strcmp(rec->ns, "tenant-a") == 0 && !gone_tenant) {
        *ns = 1, *seed = 2222, *pool = 1;
        return KVR_OK;
    }
    return KVR_ENOTFOUND;
}

static void open_tier(kvr_ssdt_t *t)
{
    cr_assert_eq(kvr_ssdt_open(t, path, SIZE, PAGE, &dx, resolve, NULL), KVR_OK);
}

/* Payload byte i of a block of key k, written as version w. */
static uint8_t byte_of(int k, int w, uint64_t i)
{
    return (uint8_t)(k * 31 + w * 7 + i * 13);
}

static void demote(kvr_ssdt_t *t, int k, int w, int tenant)
{
    char key[32];
    size_t klen = (size_t)snprintf(key, sizeof(key), "block/%04d", k);
    uint8_t *b = NULL;
    kvr_ssdt_blk_t blk = {.ns = (uint16_t)tenant, .pool = (uint8_t)tenant, .seed = tenant ? 2222 : 1111, .key = key, .key_len = (uint16_t)klen, .length = LEN, .canon = 9000 + (uint64_t)k, .ns_name = tenant ? "tenant-a" : "default", .model = "m"};

    cr_assert_eq(posix_memalign((void **)&b, KVR_SSD_ALIGN, klen + LEN + KVR_SSD_ALIGN), 0);
    memcpy(b, key, klen);
    for (uint64_t i = 0; i < LEN; i++)
        b[klen + i] = byte_of(k, w, i);
    cr_assert_eq(kvr_ssdt_demote(t, &blk, &(struct iovec){b, klen + LEN}, 1), KVR_OK, "block %d", k);
    free(b);
}

/* Finds block k; if w >= 0 reads it and checks its bytes. 1 found, 0 absent. */
static int fetch(kvr_ssdt_t *t, int k, int w, int tenant)
{
    char key[32];
    size_t klen = (size_t)snprintf(key, sizeof(key), "block/%04d", k);
    kvr_dslot_t s;
    uint64_t h1, h2;
    uint32_t id;
    uint8_t *buf = NULL;

    kvr_dindex_hash(tenant ? 2222 : 1111, key, klen, &h1, &h2);
    if (kvr_dindex_lookup(&dx, (uint16_t)tenant, h1, h2, (uint16_t)klen, &s, &id) != 1)
        return 0;
    cr_assert_eq(s.canon, 9000 + (uint64_t)k);
    cr_assert_eq(s.pool, tenant);
    if (w < 0)
        return 1;
    cr_assert_eq(posix_memalign((void **)&buf, KVR_SSD_ALIGN, kvr_ssd_rec_span(klen, LEN)), 0);
    cr_assert_eq(kvr_ssdt_read(t, &s, key, klen, buf), KVR_OK, "block %d", k);
    cr_assert_eq(memcmp(buf, key, klen), 0);
    for (uint64_t i = 0; i < LEN; i++)
        if (buf[klen + i] != byte_of(k, w, i))
            cr_assert_fail("block %d byte %llu: %u, wrote %u", k, (unsigned long long)i, buf[klen + i], byte_of(k, w, i));
    free(buf);
    return 1;
}

Test(ssdtier, demote_read_and_restart)
{
    kvr_ssdt_t t;

    open_tier(&t);
    cr_assert_eq(t.st.restored, 0);
    for (int k = 0; k < 25; k++)
        demote(&t, k, 0, k % 2);
    for (int k = 0; k < 25; k++)
        cr_assert(fetch(&t, k, 0, k % 2));
    cr_assert_eq(fetch(&t, 0, -1, 1), 0, "another namespace's key is another key");
    kvr_ssdt_close(&t); /* a clean stop: every page sealed */

    memset(region, 0x5a, kvr_dindex_bytes(NSLOTS)); /* a fresh segment: nothing left in the index */
    open_tier(&t);
    cr_assert_eq(t.st.restored, 25);
    cr_assert_eq(t.scan.summaries, 3, "three pages, sealed with summaries");
    for (int k = 0; k < 25; k++)
        cr_assert(fetch(&t, k, 0, k % 2));

    /* stop without a seal (what SIGKILL leaves), then restart */
    for (int k = 25; k < 30; k++)
        demote(&t, k, 0, 0);
    kvr_ssdp_free(&t.p);
    kvr_ssdf_close(&t.f);
    open_tier(&t);
    cr_assert_eq(t.st.restored, 30);
    for (int k = 0; k < 30; k++)
        cr_assert(fetch(&t, k, 0, k >= 25 ? 0 : k % 2));
    kvr_ssdt_close(&t);

    gone_tenant = 1; /* tenant-a was removed from the tenants file */
    open_tier(&t);
    cr_assert_eq(t.st.restore_unknown_ns, 12);
    cr_assert_eq(t.st.restored, 18);
    kvr_ssdt_close(&t);
}

Test(ssdtier, latest_write_wins_and_tombstones_hold)
{
    kvr_ssdt_t t;

    open_tier(&t);
    for (int k = 0; k < 8; k++)
        demote(&t, k, 0, 0);
    for (int k = 0; k < 12; k++) /* 0..7 written again (on later pages), 8..11 new */
        demote(&t, k, 1, 0);
    cr_assert_eq(dx.sh->live, 12);
    for (int k = 0; k < 12; k++)
        cr_assert(fetch(&t, k, 1, 0));

    /* a worker deletes 3 and 9; the writer reaps them into tombstones */
    uint64_t h1, h2;
    kvr_dindex_hash(1111, "block/0003", 10, &h1, &h2);
    cr_assert_eq(kvr_dindex_kill(&dx, 0, h1, h2, 10), 1);
    kvr_dindex_hash(1111, "block/0009", 10, &h1, &h2);
    cr_assert_eq(kvr_dindex_kill(&dx, 0, h1, h2, 10), 1);
    cr_assert_eq(fetch(&t, 3, -1, 0), 0, "a delete is a miss at once");
    cr_assert_eq(kvr_ssdt_reap(&t, 16), 2);
    cr_assert_eq(t.st.tombstones, 2);
    cr_assert_eq(t.cycle_left, 0, "the scan went all the way round");
    cr_assert_eq(t.kills_seen, kvr_dindex_kills(&dx), "and saw every kill: the next rounds scan nothing");
    cr_assert_eq(kvr_ssdt_reap(&t, 16), 0);
    cr_assert_eq(dx.sh->live, 10);
    kvr_ssdt_close(&t);

    open_tier(&t);
    cr_assert_eq(t.st.restored, 10);
    cr_assert_eq(t.st.restore_superseded, 8, "the first writes of 0..7");
    cr_assert_eq(t.st.restore_tombstoned, 2);
    for (int k = 0; k < 12; k++) {
        if (k == 3 || k == 9)
            cr_assert_eq(fetch(&t, k, -1, 0), 0, "deleted %d stays deleted", k);
        else
            cr_assert(fetch(&t, k, 1, 0), "block %d: its second write", k);
    }
    demote(&t, 3, 2, 0); /* PUT again after the delete, demoted again: it comes back */
    kvr_ssdt_close(&t);
    open_tier(&t);
    cr_assert(fetch(&t, 3, 2, 0));
    cr_assert_eq(fetch(&t, 9, -1, 0), 0);
    kvr_ssdt_close(&t);
}

Test(ssdtier, recycling_drops_the_oldest)
{
    kvr_ssdt_t t;
    int n = 100; /* 11 pages' worth in a file of 6 */

    open_tier(&t);
    for (int k = 0; k < n; k++)
        demote(&t, k, 0, 0);
    cr_assert_gt(t.st.recycled_slots, 0);
    cr_assert_eq(dx.sh->live + t.st.recycled_slots, (uint64_t)n);
    for (int k = 0; k < n; k++) {
        int expect = (uint64_t)k >= t.st.recycled_slots; /* oldest first */
        cr_assert_eq(fetch(&t, k, expect ? 0 : -1, 0), expect, "block %d", k);
    }
    uint64_t live = dx.sh->live;
    kvr_ssdt_close(&t);
    open_tier(&t);
    cr_assert_eq(t.st.restored, live, "the restart finds what the index held");
    kvr_ssdt_close(&t);
}

/* ssd=: a namespace over its quota loses its oldest copies down to 7/8 of it, the other
 * namespace nothing; a drop is a DELETE's kill, reaped into a tombstone, so a restart does not
 * bring the dropped copies back. */
Test(ssdtier, a_quota_drops_the_namespace_s_oldest_down_to_seven_eighths)
{
    kvr_ssdt_t t;
    const uint64_t quota = 10 * LEN; /* tenant 1 writes 15 blocks: 7 go (1.5 MB - 7/8 of 1 MB) */

    open_tier(&t);
    for (int k = 0; k < 30; k++)
        demote(&t, k, 0, k % 2);
    cr_assert_eq(kvr_ssdt_quota(&t, 0, 0), 0, "no quota");
    cr_assert_eq(kvr_ssdt_quota(&t, 1, quota), 7 * LEN);
    cr_assert_eq(t.st.quota_evicted, 7);
    cr_assert_eq(kvr_ssdt_quota(&t, 1, quota), 0, "the next drops wait for the reaper");
    cr_assert_eq(kvr_ssdt_reap(&t, 64), 7);
    cr_assert_eq(t.st.tombstones, 7);
    cr_assert_eq(kvr_dindex_ns_bytes(&dx, 1), 8 * LEN);
    cr_assert_eq(kvr_dindex_ns_live(&dx, 1), 8);
    cr_assert_eq(kvr_dindex_ns_bytes(&dx, 0), 15 * LEN, "the other namespace keeps all");
    cr_assert_eq(kvr_ssdt_quota(&t, 1, quota), 0, "within its quota now");
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < 30; k++) {
            int expect = k % 2 == 0 || k >= 15; /* tenant 1's oldest, 1 to 13, are gone */
            cr_assert_eq(fetch(&t, k, expect ? 0 : -1, k % 2), expect, "round %d block %d", round, k);
        }
        kvr_ssdt_close(&t);
        if (round == 0) {
            open_tier(&t);
            cr_assert_eq(t.st.restore_tombstoned, 7, "the drops hold across a restart");
            cr_assert_eq(kvr_dindex_ns_live(&dx, 1), 8);
        }
    }
}

static void kill_block(int k)
{
    char key[32];
    size_t klen = (size_t)snprintf(key, sizeof(key), "block/%04d", k);
    uint64_t h1, h2;

    kvr_dindex_hash(1111, key, klen, &h1, &h2);
    cr_assert_eq(kvr_dindex_kill(&dx, 0, h1, h2, (uint16_t)klen), 1, "block %d", k);
}

/* Compaction: with every page in use, the page to be recycled next (page 0) is two thirds
 * live: its 6 live records are copied to the open page, so its recycle drops none of them;
 * a page under half live (page 1) is not compacted; the copies survive a restart. */
Test(ssdtier, compaction_keeps_a_mostly_live_page_s_records)
{
    kvr_ssdt_t t;

    open_tier(&t);
    for (int k = 0; k < 46; k++) /* 9 a page: pages 0-4 full, page 5 open with one */
        demote(&t, k, 0, 0);
    cr_assert_eq(kvr_ssdp_victim(&t.p), 0, "every page in use: page 0 goes next");
    cr_assert_eq(kvr_ssdt_compact(&t), 0, "page 0 is all live: it does not fit in the open page");
    for (int k = 0; k < 3; k++)
        kill_block(k);
    cr_assert_eq(kvr_ssdt_reap(&t, 16), 3);
    cr_assert_eq(t.p.pg[0].live_records, 6);
    cr_assert_eq(kvr_ssdt_compact(&t), 1);
    cr_assert_eq(t.st.compacted, 6);
    cr_assert_eq(t.st.compacted_pages, 1);
    cr_assert_eq(t.p.pg[0].live_records, 0, "page 0 holds nothing indexed now");
    cr_assert_eq(kvr_ssdt_compact(&t), 0, "and is not compacted again");
    for (int k = 3; k < 9; k++)
        cr_assert(fetch(&t, k, 0, 0), "block %d read from its copy", k);

    for (int k = 46; k < 56; k++) /* page 5 fills: page 0 is recycled */
        demote(&t, k, 0, 0);
    cr_assert_eq(t.p.st.recycled, 1);
    cr_assert_eq(t.st.recycled_slots, 0, "the recycle dropped no indexed record");
    cr_assert_eq(kvr_ssdp_victim(&t.p), 1);
    for (int k = 9; k < 14; k++) /* page 1: 4 of 9 live */
        kill_block(k);
    cr_assert_eq(kvr_ssdt_reap(&t, 16), 5);
    cr_assert_eq(kvr_ssdt_compact(&t), 0, "under half live: left to its recycle");
    uint64_t live = dx.sh->live;
    kvr_ssdt_close(&t);

    open_tier(&t);
    cr_assert_eq(t.st.restored, live);
    for (int k = 0; k < 56; k++) {
        int expect = k >= 3 && (k < 9 || k >= 14);
        cr_assert_eq(fetch(&t, k, expect ? 0 : -1, 0), expect, "block %d", k);
    }
    kvr_ssdt_close(&t);
}

Test(ssdtier, a_flipped_byte_is_a_miss)
{
    kvr_ssdt_t t;
    char key[] = "block/0002";
    kvr_dslot_t s;
    uint64_t h1, h2;
    uint32_t id;
    uint8_t *buf = NULL, c;

    open_tier(&t);
    for (int k = 0; k < 4; k++)
        demote(&t, k, 0, 0);
    kvr_dindex_hash(1111, key, 10, &h1, &h2);
    cr_assert_eq(kvr_dindex_lookup(&dx, 0, h1, h2, 10, &s, &id), 1);
    int fd = open(path, O_RDWR);
    cr_assert(fd >= 0);
    off_t at = (off_t)(kvr_ssdf_page_off(&t.f, s.page) + (uint64_t)s.off4k * KVR_SSD_ALIGN + KVR_SSD_ALIGN + 5000);
    cr_assert_eq(pread(fd, &c, 1, at), 1);
    c ^= 0x10;
    cr_assert_eq(pwrite(fd, &c, 1, at), 1);
    close(fd);
    cr_assert_eq(posix_memalign((void **)&buf, KVR_SSD_ALIGN, kvr_ssd_rec_span(10, LEN)), 0);
    cr_assert_eq(kvr_ssdt_read(&t, &s, key, 10, buf), KVR_EINVAL, "the checksum catches it");
    cr_assert_eq(kvr_ssdt_read(&t, &s, "block/0003", 10, buf), KVR_ENOTFOUND, "another key's slot");
    kvr_dslot_t stale = s;
    stale.version++;
    cr_assert_eq(kvr_ssdt_read(&t, &stale, key, 10, buf), KVR_ENOTFOUND, "a recycled page's pointer");
    cr_assert(fetch(&t, 1, 0, 0), "its neighbours are fine");
    cr_assert(fetch(&t, 3, 0, 0));
    free(buf);
    kvr_ssdt_close(&t);
}

/* The disk index's bound (--ssd-slots): with every slot in use a demotion is written but not
 * kept (KVR_ENOSPACE, counted), the index keeps what it held, and a restart into an index of
 * that size restores as many as it can hold, counting the rest. */
Test(ssdtier, a_full_index_keeps_what_it_holds)
{
    kvr_ssdt_t t;
    void *small = aligned_alloc(64, KVR_ALIGN_UP(kvr_dindex_bytes(4), 64));
    char key[32];
    uint8_t *b = NULL;

    cr_assert_not_null(small);
    kvr_dindex_map(&dx, small, 4);
    open_tier(&t);
    for (int k = 0; k < 4; k++)
        demote(&t, k, 0, 0);
    size_t klen = (size_t)snprintf(key, sizeof(key), "block/%04d", 4);
    cr_assert_eq(posix_memalign((void **)&b, KVR_SSD_ALIGN, klen + LEN + KVR_SSD_ALIGN), 0);
    memcpy(b, key, klen);
    kvr_ssdt_blk_t blk = {.seed = 1111, .key = key, .key_len = (uint16_t)klen, .length = LEN, .canon = 9004, .ns_name = "default", .model = "m"};
    cr_assert_eq(kvr_ssdt_demote(&t, &blk, &(struct iovec){b, klen + LEN}, 1), KVR_ENOSPACE);
    free(b);
    cr_assert_eq(t.st.demote_index_full, 1);
    cr_assert_eq(kvr_dindex_live(&dx), 4);
    for (int k = 0; k < 4; k++)
        cr_assert(fetch(&t, k, 0, 0), "block %d kept", k);
    cr_assert_eq(fetch(&t, 4, -1, 0), 0);
    kvr_ssdt_close(&t);

    open_tier(&t); /* the file holds 5 records, the index 4 slots */
    cr_assert_eq(t.st.restored, 4);
    cr_assert_eq(t.st.restore_index_full, 1);
    kvr_ssdt_close(&t);
    kvr_dindex_map(&dx, region, NSLOTS);
    free(small);
}
