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

/* One pin-table slot: entry index (KVR_NIL = empty) and how many times this process pins it. */
typedef struct {
    uint32_t entry;
    uint32_t count;
} kvr_pin_t;

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
} kvr_store_sh_t;
static_assert(offsetof(kvr_store_sh_t, stats) % KVR_CACHELINE == 0, "stats blocks are aligned");

#define KVR_STATS_RETIRED KVR_MAX_PROCS

#endif
