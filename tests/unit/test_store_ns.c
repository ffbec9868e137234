/* The store's namespaces: a key's identity is (namespace, key bytes). */
#include "core/store_int.h"
#include "store_fixture.h"

#include <string.h>

#define NS_A 1
#define NS_B 2

static int put_ns(fx_t *f, uint16_t ns, const char *key, const void *data, uint64_t len)
{
    return kvr_store_put(&f->st, ns, key, strlen(key), data, len, kvr_store_default_canon(key, strlen(key)));
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
    cr_assert_eq(put_ns(&f, KVR_NS_MAX, "K", a, sizeof(a)), KVR_EINVAL);
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

Test(store_ns, counters_and_aggregates_per_namespace)
{
    fx_t f;
    uint8_t d[8192] = {0}, got[8192];
    kvr_store_ns_stats_t a, b;
    kvr_store_stats_t all;
    int nb;

    /* a small arena of 4 KiB pages: A's blocks are evicted by B's puts, and the victims are
     * counted against A, not against B who caused them */
    fx_open(&f, 64 << 10, 4096, 64, 0);
    for (int i = 0; i < 6; i++) {
        char k[16];
        snprintf(k, sizeof(k), "a%d", i);
        cr_assert_eq(put_ns(&f, NS_A, k, d, 4000), KVR_PUT_CREATED);
    }
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
    kvr_store_stats(&f.st, &all);
    nb = (int)(all.total_pages / 2) - 2; /* two pages each: fills what A left and some of A's */
    cr_assert_gt(nb, 0);
    for (int i = 0; i < nb; i++) {
        char k[16];
        snprintf(k, sizeof(k), "b%d", i);
        cr_assert_eq(put_ns(&f, NS_B, k, d, 8000), KVR_PUT_CREATED, "B's put %d of %d", i, nb);
    }
    kvr_store_ns_stats(&f.st, NS_A, &a);
    kvr_store_ns_stats(&f.st, NS_B, &b);
    cr_assert_gt(a.evictions, 0);
    cr_assert_eq(a.blocks, 6 - a.evictions);
    cr_assert_eq(a.evicted_bytes, a.evictions * 4000);
    cr_assert_eq(b.evictions, 0);
    cr_assert_eq(b.blocks, (uint64_t)nb);
    cr_assert_eq(b.resident_bytes, (uint64_t)nb * 8000);
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
    cr_assert_eq(kvr_store_put(&st2, NS_A, "x", 1, d, sizeof(d), 1), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_put(&st2, NS_B, "x", 1, d, 10, 2), KVR_PUT_CREATED);
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
