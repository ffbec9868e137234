/*
 * publisher_int.h — the publisher process's private state, shared by publisher.c (the change
 * log, publication, generations) and publisher_subs.c (its side of the subscriber slots).
 * Nothing outside src/proc/publisher*.c includes it.
 */
#ifndef KVR_PROC_PUBLISHER_INT_H
#define KVR_PROC_PUBLISHER_INT_H

#include "base/barrier.h"
#include "core/config.h"
#include "core/owners.h"
#include "wire/kvev.h"
#include "core/relay_int.h"
#include "core/store.h"
#include "shm/segment.h"
#include "wire/ckf.h"

#include <signal.h>
#include <stdint.h>
#include <unistd.h>

/* One relay pool as the publisher keeps it: its filter (over the pool's shared region, with
 * the dirty set of the next delta), the owner counts that drive it, its last sequence. */
typedef struct {
    kvr_ckf_t ckf;
    kvr_owners_t owners; /* every owner of a hash, RAM and disk: drives the filter */
    kvr_owners_t disk;   /* the disk tier's owners only (no filter): a hash's RAM owners are
                          * the difference, and each medium has its own KV events */
    uint64_t seq;
    uint64_t blocks; /* entries applied and not removed (kvr_relay_pool_t.blocks mirrors it) */
} pub_pool_t;

typedef struct {
    const kvr_config_t *cfg;
    kvr_seg_t *seg;
    kvr_store_t store;
    kvr_relay_t relay;
    pub_pool_t pool[KVR_POOLS_MAX];
    uint32_t npools;   /* pools taken on: the first npools of the store's table */
    uint32_t *ann_gen; /* per index entry: the generation whose insert was applied */
    uint8_t *ann_live; /* per index entry: 1 while that insert is in effect */
    uint8_t *ann_pool; /* per index entry: the pool it was applied to */
    uint64_t *ann_canon;
    kvr_ckf_image_t *images;
    size_t images_cap;
    uint8_t *msg; /* encode buffer for one delta message */
    size_t msg_cap;
    uint64_t generation;
    uint64_t pending; /* events applied since the last publication (every pool) */
    uint64_t first_pending_ns;
    uint64_t retry_at_ns; /* publish() failed to allocate: not again before this */
    uint64_t max_blocks;
    int resync; /* owner counting failed (out of memory): the filter is not exact */
    /* the main loop (docs/concurrency.md, "Change log") */
    uint64_t delay_ns;    /* --publication-delay */
    uint64_t linger_ns;   /* how long queued events may wait unconsumed */
    uint64_t log_seen_ns; /* when the log was first seen non-empty since the last consume, or 0 */
    uint64_t unwoken_ns;  /* appends may have come unannounced since (timed sleeps), or 0 */
    int busy;             /* the last turn consumed events: look again within a delay */
    /* coalescing (docs/relay-contract.md §5.3): while subscribers fall behind, a delta waits
     * `coalesce` times --publication-delay, however many events come (1 <= coalesce <=
     * --publication-coalesce-max; 1: the configured boundary); publisher_subs.c moves it */
    uint32_t coalesce;
    uint64_t coalesce_ns; /* when it last moved */
    uint64_t scanned_ns;  /* the subscriber slots' last scan */
    int scan_due;         /* a wake-up came since: perhaps a subscriber's request */
    int wake_fd;
    /* Snapshot references, private: which copy each subscriber slot holds (-1: none) and
     * how many hold each copy. Only this process counts; a worker never writes a count. */
    int8_t held[KVR_RELAY_MAX_SUBS];
    uint32_t refs[KVR_RELAY_SNAPSHOTS];
    /* the KV events (publisher_events.c), NULL when off */
    struct pub_kvev *kvev;
    int replay_due;      /* replay requests may be waiting: do not sleep */
    int rebuilding;      /* new_generation's rescan: owners change, no events (the state follows) */
    struct pub_ssd *ssd; /* the disk tier (publisher_ssd.c), NULL without --ssd-path */
} pub_t;

