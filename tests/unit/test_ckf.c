/*
 * test_ckf.c — Cuckoo filter (docs/relay-contract.md §3): sizing, addressing and RNG
 * vectors from tests/data/ckf/, SWAR cases, addressing properties, capacity, false
 * positive rate, undo on failure, removal and dirty tracking.
 */
#include <criterion/criterion.h>

#include <math.h>

#include "common.h"
#include "wire/ckf.h"
#include "core/kvhash.h"
#include "testdata.h"

#define TEST_SEED 0x123456789ABCDEF0ULL

Test(ckf, bucket_count_vectors)
{
    FILE *f = td_open("tests/data/ckf/bucket_count.txt");
    char line[256], *tok[4];
    int n = 0;
    while (td_next(f, line, sizeof(line), tok, 4) == 2) {
        uint64_t in = td_u64(tok[0]), want = td_u64(tok[1]);
        cr_expect_eq(kvr_ckf_bucket_count(in), want, "bucket_count(%lu)", (unsigned long)in);
        n++;
    }
    fclose(f);
    cr_assert_eq(n, 11);
    cr_expect(kvr_ckf_valid_bucket_count(kvr_ckf_bucket_count(53687091)));
    cr_expect(!kvr_ckf_valid_bucket_count(kvr_ckf_bucket_count(53687092)));
    cr_expect(!kvr_ckf_valid_bucket_count(1));
    cr_expect(!kvr_ckf_valid_bucket_count(3));
    cr_expect_eq(kvr_ckf_bucket_count(UINT64_MAX), 1ULL << 63); /* no overflow */
}

Test(ckf, probe_vectors)
{
    FILE *f = td_open("tests/data/ckf/probes.txt");
    char line[256], *tok[8];
    int n = 0;
    while (td_next(f, line, sizeof(line), tok, 8) == 6) {
        kvr_ckf_addr_t a;
        kvr_ckf_addr_init(&a, td_u64(tok[0]), td_u64(tok[1]));
        kvr_ckf_probe_t p = kvr_ckf_prepare(&a, td_u64(tok[2]));
        cr_expect_eq(p.fp, td_u64(tok[3]), "fp of %s/%s/%s", tok[0], tok[1], tok[2]);
        cr_expect_eq(p.a, td_u64(tok[4]), "a of %s/%s/%s", tok[0], tok[1], tok[2]);
        cr_expect_eq(p.b, td_u64(tok[5]), "b of %s/%s/%s", tok[0], tok[1], tok[2]);
        n++;
    }
    fclose(f);
    cr_assert_eq(n, 27);
}

Test(ckf, zero_fingerprint_rule)
{
    FILE *f = td_open("tests/data/ckf/zero_fp_mixed.txt");
    char line[256], *tok[4];
    int n = 0;
    while (td_next(f, line, sizeof(line), tok, 4) == 3) {
        uint8_t b[8];
        uint64_t seed = td_u64(tok[0]), h = td_u64(tok[1]);
        kvr_put_le64(b, h);
        uint64_t mixed = kvr_kvhash_xxh3(b, 8, seed);
        cr_expect_eq(mixed, td_u64(tok[2]));
        cr_expect_eq(mixed & 0xFFFF, 0);
        kvr_ckf_addr_t a;
        kvr_ckf_addr_init(&a, seed, 1024);
        cr_expect_eq(kvr_ckf_prepare(&a, h).fp, 1);
        n++;
    }
    fclose(f);
    cr_assert_eq(n, 2);
}

Test(ckf, zero_delta_rule)
{
    FILE *f = td_open("tests/data/ckf/zero_delta.txt");
    char line[256], *tok[4];
    int n = 0;
    while (td_next(f, line, sizeof(line), tok, 4) == 4) {
        kvr_ckf_addr_t a;
        uint64_t seed = td_u64(tok[0]);
        uint16_t fp = (uint16_t)td_u64(tok[1]);
        kvr_ckf_addr_init(&a, seed, 1024);
        uint8_t b[2];
        kvr_put_le16(b, fp);
        cr_expect_eq(kvr_kvhash_xxh3(b, 2, seed ^ KVR_CKF_ALT_DOMAIN) & 1023, 0,
                     "masked delta of fp %u must be 0", fp);
        cr_expect_eq(kvr_ckf_alt(&a, (uint32_t)td_u64(tok[2]), fp), td_u64(tok[3]));
        n++;
    }
    fclose(f);
    cr_assert_eq(n, 4);
}

