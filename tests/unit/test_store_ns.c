/* The store's namespaces: a key's identity is (namespace, key bytes). */
#include "core/store_int.h"
#include "store_fixture.h"

#include <string.h>

#define NS_A 1
#define NS_B 2

/* The namespace's relay pool (every PUT names one: core/store_pools.c). */
static uint32_t ns_pool(kvr_store_t *st, uint16_t ns)
{
    int pool = kvr_store_pool(st, ns, "t", "kvrelay", 7, KVR_POOLS_MAX);
    cr_assert_geq(pool, 0);
    return (uint32_t)pool;
}

static int put_ns(fx_t *f, uint16_t ns, const char *key, const void *data, uint64_t len)
{
    return kvr_store_put(&f->st, ns, ns_pool(&f->st, ns), key, strlen(key), data, len,
                         kvr_store_default_canon(key, strlen(key)));
}

/* Reads the whole block of (ns, key) into buf (len bytes); KVR_OK or the get's error. */
static int get_ns(fx_t *f, uint16_t ns, const char *key, void *buf, uint64_t len)
{
    kvr_block_ref_t ref;
    int rc = kvr_store_get(&f->st, ns, key, strlen(key), &ref);

    if (rc != KVR_OK)
        return rc;
    cr_assert_eq(ref.length, len);
    cr_assert_eq(kvr_store_read(&f->st, &ref, 0, buf, len), KVR_OK);
    kvr_store_unpin(&f->st, &ref);
    return KVR_OK;
}

Test(store_ns, same_key_in_two_namespaces_is_two_blocks)
{
    fx_t f;
    uint8_t a[4096], b[4096], got[4096];
    uint32_t left = 99;
    kvr_store_ns_stats_t sa, sb;

    fx_open(&f, 8 << 20, 4096, 64, 0);
    memset(a, 'a', sizeof(a));
    memset(b, 'b', sizeof(b));
    cr_assert_eq(put_ns(&f, NS_A, "K", a, sizeof(a)), KVR_PUT_CREATED);
    /* B sees nothing of A's K: no dedup hit, no conflict, its own bytes */
    cr_assert_eq(kvr_store_exists(&f.st, NS_B, "K", 1, NULL), 0);
    cr_assert_eq(get_ns(&f, NS_B, "K", got, sizeof(got)), KVR_ENOTFOUND);
    cr_assert_eq(kvr_store_release(&f.st, NS_B, "K", 1, &left), KVR_ENOTFOUND);
    cr_assert_eq(put_ns(&f, NS_B, "K", b, 100), KVR_PUT_CREATED, "another length is not a conflict across namespaces");
    cr_assert_eq(put_ns(&f, NS_B, "K2", b, sizeof(b)), KVR_PUT_CREATED);
    cr_assert_eq(put_ns(&f, NS_A, "K", a, sizeof(a)), KVR_PUT_DEDUP, "within a namespace dedup still works");
    cr_assert_eq(put_ns(&f, NS_A, "K", a, 10), KVR_ECONFLICT, "and so do conflicts");
    kvr_store_ns_stats(&f.st, NS_A, &sa);
    kvr_store_ns_stats(&f.st, NS_B, &sb);
    cr_assert_eq(sa.blocks, 1);
    cr_assert_eq(sa.refs, 2);
    cr_assert_eq(sa.logical_bytes, 2 * sizeof(a));
    cr_assert_eq(sa.put_conflicts, 1);
    cr_assert_eq(sb.blocks, 2);
    cr_assert_eq(sb.refs, 2);
    cr_assert_eq(sb.resident_bytes, 100 + sizeof(b));
    cr_assert_eq(sb.put_conflicts, 0);
    cr_assert_eq(get_ns(&f, NS_A, "K", got, sizeof(got)), KVR_OK);
    cr_assert_eq(memcmp(got, a, sizeof(a)), 0);
    cr_assert_eq(get_ns(&f, NS_B, "K", got, 100), KVR_OK);
    cr_assert_eq(memcmp(got, b, 100), 0);
    /* the default namespace is a namespace like the others */
    cr_assert_eq(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "K", 1, NULL), 0);
    /* B's delete takes B's block only */
    cr_assert_eq(kvr_store_release(&f.st, NS_B, "K", 1, &left), KVR_OK);
    cr_assert_eq(left, 0);
    cr_assert_eq(kvr_store_exists(&f.st, NS_B, "K", 1, NULL), 0);
    cr_assert_eq(kvr_store_exists(&f.st, NS_A, "K", 1, NULL), 1);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(store_ns, namespace_out_of_range_is_invalid)
{
    fx_t f;
    uint8_t a[16] = {0};
    kvr_block_ref_t ref;

    fx_open(&f, 8 << 20, 4096, 64, 0);
    cr_assert_eq(kvr_store_put(&f.st, KVR_NS_MAX, 0, "K", 1, a, sizeof(a), 1), KVR_EINVAL);
    cr_assert_eq(kvr_store_pool(&f.st, KVR_NS_MAX, "t", "m", 1, KVR_POOLS_MAX), KVR_EINVAL, "nor has it a pool");
    cr_assert_eq(kvr_store_get(&f.st, KVR_NS_MAX, "K", 1, &ref), KVR_EINVAL);
    cr_assert_eq(kvr_store_exists(&f.st, KVR_NS_MAX, "K", 1, NULL), 0);
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_MAX, "K", 1, NULL), KVR_EINVAL);
    fx_close(&f);
}

