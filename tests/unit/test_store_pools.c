/* The relay pools' table (core/store_pools.c): one pool per (namespace, model), found again by
 * later PUTs, bounded by the segment's --max-pools, and carried by every block into the change
 * log and the publisher's rescan. */
#include "store_fixture.h"

#include "shm/changelog.h"

#include <string.h>

static void open_pools(fx_t *f, uint32_t pools)
{
    kvr_seg_config_t cfg = {0};

    kvr_log_level = KVR_LOG_ERROR;
    cfg.memory = 4 << 20;
    cfg.page_size = 4096;
    cfg.max_blocks = 64;
    cfg.hugepages = KVR_HUGEPAGES_OFF;
    cfg.relay_pools = pools;
    cr_assert_eq(kvr_seg_create(&f->seg, &cfg), KVR_OK);
    cr_assert_eq(kvr_store_format(&f->seg, 0), KVR_OK);
    cr_assert_geq(kvr_seg_proc_claim(&f->seg, 0), 0);
    cr_assert_eq(kvr_store_open(&f->st, &f->seg), KVR_OK);
}

#define POOL(f, ns, model) kvr_store_pool(&(f)->st, (ns), "t", (model), strlen(model), KVR_POOLS_MAX)

Test(store_pools, one_pool_per_namespace_and_model_found_again)
{
    fx_t f;
    kvr_pool_info_t pi;

    open_pools(&f, 4);
    cr_assert_eq(kvr_store_pool_count(&f.st), 0);
    cr_assert_eq(POOL(&f, 0, "m1"), 0);
    cr_assert_eq(POOL(&f, 0, "m2"), 1, "another model: another pool");
    cr_assert_eq(POOL(&f, 3, "m1"), 2, "another namespace: another pool");
    cr_assert_eq(POOL(&f, 0, "m1"), 0, "found again");
    cr_assert_eq(POOL(&f, 3, "m1"), 2);
    cr_assert_eq(POOL(&f, 0, "m"), 3, "a prefix is another model");
    cr_assert_eq(kvr_store_pool_count(&f.st), 4);
    cr_assert_eq(kvr_store_pool_info(&f.st, 2, &pi), KVR_OK);
    cr_assert_str_eq(pi.model, "m1");
    cr_assert_str_eq(pi.ns_name, "t");
    cr_assert_eq(pi.ns, 3);
    cr_assert_eq(kvr_store_pool_info(&f.st, 4, &pi), KVR_ENOTFOUND);
    fx_close(&f);
}

Test(store_pools, past_max_pools_a_new_pool_is_refused_and_the_old_ones_stay)
{
    fx_t f;

    open_pools(&f, 2);
    cr_assert_eq(POOL(&f, 0, "a"), 0);
    cr_assert_eq(POOL(&f, 0, "b"), 1);
    cr_assert_eq(POOL(&f, 0, "c"), KVR_ENOSPACE);
    cr_assert_eq(POOL(&f, 1, "a"), KVR_ENOSPACE);
    cr_assert_eq(POOL(&f, 0, "b"), 1, "an existing pool is still found");
    cr_assert_eq(kvr_store_pool_count(&f.st), 2);
    fx_close(&f);
}

Test(store_pools, a_namespace_makes_at_most_its_share_of_pools)
{
    fx_t f;

    open_pools(&f, 8);
    cr_assert_eq(kvr_store_pool(&f.st, 1, "a", "m1", 2, 2), 0);
    cr_assert_eq(kvr_store_pool(&f.st, 1, "a", "m2", 2, 2), 1);
    cr_assert_eq(kvr_store_pool(&f.st, 1, "a", "m3", 2, 2), KVR_EQUOTA, "namespace 1 has its 2");
    cr_assert_eq(kvr_store_pool(&f.st, 1, "a", "m1", 2, 2), 0, "its own are still found");
    cr_assert_eq(kvr_store_pool(&f.st, 2, "b", "m3", 2, 2), 2, "another namespace is not held back");
    cr_assert_eq(kvr_store_pool_count(&f.st), 3);
    fx_close(&f);
}

Test(store_pools, an_invalid_model_is_refused)
{
    fx_t f;
    char big[KVR_MODEL_MAX + 2];

    open_pools(&f, 4);
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    cr_assert_eq(POOL(&f, 0, ""), KVR_EINVAL);
    cr_assert_eq(POOL(&f, 0, "a b"), KVR_EINVAL);
    cr_assert_eq(POOL(&f, 0, "a\tb"), KVR_EINVAL);
    cr_assert_eq(POOL(&f, 0, big), KVR_EINVAL, "129 bytes");
    big[KVR_MODEL_MAX] = '\0';
    cr_assert_eq(POOL(&f, 0, big), 0, "128 bytes");
    cr_assert_eq(POOL(&f, 0, "meta-llama/Llama-3.1-8B-Instruct"), 1);
    fx_close(&f);
}

static void pool_cb(void *ctx, uint32_t e, uint32_t g, uint64_t canon, uint32_t pool)
{
    uint32_t *seen = ctx;
    (void)e;
    (void)g;
    seen[canon] = pool + 1;
}

Test(store_pools, a_block_carries_its_pool_into_the_change_log_and_the_rescan)
{
    fx_t f;
    kvr_chlog_event_t ev[8];
    uint32_t seen[4] = {0};

    open_pools(&f, 4);
    cr_assert_eq(POOL(&f, 0, "m1"), 0);
    cr_assert_eq(POOL(&f, 0, "m2"), 1);
    cr_assert_eq(kvr_store_put(&f.st, 0, 1, "k1", 2, "x", 1, 1), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_put(&f.st, 0, 0, "k2", 2, "y", 1, 2), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_put(&f.st, 0, 7, "k3", 2, "z", 1, 3), KVR_EINVAL, "no such pool");
    cr_assert_eq(kvr_chlog_consume(f.st.log, ev, 8), 2);
    cr_assert_eq(ev[0].canon, 1);
    cr_assert_eq(ev[0].pool, 1);
    cr_assert_eq(ev[1].canon, 2);
    cr_assert_eq(ev[1].pool, 0);
    kvr_store_resync(&f.st, pool_cb, seen);
    cr_assert_eq(seen[1], 2, "k1 in pool 1");
    cr_assert_eq(seen[2], 1, "k2 in pool 0");
    cr_assert_eq(seen[3], 0);
    fx_close(&f);
}