Test(ckf, rng_vectors)
{
    FILE *f = td_open("tests/data/ckf/rng.txt");
    char line[256], *tok[4];
    int n = 0;
    while (td_next(f, line, sizeof(line), tok, 4) == 3) {
        cr_expect_eq(kvr_ckf_lane_rng_seed(td_u64(tok[0]), td_u64(tok[1])), td_u64(tok[2]));
        n++;
    }
    fclose(f);
    cr_assert_eq(n, 2);
    /* a fresh handle starts its RNG at lane_rng_seed(seed, 0) */
    uint64_t buckets[2] = {0};
    kvr_ckf_t c;
    cr_assert_eq(kvr_ckf_init(&c, buckets, 2, KVR_CKF_DEFAULT_SEED, 0, 0), KVR_OK);
    cr_expect_eq(c.rng, 0xc050d0a84124db84ULL);
    cr_expect_eq(c.max_kicks, 500);
    kvr_ckf_destroy(&c);
}

Test(ckf, swar)
{
    /* slots [1, 0x1234, 0x8000, 0xFFFF], least significant first */
    uint64_t w = 0xFFFF800012340001ULL;
    cr_expect(kvr_ckf_word_has(w, 1));
    cr_expect(kvr_ckf_word_has(w, 0x1234));
    cr_expect(kvr_ckf_word_has(w, 0x8000));
    cr_expect(kvr_ckf_word_has(w, 0xFFFF));
    cr_expect(!kvr_ckf_word_has(w, 2));
    cr_expect(!kvr_ckf_word_has(w, 0x1235));
    cr_expect(!kvr_ckf_word_has(w, 0xFFFE));
    cr_expect_eq(kvr_ckf_word_first(w, 1), 0);
    cr_expect_eq(kvr_ckf_word_first(w, 0x8000), 2);
    cr_expect_eq(kvr_ckf_word_first(w, 0), -1);
    uint64_t cleared = kvr_ckf_word_with(w, 1, 0);
    cr_expect_eq(kvr_ckf_word_first(cleared, 0), 1);
    /* the word layout of docs/relay-contract.md §3.1: slot s is (word >> 16s) & 0xFFFF */
    cr_expect_eq(kvr_ckf_word_slot(0x0001abcd00001234ULL, 0), 0x1234);
    cr_expect_eq(kvr_ckf_word_slot(0x0001abcd00001234ULL, 1), 0);
    cr_expect_eq(kvr_ckf_word_slot(0x0001abcd00001234ULL, 2), 0xabcd);
    cr_expect_eq(kvr_ckf_word_slot(0x0001abcd00001234ULL, 3), 1);
    /* exhaustive against a plain loop on random words, with duplicate slots */
    uint64_t s = 7;
    for (int i = 0; i < 200000; i++) {
        uint64_t r = td_splitmix(&s);
        uint64_t word = (i & 1) ? r : (r & 0x0003000300030003ULL);
        uint16_t fp = (uint16_t)((i & 2) ? td_splitmix(&s) : (td_splitmix(&s) & 3));
        int first = -1;
        for (int k = 3; k >= 0; k--)
            if (kvr_ckf_word_slot(word, (unsigned)k) == fp)
                first = k;
        cr_assert_eq(kvr_ckf_word_first(word, fp), first);
        cr_assert_eq(kvr_ckf_word_has(word, fp), first >= 0);
    }
}

