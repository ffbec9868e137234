/*
 * relay_sh.h — the relay's shared state: what the publisher publishes and what workers
 * stream to gRPC subscribers (docs/relay-contract.md; the rules are in docs/concurrency.md).
 *
 * Only core/relay.c and proc/publisher*.c touch these structs; everything else goes through
 * core/relay.h.
 *
 *   status      generation (layout_generation), catalog revision, the relay's identity
 *               (incarnation, DcId, filter format); written by the supervisor (identity)
 *               and the publisher.
 *   pools       one per relay pool (namespace, model) of the store's pool table
 *               (shm/store_sh.h), each with its own filter (hdr->off_filter + pool x one
 *               filter's bytes), identity and published sequence. The publisher takes pools
 *               on in table order when it first sees them: it writes a pool's identity, then
 *               raises `pools_ready` past it (release); nobody lists or streams a pool before.
 *   frames      a broadcast ring of encoded delta frames: each delta is encoded ONCE into
 *               `ring` (one byte ring for every pool) and indexed in its pool's
 *               `frame[seq % KVR_RELAY_FRAMES]`; every subscriber reads it at its own
 *               cursor. A subscriber's queue is implicitly the frames of its pool between its
 *               cursor and the pool's published sequence; the publisher cuts it
 *               (SUBSCRIBER_LAGGED) when that exceeds 16 frames or 16 MiB (payload + 256 per
 *               frame). Other pools' frames may overwrite its unread bytes too (the ring
 *               holds the last 32 MiB of all pools): its read then fails and it is cut the same.
 *   snapshots   copies of a pool's filter, each exact at a published sequence of that pool
 *               (`pool`, `seq`), taken by the publisher between publications and streamed
 *               chunk by chunk by workers; a new subscriber waits for a free copy. Which
 *               subscriber holds which copy is the publisher's private bookkeeping (`refs`
 *               here is only its mirror, for debugging), so no worker ever writes a count.
 *   subs        one slot per pool subscriber, a small state machine whose every transition
 *               is a compare-and-swap from the state it expects (kvr_relay_sub_t below).
 *
 * Ordering: the frame ring is two seqlocks (the index entry's `seq`, 0 while it is written;
 * `ring_tail` for the bytes), written by core/relay.c's kvr_relay_put_frame and read by its
 * kvr_relay_read_frame (docs/concurrency.md, "The relay ring and its frames"). Subscriber
 * slot hand-offs go through `state` (CAS, seq_cst).
 */
#ifndef KVR_SHM_RELAY_SH_H
#define KVR_SHM_RELAY_SH_H

#include "common.h"

#include <stdatomic.h>

#define KVR_RELAY_FRAMES         64
#define KVR_RELAY_RING_BYTES     (32u << 20)
#define KVR_RELAY_MAX_SUBS       256
#define KVR_RELAY_SNAPSHOTS      4
#define KVR_RELAY_QUEUE_FRAMES   16
#define KVR_RELAY_QUEUE_BYTES    (16u << 20)
#define KVR_RELAY_FRAME_OVERHEAD 256

/* Stream types for admission counting: at most --max-streams streams of each type at once. */
enum {
    KVR_STREAM_CATALOG = 0,
    KVR_STREAM_POOL = 1,
    KVR_STREAM_READINESS = 2,
    KVR_STREAM_LOAD = 3,
    KVR_STREAM_SERVING_LOAD = 4,
    KVR_STREAM_TYPES = 5
};

/*
 * Subscriber slot states, and who may take each transition (all by CAS from the expected
 * state; docs/concurrency.md has the diagram):
 *
 *   FREE -> CLAIMED        worker, after it won the slot's `owner` word (0 -> its id)
 *   CLAIMED -> REQUESTED   worker, once generation and its own fields are written
 *   REQUESTED -> LIVE      publisher: admitted at snap_seq with snapshot copy snap_index
 *   REQUESTED|LIVE -> CLOSED    publisher: close_reason says why
 *   REQUESTED|LIVE|CLOSED -> RELEASING   worker, when its stream ends for any reason
 *   RELEASING -> FREE      publisher: drops the snapshot reference it tracks, then clears
 *                          `owner` (after the state: a new claim starts from FREE)
 *   any but FREE -> RELEASING   publisher, when the owner process is dead
 */
enum {
    KVR_SUB_FREE = 0,
    KVR_SUB_CLAIMED = 1,   /* a worker is filling it in */
    KVR_SUB_REQUESTED = 2, /* waiting for the publisher to admit it */
    KVR_SUB_LIVE = 3,      /* admitted: snapshot at snap_seq, deltas from snap_seq + 1 */
    KVR_SUB_CLOSED = 4,    /* closed by the publisher: close_reason says why */
    KVR_SUB_RELEASING = 5, /* the worker is done with it; the publisher frees it */
};

/* The owner word: ((uint64_t)pid << 32) | (process slot + 1); 0 = nobody. */
#define KVR_SUB_OWNER(pid, slot) (((uint64_t)(uint32_t)(pid) << 32) | (uint64_t)((slot) + 1))
#define KVR_SUB_OWNER_PID(w)     ((int32_t)((w) >> 32))
#define KVR_SUB_OWNER_SLOT(w)    ((int)((w)&0xFFFFFFFFu) - 1)

