/*
 * test_relay_validate.c — the request validation helpers of src/wire/relay_validate.c
 * (docs/relay-contract.md: §1.1 the order of the checks, §1.2 reasons and codes, §2.3
 * identities), the consumer side of FilterUpdate and the strict wire check.
 */
#include <criterion/criterion.h>

#include "common.h"
#include "testdata.h"
#include "wire/relay.pb-c.h"
#include "wire/relay_validate.h"

#define MARKER KVR_RELAY_CONTRACT_MARKER

static uint8_t dig_a[16] = {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
                            0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11};
static uint8_t dig_b[16] = {0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
                            0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22};

typedef struct producer_fixture {
    Dynamo__Kvrelay__V1__DigestIdentity cache, routing;
    Dynamo__Kvrelay__V1__IndexerDomainId domain;
    Dynamo__Kvrelay__V1__KvPoolId pool;
    Dynamo__Kvrelay__V1__CkfFormat fmt;
    Dynamo__Kvrelay__V1__ProducerIdentity p;
} producer_fixture_t;

static void producer_fixture(producer_fixture_t *f)
{
    Dynamo__Kvrelay__V1__DigestIdentity di = DYNAMO__KVRELAY__V1__DIGEST_IDENTITY__INIT;
    Dynamo__Kvrelay__V1__IndexerDomainId dom = DYNAMO__KVRELAY__V1__INDEXER_DOMAIN_ID__INIT;
    Dynamo__Kvrelay__V1__KvPoolId pool = DYNAMO__KVRELAY__V1__KV_POOL_ID__INIT;
    Dynamo__Kvrelay__V1__CkfFormat fmt = DYNAMO__KVRELAY__V1__CKF_FORMAT__INIT;
    Dynamo__Kvrelay__V1__ProducerIdentity p = DYNAMO__KVRELAY__V1__PRODUCER_IDENTITY__INIT;
    f->cache = di;
    f->cache.digest.data = dig_a;
    f->cache.digest.len = 16;
    f->cache.source = DYNAMO__KVRELAY__V1__IDENTITY_SOURCE__IDENTITY_SOURCE_DEFAULT_DERIVED;
    f->routing = di;
    f->routing.digest.data = dig_b;
    f->routing.digest.len = 16;
    f->routing.source = DYNAMO__KVRELAY__V1__IDENTITY_SOURCE__IDENTITY_SOURCE_EXPLICIT;
    f->domain = dom;
    f->domain.cache_semantics = &f->cache;
    f->domain.routing_scope = &f->routing;
    f->pool = pool;
    f->pool.identity_version = 1;
    f->pool.indexer_domain = &f->domain;
    f->pool.dc_id = 0xAABBCCDDEEFF0011ULL;
    f->fmt = fmt;
    f->fmt.format_version = 1;
    f->fmt.seed = 0x5DEECE66D1B54A33ULL;
    f->fmt.bucket_count = 524288;
    f->fmt.fingerprint_bits = 16;
    f->fmt.slots_per_bucket = 4;
    f->p = p;
    f->p.pool_id = &f->pool;
    f->p.producer_incarnation = 7;
    f->p.layout_generation = 1;
    f->p.ckf_format = &f->fmt;
}

/* Packs a request of `rpc` with the given marker, subscriber_id bytes and producer. */
static size_t pack_request(kvr_relay_rpc_t rpc, uint32_t marker, const char *id, size_t id_len,
                           Dynamo__Kvrelay__V1__ProducerIdentity *producer, uint8_t *out)
{
    /* subscriber_id is written by hand so that it may hold any bytes (NUL included) */
    size_t n = 0;
    if (rpc != KVR_RELAY_RPC_GET_RELAY_INFO && id_len) {
        out[n++] = 0x0a;
        out[n++] = (uint8_t)id_len; /* ids here are < 128 bytes + a few */
        if (id_len >= 128) {
            out[n - 1] = (uint8_t)(id_len | 0x80);
            out[n++] = (uint8_t)(id_len >> 7);
        }
        memcpy(out + n, id, id_len);
        n += id_len;
    }
    if (rpc == KVR_RELAY_RPC_SUBSCRIBE_KV_POOL && producer) {
        Dynamo__Kvrelay__V1__SubscribeKvPoolRequest r =
            DYNAMO__KVRELAY__V1__SUBSCRIBE_KV_POOL_REQUEST__INIT;
        r.expected_producer = producer;
        n += protobuf_c_message_pack(&r.base, out + n);
    }
    if (marker) {
        out[n++] = 0xfd;
        out[n++] = 0x07;
        kvr_put_le32(out + n, marker);
        n += 4;
    }
    return n;
}