/* Upstream property, over 100k hashes, both seeds, several bucket counts. */
Test(ckf, addressing_properties)
{
    const uint64_t seeds[2] = {KVR_CKF_DEFAULT_SEED, TEST_SEED};
    const uint64_t bcs[5] = {2, 1024, 65536, 524288, 1ULL << 24};
    for (int si = 0; si < 2; si++) {
        for (int bi = 0; bi < 5; bi++) {
            kvr_ckf_addr_t a;
            kvr_ckf_addr_init(&a, seeds[si], bcs[bi]);
            uint64_t rs = 42;
            for (uint64_t i = 0; i < 100000; i++) {
                uint64_t h = (i & 1) ? i : td_splitmix(&rs);
                kvr_ckf_probe_t p = kvr_ckf_prepare(&a, h);
                cr_assert_neq(p.fp, 0);
                cr_assert_neq(p.a, p.b);
                cr_assert_lt(p.a, bcs[bi]);
                cr_assert_lt(p.b, bcs[bi]);
                cr_assert_eq(kvr_ckf_alt(&a, p.b, p.fp), p.a);
                cr_assert_eq(kvr_ckf_alt(&a, kvr_ckf_alt(&a, p.a, p.fp), p.fp), p.a);
            }
        }
    }
}

/* E1's first step: the first insert into an empty table goes to bucket_a, slot 0. */
Test(ckf, first_insert_goes_to_a_slot0)
{
    static uint64_t buckets[1024];
    kvr_ckf_t c;
    cr_assert_eq(kvr_ckf_init(&c, buckets, 1024, KVR_CKF_DEFAULT_SEED, 0, 1), KVR_OK);
    cr_assert_eq(kvr_ckf_insert(&c, 0x7ee2cbedc694ab46ULL), KVR_OK);
    cr_expect_eq(buckets[748], 0x4fcc);
    kvr_ckf_image_t im[4];
    cr_assert_eq(kvr_ckf_dirty_count(&c), 1);
    cr_assert_eq(kvr_ckf_drain(&c, im), 1);
    cr_expect_eq(im[0].bucket, 748);
    cr_expect_eq(im[0].value, 0x4fcc);
    kvr_ckf_destroy(&c);
}

/* Fill with random hashes until the first failed insert; returns the count inserted. */
static uint64_t fill_until_full(kvr_ckf_t *c, uint64_t *rs)
{
    uint64_t n = 0;
    while (kvr_ckf_insert(c, td_splitmix(rs)) == KVR_OK)
        n++;
    return n;
}

Test(ckf, capacity_95_percent, .timeout = 60)
{
    const uint64_t bcs[4] = {1024, 65536, 262144, 1ULL << 20};
    for (int i = 0; i < 4; i++) {
        uint64_t bc = bcs[i];
        uint64_t *buckets = calloc(bc, 8);
        kvr_ckf_t c;
        cr_assert_eq(kvr_ckf_init(&c, buckets, bc, KVR_CKF_DEFAULT_SEED, 0, 0), KVR_OK);
        uint64_t rs = 1000 + (uint64_t)i;
        uint64_t n = fill_until_full(&c, &rs);
        double load = (double)n / (double)(4 * bc);
        cr_log_info("bucket_count %lu: first failure after %lu inserts, load %.4f",
                    (unsigned long)bc, (unsigned long)n, load);
        cr_expect_geq(load, 0.95, "bucket_count %lu reached only %.4f", (unsigned long)bc, load);
        cr_expect_eq(c.items, n);
        kvr_ckf_destroy(&c);
        free(buckets);
    }
}