typedef struct {
    _Atomic uint64_t seq; /* the delta's sequence; 0 = empty */
    uint64_t cum_off;     /* start of its bytes in the ring's cumulative byte space */
    uint64_t queue_cum;   /* sum over frames <= seq of (len + 256): what a subscriber has
                           * queued (docs/relay-contract.md, "A pool stream", step 5) */
    uint32_t len;
    uint32_t pad_;
} kvr_relay_frame_t;
static_assert(sizeof(kvr_relay_frame_t) == 32, "frame index entry");

typedef struct {
    _Atomic uint64_t seq; /* sequence of `pool` the copy is exact at */
    _Atomic uint64_t generation;
    uint32_t refs; /* the publisher's private count, mirrored for debugging only */
    _Atomic uint32_t valid;
    _Atomic uint32_t pool; /* whose filter it copies */
    uint32_t pad0_;
    uint64_t pad_[4];
} kvr_relay_snap_t;
static_assert(sizeof(kvr_relay_snap_t) == 64, "snapshot slot");

typedef struct {
    _Atomic uint32_t state;        /* KVR_SUB_*, every change a CAS */
    _Atomic uint32_t close_reason; /* RelayErrorReason when CLOSED (publisher, before the CAS) */
    _Atomic uint64_t owner;        /* KVR_SUB_OWNER of the claiming worker; the claim itself */
    uint64_t generation;           /* the layout_generation it subscribed to (worker, CLAIMED) */
    _Atomic uint64_t snap_seq;     /* N, set by the publisher before REQUESTED -> LIVE */
    _Atomic int32_t snap_index;    /* snapshot copy, set by the publisher with snap_seq */
    _Atomic uint32_t snap_done;    /* set by the worker once the snapshot is sent */
    _Atomic uint64_t cursor;       /* next delta the worker sends: publisher at admission, then worker */
    uint32_t pool;                 /* the pool it subscribes to (worker, CLAIMED) */
    uint32_t pad0_;
    uint64_t pad_;
} kvr_relay_sub_t;
static_assert(sizeof(kvr_relay_sub_t) == 64, "subscriber slot");

/* One relay pool. Identity written by the publisher before it counts the pool in pools_ready. */
typedef struct {
    uint8_t cache_digest[16];   /* from the pool's model, block size and hash format */
    uint8_t routing_digest[16]; /* from its serving endpoint (docs/tenancy.md, "Pools") */
    uint64_t pad0_;
    _Atomic uint64_t published_seq; /* last published delta sequence of this generation */
    _Atomic uint64_t blocks;        /* its resident blocks as the publisher counts them (a gauge) */
    uint64_t pad1_;
    kvr_relay_frame_t frame[KVR_RELAY_FRAMES];
} kvr_relay_pool_t;
static_assert(offsetof(kvr_relay_pool_t, frame) == 64, "a pool's header is one line");

typedef struct {
    /* identity: written by the supervisor before fork, read-only after */
    uint64_t incarnation;
    uint64_t seed;
    uint64_t bucket_count;
    uint64_t dc_id;
    uint32_t npools; /* pools the segment has filters for (hdr->relay_pools) */
    uint32_t pad4_;
    uint64_t pad5_[3];

    /* publisher state */
    _Atomic uint64_t generation;       /* layout_generation being served; 0 = none */
    _Atomic uint64_t pools_ready;      /* pools taken on (a prefix of the store's table) */
    _Atomic uint64_t catalog_revision; /* +1 per catalog change */
    _Atomic uint64_t ring_head;        /* cumulative bytes written into the ring */
    _Atomic uint64_t ring_tail;        /* cumulative offset below which bytes may be gone */
    _Atomic uint32_t publisher_pid;    /* the publisher that started the current generation */
    uint32_t pad1_;
    uint64_t pad3_[2]; /* the publisher state fills one cache line */

    /* admission (--max-streams per stream type): global counts per stream type, and each
     * process's share so that a dead worker's streams are released by the supervisor */
    _Atomic uint32_t active[KVR_STREAM_TYPES];
    uint32_t pad2_[11];
    _Atomic uint32_t per_proc[64][KVR_STREAM_TYPES];

    kvr_relay_snap_t snap[KVR_RELAY_SNAPSHOTS];
    kvr_relay_sub_t sub[KVR_RELAY_MAX_SUBS];
    kvr_relay_pool_t pool[KVR_POOLS_MAX];
} kvr_relay_sh_t;
static_assert(offsetof(kvr_relay_sh_t, generation) % 64 == 0, "publisher state on its own line");
static_assert(offsetof(kvr_relay_sh_t, active) - offsetof(kvr_relay_sh_t, generation) == 64,
              "publisher state is one line");
static_assert(offsetof(kvr_relay_sh_t, pool) % 64 == 0, "pools aligned");
static_assert(offsetof(kvr_relay_sh_t, sub) % 64 == 0, "subscriber slots aligned");

#endif
