/* stats.c — see stats.h. */
#include "shm/stats.h"

const uint64_t kvr_pub_bucket_us[KVR_PUB_BUCKETS] = {100, 250, 500, 1000, 2000, 5000, 10000, 25000, 50000, 100000, 250000, 1000000};

uint64_t kvr_stats_sum(const kvr_stats_block_t *blocks, unsigned n, unsigned i)
{
    uint64_t s = 0;
    for (unsigned k = 0; k < n; k++)
        s += kvr_atomic_load_relaxed(&blocks[k].c[i]); /* counters: pairs with nothing */
    return s;
}

void kvr_stats_retire(kvr_stats_block_t *into, kvr_stats_block_t *from)
{
    /* The supervisor, after `from`'s owner died and before its slot is reused: no writer of
     * either block runs, and readers may see a sum one counter late (relaxed, pairs with
     * nothing). */
    for (unsigned i = 0; i < KVR_ST_MAX; i++) {
        if (i < KVR_ST_LEVELS || i >= KVR_ST_USED) /* a level is the dead one's own: it goes */
            kvr_stat_add(into, i, kvr_atomic_load_relaxed(&from->c[i]));
        kvr_atomic_store_relaxed(&from->c[i], 0);
    }
}
