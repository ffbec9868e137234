/*
 * relay_validate.c — dynamo.kvrelay.v1 validation helpers (docs/relay-contract.md
 * §1.1, §1.2, §2.3). See relay_validate.h for the contract; the check order below is the
 * reference's (service.rs for requests, wire/identity.rs for identities).
 */
#include <stdlib.h>

#include "base/utf8.h"
#include "common.h"
#include "wire/relay_validate.h"

#define RELAY_SERVICE_PREFIX "/dynamo.kvrelay.v1.KvEventRelay/"

/* ---- reasons (docs/relay-contract.md §1.2) -------------------------------------------- */

#define REASON_GRPC_(name, grpc)  [KVR_RELAY_REASON_##name] = grpc,
#define REASON_COUNT_(name, grpc) +1

/* The gRPC status of each reason, from KVR_RELAY_REASON_TABLE; the symbols themselves are
 * read from protoc-c's enum descriptor. */
static const int reason_grpc[] = {KVR_RELAY_REASON_TABLE(REASON_GRPC_)};
static_assert((0 KVR_RELAY_REASON_TABLE(REASON_COUNT_)) ==
                  DYNAMO__KVRELAY__V1__RELAY_ERROR_REASON__RELAY_ERROR_REASON_INTERNAL + 1,
              "a RelayErrorReason of relay.proto is missing from KVR_RELAY_REASON_TABLE");

const char *kvr_relay_reason_name(int reason)
{
    const ProtobufCEnumValue *v;

    if (reason < 0 || (size_t)reason >= KVR_ARRAY_SIZE(reason_grpc))
        return NULL;
    v = protobuf_c_enum_descriptor_get_value(&dynamo__kvrelay__v1__relay_error_reason__descriptor, reason);
    return v ? v->name : NULL;
}

int kvr_relay_reason_grpc(int reason)
{
    if (reason < 0 || (size_t)reason >= KVR_ARRAY_SIZE(reason_grpc))
        return KVR_GRPC_INTERNAL;
    return reason_grpc[reason];
}

kvr_relay_reason_t kvr_relay_reason_parse(const char *s, size_t len)
{
    for (int i = 1; s && (size_t)i < KVR_ARRAY_SIZE(reason_grpc); i++) {
        const char *name = kvr_relay_reason_name(i);
        if (name && strlen(name) == len && memcmp(name, s, len) == 0)
            return (kvr_relay_reason_t)i;
    }
    return KVR_RELAY_REASON_UNSPECIFIED;
}

/* ---- identity (docs/relay-contract.md §2.3) ------------------------------------------- */

static const char *const ierr_names[] = {
    [KVR_RELAY_IERR_OK] = "OK",
    [KVR_RELAY_IERR_CONTRACT_MARKER] = "ContractMarker",
    [KVR_RELAY_IERR_PROTOCOL_VERSION] = "ProtocolVersion",
    [KVR_RELAY_IERR_MISSING_FIELD] = "MissingField",
    [KVR_RELAY_IERR_POOL_VERSION_ZERO] = "PoolIdentityVersion(0)",
    [KVR_RELAY_IERR_POOL_VERSION] = "PoolIdentityVersion",
    [KVR_RELAY_IERR_DIGEST_LENGTH] = "DigestLength",
    [KVR_RELAY_IERR_SOURCE_UNSPECIFIED] = "IdentitySource(0)",
    [KVR_RELAY_IERR_SOURCE_UNKNOWN] = "IdentitySource",
    [KVR_RELAY_IERR_ZERO_LAYOUT_GENERATION] = "ZeroLayoutGeneration",
    [KVR_RELAY_IERR_ZERO_FORMAT_FIELD] = "ZeroFormatField",
    [KVR_RELAY_IERR_UNSUPPORTED_CKF_FORMAT] = "UnsupportedCkfFormat",
    [KVR_RELAY_IERR_BUCKET_COUNT_TOO_LARGE] = "BucketCountTooLarge",
    [KVR_RELAY_IERR_BUCKET_COUNT] = "UnsupportedBucketCount",
};

const char *kvr_relay_ierr_name(int err)
{
    if (err < 0 || (size_t)err >= KVR_ARRAY_SIZE(ierr_names))
        return "Unknown";
    return ierr_names[err];
}

int kvr_relay_ierr_unsupported(int err)
{
    return err == KVR_RELAY_IERR_POOL_VERSION || err == KVR_RELAY_IERR_SOURCE_UNKNOWN ||
           err == KVR_RELAY_IERR_UNSUPPORTED_CKF_FORMAT ||
           err == KVR_RELAY_IERR_BUCKET_COUNT_TOO_LARGE;
}

