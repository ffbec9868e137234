/*
 * relay_validate.h — request, envelope and identity validation for dynamo.kvrelay.v1
 * (docs/relay-contract.md), over protobuf-c's generated structs.
 *
 * Server side (docs/relay-contract.md §1.1), in the reference order: contract marker first
 * (every RPC), then subscriber_id (streaming RPCs: non-empty, <= 128 bytes, valid UTF-8, no Cc
 * control characters), then for SubscribeKvPool the expected ProducerIdentity (missing ->
 * INVALID_REQUEST; unsupported -> UNSUPPORTED_FEATURE; malformed -> INVALID_REQUEST). Failures
 * carry a RelayErrorReason whose symbol goes into the `kv-relay-error-reason` trailer and
 * whose gRPC status code follows the table of §1.2.
 *
 * Identity checks (§2.3) follow the reference validator field by field, with a detailed
 * error code and its unsupported-vs-malformed classification: unsupported means "quarantine
 * that pool", malformed means "the entry is invalid".
 *
 * protobuf-c stores strings NUL-terminated and does not check UTF-8, so subscriber_id is
 * read from the raw request bytes: an embedded NUL (a Cc character) is then seen too.
 */
#ifndef KVR_RELAY_VALIDATE_H
#define KVR_RELAY_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "wire/mirror.h"
#include "wire/relay.pb-c.h"

#define KVR_RELAY_PROTOCOL_VERSION      1u
#define KVR_RELAY_CONTRACT_MARKER       0x4B565231u /* "KVR1"; fixed32 at field 127 */
#define KVR_RELAY_POOL_IDENTITY_VERSION 1u
#define KVR_RELAY_SUBSCRIBER_ID_MAX     128u
#define KVR_RELAY_REASON_TRAILER        "kv-relay-error-reason"

/* gRPC status codes used by the relay. */
enum {
    KVR_GRPC_OK = 0,
    KVR_GRPC_INVALID_ARGUMENT = 3,
    KVR_GRPC_NOT_FOUND = 5,
    KVR_GRPC_PERMISSION_DENIED = 7,
    KVR_GRPC_RESOURCE_EXHAUSTED = 8,
    KVR_GRPC_FAILED_PRECONDITION = 9,
    KVR_GRPC_INTERNAL = 13,
    KVR_GRPC_UNAVAILABLE = 14,
    KVR_GRPC_UNAUTHENTICATED = 16,
};

/*
 * RelayErrorReason: each symbol of relay.proto with the gRPC status it ends a call with
 * (docs/relay-contract.md §1.2). The values come from the code protoc-c generates from
 * relay.proto, so the numbering cannot drift; a static_assert in relay_validate.c and a walk
 * of the generated enum descriptor in tests/unit/test_relay_validate.c check that every reason
 * of the .proto is listed.
 */
#define KVR_RELAY_REASON_TABLE(X) \
    X(UNSPECIFIED, KVR_GRPC_INTERNAL) \
    X(CONTRACT_MISMATCH, KVR_GRPC_FAILED_PRECONDITION) \
    X(INVALID_REQUEST, KVR_GRPC_INVALID_ARGUMENT) \
    X(UNSUPPORTED_FEATURE, KVR_GRPC_FAILED_PRECONDITION) \
    X(POOL_NOT_FOUND, KVR_GRPC_NOT_FOUND) \
    X(PRODUCER_CHANGED, KVR_GRPC_FAILED_PRECONDITION) \
    X(RESOURCE_LIMIT, KVR_GRPC_RESOURCE_EXHAUSTED) \
    X(SUBSCRIBER_LAGGED, KVR_GRPC_RESOURCE_EXHAUSTED) \
    X(SNAPSHOT_PROGRESS_TIMEOUT, KVR_GRPC_RESOURCE_EXHAUSTED) \
    X(PUBLICATION_UNAVAILABLE, KVR_GRPC_UNAVAILABLE) \
    X(INVALID_PUBLICATION, KVR_GRPC_FAILED_PRECONDITION) \
    X(INTERNAL, KVR_GRPC_INTERNAL)