Test(store_ns, seeds_are_drawn_per_namespace)
{
    fx_t f;
    int distinct = 1;

    fx_open(&f, 8 << 20, 4096, 64, 0);
    for (unsigned i = 0; i < KVR_NS_MAX; i++)
        for (unsigned j = i + 1; j < KVR_NS_MAX; j++)
            distinct &= f.st.sh->ns_seed[i] != f.st.sh->ns_seed[j];
    cr_assert(distinct, "two namespaces drew the same chain-hash seed");
    fx_close(&f);
}

/* Puts n one-page blocks (4000 bytes) named <prefix><i> into ns; returns how many were created. */
static int fill(fx_t *f, uint16_t ns, const char *prefix, int from, int n)
{
    static const uint8_t d[4000];
    int created = 0;

    for (int i = from; i < from + n; i++) {
        char k[32];
        snprintf(k, sizeof(k), "%s%d", prefix, i);
        created += put_ns(f, ns, k, d, sizeof(d)) == KVR_PUT_CREATED;
    }
    return created;
}

static uint64_t arena_pages(fx_t *f)
{
    kvr_store_stats_t all;

    kvr_store_stats(&f->st, &all);
    return all.total_pages;
}

Test(store_ns, counters_and_aggregates_per_namespace)
{
    fx_t f;
    uint8_t d[4000] = {0}, got[4000];
    kvr_store_ns_stats_t a;

    fx_open(&f, 1 << 20, 4096, 256, 0);
    cr_assert_eq(fill(&f, NS_A, "a", 0, 6), 6);
    cr_assert_eq(put_ns(&f, NS_A, "a0", d, 4000), KVR_PUT_DEDUP);
    cr_assert_eq(get_ns(&f, NS_A, "a1", got, 4000), KVR_OK);
    cr_assert_eq(get_ns(&f, NS_A, "zz", got, 4000), KVR_ENOTFOUND);
    kvr_store_ns_stats(&f.st, NS_A, &a);
    cr_assert_eq(a.blocks, 6);
    cr_assert_eq(a.resident_bytes, 6 * 4000);
    cr_assert_eq(a.put_new, 6);
    cr_assert_eq(a.put_dedup, 1);
    cr_assert_eq(a.get_hits, 1);
    cr_assert_eq(a.get_misses, 1);
    cr_assert_eq(a.evictions, 0);
    fx_close(&f);
}