/*
 * Owner checks (KVR_DASSERT, base/dassert.h). The publisher is the single writer of the relay's
 * frames, ring, snapshot copies and of its side of the subscriber slots, and the change log's
 * only consumer. pub_is_me: this process holds the publisher's process slot (the process table
 * records pid and role). pub_owns_relay: besides, it is the publisher the relay state names
 * (publisher_pid, stored at the end of the first new_generation).
 */
static inline int pub_is_me(const pub_t *p)
{
    const kvr_proc_sh_t *me;

    if (p->seg->slot < 0)
        return 0;
    me = &p->seg->procs[p->seg->slot];
    return me->role == KVR_ROLE_PUBLISHER && kvr_atomic_load_relaxed(&me->pid) == (int32_t)getpid();
}

static inline int pub_owns_relay(const pub_t *p)
{
    return pub_is_me(p) && kvr_atomic_load_relaxed(&p->relay.sh->publisher_pid) == (uint32_t)getpid();
}

/* publisher.c: counts one latency (first_ns -> now) into the histogram at stats slot base
 * (KVR_PUB_BUCKETS buckets, then the sum in us and the count). */
void pub_record_latency(pub_t *p, unsigned base, uint64_t first_ns);

/* publisher_events.c (docs/kv-events.md). Each is a no-op when the events are off.
 * open: binds the sockets (KVR_ERR: they cannot be); op: pool's count of owners of hash in
 * medium m went 0 -> 1 (stored) or 1 -> 0; flush_due: sends the pools' pending events that have waited
 * --kv-events-interval; due: when the next must go (UINT64_MAX: none); generation: every
 * pool's stream states its whole state (after a rebuild of the owners); service: answers
 * waiting replay requests, 1 when more may wait; fd: the replay socket's ZMQ_FD for poll, or -1. */
/* publisher.c: SIGTERM came (the main loop ends, and so does a wait for the disk tier). */
extern volatile sig_atomic_t pub_term;

/* publisher.c: the pools the store made since; one owner more or less of a hash in a pool (the
 * filter and the KV events follow the first and the last). */
void pub_take_pools(pub_t *p);
int pub_owner_add(pub_t *p, uint32_t pool, uint64_t canon, kvr_kvev_medium_t m);
int pub_owner_del(pub_t *p, uint32_t pool, uint64_t canon, kvr_kvev_medium_t m);

/* publisher_ssd.c: the disk tier. start runs the disk writer thread and waits for its restore
 * (heartbeats meanwhile; KVR_OK without --ssd-path); apply counts the changed disk slots as
 * owners of their hashes; rebuild counts every disk block again (new_generation); stop seals. */
int pub_ssd_start(pub_t *p);
void pub_ssd_apply(pub_t *p);
void pub_ssd_rebuild(pub_t *p);
void pub_ssd_stop(pub_t *p);

int pub_kvev_open(pub_t *p);
void pub_kvev_op(pub_t *p, uint32_t pool, int stored, uint64_t hash, kvr_kvev_medium_t m);
void pub_kvev_flush_due(pub_t *p, uint64_t now);
uint64_t pub_kvev_due(pub_t *p);
void pub_kvev_generation(pub_t *p);
int pub_kvev_service(pub_t *p);
int pub_kvev_fd(pub_t *p);

/* publisher_subs.c */
int pub_sub_cas(kvr_relay_sub_t *s, uint32_t from, uint32_t to);
void pub_wake_owner(pub_t *p, uint64_t owner);
void pub_take_ref(pub_t *p, int i, int k);
void pub_close_sub(pub_t *p, int i, int reason);
void pub_reclaim_subscribers(pub_t *p);
void pub_rebuild_refs(pub_t *p);
/* After a publication: closes the subscribers past the queue limits (docs/relay-contract.md)
 * and records the largest lag of the others, from which it moves p->coalesce (up or down).
 * pub_sample_lag only records it and lets p->coalesce come down (the slot scan). */
void pub_check_lag(pub_t *p);
void pub_sample_lag(pub_t *p);
void pub_wake_live_workers(pub_t *p);
/* publisher.c: the publication boundary in force: --publication-threshold events or
 * --publication-delay; while p->coalesce > 1, that many delays (the events' count only
 * bounds a delta's size) */
uint64_t pub_threshold(const pub_t *p);
uint64_t pub_delay(const pub_t *p);

#endif
