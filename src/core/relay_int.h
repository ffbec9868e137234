/*
 * relay_int.h — the relay's internals, for the processes that publish and stream it: the
 * handle's fields over the shared layout (shm/relay_sh.h), setup, admission, the worker's
 * side of the subscriber slot protocol, and the dynamo.kvrelay.v1 messages built with
 * protobuf-c (FilterUpdate, ProducerIdentity). Included by core/relay.c, proc/ (supervisor,
 * worker, publisher) and io/grpc_*.c; HTTP code includes core/relay.h only.
 */
#ifndef KVR_CORE_RELAY_INT_H
#define KVR_CORE_RELAY_INT_H

#include "core/relay.h"
#include "shm/relay_sh.h"
#include "wire/grpc_frame.h"
#include "wire/relay_msg.h"
#include "wire/relay.pb-c.h"

struct kvr_relay_s {
    kvr_seg_t *seg;
    kvr_relay_sh_t *sh;
    uint64_t *filters;                   /* the publisher's working filters, one per pool */
    uint64_t filter_words;               /* words from one pool's filter to the next */
    uint64_t *snap[KVR_RELAY_SNAPSHOTS]; /* snapshot copies */
    uint8_t *ring;                       /* KVR_RELAY_RING_BYTES */
    const kvr_relay_fds_t *fds;
    const kvr_config_t *cfg;
};

/* Bucket count for a segment sized by cfg: the filter sizing rule (docs/relay-contract.md
 * §3.2) applied to --expected-unique-blocks, or to the index capacity when that is 0. */
uint64_t kvr_relay_bucket_count(const kvr_config_t *cfg, uint64_t max_blocks);

/* Supervisor: fills the identity (fresh incarnation, DcId) of the relay and empties its
 * filters; the pools' identities follow as the publisher takes them on. */
int kvr_relay_format(kvr_relay_t *r, kvr_seg_t *seg, const kvr_config_t *cfg);

/* Pool i's working filter. */
static inline uint64_t *kvr_relay_filter(const kvr_relay_t *r, uint32_t pool)
{
    return r->filters + (uint64_t)pool * r->filter_words;
}

/*
 * The publisher: writes pool i's identity, derived from the namespace and the model the
 * store's pool table gives it (docs/tenancy.md, "Pools"). The caller then counts the pool in
 * pools_ready (kvr_relay_set_pools_ready).
 */
void kvr_relay_take_pool(kvr_relay_t *r, uint32_t i, const char *ns_name, const char *model);
void kvr_relay_set_pools_ready(kvr_relay_t *r, uint32_t n);

/* Any process: binds the handle. */
void kvr_relay_attach(kvr_relay_t *r, kvr_seg_t *seg, const kvr_config_t *cfg, const kvr_relay_fds_t *fds);

/* ---- admission (docs/relay-contract.md §1.3) */

/* Takes a stream permit of `type` for process slot `slot`. 1 if admitted, 0 at the limit. */
int kvr_relay_admit(kvr_relay_t *r, int type, int slot, uint32_t limit);
void kvr_relay_release(kvr_relay_t *r, int type, int slot);
/* Supervisor: gives back every permit a dead process held. */
void kvr_relay_release_all(kvr_relay_t *r, int slot);

/* The pool `want` names (DcId, both digests and their sources), or -1 for none. */
int kvr_relay_pool_find(const kvr_relay_t *r, const Dynamo__Kvrelay__V1__KvPoolId *want);

/* ---- pool subscribers: a worker's side of the slot protocol (relay_sh.h) */

/* Claims a subscriber slot for pool's generation and asks the publisher to admit it. Returns
 * the slot index or -1 when none is free. */
int kvr_relay_sub_open(kvr_relay_t *r, int owner_slot, uint64_t generation, uint32_t pool);

typedef enum {
    KVR_SUBP_WAITING = 0, /* not admitted yet */
    KVR_SUBP_LIVE = 1,    /* admitted: snapshot at v->snap_seq in v->chunk_count chunks */
    KVR_SUBP_CLOSED = 2,  /* the publisher closed it: v->reason (a RelayErrorReason) */
    KVR_SUBP_RETIRED = 3, /* its generation is no longer the one published */
} kvr_relay_poll_t;