/* False positives at high load: within 20 % of 8/65536 over 4M non-member probes. */
Test(ckf, false_positive_rate, .timeout = 60)
{
    const uint64_t bc = 262144;
    uint64_t *buckets = calloc(bc, 8);
    kvr_ckf_t c;
    cr_assert_eq(kvr_ckf_init(&c, buckets, bc, KVR_CKF_DEFAULT_SEED, 0, 0), KVR_OK);
    uint64_t rs = 99;
    uint64_t n = fill_until_full(&c, &rs);
    double load = (double)n / (double)(4 * bc);
    cr_assert_geq(load, 0.95);
    /* members are all found */
    uint64_t rs2 = 99;
    for (uint64_t i = 0; i < n; i++)
        cr_assert(kvr_ckf_contains(&c, td_splitmix(&rs2)));
    /* probes from an independent stream: non-members (a 64-bit collision is negligible) */
    const uint64_t probes = 4000000;
    uint64_t ps = 0xFEEDFACECAFEBEEFULL, hits = 0;
    for (uint64_t i = 0; i < probes; i++)
        hits += (uint64_t)kvr_ckf_contains(&c, td_splitmix(&ps));
    double fpr = (double)hits / (double)probes, target = 8.0 / 65536.0;
    cr_log_info("load %.4f: %lu false positives in %lu probes, rate %.3e (8/65536 = %.3e, "
                "ratio %.3f)",
                load, (unsigned long)hits, (unsigned long)probes, fpr, target, fpr / target);
    cr_expect_leq(fabs(fpr - target), 0.2 * target, "fpr %.3e vs %.3e", fpr, target);
    /* batched lookups agree with single ones */
    uint64_t hs[1000];
    uint8_t out[1000];
    ps = 5;
    for (int i = 0; i < 1000; i++)
        hs[i] = (i & 1) ? td_splitmix(&ps) : (uint64_t)i;
    kvr_ckf_contains_many(&c, hs, 1000, out);
    for (int i = 0; i < 1000; i++)
        cr_assert_eq(out[i], kvr_ckf_contains(&c, hs[i]));
    kvr_ckf_destroy(&c);
    free(buckets);
}

/* A failed insert (kicks exhausted) leaves every bucket and the dirty set untouched. */
Test(ckf, failed_insert_is_undone)
{
    const uint64_t bc = 64;
    uint64_t buckets[64] = {0}, before[64];
    kvr_ckf_t c;
    cr_assert_eq(kvr_ckf_init(&c, buckets, bc, KVR_CKF_DEFAULT_SEED, 0, 1), KVR_OK);
    uint64_t rs = 3, failures = 0;
    for (int i = 0; i < 2000; i++) {
        memcpy(before, buckets, sizeof(before));
        size_t dirty = kvr_ckf_dirty_count(&c);
        uint64_t items = c.items, kicks = c.kicks;
        int rc = kvr_ckf_insert(&c, td_splitmix(&rs));
        if (rc == KVR_OK)
            continue;
        cr_assert_eq(rc, KVR_ENOSPACE);
        cr_assert_eq(c.kicks - kicks, 500, "a failure takes exactly max_kicks kicks");
        cr_assert_arr_eq(before, buckets, sizeof(before));
        cr_assert_eq(kvr_ckf_dirty_count(&c), dirty);
        cr_assert_eq(c.items, items);
        failures++;
    }
    cr_assert_gt(failures, 0);
    cr_expect_gt(c.items, 240); /* nearly full */
    kvr_ckf_destroy(&c);
}

/*
 * Removal after insertion restores the filter bucket for bucket whenever the insert did
 * not kick (a kick moves other entries, which no cuckoo filter can put back; then the
 * filter is still semantically equal: same members, same count).
 */
Test(ckf, insert_then_remove_restores_buckets, .timeout = 30)
{
    const uint64_t bc = 65536;
    uint64_t *buckets = calloc(bc, 8), *snap = malloc(bc * 8);
    kvr_ckf_t c;
    cr_assert_eq(kvr_ckf_init(&c, buckets, bc, KVR_CKF_DEFAULT_SEED, 0, 0), KVR_OK);
    uint64_t rs = 17;
    for (uint64_t i = 0; i < bc / 2; i++) /* 12.5 % load */
        cr_assert_eq(kvr_ckf_insert(&c, td_splitmix(&rs)), KVR_OK);
    memcpy(snap, buckets, bc * 8);
    uint64_t kicks0 = c.kicks;
    enum { T = 2000 };
    static uint64_t t[T];
    for (int i = 0; i < T; i++) {
        t[i] = td_splitmix(&rs);
        cr_assert_eq(kvr_ckf_insert(&c, t[i]), KVR_OK);
    }
    cr_assert_eq(c.kicks, kicks0, "this batch (fixed seed) needs no kick");
    for (int i = T - 1; i >= 0; i--)
        cr_assert_eq(kvr_ckf_remove(&c, t[i]), KVR_OK);
    cr_assert_arr_eq(snap, buckets, bc * 8, "bucket-for-bucket equal after removal");

    /* With kicks: fill to the first failure, then remove everything: all empty again. */
    uint64_t rs2 = 17, rs3 = 17;
    kvr_ckf_clear(&c);
    uint64_t n = fill_until_full(&c, &rs2);
    cr_assert_gt(c.kicks, 0);
    for (uint64_t i = 0; i < n; i++)
        cr_assert_eq(kvr_ckf_remove(&c, td_splitmix(&rs3)), KVR_OK);
    for (uint64_t i = 0; i < bc; i++)
        cr_assert_eq(buckets[i], 0);
    cr_assert_eq(c.items, 0);
    cr_expect_eq(kvr_ckf_remove(&c, 12345), KVR_ENOTFOUND);
    kvr_ckf_destroy(&c);
    free(buckets);
    free(snap);
}

