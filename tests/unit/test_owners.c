/*
 * test_owners.c — owner counting for the Cuckoo filter (src/core/owners.c,
 * docs/relay-contract.md §3.5): the first owner inserts, the last removes, a reference model
 * with table growth, and an owner whose insert found no room.
 */
#include <criterion/criterion.h>

#include <stdlib.h>

#include "common.h"
#include "core/owners.h"
#include "wire/ckf.h"
#include "testdata.h"

#define TEST_SEED 0x123456789ABCDEF0ULL

Test(ckf_owners, first_inserts_last_removes)
{
    static uint64_t buckets[1024];
    kvr_ckf_t c;
    kvr_owners_t o;
    kvr_ckf_image_t im[8];
    cr_assert_eq(kvr_ckf_init(&c, buckets, 1024, KVR_CKF_DEFAULT_SEED, 0, 1), KVR_OK);
    cr_assert_eq(kvr_owners_init(&o, 4), KVR_OK);
    uint64_t h = 0x7ee2cbedc694ab46ULL;

    cr_assert_eq(kvr_owners_add(&o, &c, h), KVR_OK);
    cr_assert_eq(c.items, 1);
    cr_assert_eq(kvr_ckf_drain(&c, im), 1, "first owner inserts");
    cr_assert_eq(kvr_owners_add(&o, &c, h), KVR_OK);
    cr_assert_eq(kvr_owners_add(&o, &c, h), KVR_OK);
    cr_assert_eq(c.items, 1, "further owners change nothing");
    cr_assert_eq(kvr_ckf_dirty_count(&c), 0);
    cr_assert_eq(kvr_owners_count(&o, h), 3);
    cr_assert_eq(kvr_owners_del(&o, &c, h), KVR_OK);
    cr_assert_eq(kvr_owners_del(&o, &c, h), KVR_OK);
    cr_assert_eq(c.items, 1, "owners leaving while others remain change nothing");
    cr_assert(kvr_ckf_contains(&c, h));
    cr_assert_eq(kvr_owners_del(&o, &c, h), KVR_OK);
    cr_assert_eq(c.items, 0, "last owner removes");
    cr_assert(!kvr_ckf_contains(&c, h));
    cr_assert_eq(kvr_ckf_drain(&c, im), 1);
    cr_assert_eq(im[0].value, 0);
    cr_assert_eq(kvr_owners_count(&o, h), 0);
    cr_assert_eq(kvr_owners_del(&o, &c, h), KVR_ENOTFOUND, "unknown hash: no-op");
    kvr_owners_destroy(&o);
    kvr_ckf_destroy(&c);
}

/* Against a reference model with many hashes, including table growth and deletions. */
Test(ckf_owners, model, .timeout = 30)
{
    const uint64_t bc = 16384;
    uint64_t *buckets = calloc(bc, 8);
    kvr_ckf_t c;
    kvr_owners_t o;
    cr_assert_eq(kvr_ckf_init(&c, buckets, bc, TEST_SEED, 0, 0), KVR_OK);
    cr_assert_eq(kvr_owners_init(&o, 1), KVR_OK);
    enum { H = 20000 };
    static uint64_t hs[H];
    static uint32_t cnt[H];
    uint64_t rs = 11;
    for (int i = 0; i < H; i++)
        hs[i] = (i % 7 == 0) ? (uint64_t)i : td_splitmix(&rs); /* some low-entropy keys */
    for (int step = 0; step < 200000; step++) {
        int i = (int)(td_splitmix(&rs) % H);
        if (cnt[i] && (td_splitmix(&rs) & 1)) {
            cr_assert_eq(kvr_owners_del(&o, &c, hs[i]), KVR_OK);
            cnt[i]--;
        } else {
            cr_assert_eq(kvr_owners_add(&o, &c, hs[i]), KVR_OK);
            cnt[i]++;
        }
    }
    uint64_t distinct = 0;
    for (int i = 0; i < H; i++) {
        cr_assert_eq(kvr_owners_count(&o, hs[i]), cnt[i]);
        cr_assert_eq(kvr_owners_resident(&o, hs[i]), cnt[i] > 0);
        if (cnt[i])
            cr_assert(kvr_ckf_contains(&c, hs[i]));
        distinct += cnt[i] > 0;
    }
    cr_assert_eq(c.items, distinct);
    cr_assert_eq(o.n, distinct);
    for (int i = 0; i < H; i++)
        while (cnt[i]--)
            cr_assert_eq(kvr_owners_del(&o, &c, hs[i]), KVR_OK);
    cr_assert_eq(c.items, 0);
    cr_assert_eq(o.n, 0);
    kvr_owners_destroy(&o);
    kvr_ckf_destroy(&c);
    free(buckets);
}

/* A capacity omission counts the owner but leaves the hash out; a later owner retries. */
Test(ckf_owners, capacity_omission)
{
    uint64_t buckets[2] = {0};
    kvr_ckf_t c;
    kvr_owners_t o;
    cr_assert_eq(kvr_ckf_init(&c, buckets, 2, KVR_CKF_DEFAULT_SEED, 0, 1), KVR_OK);
    cr_assert_eq(kvr_owners_init(&o, 16), KVR_OK);
    for (uint64_t h = 100; h < 108; h++)
        cr_assert_eq(kvr_owners_add(&o, &c, h), KVR_OK);
    cr_assert_eq(c.items, 8); /* 2 buckets x 4 slots: full */
    uint64_t before[2] = {buckets[0], buckets[1]};
    cr_assert_eq(kvr_owners_add(&o, &c, 999), KVR_ENOSPACE);
    cr_assert_eq(kvr_owners_count(&o, 999), 1);
    cr_assert(!kvr_owners_resident(&o, 999));
    cr_assert_arr_eq(before, buckets, sizeof(before));
    /* make room, then a second owner of 999 retries and succeeds */
    cr_assert_eq(kvr_owners_del(&o, &c, 100), KVR_OK);
    cr_assert_eq(kvr_owners_add(&o, &c, 999), KVR_OK);
    cr_assert(kvr_owners_resident(&o, 999));
    cr_assert_eq(kvr_owners_count(&o, 999), 2);
    cr_assert_eq(kvr_owners_del(&o, &c, 999), KVR_OK);
    cr_assert_eq(kvr_owners_del(&o, &c, 999), KVR_OK);
    cr_assert_eq(c.items, 7);
    kvr_owners_destroy(&o);
    kvr_ckf_destroy(&c);
}