kvr_relay_reason_t kvr_relay_ierr_reason(int err)
{
    if (err == KVR_RELAY_IERR_OK)
        return KVR_RELAY_REASON_NONE;
    return kvr_relay_ierr_unsupported(err) ? KVR_RELAY_REASON_UNSUPPORTED_FEATURE
                                           : KVR_RELAY_REASON_INVALID_REQUEST;
}

static int validate_digest(const Dynamo__Kvrelay__V1__DigestIdentity *d)
{
    if (!d)
        return KVR_RELAY_IERR_MISSING_FIELD;
    if (d->digest.len != 16)
        return KVR_RELAY_IERR_DIGEST_LENGTH;
    if (d->source == DYNAMO__KVRELAY__V1__IDENTITY_SOURCE__IDENTITY_SOURCE_UNSPECIFIED)
        return KVR_RELAY_IERR_SOURCE_UNSPECIFIED;
    if (d->source != DYNAMO__KVRELAY__V1__IDENTITY_SOURCE__IDENTITY_SOURCE_DEFAULT_DERIVED &&
        d->source != DYNAMO__KVRELAY__V1__IDENTITY_SOURCE__IDENTITY_SOURCE_EXPLICIT)
        return KVR_RELAY_IERR_SOURCE_UNKNOWN;
    return KVR_RELAY_IERR_OK;
}

int kvr_relay_validate_pool_id(const Dynamo__Kvrelay__V1__KvPoolId *p)
{
    if (!p)
        return KVR_RELAY_IERR_MISSING_FIELD;
    if (p->identity_version != KVR_RELAY_POOL_IDENTITY_VERSION)
        return p->identity_version == 0 ? KVR_RELAY_IERR_POOL_VERSION_ZERO
                                        : KVR_RELAY_IERR_POOL_VERSION;
    if (!p->indexer_domain)
        return KVR_RELAY_IERR_MISSING_FIELD;
    int rc = validate_digest(p->indexer_domain->cache_semantics);
    if (rc != KVR_RELAY_IERR_OK)
        return rc;
    return validate_digest(p->indexer_domain->routing_scope);
}

int kvr_relay_validate_ckf_format(const Dynamo__Kvrelay__V1__CkfFormat *f)
{
    if (!f)
        return KVR_RELAY_IERR_MISSING_FIELD;
    /* The seed is not checked for zero (the reference lists only these four). */
    if (f->format_version == 0 || f->bucket_count == 0 || f->fingerprint_bits == 0 ||
        f->slots_per_bucket == 0)
        return KVR_RELAY_IERR_ZERO_FORMAT_FIELD;
    if (f->format_version != 1 || f->fingerprint_bits != 16 || f->slots_per_bucket != 4)
        return KVR_RELAY_IERR_UNSUPPORTED_CKF_FORMAT;
    if (f->bucket_count > (1ULL << 24))
        return KVR_RELAY_IERR_BUCKET_COUNT_TOO_LARGE;
    if (f->bucket_count < 2 || (f->bucket_count & (f->bucket_count - 1)) != 0)
        return KVR_RELAY_IERR_BUCKET_COUNT;
    return KVR_RELAY_IERR_OK;
}

int kvr_relay_validate_producer(const Dynamo__Kvrelay__V1__ProducerIdentity *p)
{
    if (!p || !p->pool_id)
        return KVR_RELAY_IERR_MISSING_FIELD;
    int rc = kvr_relay_validate_pool_id(p->pool_id);
    if (rc != KVR_RELAY_IERR_OK)
        return rc;
    if (p->layout_generation == 0)
        return KVR_RELAY_IERR_ZERO_LAYOUT_GENERATION;
    return kvr_relay_validate_ckf_format(p->ckf_format);
}

int kvr_relay_validate_envelope(uint32_t protocol_version, uint32_t contract_marker)
{
    if (contract_marker != KVR_RELAY_CONTRACT_MARKER)
        return KVR_RELAY_IERR_CONTRACT_MARKER;
    if (protocol_version != KVR_RELAY_PROTOCOL_VERSION)
        return KVR_RELAY_IERR_PROTOCOL_VERSION;
    return KVR_RELAY_IERR_OK;
}

static int digest_equal(const Dynamo__Kvrelay__V1__DigestIdentity *a,
                        const Dynamo__Kvrelay__V1__DigestIdentity *b)
{
    if (!a || !b)
        return a == b;
    return a->source == b->source && a->digest.len == b->digest.len &&
           (a->digest.len == 0 || memcmp(a->digest.data, b->digest.data, a->digest.len) == 0);
}