/* Insert + remove of one hash at 90 % load, many times. */
Test(ckf, insert_remove_pairs_at_high_load, .timeout = 30)
{
    const uint64_t bc = 4096;
    uint64_t *buckets = calloc(bc, 8), *snap = malloc(bc * 8);
    kvr_ckf_t c;
    cr_assert_eq(kvr_ckf_init(&c, buckets, bc, TEST_SEED, 0, 0), KVR_OK);
    uint64_t rs = 23;
    const uint64_t members = bc * 4 * 9 / 10;
    for (uint64_t i = 0; i < members; i++)
        cr_assert_eq(kvr_ckf_insert(&c, td_splitmix(&rs)), KVR_OK);
    int exact = 0, moved = 0;
    for (int i = 0; i < 10000; i++) {
        memcpy(snap, buckets, bc * 8);
        uint64_t kicks = c.kicks, h = td_splitmix(&rs);
        int rc = kvr_ckf_insert(&c, h);
        if (rc == KVR_ENOSPACE) {
            cr_assert_arr_eq(snap, buckets, bc * 8);
            continue;
        }
        cr_assert_eq(kvr_ckf_remove(&c, h), KVR_OK);
        cr_assert_eq(c.items, members);
        if (c.kicks == kicks) {
            cr_assert_arr_eq(snap, buckets, bc * 8, "no kick: restored exactly");
            exact++;
        } else {
            moved++;
        }
    }
    uint64_t check = 23;
    for (uint64_t i = 0; i < members; i++)
        cr_assert(kvr_ckf_contains(&c, td_splitmix(&check)), "member %lu lost", (unsigned long)i);
    cr_log_info("at 90%% load: %d pairs restored exactly, %d moved entries by kicking", exact,
                moved);
    cr_assert_gt(exact, 5000);
    kvr_ckf_destroy(&c);
    free(buckets);
    free(snap);
}

/* Two copies of colliding hashes stay separate: removing one leaves the other. */
Test(ckf, duplicate_copies)
{
    uint64_t buckets[16] = {0};
    kvr_ckf_t c;
    cr_assert_eq(kvr_ckf_init(&c, buckets, 16, TEST_SEED, 0, 0), KVR_OK);
    cr_assert_eq(kvr_ckf_insert(&c, 77), KVR_OK);
    cr_assert_eq(kvr_ckf_insert(&c, 77), KVR_OK);
    cr_assert_eq(c.items, 2);
    cr_assert_eq(kvr_ckf_remove(&c, 77), KVR_OK);
    cr_assert(kvr_ckf_contains(&c, 77));
    cr_assert_eq(kvr_ckf_remove(&c, 77), KVR_OK);
    cr_assert(!kvr_ckf_contains(&c, 77));
    cr_assert_eq(kvr_ckf_remove(&c, 77), KVR_ENOTFOUND);
    kvr_ckf_destroy(&c);
}

