/*
 * mirror.h — a consumer's replica of one pool's Cuckoo filter, fed by a SubscribeKvPool
 * stream (docs/relay-contract.md §5, §6).
 *
 * State machine, fail-closed:
 *
 *   EMPTY --chunk 0--> ASSEMBLING --last chunk, full coverage--> LIVE (sequence N)
 *   LIVE --delta N->N+1--> LIVE (N+1);  LIVE --heartbeat N/N, empty--> LIVE (N)
 *   any violation --> FAILED (the replica is dropped; resubscribe and start over)
 *
 * The input is one decoded FilterUpdate envelope reduced to the fields that matter here
 * (kvr_mirror_update_t), so a gRPC client can feed it straight from protobuf-c's
 * struct (see kvr_relay_filter_update_fields() in relay_validate.h). The filter is exposed
 * (contains() can answer 1) only while LIVE. Not thread-safe: one stream, one owner.
 */
#ifndef KVR_MIRROR_H
#define KVR_MIRROR_H

#include <stddef.h>
#include <stdint.h>

#include "wire/ckf.h"
#include "wire/cbi1.h"
#include "wire/relay.pb-c.h"

/* FilterUpdateKind, short names for the values protoc-c generates from relay.proto. */
#define KVR_FILTER_UPDATE_UNSPECIFIED    DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_UNSPECIFIED
#define KVR_FILTER_UPDATE_SNAPSHOT_CHUNK DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_SNAPSHOT_CHUNK
#define KVR_FILTER_UPDATE_DELTA          DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_DELTA
#define KVR_FILTER_UPDATE_HEARTBEAT      DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_HEARTBEAT

typedef enum kvr_mirror_state {
    KVR_MIRROR_EMPTY = 0,
    KVR_MIRROR_ASSEMBLING = 1,
    KVR_MIRROR_LIVE = 2,
    KVR_MIRROR_FAILED = 3,
} kvr_mirror_state_t;

/*
 * Mirror statuses: KVR_MIRROR_OK, or a negative value that is either a kvr_cbi1_status_t
 * (the payload failed docs/relay-contract.md §4.2 or §4.3) or one of these stream-level
 * violations (§5.1, §6 there).
 */
typedef enum kvr_mirror_status {
    KVR_MIRROR_OK = 0,
    KVR_MIRROR_E_FAILED = -100,            /* already FAILED: resubscribe */
    KVR_MIRROR_E_PRODUCER = -101,          /* envelope seed/bucket_count/dc_id != subscribed */
    KVR_MIRROR_E_KIND = -102,              /* unknown or UNSPECIFIED kind: rejected, never skipped */
    KVR_MIRROR_E_KIND_FLAGS = -103,        /* kind disagrees with the CBI1 flags */
    KVR_MIRROR_E_DC_ID = -104,             /* CBI1 header dc_id != producer dc_id */
    KVR_MIRROR_E_EPOCH = -105,             /* CBI1 epoch != envelope sequence */
    KVR_MIRROR_E_BASE_EPOCH = -106,        /* delta base_epoch != envelope base_sequence */
    KVR_MIRROR_E_CHUNK_BASE = -107,        /* snapshot chunk with base_sequence != sequence */
    KVR_MIRROR_E_CHUNK_AFTER_LIVE = -108,  /* snapshot chunk after the snapshot was installed */
    KVR_MIRROR_E_DELTA_NO_SNAPSHOT = -109, /* delta before any snapshot chunk */
    KVR_MIRROR_E_DELTA_ASSEMBLING = -110,  /* delta during assembly (reference: ChunkSequence) */
    KVR_MIRROR_E_GAP = -111,               /* delta base_sequence > installed sequence */
    KVR_MIRROR_E_REPEAT = -112,            /* delta base_sequence < installed sequence */
    KVR_MIRROR_E_DELTA_SEQUENCE = -113,    /* delta sequence != base_sequence + 1 */
    KVR_MIRROR_E_HEARTBEAT_PAYLOAD = -114, /* heartbeat with a non-empty payload */
    KVR_MIRROR_E_HEARTBEAT_EARLY = -115,   /* heartbeat before the snapshot completed */
    KVR_MIRROR_E_HEARTBEAT_SEQUENCE = -116 /* heartbeat base/sequence != installed */
} kvr_mirror_status_t;

/* One FilterUpdate, reduced. Pointers are borrowed for the duration of the call. */
typedef struct kvr_mirror_update {
    uint64_t seed;          /* producer.ckf_format.seed */
    uint64_t bucket_count;  /* producer.ckf_format.bucket_count */
    uint64_t dc_id;         /* producer.pool_id.dc_id */
    uint64_t base_sequence; /* base_sequence */
    uint64_t sequence;      /* sequence */
    int32_t kind;           /* FilterUpdateKind */
    const uint8_t *payload; /* CBI1 bytes */
    size_t payload_len;
} kvr_mirror_update_t;

typedef struct kvr_mirror {
    uint64_t seed, bucket_count, dc_id; /* the subscribed producer's format and DC */
    kvr_ckf_addr_t addr;
    uint64_t *buckets; /* bucket_count words, owned */
    kvr_cbi1_asm_t assembly;
    kvr_mirror_state_t state;
    uint64_t sequence; /* installed sequence (valid when LIVE) */
    int last_error;    /* the status that moved it to FAILED */
} kvr_mirror_t;

/* Allocates an EMPTY mirror for the subscribed producer's (seed, bucket_count, dc_id).
 * KVR_OK, KVR_EINVAL (bucket_count not a power of two in 2..2^24) or KVR_ERR (memory). */
int kvr_mirror_init(kvr_mirror_t *m, uint64_t seed, uint64_t bucket_count, uint64_t dc_id);
void kvr_mirror_destroy(kvr_mirror_t *m);
/* Back to EMPTY, for a resubscription to the same producer. */
void kvr_mirror_reset(kvr_mirror_t *m);

/* Applies one update. KVR_MIRROR_OK, or an error status after which the mirror is FAILED
 * (nothing of the offending frame was applied). */
int kvr_mirror_apply(kvr_mirror_t *m, const kvr_mirror_update_t *u);

/* 1 when LIVE and h's fingerprint is present; 0 otherwise (including when not LIVE). */
int kvr_mirror_contains(const kvr_mirror_t *m, uint64_t h);

static inline kvr_mirror_state_t kvr_mirror_state(const kvr_mirror_t *m)
{
    return m->state;
}

/* Symbol of a mirror or CBI1 status. Never NULL. */
const char *kvr_mirror_strerror(int status);

#endif
