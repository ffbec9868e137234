/*
 * relay_sh.h — the relay's shared state: what the publisher publishes and what workers
 * stream to gRPC subscribers (spec/dynamo-relay.md §1.5-§1.7, §3).
 *
 *   status      generation (layout_generation), published sequence, catalog revision,
 *               pool identity; written by the supervisor (identity) and the publisher.
 *   frames      a broadcast ring of encoded delta frames: each delta is encoded ONCE into
 *               `ring` (a byte ring) and indexed in `frame[seq % KVR_RELAY_FRAMES]`; every
 *               subscriber reads it at its own cursor. A subscriber's queue is implicitly
 *               the frames between its cursor and the published sequence; the publisher
 *               cuts it (SUBSCRIBER_LAGGED) when that exceeds 16 frames or 16 MiB
 *               (payload + 256 per frame, §1.7), so the ring only ever needs the last 16
 *               frames plus one maximal frame.
 *   snapshots   two copies of the filter, each exact at a published sequence, taken by the
 *               publisher between publications and streamed chunk by chunk by workers; a
 *               new subscriber waits for a free copy (the reference's encoding permits).
 *   subs        one slot per pool subscriber: a worker claims one, the publisher admits it
 *               at a sequence N (snapshot at N, deltas from N+1) or closes it with a reason.
 *
 * Ordering: the publisher writes a frame's bytes, then its index entry, then
 * `published_seq` (release); readers acquire `published_seq`, read the index entry and the
 * bytes, then check `ring_tail` (acquire) to know the bytes were not overwritten meanwhile.
 * Subscriber slot hand-offs go through `state` with release/acquire.
 */
#ifndef KVR_SHM_RELAY_SH_H
#define KVR_SHM_RELAY_SH_H

#include "common.h"

#include <stdatomic.h>

#define KVR_RELAY_FRAMES     64
#define KVR_RELAY_RING_BYTES (32u << 20)
#define KVR_RELAY_MAX_SUBS   256
#define KVR_RELAY_SNAPSHOTS  2
#define KVR_RELAY_QUEUE_FRAMES 16
#define KVR_RELAY_QUEUE_BYTES  (16u << 20)
#define KVR_RELAY_FRAME_OVERHEAD 256

/* Stream types for admission counting (§2.8). */
enum {
    KVR_STREAM_CATALOG = 0,
    KVR_STREAM_POOL = 1,
    KVR_STREAM_READINESS = 2,
    KVR_STREAM_LOAD = 3,
    KVR_STREAM_SERVING_LOAD = 4,
    KVR_STREAM_TYPES = 5
};

/* Subscriber slot states. */
enum {
    KVR_SUB_FREE = 0,
    KVR_SUB_CLAIMED = 1,   /* a worker is filling it in */
    KVR_SUB_REQUESTED = 2, /* waiting for the publisher to admit it */
    KVR_SUB_LIVE = 3,      /* admitted: snapshot at snap_seq, deltas from snap_seq + 1 */
    KVR_SUB_CLOSED = 4,    /* closed by the publisher: close_reason says why */
};

typedef struct {
    _Atomic uint64_t seq;   /* the delta's sequence; 0 = empty */
    uint64_t cum_off;       /* start of its bytes in the ring's cumulative byte space */
    uint64_t queue_cum;     /* sum over frames <= seq of (len + 256): the §1.7 accounting */
    uint32_t len;
    uint32_t pad_;
} kvr_relay_frame_t;
static_assert(sizeof(kvr_relay_frame_t) == 32, "frame index entry");

typedef struct {
    _Atomic uint64_t seq;  /* sequence the copy is exact at */
    _Atomic uint64_t generation;
    uint32_t refs;         /* subscribers streaming it (publisher-owned count) */
    _Atomic uint32_t valid;
    uint64_t pad_[5];
} kvr_relay_snap_t;
static_assert(sizeof(kvr_relay_snap_t) == 64, "snapshot slot");

typedef struct {
    _Atomic uint32_t state;
    _Atomic uint32_t close_reason; /* RelayErrorReason when CLOSED */
    int32_t owner_slot;            /* worker process slot */
    int32_t owner_pid;
    uint64_t generation;           /* the layout_generation it subscribed to */
    _Atomic uint64_t snap_seq;     /* N, set by the publisher at admission */
    _Atomic int32_t snap_index;    /* snapshot copy, set at admission */
    _Atomic uint32_t snap_done;    /* set by the worker once the snapshot is sent */
    _Atomic uint64_t cursor;       /* next delta sequence the worker will send */
    uint64_t pad_[2];
} kvr_relay_sub_t;
static_assert(sizeof(kvr_relay_sub_t) == 64, "subscriber slot");

typedef struct {
    /* identity: written by the supervisor before fork, read-only after */
    uint64_t incarnation;
    uint64_t seed;
    uint64_t bucket_count;
    uint64_t dc_id;
    uint8_t cache_digest[16];
    uint8_t routing_digest[16];

    /* publisher state */
    _Atomic uint64_t generation;       /* layout_generation being served; 0 = none */
    _Atomic uint64_t published_seq;    /* last published delta sequence of this generation */
    _Atomic uint64_t catalog_revision; /* +1 per catalog change */
    _Atomic uint64_t publish_ns;       /* CLOCK_MONOTONIC of the last publication */
    _Atomic uint64_t ring_head;        /* cumulative bytes written into the ring */
    _Atomic uint64_t ring_tail;        /* cumulative offset below which bytes may be gone */
    _Atomic uint32_t publisher_pid;
    uint32_t pad1_;
    _Atomic uint64_t live_worker_mask; /* worker slots with live pool streams: who to wake */

    /* admission (§2.8): global counts per stream type, and each process's share so that a
     * dead worker's streams are released by the supervisor */
    _Atomic uint32_t active[KVR_STREAM_TYPES];
    uint32_t pad2_[11];
    _Atomic uint32_t per_proc[64][KVR_STREAM_TYPES];

    kvr_relay_frame_t frame[KVR_RELAY_FRAMES];
    kvr_relay_snap_t snap[KVR_RELAY_SNAPSHOTS];
    kvr_relay_sub_t sub[KVR_RELAY_MAX_SUBS];
} kvr_relay_sh_t;
static_assert(offsetof(kvr_relay_sh_t, generation) % 64 == 0, "publisher state on its own line");
static_assert(offsetof(kvr_relay_sh_t, frame) % 64 == 0, "frame index aligned");
static_assert(offsetof(kvr_relay_sh_t, sub) % 64 == 0, "subscriber slots aligned");

#endif