#define KVR_RELAY_REASON_ENUM_(name, grpc) \
    KVR_RELAY_REASON_##name = DYNAMO__KVRELAY__V1__RELAY_ERROR_REASON__RELAY_ERROR_REASON_##name,

/* KVR_RELAY_REASON_<symbol without its prefix>. NONE (= UNSPECIFIED) doubles as "valid" in
 * validator results; it is never sent as a reason. */
typedef enum kvr_relay_reason {
    KVR_RELAY_REASON_NONE = DYNAMO__KVRELAY__V1__RELAY_ERROR_REASON__RELAY_ERROR_REASON_UNSPECIFIED,
    KVR_RELAY_REASON_TABLE(KVR_RELAY_REASON_ENUM_)
} kvr_relay_reason_t;

/* Exact enum symbol, e.g. "RELAY_ERROR_REASON_PRODUCER_CHANGED"; NULL when out of range. */
const char *kvr_relay_reason_name(int reason);
/* gRPC status code of a reason (docs/relay-contract.md §1.2); UNSPECIFIED and unknown values
 * map to INTERNAL. */
int kvr_relay_reason_grpc(int reason);
/* Parses a trailer value back into a reason; UNSPECIFIED for missing/unknown text. */
kvr_relay_reason_t kvr_relay_reason_parse(const char *s, size_t len);

/* ---- identity (docs/relay-contract.md §2.3; reference wire/identity.rs) --------------- */

typedef enum kvr_relay_ierr {
    KVR_RELAY_IERR_OK = 0,
    KVR_RELAY_IERR_CONTRACT_MARKER,        /* malformed */
    KVR_RELAY_IERR_PROTOCOL_VERSION,       /* malformed */
    KVR_RELAY_IERR_MISSING_FIELD,          /* malformed */
    KVR_RELAY_IERR_POOL_VERSION_ZERO,      /* malformed: identity_version 0 */
    KVR_RELAY_IERR_POOL_VERSION,           /* UNSUPPORTED: identity_version not 0 or 1 */
    KVR_RELAY_IERR_DIGEST_LENGTH,          /* malformed: digest not 16 bytes */
    KVR_RELAY_IERR_SOURCE_UNSPECIFIED,     /* malformed: source 0 */
    KVR_RELAY_IERR_SOURCE_UNKNOWN,         /* UNSUPPORTED: source not 0, 1, 2 */
    KVR_RELAY_IERR_ZERO_LAYOUT_GENERATION, /* malformed */
    KVR_RELAY_IERR_ZERO_FORMAT_FIELD,      /* malformed: format_version/bucket_count/bits/slots 0 */
    KVR_RELAY_IERR_UNSUPPORTED_CKF_FORMAT, /* UNSUPPORTED: version != 1, bits != 16, slots != 4 */
    KVR_RELAY_IERR_BUCKET_COUNT_TOO_LARGE, /* UNSUPPORTED: > 2^24 */
    KVR_RELAY_IERR_BUCKET_COUNT,           /* malformed: not a power of two >= 2 */
} kvr_relay_ierr_t;

/* 1 for the errors that mean "unsupported" (reference is_unsupported()). */
int kvr_relay_ierr_unsupported(int err);
const char *kvr_relay_ierr_name(int err);
/* Reason for a SubscribeKvPool request whose expected_producer failed with err. */
kvr_relay_reason_t kvr_relay_ierr_reason(int err);