static kvr_relay_verdict_t check(kvr_relay_rpc_t rpc, uint32_t marker, const char *id,
                                 Dynamo__Kvrelay__V1__ProducerIdentity *producer)
{
    uint8_t buf[2048];
    size_t len = pack_request(rpc, marker, id, id ? strlen(id) : 0, producer, buf);
    return kvr_relay_validate_request(rpc, buf, len, NULL);
}

Test(relay_validate, reason_table)
{
    const struct {
        int reason;
        const char *name;
        int code;
    } t[] = {
        {0, "RELAY_ERROR_REASON_UNSPECIFIED", 13},
        {1, "RELAY_ERROR_REASON_CONTRACT_MISMATCH", 9},
        {2, "RELAY_ERROR_REASON_INVALID_REQUEST", 3},
        {3, "RELAY_ERROR_REASON_UNSUPPORTED_FEATURE", 9},
        {4, "RELAY_ERROR_REASON_POOL_NOT_FOUND", 5},
        {5, "RELAY_ERROR_REASON_PRODUCER_CHANGED", 9},
        {6, "RELAY_ERROR_REASON_RESOURCE_LIMIT", 8},
        {7, "RELAY_ERROR_REASON_SUBSCRIBER_LAGGED", 8},
        {8, "RELAY_ERROR_REASON_SNAPSHOT_PROGRESS_TIMEOUT", 8},
        {9, "RELAY_ERROR_REASON_PUBLICATION_UNAVAILABLE", 14},
        {10, "RELAY_ERROR_REASON_INVALID_PUBLICATION", 9},
        {11, "RELAY_ERROR_REASON_INTERNAL", 13},
    };
    for (size_t i = 0; i < KVR_ARRAY_SIZE(t); i++) {
        cr_expect_str_eq(kvr_relay_reason_name(t[i].reason), t[i].name);
        cr_expect_eq(kvr_relay_reason_grpc(t[i].reason), t[i].code, "%s", t[i].name);
        /* the generated enum agrees, name and number */
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
            &dynamo__kvrelay__v1__relay_error_reason__descriptor, t[i].reason);
        cr_assert_not_null(v);
        cr_expect_str_eq(v->name, t[i].name);
        if (t[i].reason)
            cr_expect_eq(kvr_relay_reason_parse(t[i].name, strlen(t[i].name)), t[i].reason);
    }
    cr_expect_null(kvr_relay_reason_name(12));
    cr_expect_eq(kvr_relay_reason_grpc(99), KVR_GRPC_INTERNAL);
    cr_expect_eq(kvr_relay_reason_parse("RELAY_ERROR_REASON_NOPE", 23), 0);
    cr_expect_str_eq(KVR_RELAY_REASON_TRAILER, "kv-relay-error-reason");
    /* Every reason relay.proto defines has a name and a status here (a new one fails). */
    for (unsigned i = 0; i < dynamo__kvrelay__v1__relay_error_reason__descriptor.n_values; i++) {
        const ProtobufCEnumValue *v = &dynamo__kvrelay__v1__relay_error_reason__descriptor.values[i];
        cr_expect_str_eq(kvr_relay_reason_name(v->value), v->name);
    }
}

Test(relay_validate, marker_checked_first_on_every_rpc)
{
    producer_fixture_t f;
    producer_fixture(&f);
    f.p.layout_generation = 0; /* also malformed: the marker must win */
    for (int rpc = 0; rpc < KVR_RELAY_RPC_COUNT; rpc++) {
        const uint32_t bad[] = {0, 0x4B565232, 0x3152564B};
        for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
            kvr_relay_verdict_t v = check((kvr_relay_rpc_t)rpc, bad[i], "", &f.p);
            cr_expect_eq(v.grpc_status, KVR_GRPC_FAILED_PRECONDITION, "rpc %d", rpc);
            cr_expect_eq(v.reason, KVR_RELAY_REASON_CONTRACT_MISMATCH, "rpc %d", rpc);
        }
    }
    kvr_relay_verdict_t ok = check(KVR_RELAY_RPC_GET_RELAY_INFO, MARKER, NULL, NULL);
    cr_expect_eq(ok.grpc_status, KVR_GRPC_OK);
    cr_expect_eq(ok.reason, KVR_RELAY_REASON_NONE);
}

