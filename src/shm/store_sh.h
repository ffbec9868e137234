/*
 * store_sh.h — the store's shared state: one struct at off_store in the segment.
 *
 * Written under `lock` (see shlock.h for the lock order) except the seqlock and change-log
 * indices, whose orderings are documented in index.h and changelog.h. The per-process pin
 * tables and stats blocks are separate regions (off_pins, and `stats` here).
 */
#ifndef KVR_SHM_STORE_SH_H
#define KVR_SHM_STORE_SH_H

#include "common.h"
#include "shm/arena.h"
#include "shm/index.h"
#include "shm/segment.h"
#include "shm/shlock.h"
#include "shm/stats.h"
#include "shm/tenants_sh.h"

/* One pin-table slot: entry index (KVR_NIL = empty) and how many times this process pins it. */
typedef struct {
    uint32_t entry;
    uint32_t count;
} kvr_pin_t;

/* A process's counters for one namespace: like kvr_stats_block_t, written by the slot's owner
 * alone with relaxed stores, summed by readers, folded into the retired row at reap. */
enum { KVR_NSST_GET_HITS,
       KVR_NSST_GET_MISSES,
       KVR_NSST_PUT_NEW,
       KVR_NSST_PUT_DEDUP,
       KVR_NSST_EVICTIONS,
       KVR_NSST_EVICTED_BYTES,
       KVR_NSST_DELETES,
       KVR_NSST_PUT_CONFLICTS,
       KVR_NSST_N = 8 };
typedef struct {
    uint64_t c[KVR_NSST_N];
} kvr_ns_stats_t;
static_assert(sizeof(kvr_ns_stats_t) == KVR_CACHELINE, "a namespace's counters are one line");

/* A namespace's share of the resident set: the totals below, restricted to it. */
typedef struct {
    uint64_t blocks, refs, resident_bytes, logical_bytes;
    uint64_t reserved_bytes; /* payload of its PUTs in flight (RESERVED entries): the quota counts them */
} kvr_ns_agg_t;

/*
 * A relay pool: the blocks of one (namespace, model), published as one filter
 * (docs/tenancy.md, "Pools"). Slots below `npools` are immutable once published: a worker
 * fills the next slot under the store lock and then stores npools + 1 with release; readers
 * load npools with acquire and read the slots below it without a lock. Pool 0 is (default,
 * --model), written when the store is formatted. A pool lives as long as the segment.
 */
typedef struct {
    uint16_t ns;
    uint8_t model_len;
    uint8_t pad0_;
    char ns_name[KVR_NS_NAME_MAX + 1]; /* the namespace's name when the pool was made */
    char model[KVR_MODEL_MAX + 1];     /* NUL-terminated */
    uint8_t pad1_[2];
} kvr_pool_sh_t;
static_assert(sizeof(kvr_pool_sh_t) == 168, "pool slot layout");
static_assert(KVR_POOLS_MAX <= 256, "an entry names its pool in 8 bits");

typedef struct {
    kvr_shlock_t lock;
    kvr_index_sh_t index;
    kvr_arena_sh_t arena;
    /* Aggregates of the resident set, maintained under the lock, recomputed by repair. */
    uint64_t unique_blocks;
    uint64_t total_refs;
    uint64_t resident_bytes;
    uint64_t logical_bytes;
    uint64_t pinned_entries; /* entries with pins > 0 (LIVE or ZOMBIE) */
    uint64_t zombies;
    uint32_t no_evict;
    uint32_t formatted;
    uint64_t repairs;         /* full repairs run */
    uint64_t lock_recoveries; /* repairs because a holder died with the lock */
    uint8_t pad_[64 - (KVR_ARENA_CLASSES * 4 + 24 + 9 * 8) % 64];
    kvr_stats_block_t stats[KVR_MAX_PROCS + 1]; /* + the retired block */

    /* Namespaces (id 0 is "default"; ids come from the tenants table). The seeds are drawn
     * once when the store is formatted and never change: the index's chain hash of a key is
     * XXH3 seeded with its namespace's seed, secret to clients. The per-namespace aggregates
     * are kept under `lock` with the totals above and recomputed by the repair. */
    uint64_t ns_seed[KVR_NS_MAX];
    kvr_ns_agg_t ns_agg[KVR_NS_MAX];
    kvr_lru_t ns_lru[KVR_NS_MAX]; /* the index's LRU lists, one per namespace (index.h) */
    /* memory= of each namespace in payload bytes (0: none): the supervisor copies it from the
     * tenants table under the lock at every publication (kvr_store_set_quotas) */
    uint64_t ns_quota[KVR_NS_MAX];
    /* ssd= of each namespace in payload bytes (0: none), copied with ns_quota; the disk writer
     * reads it with relaxed loads, no lock (a quota one publication late is harmless) */
    uint64_t ns_ssd_quota[KVR_NS_MAX];
    kvr_ns_stats_t ns_stats[KVR_MAX_PROCS + 1][KVR_NS_MAX]; /* by process slot, as `stats` */

    _Atomic uint32_t npools; /* pool slots in use (the protocol above) */
    uint32_t pad2_;
    kvr_pool_sh_t pool[KVR_POOLS_MAX];
} kvr_store_sh_t;
static_assert(offsetof(kvr_store_sh_t, stats) % KVR_CACHELINE == 0, "stats blocks are aligned");

#define KVR_STATS_RETIRED KVR_MAX_PROCS

#endif