Test(ckf, dirty_tracking)
{
    static uint64_t buckets[1024];
    kvr_ckf_t c;
    kvr_ckf_image_t im[1024];
    cr_assert_eq(kvr_ckf_init(&c, buckets, 1024, KVR_CKF_DEFAULT_SEED, 0, 1), KVR_OK);
    kvr_ckf_addr_t a = c.addr;

    /* net reversion: insert then remove before a drain -> nothing to publish */
    cr_assert_eq(kvr_ckf_insert(&c, 1), KVR_OK);
    cr_assert_eq(kvr_ckf_remove(&c, 1), KVR_OK);
    cr_assert_eq(kvr_ckf_dirty_count(&c), 1);
    cr_assert_eq(kvr_ckf_drain(&c, im), 0);
    cr_assert_eq(kvr_ckf_dirty_count(&c), 0);

    /* unique buckets, first-touch order, absolute values */
    uint64_t hs[3] = {0xFFFFFFFFFFFFFFFFULL, 0, 0x0123456789ABCDEFULL};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(kvr_ckf_insert(&c, hs[i]), KVR_OK);
    cr_assert_eq(kvr_ckf_insert(&c, hs[0]), KVR_OK); /* same bucket again */
    cr_assert_eq(kvr_ckf_dirty_count(&c), 3);
    cr_assert_eq(kvr_ckf_drain(&c, im), 3);
    for (int i = 0; i < 3; i++) {
        kvr_ckf_probe_t p = kvr_ckf_prepare(&a, hs[i]);
        cr_expect_eq(im[i].bucket, p.a);
        cr_expect_eq(im[i].value, buckets[p.a]);
    }
    uint64_t fp0 = kvr_ckf_prepare(&a, hs[0]).fp;
    cr_expect_eq(im[0].value, fp0 | (fp0 << 16));

    /* after a drain the drained values are the published ones */
    cr_assert_eq(kvr_ckf_remove(&c, hs[0]), KVR_OK);
    cr_assert_eq(kvr_ckf_insert(&c, hs[0]), KVR_OK);
    cr_assert_eq(kvr_ckf_drain(&c, im), 0, "back to the published word");
    cr_assert_eq(kvr_ckf_remove(&c, hs[1]), KVR_OK);
    cr_assert_eq(kvr_ckf_drain(&c, im), 1);
    cr_expect_eq(im[0].value, 0);
    kvr_ckf_destroy(&c);
}

/* Replaying drained images onto a copy reproduces the filter exactly, kicks included. */
Test(ckf, drained_deltas_reproduce_filter)
{
    const uint64_t bc = 256;
    uint64_t buckets[256] = {0}, replica[256] = {0};
    kvr_ckf_t c;
    static kvr_ckf_image_t im[256];
    cr_assert_eq(kvr_ckf_init(&c, buckets, bc, KVR_CKF_DEFAULT_SEED, 0, 1), KVR_OK);
    uint64_t rs = 5, rr = 5;
    size_t seen = 0;
    for (int round = 0; round < 200; round++) {
        for (int k = 0; k < 16; k++) {
            if ((round + k) % 3 == 2 && seen < c.items) {
                cr_assert_eq(kvr_ckf_remove(&c, td_splitmix(&rr)), KVR_OK);
                seen++;
            } else {
                (void)kvr_ckf_insert(&c, td_splitmix(&rs));
            }
        }
        size_t n = kvr_ckf_drain(&c, im);
        for (size_t i = 0; i < n; i++) {
            cr_assert_lt(im[i].bucket, bc);
            for (size_t j = 0; j < i; j++)
                cr_assert_neq(im[i].bucket, im[j].bucket, "unique buckets per delta");
            replica[im[i].bucket] = im[i].value;
        }
        cr_assert_arr_eq(replica, buckets, sizeof(replica), "round %d", round);
    }
    kvr_ckf_destroy(&c);
}

Test(ckf, init_rejects_bad_layouts)
{
    uint64_t b[4];
    kvr_ckf_t c;
    cr_expect_eq(kvr_ckf_init(&c, b, 3, 1, 0, 0), KVR_EINVAL);
    cr_expect_eq(kvr_ckf_init(&c, b, 1, 1, 0, 0), KVR_EINVAL);
    cr_expect_eq(kvr_ckf_init(&c, b, 4, 1, 4097, 0), KVR_EINVAL);
    cr_expect_eq(kvr_ckf_init(&c, NULL, 4, 1, 0, 0), KVR_EINVAL);
    cr_expect_eq(kvr_ckf_init(&c, b, 1ULL << 25, 1, 0, 0), KVR_EINVAL);
}