int kvr_relay_producer_equal(const Dynamo__Kvrelay__V1__ProducerIdentity *a,
                             const Dynamo__Kvrelay__V1__ProducerIdentity *b)
{
    if (!a || !b)
        return a == b;
    if (a->producer_incarnation != b->producer_incarnation ||
        a->layout_generation != b->layout_generation)
        return 0;
    const Dynamo__Kvrelay__V1__KvPoolId *pa = a->pool_id, *pb = b->pool_id;
    if (!pa || !pb) {
        if (pa != pb)
            return 0;
    } else {
        if (pa->identity_version != pb->identity_version || pa->dc_id != pb->dc_id)
            return 0;
        const Dynamo__Kvrelay__V1__IndexerDomainId *da = pa->indexer_domain,
                                                   *db = pb->indexer_domain;
        if (!da || !db) {
            if (da != db)
                return 0;
        } else if (!digest_equal(da->cache_semantics, db->cache_semantics) ||
                   !digest_equal(da->routing_scope, db->routing_scope)) {
            return 0;
        }
    }
    const Dynamo__Kvrelay__V1__CkfFormat *fa = a->ckf_format, *fb = b->ckf_format;
    if (!fa || !fb)
        return fa == fb;
    return fa->format_version == fb->format_version && fa->seed == fb->seed &&
           fa->bucket_count == fb->bucket_count && fa->fingerprint_bits == fb->fingerprint_bits &&
           fa->slots_per_bucket == fb->slots_per_bucket;
}

/* ---- text ---------------------------------------------------------------------------- */

kvr_relay_reason_t kvr_relay_check_subscriber_id(const uint8_t *s, size_t len)
{
    if (len == 0 || len > KVR_RELAY_SUBSCRIBER_ID_MAX || !kvr_utf8_valid(s, len))
        return KVR_RELAY_REASON_INVALID_REQUEST;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < 0x20 || s[i] == 0x7F)
            return KVR_RELAY_REASON_INVALID_REQUEST; /* C0 controls and DEL */
        if (s[i] == 0xC2 && i + 1 < len && s[i + 1] >= 0x80 && s[i + 1] <= 0x9F)
            return KVR_RELAY_REASON_INVALID_REQUEST; /* C1 controls U+0080..U+009F */
    }
    return KVR_RELAY_REASON_NONE;
}

/* ---- requests (docs/relay-contract.md §1.1) ------------------------------------------- */

static const struct {
    const char *method;
    const ProtobufCMessageDescriptor *desc;
} rpcs[KVR_RELAY_RPC_COUNT] = {
    [KVR_RELAY_RPC_GET_RELAY_INFO] = {"GetRelayInfo",
                                      &dynamo__kvrelay__v1__relay_info_request__descriptor},
    [KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG] =
        {"WatchKvPoolCatalog", &dynamo__kvrelay__v1__watch_kv_pool_catalog_request__descriptor},
    [KVR_RELAY_RPC_SUBSCRIBE_KV_POOL] =
        {"SubscribeKvPool", &dynamo__kvrelay__v1__subscribe_kv_pool_request__descriptor},
    [KVR_RELAY_RPC_SUBSCRIBE_SERVING_READINESS] =
        {"SubscribeServingReadiness",
         &dynamo__kvrelay__v1__subscribe_serving_readiness_request__descriptor},
    [KVR_RELAY_RPC_SUBSCRIBE_KV_POOL_LOAD] =
        {"SubscribeKvPoolLoad", &dynamo__kvrelay__v1__subscribe_kv_pool_load_request__descriptor},
    [KVR_RELAY_RPC_SUBSCRIBE_SERVING_LOAD] =
        {"SubscribeServingLoad",
         &dynamo__kvrelay__v1__subscribe_serving_load_request__descriptor},
};

const char *kvr_relay_rpc_method(kvr_relay_rpc_t rpc)
{
    return (unsigned)rpc < KVR_RELAY_RPC_COUNT ? rpcs[rpc].method : NULL;
}

const ProtobufCMessageDescriptor *kvr_relay_rpc_request_desc(kvr_relay_rpc_t rpc)
{
    return (unsigned)rpc < KVR_RELAY_RPC_COUNT ? rpcs[rpc].desc : NULL;
}

int kvr_relay_rpc_from_path(const char *path, size_t len)
{
    size_t plen = sizeof(RELAY_SERVICE_PREFIX) - 1;
    if (len <= plen || memcmp(path, RELAY_SERVICE_PREFIX, plen) != 0)
        return -1;
    for (int i = 0; i < KVR_RELAY_RPC_COUNT; i++) {
        size_t mlen = strlen(rpcs[i].method);
        if (len - plen == mlen && memcmp(path + plen, rpcs[i].method, mlen) == 0)
            return i;
    }
    return -1;
}