Test(relay_validate, subscriber_id_rules)
{
    const struct {
        const char *id;
        size_t len;
        int ok;
    } t[] = {
        {"pylon", 5, 1},
        {"", 0, 0},
        {"router-\xc3\xa9", 9, 1},         /* é */
        {"\xe2\x82\xac euro", 8, 1},       /* € */
        {"emoji \xf0\x9f\x98\x80", 10, 1}, /* U+1F600 */
        {"tab\there", 8, 0},
        {"nul\0inside", 10, 0},
        {"del\x7f", 4, 0},
        {"c1 \xc2\x85", 5, 0},   /* U+0085 NEL is Cc */
        {"nbsp \xc2\xa0", 7, 1}, /* U+00A0 is not Cc */
        {"bad \xff", 5, 0},
        {"overlong \xc0\xaf", 11, 0},
        {"surrogate \xed\xa0\x80", 13, 0},
        {"truncated \xe2\x82", 12, 0},
        {"too big \xf4\x90\x80\x80", 12, 0},
    };
    for (size_t i = 0; i < KVR_ARRAY_SIZE(t); i++) {
        int want = t[i].ok ? KVR_RELAY_REASON_NONE : KVR_RELAY_REASON_INVALID_REQUEST;
        cr_expect_eq(kvr_relay_check_subscriber_id((const uint8_t *)t[i].id, t[i].len), want,
                     "case %zu", i);
        /* and through a real request of every streaming RPC */
        for (int rpc = 1; rpc < KVR_RELAY_RPC_COUNT; rpc++) {
            producer_fixture_t f;
            producer_fixture(&f);
            uint8_t buf[512];
            size_t len = pack_request((kvr_relay_rpc_t)rpc, MARKER, t[i].id, t[i].len, &f.p, buf);
            kvr_relay_verdict_t v = kvr_relay_validate_request((kvr_relay_rpc_t)rpc, buf, len, NULL);
            cr_expect_eq(v.reason, want, "case %zu rpc %d", i, rpc);
            cr_expect_eq(v.grpc_status, t[i].ok ? KVR_GRPC_OK : KVR_GRPC_INVALID_ARGUMENT);
        }
    }
    char id[130];
    memset(id, 'x', sizeof(id));
    cr_expect_eq(kvr_relay_check_subscriber_id((uint8_t *)id, 128), KVR_RELAY_REASON_NONE);
    cr_expect_eq(kvr_relay_check_subscriber_id((uint8_t *)id, 129),
                 KVR_RELAY_REASON_INVALID_REQUEST);
    uint8_t buf[512];
    size_t len = pack_request(KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG, MARKER, id, 129, NULL, buf);
    kvr_relay_verdict_t v =
        kvr_relay_validate_request(KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG, buf, len, NULL);
    cr_expect_eq(v.reason, KVR_RELAY_REASON_INVALID_REQUEST);
    /* the last occurrence of a repeated scalar field wins (proto3) */
    len = pack_request(KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG, 0, "ok", 2, NULL, buf);
    len += pack_request(KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG, MARKER, "a\x01", 2, NULL, buf + len);
    v = kvr_relay_validate_request(KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG, buf, len, NULL);
    cr_expect_eq(v.reason, KVR_RELAY_REASON_INVALID_REQUEST);
}

Test(relay_validate, subscribe_kv_pool_producer)
{
    producer_fixture_t f;
    ProtobufCMessage *msg = NULL;
    uint8_t buf[512];

    /* valid: the unpacked request is handed back */
    producer_fixture(&f);
    size_t len = pack_request(KVR_RELAY_RPC_SUBSCRIBE_KV_POOL, MARKER, "r1", 2, &f.p, buf);
    kvr_relay_verdict_t v = kvr_relay_validate_request(KVR_RELAY_RPC_SUBSCRIBE_KV_POOL, buf, len, &msg);
    cr_assert_eq(v.grpc_status, KVR_GRPC_OK);
    cr_assert_not_null(msg);
    Dynamo__Kvrelay__V1__SubscribeKvPoolRequest *r = (void *)msg;
    cr_expect_str_eq(r->subscriber_id, "r1");
    cr_expect(kvr_relay_producer_equal(r->expected_producer, &f.p));
    protobuf_c_message_free_unpacked(msg, NULL);

    /* missing -> INVALID_REQUEST */
    v = check(KVR_RELAY_RPC_SUBSCRIBE_KV_POOL, MARKER, "r1", NULL);
    cr_expect_eq(v.reason, KVR_RELAY_REASON_INVALID_REQUEST);
    cr_expect_eq(v.grpc_status, KVR_GRPC_INVALID_ARGUMENT);

    /* subscriber_id is checked before the producer */
    producer_fixture(&f);
    f.p.ckf_format->format_version = 2;
    v = check(KVR_RELAY_RPC_SUBSCRIBE_KV_POOL, MARKER, NULL, &f.p);
    cr_expect_eq(v.reason, KVR_RELAY_REASON_INVALID_REQUEST);
    cr_expect_eq(v.detail, 0);
}