Test(store_ns, a_full_arena_takes_from_the_namespace_most_over_its_share)
{
    fx_t f;
    kvr_store_ns_stats_t a, b;
    uint64_t n;

    /* A fills the arena alone, then B writes: A is far over its half, B under it, so every
     * block that goes is A's, counted against A though B's puts caused it */
    fx_open(&f, 1 << 20, 4096, 1024, 0);
    n = arena_pages(&f);
    cr_assert_eq(fill(&f, NS_A, "a", 0, (int)n), (int)n);
    cr_assert_eq(fill(&f, NS_B, "b", 0, (int)(n / 4)), (int)(n / 4));
    kvr_store_ns_stats(&f.st, NS_A, &a);
    kvr_store_ns_stats(&f.st, NS_B, &b);
    cr_assert_eq(a.evictions, n / 4);
    cr_assert_eq(a.evicted_bytes, n / 4 * 4000);
    cr_assert_eq(b.evictions, 0);
    cr_assert_eq(b.blocks, n / 4);
    /* B goes on past its half: then B is the one over, and gives up its own oldest first */
    cr_assert_eq(fill(&f, NS_B, "b", (int)(n / 4), (int)n), (int)n);
    kvr_store_ns_stats(&f.st, NS_A, &a);
    kvr_store_ns_stats(&f.st, NS_B, &b);
    cr_assert_gt(b.evictions, 0);
    cr_assert_eq(a.blocks, b.blocks,
                 "the two end at equal shares: A %llu, B %llu blocks", (unsigned long long)a.blocks,
                 (unsigned long long)b.blocks);
    cr_assert_eq(kvr_store_exists(&f.st, NS_B, "b0", 2, NULL), 0, "B's oldest went first");
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(store_ns, a_quota_evicts_the_namespaces_own_blocks_only)
{
    fx_t f;
    uint64_t q[KVR_NS_MAX] = {0};
    uint8_t big[5 * 4000 + 1] = {0};
    kvr_store_ns_stats_t a, b;

    fx_open(&f, 1 << 20, 4096, 1024, 0);
    q[NS_A] = 5 * 4000;
    kvr_store_set_quotas(&f.st, q, (uint64_t[KVR_NS_MAX]){0});
    cr_assert_eq(fill(&f, NS_B, "b", 0, 8), 8);
    cr_assert_eq(fill(&f, NS_A, "a", 0, 12), 12);
    kvr_store_ns_stats(&f.st, NS_A, &a);
    kvr_store_ns_stats(&f.st, NS_B, &b);
    cr_assert_eq(a.resident_bytes, 5 * 4000, "A holds its quota: %llu", (unsigned long long)a.resident_bytes);
    cr_assert_eq(a.evictions, 7);
    cr_assert_eq(b.blocks, 8, "B lost nothing");
    cr_assert_eq(b.evictions, 0);
    cr_assert_eq(kvr_store_exists(&f.st, NS_A, "a6", 2, NULL), 0, "A's oldest went");
    cr_assert_eq(kvr_store_exists(&f.st, NS_A, "a11", 3, NULL), 1);
    /* a block larger than the quota never fits: refused, nothing evicted */
    cr_assert_eq(put_ns(&f, NS_A, "huge", big, sizeof(big)), KVR_EQUOTA);
    kvr_store_ns_stats(&f.st, NS_A, &a);
    cr_assert_eq(a.evictions, 7);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(store_ns, a_quota_counts_puts_in_flight_and_pins_hold)
{
    fx_t f;
    uint64_t q[KVR_NS_MAX] = {0};
    kvr_put_txn_t t1, t2;
    kvr_block_ref_t ref;

    fx_open(&f, 1 << 20, 4096, 1024, 0);
    q[NS_A] = 3 * 4000;
    kvr_store_set_quotas(&f.st, q, (uint64_t[KVR_NS_MAX]){0});
    /* two reservations in flight hold 8000 of the 12000: a third 4000 fits, a fourth not
     * while the first two are all that could go (they are not resident yet) */
    cr_assert_eq(kvr_store_put_begin(&f.st, NS_A, ns_pool(&f.st, NS_A), "r1", 2, 4000, 1, &t1), KVR_OK);
    cr_assert_eq(kvr_store_put_begin(&f.st, NS_A, ns_pool(&f.st, NS_A), "r2", 2, 4000, 2, &t2), KVR_OK);
    cr_assert_eq(fill(&f, NS_A, "a", 0, 1), 1);
    cr_assert_eq(kvr_store_get(&f.st, NS_A, "a0", 2, &ref), KVR_OK); /* pinned: cannot go */
    cr_assert_eq(fill(&f, NS_A, "a", 1, 1), 0, "over quota with only pinned and reserved bytes");
    kvr_store_unpin(&f.st, &ref);
    cr_assert_eq(fill(&f, NS_A, "a", 1, 1), 1, "unpinned, a0 makes room");
    kvr_store_put_abort(&f.st, &t1);
    cr_assert_eq(kvr_store_put_commit(&f.st, &t2), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(store_ns, repair_recounts_namespaces_and_reap_keeps_their_counters)
{
    fx_t f;
    kvr_seg_t seg2;
    kvr_store_t st2;
    uint8_t d[1000] = {0};
    kvr_store_ns_stats_t a;

    fx_open(&f, 8 << 20, 4096, 64, 0);
    fx_second(&f, &seg2, &st2);
    cr_assert_eq(kvr_store_put(&st2, NS_A, ns_pool(&st2, NS_A), "x", 1, d, sizeof(d), 1), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_put(&st2, NS_B, ns_pool(&st2, NS_B), "x", 1, d, 10, 2), KVR_PUT_CREATED);
    /* wreck the aggregates: the repair rebuilds them from the entries */
    f.st.sh->ns_agg[NS_A].blocks = 77;
    f.st.sh->ns_agg[NS_B].refs = 0;
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_ERR);
    cr_assert_eq(store_lock(&f.st), KVR_OK);
    kvr_store_repair_locked(&f.st, -1);
    store_unlock(&f.st);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    kvr_store_ns_stats(&f.st, NS_A, &a);
    cr_assert_eq(a.blocks, 1);
    cr_assert_eq(a.resident_bytes, sizeof(d));
    cr_assert_eq(a.put_new, 1);
    /* the slot that counted it goes: its counters stay in the retired row */
    f.st.seg->procs[f.st.slot].role = KVR_ROLE_SUPERVISOR;
    cr_assert_eq(kvr_store_reap_slot(&f.st, st2.slot), KVR_OK);
    kvr_store_ns_stats(&f.st, NS_A, &a);
    cr_assert_eq(a.put_new, 1);
    cr_assert_eq(f.st.sh->ns_stats[seg2.slot][NS_A].c[KVR_NSST_PUT_NEW], 0);
    fx_close(&f);
}