/* Reads a varint at *pos; 0 on truncation or a value that does not fit 64 bits. */
static int read_varint(const uint8_t *buf, size_t len, size_t *pos, uint64_t *v)
{
    uint64_t r = 0;
    for (unsigned shift = 0; shift < 70 && *pos < len; shift += 7) {
        uint8_t b = buf[(*pos)++];
        if (shift == 63 && b > 1)
            return 0;
        r |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return 1;
        }
    }
    return 0;
}

/* The last top-level occurrence of length-delimited field `field` (proto3: last wins).
 * Returns 1 and sets *p, *n when found, 0 when absent, -1 when the bytes are malformed. */
static int raw_len_field(const uint8_t *buf, size_t len, uint32_t field, const uint8_t **p,
                         size_t *n)
{
    size_t pos = 0;
    int found = 0;
    while (pos < len) {
        uint64_t key, v;
        if (!read_varint(buf, len, &pos, &key))
            return -1;
        switch (key & 7) {
        case 0:
            if (!read_varint(buf, len, &pos, &v))
                return -1;
            break;
        case 1:
            if (len - pos < 8)
                return -1;
            pos += 8;
            break;
        case 5:
            if (len - pos < 4)
                return -1;
            pos += 4;
            break;
        case 2:
            if (!read_varint(buf, len, &pos, &v) || v > len - pos)
                return -1;
            if ((key >> 3) == field) {
                *p = buf + pos;
                *n = (size_t)v;
                found = 1;
            }
            pos += (size_t)v;
            break;
        default:
            return -1; /* groups are not used by this schema */
        }
    }
    return found;
}

/*
 * Walks the wire bytes of a message of descriptor d, recursing into known sub-message
 * fields, and rejects what protobuf-c lets through but a conforming decoder (prost, as
 * used by the reference) refuses: a field number 0 (protobuf-c only checks the first key
 * byte, so an over-long key such as 80 00 slips through), group wire types and keys or
 * varints longer than 10 bytes. Unknown fields are skipped as opaque, as prost does.
 */
static int wire_ok(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, int depth)
{
    size_t pos = 0;
    if (depth > 32)
        return 0;
    while (pos < len) {
        uint64_t key, v;
        if (!read_varint(buf, len, &pos, &key) || (key >> 3) == 0 || (key >> 3) > 0x1FFFFFFF)
            return 0;
        switch (key & 7) {
        case 0:
            if (!read_varint(buf, len, &pos, &v))
                return 0;
            break;
        case 1:
            if (len - pos < 8)
                return 0;
            pos += 8;
            break;
        case 5:
            if (len - pos < 4)
                return 0;
            pos += 4;
            break;
        case 2: {
            if (!read_varint(buf, len, &pos, &v) || v > len - pos)
                return 0;
            const ProtobufCFieldDescriptor *f =
                d ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
                !wire_ok(f->descriptor, buf + pos, (size_t)v, depth + 1))
                return 0;
            pos += (size_t)v;
            break;
        }
        default:
            return 0;
        }
    }
    return 1;
}

int kvr_relay_wire_check(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len)
{
    return wire_ok(d, buf, len, 0);
}

static kvr_relay_verdict_t verdict(kvr_relay_reason_t reason, int detail, const char *message)
{
    kvr_relay_verdict_t v;
    v.grpc_status = reason == KVR_RELAY_REASON_NONE ? KVR_GRPC_OK : kvr_relay_reason_grpc(reason);
    v.reason = reason;
    v.detail = detail;
    v.message = message;
    return v;
}

static uint32_t request_marker(kvr_relay_rpc_t rpc, const ProtobufCMessage *m)
{
    switch (rpc) {
    case KVR_RELAY_RPC_GET_RELAY_INFO:
        return ((const Dynamo__Kvrelay__V1__RelayInfoRequest *)m)->contract_marker;
    case KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG:
        return ((const Dynamo__Kvrelay__V1__WatchKvPoolCatalogRequest *)m)->contract_marker;
    case KVR_RELAY_RPC_SUBSCRIBE_KV_POOL:
        return ((const Dynamo__Kvrelay__V1__SubscribeKvPoolRequest *)m)->contract_marker;
    case KVR_RELAY_RPC_SUBSCRIBE_SERVING_READINESS:
        return ((const Dynamo__Kvrelay__V1__SubscribeServingReadinessRequest *)m)
            ->contract_marker;
    case KVR_RELAY_RPC_SUBSCRIBE_KV_POOL_LOAD:
        return ((const Dynamo__Kvrelay__V1__SubscribeKvPoolLoadRequest *)m)->contract_marker;
    case KVR_RELAY_RPC_SUBSCRIBE_SERVING_LOAD:
        return ((const Dynamo__Kvrelay__V1__SubscribeServingLoadRequest *)m)->contract_marker;
    default:
        return 0;
    }
}