/* Each identity case: mutate a valid fixture, expect the detail and the reason. */
typedef void (*mutate_fn)(producer_fixture_t *);
static void m_pool_missing(producer_fixture_t *f)
{
    f->p.pool_id = NULL;
}
static void m_version_zero(producer_fixture_t *f)
{
    f->pool.identity_version = 0;
}
static void m_version_two(producer_fixture_t *f)
{
    f->pool.identity_version = 2;
}
static void m_domain_missing(producer_fixture_t *f)
{
    f->pool.indexer_domain = NULL;
}
static void m_cache_missing(producer_fixture_t *f)
{
    f->domain.cache_semantics = NULL;
}
static void m_digest_15(producer_fixture_t *f)
{
    f->routing.digest.len = 15;
}
static void m_source_zero(producer_fixture_t *f)
{
    f->cache.source = 0;
}
static void m_source_unknown(producer_fixture_t *f)
{
    f->cache.source = 3;
}
static void m_layout_zero(producer_fixture_t *f)
{
    f->p.layout_generation = 0;
}
static void m_format_missing(producer_fixture_t *f)
{
    f->p.ckf_format = NULL;
}
static void m_bits_zero(producer_fixture_t *f)
{
    f->fmt.fingerprint_bits = 0;
}
static void m_buckets_zero(producer_fixture_t *f)
{
    f->fmt.bucket_count = 0;
}
static void m_format_v2(producer_fixture_t *f)
{
    f->fmt.format_version = 2;
}
static void m_bits_8(producer_fixture_t *f)
{
    f->fmt.fingerprint_bits = 8;
}
static void m_slots_8(producer_fixture_t *f)
{
    f->fmt.slots_per_bucket = 8;
}
static void m_buckets_2_25(producer_fixture_t *f)
{
    f->fmt.bucket_count = 1ULL << 25;
}
static void m_buckets_3(producer_fixture_t *f)
{
    f->fmt.bucket_count = 3;
}
static void m_buckets_1(producer_fixture_t *f)
{
    f->fmt.bucket_count = 1;
}
static void m_seed_zero(producer_fixture_t *f)
{
    f->fmt.seed = 0;
}
static void m_incarnation_zero(producer_fixture_t *f)
{
    f->p.producer_incarnation = 0;
}

