/*
 * store_stats.c — the store's figures: totals of the resident set, counters summed over
 * every process's stats block, one namespace's share, the change log's positions.
 */
#include "core/store.h"

#include "core/store_int.h"

#include <string.h>

uint64_t kvr_store_counter(const kvr_store_t *st, unsigned i)
{
    return kvr_stats_sum(st->sh->stats, KVR_MAX_PROCS + 1, i);
}

/* Status only (/debug/relay): the two loads need not be one moment, so nothing pairs with
 * them; seq_cst as they always were. */
void kvr_store_log_positions(const kvr_store_t *st, uint64_t *head, uint64_t *tail)
{
    *head = kvr_atomic_load_seq_cst(&st->log->head);
    *tail = kvr_atomic_load_seq_cst(&st->log->tail);
}

void kvr_store_ns_stats(kvr_store_t *st, uint16_t ns, kvr_store_ns_stats_t *o)
{
    uint64_t c[KVR_NSST_N] = {0};

    memset(o, 0, sizeof(*o));
    if (ns >= KVR_NS_MAX)
        return;
    if (store_lock(st) == KVR_OK) {
        o->blocks = st->sh->ns_agg[ns].blocks;
        o->refs = st->sh->ns_agg[ns].refs;
        o->resident_bytes = st->sh->ns_agg[ns].resident_bytes;
        o->logical_bytes = st->sh->ns_agg[ns].logical_bytes;
        store_unlock(st);
    }
    for (unsigned p = 0; p <= KVR_MAX_PROCS; p++) /* counters: relaxed, pair with nothing */
        for (unsigned i = 0; i < KVR_NSST_N; i++)
            c[i] += kvr_atomic_load_relaxed(&st->sh->ns_stats[p][ns].c[i]);
    o->get_hits = c[KVR_NSST_GET_HITS];
    o->get_misses = c[KVR_NSST_GET_MISSES];
    o->put_new = c[KVR_NSST_PUT_NEW];
    o->put_dedup = c[KVR_NSST_PUT_DEDUP];
    o->evictions = c[KVR_NSST_EVICTIONS];
    o->evicted_bytes = c[KVR_NSST_EVICTED_BYTES];
    o->deletes = c[KVR_NSST_DELETES];
    o->put_conflicts = c[KVR_NSST_PUT_CONFLICTS];
}

void kvr_store_stats(kvr_store_t *st, kvr_store_stats_t *o)
{
    kvr_store_sh_t *sh = st->sh;
    const kvr_stats_block_t *b = sh->stats;
    const unsigned n = KVR_MAX_PROCS + 1;

    memset(o, 0, sizeof(*o));
    if (store_lock(st) == KVR_OK) {
        o->unique_blocks = sh->unique_blocks;
        o->total_refs = sh->total_refs;
        o->resident_bytes = sh->resident_bytes;
        o->logical_bytes = sh->logical_bytes;
        o->pinned_blocks = sh->pinned_entries;
        o->zombie_blocks = sh->zombies;
        o->free_pages = sh->arena.free_pages;
        o->repairs = sh->repairs;
        o->lock_recoveries = sh->lock_recoveries;
        store_unlock(st);
    }
    o->dedup_savings_bytes = o->logical_bytes > o->resident_bytes ? o->logical_bytes - o->resident_bytes : 0;
    o->total_pages = sh->arena.npages;
    o->capacity_bytes = sh->arena.npages * st->page_size;
    o->dedup_hits = kvr_stats_sum(b, n, KVR_ST_PUT_DEDUP);
    o->get_hits = kvr_stats_sum(b, n, KVR_ST_GET_HIT);
    o->get_misses = kvr_stats_sum(b, n, KVR_ST_GET_MISS);
    o->evictions = kvr_stats_sum(b, n, KVR_ST_EVICTIONS);
    o->evicted_bytes = kvr_stats_sum(b, n, KVR_ST_EVICTED_BYTES);
    o->put_new = kvr_stats_sum(b, n, KVR_ST_PUT_NEW);
    o->put_conflicts = kvr_stats_sum(b, n, KVR_ST_PUT_CONFLICT);
    o->put_nospace = kvr_stats_sum(b, n, KVR_ST_PUT_NOSPACE);
    o->deletes = kvr_stats_sum(b, n, KVR_ST_DELETES);
    /* Counters, relaxed: their producers' relaxed adds (changelog.c) order nothing either. */
    o->log_appended = kvr_atomic_load_relaxed(&st->log->appended);
    o->log_dropped = kvr_atomic_load_relaxed(&st->log->dropped);
}