typedef struct {
    uint64_t snap_seq;
    uint32_t chunk_count;
    int reason;
} kvr_relay_sub_view_t;

/* Where subscription idx stands. The stream still has to kvr_relay_sub_close it. */
kvr_relay_poll_t kvr_relay_sub_poll(kvr_relay_t *r, int idx, kvr_relay_sub_view_t *v);

/*
 * Encodes snapshot chunk `chunk` of an admitted subscription as a gRPC-framed FilterUpdate
 * into dst. After the last chunk, records that the snapshot was sent (the publisher then
 * drops the copy's reference). Returns the length, or 0 on error.
 */
size_t kvr_relay_sub_chunk(kvr_relay_t *r, int idx, uint32_t chunk, uint8_t *dst, size_t cap);

/*
 * Copies the delta at the subscription's cursor into dst and advances the cursor. Returns
 * its length (and its sequence in *seq), 0 when none is published yet, -1 when it is gone
 * (the subscriber lagged) or does not fit.
 */
ssize_t kvr_relay_sub_next_frame(kvr_relay_t *r, int idx, uint8_t *dst, size_t cap, uint64_t *seq);

/* 1 when a published delta waits at the subscription's cursor. */
int kvr_relay_sub_pending(const kvr_relay_t *r, int idx);

/* The worker is done with the slot (stream ended, cancelled, or closed by the publisher):
 * marks it RELEASING; the publisher frees it. Exactly once per successful open. */
void kvr_relay_sub_close(kvr_relay_t *r, int idx);

/* ---- the frame ring (docs/concurrency.md, "The relay ring and its frames") */

/*
 * Publisher only: copies the encoded delta message msg (len bytes, payload_len of them the
 * CBI1 payload) into the ring and publishes it as sequence seq (>= 1) of the current
 * generation. Cannot fail.
 */
void kvr_relay_put_frame(kvr_relay_t *r, uint32_t pool, uint64_t seq, const uint8_t *msg, size_t len,
                         size_t payload_len);

/*
 * Copies pool's published delta `seq` of `generation` (a complete gRPC message) into dst. Returns
 * its length, 0 when seq is not published yet or generation is no longer the current one,
 * or -1 when it is gone (overwritten: the subscriber lagged) or does not fit.
 */
ssize_t kvr_relay_read_frame(kvr_relay_t *r, uint32_t pool, uint64_t generation, uint64_t seq, uint8_t *dst,
                             size_t cap);

/* ---- messages */

/* Fills pid/producer structs (caller-owned storage) for pool's identity. */
typedef struct {
    Dynamo__Kvrelay__V1__DigestIdentity cache, routing;
    Dynamo__Kvrelay__V1__IndexerDomainId domain;
    Dynamo__Kvrelay__V1__KvPoolId pool;
    Dynamo__Kvrelay__V1__CkfFormat format;
    Dynamo__Kvrelay__V1__ProducerIdentity producer;
    Dynamo__Kvrelay__V1__RelayIdentity relay;
} kvr_relay_ident_t;
void kvr_relay_ident(const kvr_relay_t *r, uint32_t pool, uint64_t generation, kvr_relay_ident_t *id);

/*
 * Writes a gRPC-framed FilterUpdate of pool's identity for generation into dst
 * (wire/relay_msg.h: field 8 with payload_len bytes, whose start is returned in *payload for
 * the caller to fill). Returns the total message length, or 0 if cap is too small.
 */
size_t kvr_relay_filter_update(const kvr_relay_t *r, uint32_t pool, uint64_t generation, uint64_t base_seq,
                               uint64_t seq, int kind, size_t payload_len, uint8_t *dst, size_t cap, uint8_t **payload);

/*
 * Writes snapshot chunk `chunk` of snapshot copy k (pool's filter, exact at sequence seq of
 * generation) as a gRPC-framed FilterUpdate into dst. Returns its length, or 0 on error.
 */
size_t kvr_relay_snapshot_chunk(const kvr_relay_t *r, int k, uint32_t pool, uint64_t generation, uint64_t seq,
                                uint32_t chunk, uint8_t *dst, size_t cap);

/* Size of the largest snapshot chunk message for this filter. */
size_t kvr_relay_chunk_msg_max(const kvr_relay_t *r);

#endif