Test(relay_validate, producer_unsupported_vs_malformed)
{
    const struct {
        mutate_fn m;
        int detail;
        int reason;
    } t[] = {
        {m_pool_missing, KVR_RELAY_IERR_MISSING_FIELD, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_version_zero, KVR_RELAY_IERR_POOL_VERSION_ZERO, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_version_two, KVR_RELAY_IERR_POOL_VERSION, KVR_RELAY_REASON_UNSUPPORTED_FEATURE},
        {m_domain_missing, KVR_RELAY_IERR_MISSING_FIELD, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_cache_missing, KVR_RELAY_IERR_MISSING_FIELD, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_digest_15, KVR_RELAY_IERR_DIGEST_LENGTH, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_source_zero, KVR_RELAY_IERR_SOURCE_UNSPECIFIED, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_source_unknown, KVR_RELAY_IERR_SOURCE_UNKNOWN, KVR_RELAY_REASON_UNSUPPORTED_FEATURE},
        {m_layout_zero, KVR_RELAY_IERR_ZERO_LAYOUT_GENERATION, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_format_missing, KVR_RELAY_IERR_MISSING_FIELD, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_bits_zero, KVR_RELAY_IERR_ZERO_FORMAT_FIELD, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_buckets_zero, KVR_RELAY_IERR_ZERO_FORMAT_FIELD, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_format_v2, KVR_RELAY_IERR_UNSUPPORTED_CKF_FORMAT, KVR_RELAY_REASON_UNSUPPORTED_FEATURE},
        {m_bits_8, KVR_RELAY_IERR_UNSUPPORTED_CKF_FORMAT, KVR_RELAY_REASON_UNSUPPORTED_FEATURE},
        {m_slots_8, KVR_RELAY_IERR_UNSUPPORTED_CKF_FORMAT, KVR_RELAY_REASON_UNSUPPORTED_FEATURE},
        {m_buckets_2_25, KVR_RELAY_IERR_BUCKET_COUNT_TOO_LARGE,
         KVR_RELAY_REASON_UNSUPPORTED_FEATURE},
        {m_buckets_3, KVR_RELAY_IERR_BUCKET_COUNT, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_buckets_1, KVR_RELAY_IERR_BUCKET_COUNT, KVR_RELAY_REASON_INVALID_REQUEST},
        {m_seed_zero, KVR_RELAY_IERR_OK, KVR_RELAY_REASON_NONE},
        {m_incarnation_zero, KVR_RELAY_IERR_OK, KVR_RELAY_REASON_NONE},
    };
    for (size_t i = 0; i < KVR_ARRAY_SIZE(t); i++) {
        producer_fixture_t f;
        producer_fixture(&f);
        t[i].m(&f);
        cr_expect_eq(kvr_relay_validate_producer(&f.p), t[i].detail, "case %zu: got %s", i,
                     kvr_relay_ierr_name(kvr_relay_validate_producer(&f.p)));
        cr_expect_eq(kvr_relay_ierr_reason(t[i].detail), t[i].reason, "case %zu", i);
        kvr_relay_verdict_t v = check(KVR_RELAY_RPC_SUBSCRIBE_KV_POOL, MARKER, "sub", &f.p);
        cr_expect_eq(v.reason, t[i].reason, "case %zu via request", i);
        int code = t[i].reason == KVR_RELAY_REASON_NONE ? KVR_GRPC_OK
                 : t[i].reason == KVR_RELAY_REASON_UNSUPPORTED_FEATURE
                     ? KVR_GRPC_FAILED_PRECONDITION
                     : KVR_GRPC_INVALID_ARGUMENT;
        cr_expect_eq(v.grpc_status, code, "case %zu", i);
        if (t[i].detail != KVR_RELAY_IERR_OK && t[i].m != m_pool_missing &&
            t[i].m != m_format_missing && t[i].m != m_domain_missing && t[i].m != m_cache_missing)
            cr_expect_eq(v.detail, t[i].detail, "case %zu detail", i);
    }
}

Test(relay_validate, undecodable_request_is_internal)
{
    const uint8_t junk[] = {0x0a, 0x05, 'a'}; /* length beyond the end */
    kvr_relay_verdict_t v =
        kvr_relay_validate_request(KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG, junk, sizeof(junk), NULL);
    cr_expect_eq(v.grpc_status, KVR_GRPC_INTERNAL);
    cr_expect_eq(v.reason, KVR_RELAY_REASON_NONE);
    v = kvr_relay_validate_request(KVR_RELAY_RPC_COUNT, junk, 0, NULL);
    cr_expect_eq(v.grpc_status, KVR_GRPC_INTERNAL);
}

Test(relay_validate, producer_equality_covers_every_field)
{
    producer_fixture_t a, b;
    producer_fixture(&a);
    producer_fixture(&b);
    cr_expect(kvr_relay_producer_equal(&a.p, &b.p));
    b.routing.source = DYNAMO__KVRELAY__V1__IDENTITY_SOURCE__IDENTITY_SOURCE_DEFAULT_DERIVED;
    cr_expect(!kvr_relay_producer_equal(&a.p, &b.p), "digest sources are part of the key");
    producer_fixture(&b);
    b.p.layout_generation = 2;
    cr_expect(!kvr_relay_producer_equal(&a.p, &b.p));
    producer_fixture(&b);
    b.fmt.seed ^= 1;
    cr_expect(!kvr_relay_producer_equal(&a.p, &b.p));
    producer_fixture(&b);
    b.pool.dc_id ^= 1;
    cr_expect(!kvr_relay_producer_equal(&a.p, &b.p));
    producer_fixture(&b);
    uint8_t other[16] = {0x11};
    b.cache.digest.data = other;
    cr_expect(!kvr_relay_producer_equal(&a.p, &b.p));
}