static kvr_relay_verdict_t check_request(kvr_relay_rpc_t rpc, const uint8_t *buf, size_t len,
                                         const ProtobufCMessage *m)
{
    if (request_marker(rpc, m) != KVR_RELAY_CONTRACT_MARKER)
        return verdict(KVR_RELAY_REASON_CONTRACT_MISMATCH, KVR_RELAY_IERR_CONTRACT_MARKER,
                       "contract marker mismatch");
    if (rpc == KVR_RELAY_RPC_GET_RELAY_INFO)
        return verdict(KVR_RELAY_REASON_NONE, 0, NULL);

    const uint8_t *id = NULL;
    size_t id_len = 0;
    if (raw_len_field(buf, len, 1, &id, &id_len) < 0 ||
        kvr_relay_check_subscriber_id(id, id_len) != KVR_RELAY_REASON_NONE)
        return verdict(KVR_RELAY_REASON_INVALID_REQUEST, 0, "invalid subscriber_id");

    if (rpc == KVR_RELAY_RPC_SUBSCRIBE_KV_POOL) {
        const Dynamo__Kvrelay__V1__SubscribeKvPoolRequest *r =
            (const Dynamo__Kvrelay__V1__SubscribeKvPoolRequest *)m;
        if (!r->expected_producer)
            return verdict(KVR_RELAY_REASON_INVALID_REQUEST, KVR_RELAY_IERR_MISSING_FIELD,
                           "expected_producer is missing");
        int e = kvr_relay_validate_producer(r->expected_producer);
        if (e != KVR_RELAY_IERR_OK)
            return verdict(kvr_relay_ierr_reason(e), e,
                           kvr_relay_ierr_unsupported(e) ? "unsupported expected_producer"
                                                         : "malformed expected_producer");
    }
    return verdict(KVR_RELAY_REASON_NONE, 0, NULL);
}

kvr_relay_verdict_t kvr_relay_validate_request(kvr_relay_rpc_t rpc, const uint8_t *buf,
                                               size_t len, ProtobufCMessage **msg)
{
    if (msg)
        *msg = NULL;
    if ((unsigned)rpc >= KVR_RELAY_RPC_COUNT) {
        kvr_relay_verdict_t v = verdict(KVR_RELAY_REASON_NONE, 0, "unknown method");
        v.grpc_status = KVR_GRPC_INTERNAL;
        return v;
    }
    ProtobufCMessage *m = NULL;
    if (kvr_relay_wire_check(rpcs[rpc].desc, buf, len))
        m = protobuf_c_message_unpack(rpcs[rpc].desc, NULL, len, buf);
    if (!m) {
        kvr_relay_verdict_t v = verdict(KVR_RELAY_REASON_NONE, 0, "failed to decode request");
        v.grpc_status = KVR_GRPC_INTERNAL;
        return v;
    }
    kvr_relay_verdict_t v = check_request(rpc, buf, len, m);
    if (v.grpc_status == KVR_GRPC_OK && msg)
        *msg = m;
    else
        protobuf_c_message_free_unpacked(m, NULL);
    return v;
}

/* ---- consumer: FilterUpdate -> mirror input ------------------------------------------ */

int kvr_relay_filter_update_fields(const Dynamo__Kvrelay__V1__FilterUpdate *u,
                                   kvr_mirror_update_t *out)
{
    int rc = kvr_relay_validate_envelope(u->protocol_version, u->contract_marker);
    if (rc != KVR_RELAY_IERR_OK)
        return rc;
    if (!u->relay || !u->producer)
        return KVR_RELAY_IERR_MISSING_FIELD;
    rc = kvr_relay_validate_producer(u->producer);
    if (rc != KVR_RELAY_IERR_OK)
        return rc;
    out->seed = u->producer->ckf_format->seed;
    out->bucket_count = u->producer->ckf_format->bucket_count;
    out->dc_id = u->producer->pool_id->dc_id;
    out->base_sequence = u->base_sequence;
    out->sequence = u->sequence;
    out->kind = (int32_t)u->kind;
    out->payload = u->payload.data;
    out->payload_len = u->payload.len;
    return KVR_RELAY_IERR_OK;
}