int kvr_relay_validate_pool_id(const Dynamo__Kvrelay__V1__KvPoolId *p);
int kvr_relay_validate_ckf_format(const Dynamo__Kvrelay__V1__CkfFormat *f);
/* pool_id, then layout_generation, then ckf_format (reference order). */
int kvr_relay_validate_producer(const Dynamo__Kvrelay__V1__ProducerIdentity *p);
/* Consumer envelope check: marker first, then protocol_version. */
int kvr_relay_validate_envelope(uint32_t protocol_version, uint32_t contract_marker);
/* Frozen-key equality of two (valid) producer identities: every field, digest sources
 * included. */
int kvr_relay_producer_equal(const Dynamo__Kvrelay__V1__ProducerIdentity *a,
                             const Dynamo__Kvrelay__V1__ProducerIdentity *b);

/* ---- requests (docs/relay-contract.md §1.1) ------------------------------------------- */

typedef enum kvr_relay_rpc {
    KVR_RELAY_RPC_GET_RELAY_INFO = 0,
    KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG,
    KVR_RELAY_RPC_SUBSCRIBE_KV_POOL,
    KVR_RELAY_RPC_SUBSCRIBE_SERVING_READINESS,
    KVR_RELAY_RPC_SUBSCRIBE_KV_POOL_LOAD,
    KVR_RELAY_RPC_SUBSCRIBE_SERVING_LOAD,
    KVR_RELAY_RPC_COUNT
} kvr_relay_rpc_t;

/* The RPC's method name ("SubscribeKvPool") and request descriptor. */
const char *kvr_relay_rpc_method(kvr_relay_rpc_t rpc);
const ProtobufCMessageDescriptor *kvr_relay_rpc_request_desc(kvr_relay_rpc_t rpc);
/* Looks up an RPC by HTTP/2 :path ("/dynamo.kvrelay.v1.KvEventRelay/<Method>"); -1 if none. */
int kvr_relay_rpc_from_path(const char *path, size_t len);

/* subscriber_id check on raw bytes: non-empty, <= 128 bytes, UTF-8, no Cc characters. */
kvr_relay_reason_t kvr_relay_check_subscriber_id(const uint8_t *s, size_t len);

/* Outcome of validating a request. */
typedef struct kvr_relay_verdict {
    int grpc_status;           /* KVR_GRPC_OK or the status to end the call with */
    kvr_relay_reason_t reason; /* NONE when ok or when no reason trailer applies */
    int detail;                /* kvr_relay_ierr_t for producer failures, else 0 */
    const char *message;       /* diagnostic grpc-message text (static) */
} kvr_relay_verdict_t;

/*
 * 1 when buf[0..len) is well-formed wire data for descriptor d by the rules of a strict
 * decoder: no field number 0, no group wire types, no over-long varints (recursing into
 * known sub-messages). protobuf-c alone accepts some of these; call this before
 * protobuf_c_message_unpack() on bytes from a peer.
 */
int kvr_relay_wire_check(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len);

/*
 * Decodes one request message of `rpc` from buf[0..len) and validates it as checks 1-3 of
 * docs/relay-contract.md §1.1. On success *msg (when msg is non-NULL) receives the unpacked
 * message, to be freed with protobuf_c_message_free_unpacked(*msg, NULL); on failure *msg is
 * NULL. A message that does not decode (including kvr_relay_wire_check() failures) yields
 * INTERNAL without a reason, as tonic does.
 */
kvr_relay_verdict_t kvr_relay_validate_request(kvr_relay_rpc_t rpc, const uint8_t *buf,
                                               size_t len, ProtobufCMessage **msg);

/*
 * Consumer side of a FilterUpdate (docs/relay-contract.md §6), after kvr_relay_wire_check()
 * and unpacking: envelope (marker, protocol_version, relay present), producer present and
 * valid; then fills *out for kvr_mirror_apply(). Returns KVR_RELAY_IERR_OK or the first
 * failure. The caller also compares u->producer with its subscribed key
 * (kvr_relay_producer_equal).
 */
int kvr_relay_filter_update_fields(const Dynamo__Kvrelay__V1__FilterUpdate *u,
                                   kvr_mirror_update_t *out);

#endif
