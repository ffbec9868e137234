/*
 * stats.h — per-process counter blocks in shared memory, summed on read.
 *
 * Each process owns one block (its proc slot) and is the only writer of it, so increments
 * are plain relaxed load+store pairs, no atomic read-modify-write and no shared cache line:
 * blocks are 2 KiB, cache-line aligned. Readers sum every block with relaxed loads.
 * When the supervisor reaps a dead process it folds that block into the retired block
 * (KVR_MAX_PROCS), so totals never go backwards.
 */
#ifndef KVR_SHM_STATS_H
#define KVR_SHM_STATS_H

#include "common.h"

enum {
    KVR_ST_PUT_NEW,
    KVR_ST_PUT_DEDUP,
    KVR_ST_PUT_CONFLICT,
    KVR_ST_PUT_NOSPACE,
    KVR_ST_GET_HIT,
    KVR_ST_GET_MISS,
    KVR_ST_DELETES,
    KVR_ST_EVICTIONS,
    KVR_ST_EVICTED_BYTES,
    KVR_ST_REPAIRS,
    KVR_ST_STORE_MAX = 16,
    /* HTTP: requests by method x status, then latency histograms by method (see http.c) */
    KVR_ST_HTTP_BYTES_IN = 16,
    KVR_ST_HTTP_BYTES_OUT = 17,
    KVR_ST_HTTP_REQ = 20,   /* KVR_HTTP_METHODS x KVR_HTTP_STATUSES counters */
    KVR_ST_HTTP_HIST = 100, /* KVR_HTTP_METHODS x (KVR_HTTP_BUCKETS + 2: sum in us, count) */
    KVR_ST_RELAY = 200,     /* the relay layer's counters (see io/grpc_relay.c, core/publisher.c) */
    KVR_ST_PUB_HIST = 220,  /* publication latency histogram: KVR_PUB_BUCKETS + sum (us) + count */
    KVR_ST_MAX = 256
};

/* Relay counters, KVR_ST_RELAY + i. */
enum {
    KVR_RC_DELTAS = 0,     /* publisher: deltas published */
    KVR_RC_DELTA_BYTES,    /* publisher: their message bytes */
    KVR_RC_FRAMES,         /* workers: FilterUpdate frames sent */
    KVR_RC_BYTES,          /* workers: their bytes */
    KVR_RC_HEARTBEATS,     /* workers: pool heartbeats sent */
    KVR_RC_LAGGED,         /* workers: streams closed for lag */
    KVR_RC_REJECTED,       /* workers: admission refusals */
    KVR_RC_LOAD_WINDOWS,   /* workers: load windows sent */
    KVR_RC_STREAMS_OPENED, /* workers: streams admitted */
    KVR_RC_GENERATIONS,    /* publisher: generations started */
};
#define KVR_PUB_BUCKETS 12

typedef struct {
    uint64_t c[KVR_ST_MAX];
} kvr_stats_block_t;
static_assert(sizeof(kvr_stats_block_t) == 2048, "stats block layout");

static inline void kvr_stat_add(kvr_stats_block_t *b, unsigned i, uint64_t v)
{
    __atomic_store_n(&b->c[i], __atomic_load_n(&b->c[i], __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

/* Sums counter i over n blocks. */
uint64_t kvr_stats_sum(const kvr_stats_block_t *blocks, unsigned n, unsigned i);

/* Folds block `from` into `into` and zeroes `from` (reap of a dead process). */
void kvr_stats_retire(kvr_stats_block_t *into, kvr_stats_block_t *from);

#endif