/* A FilterUpdate from the wire, through kvr_relay_filter_update_fields into a mirror. */
Test(relay_validate, filter_update_to_mirror)
{
    producer_fixture_t f;
    producer_fixture(&f);
    f.fmt.bucket_count = 2;
    f.fmt.seed = 0x5EED;
    f.pool.dc_id = 9;
    size_t s1_len;
    uint8_t *s1 = td_load_hex("tests/data/cbi1/S1.hex", &s1_len);
    Dynamo__Kvrelay__V1__RelayIdentity rel = DYNAMO__KVRELAY__V1__RELAY_IDENTITY__INIT;
    Dynamo__Kvrelay__V1__FilterUpdate u = DYNAMO__KVRELAY__V1__FILTER_UPDATE__INIT;
    rel.relay_incarnation = 7;
    u.protocol_version = 1;
    u.relay = &rel;
    u.producer = &f.p;
    u.base_sequence = u.sequence = 6;
    u.kind = DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_SNAPSHOT_CHUNK;
    u.payload.data = s1;
    u.payload.len = s1_len;
    u.contract_marker = MARKER;
    size_t len = protobuf_c_message_get_packed_size(&u.base);
    uint8_t *wire = malloc(len);
    protobuf_c_message_pack(&u.base, wire);
    Dynamo__Kvrelay__V1__FilterUpdate *d = dynamo__kvrelay__v1__filter_update__unpack(NULL, len, wire);
    cr_assert_not_null(d);
    kvr_mirror_update_t mu;
    cr_assert_eq(kvr_relay_filter_update_fields(d, &mu), KVR_RELAY_IERR_OK);
    kvr_mirror_t m;
    cr_assert_eq(kvr_mirror_init(&m, 0x5EED, 2, 9), KVR_OK);
    cr_expect_eq(kvr_mirror_apply(&m, &mu), KVR_MIRROR_OK);
    cr_expect_eq(kvr_mirror_state(&m), KVR_MIRROR_LIVE);
    d->protocol_version = 2;
    cr_expect_eq(kvr_relay_filter_update_fields(d, &mu), KVR_RELAY_IERR_PROTOCOL_VERSION);
    d->contract_marker = 0;
    cr_expect_eq(kvr_relay_filter_update_fields(d, &mu), KVR_RELAY_IERR_CONTRACT_MARKER);
    d->contract_marker = MARKER;
    d->protocol_version = 1;
    Dynamo__Kvrelay__V1__RelayIdentity *saved = d->relay;
    d->relay = NULL;
    cr_expect_eq(kvr_relay_filter_update_fields(d, &mu), KVR_RELAY_IERR_MISSING_FIELD);
    d->relay = saved;
    dynamo__kvrelay__v1__filter_update__free_unpacked(d, NULL);
    kvr_mirror_destroy(&m);
    free(wire);
    free(s1);
}

/* fuzz_relay_req finding: field number 0 behind an over-long key. */
Test(relay_validate, field_number_zero_is_undecodable)
{
    size_t len;
    uint8_t *b = td_load_hex("tests/data/relay/fuzz_field0_request.hex", &len);
    kvr_relay_verdict_t v =
        kvr_relay_validate_request(KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG, b, len, NULL);
    cr_expect_eq(v.grpc_status, KVR_GRPC_INTERNAL);
    cr_expect_eq(v.reason, KVR_RELAY_REASON_NONE);
    cr_expect(!kvr_relay_wire_check(&dynamo__kvrelay__v1__watch_kv_pool_catalog_request__descriptor,
                                    b, len));
    free(b);
    /* minimal cases: key 00, key 80 00, group wire type, 11-byte varint; nested field 0 */
    const uint8_t k0[] = {0x00, 0x00}, k0long[] = {0x80, 0x00, 0x00}, group[] = {0x0b, 0x0c};
    const uint8_t longv[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02};
    const ProtobufCMessageDescriptor *d = &dynamo__kvrelay__v1__subscribe_kv_pool_request__descriptor;
    cr_expect(!kvr_relay_wire_check(d, k0, sizeof(k0)));
    cr_expect(!kvr_relay_wire_check(d, k0long, sizeof(k0long)));
    cr_expect(!kvr_relay_wire_check(d, group, sizeof(group)));
    cr_expect(!kvr_relay_wire_check(d, longv, sizeof(longv)));
    const uint8_t nested[] = {0x12, 0x03, 0x80, 0x00, 0x00}; /* expected_producer { field 0 } */
    cr_expect(!kvr_relay_wire_check(d, nested, sizeof(nested)));
    const uint8_t unknown_opaque[] = {0x1a, 0x02, 0x00, 0x00}; /* unknown field 3: opaque */
    cr_expect(kvr_relay_wire_check(d, unknown_opaque, sizeof(unknown_opaque)));
    const uint8_t max_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    cr_expect(kvr_relay_wire_check(d, max_varint, sizeof(max_varint)));
}
