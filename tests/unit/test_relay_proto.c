/*
 * test_relay_proto.c — the dynamo.kvrelay.v1 schema (src/wire/relay.proto) through protoc-c:
 * the byte examples of tests/data/relay/ (docs/relay-contract.md §7), field numbers and types
 * (§1.4), proto3 presence and unknown oneof alternatives.
 */
#include <criterion/criterion.h>

#include "common.h"
#include "testdata.h"
#include "wire/health.pb-c.h"
#include "wire/relay.pb-c.h"
#include "wire/relay_validate.h"

#define MARKER KVR_RELAY_CONTRACT_MARKER

static void expect_packed(const ProtobufCMessage *m, const char *path)
{
    size_t want_len;
    uint8_t *want = td_load_hex(path, &want_len);
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *got = malloc(len + 1);
    cr_assert_eq(protobuf_c_message_pack(m, got), len);
    cr_assert_eq(len, want_len, "%s: %zu bytes, expected %zu", path, len, want_len);
    cr_assert_arr_eq(got, want, len, "%s differs", path);
    free(got);
    free(want);
}

/* ---- bytes (§7, tests/data/relay/) --------------------------------------------------- */

Test(relay_proto, relay_info_request_bytes)
{
    Dynamo__Kvrelay__V1__RelayInfoRequest r = DYNAMO__KVRELAY__V1__RELAY_INFO_REQUEST__INIT;
    r.contract_marker = MARKER;
    expect_packed(&r.base, "tests/data/relay/relay_info_request.hex");
}

Test(relay_proto, relay_info_bytes)
{
    Dynamo__Kvrelay__V1__RelayIdentity id = DYNAMO__KVRELAY__V1__RELAY_IDENTITY__INIT;
    Dynamo__Kvrelay__V1__RelayInfo r = DYNAMO__KVRELAY__V1__RELAY_INFO__INIT;
    id.drt_instance_id = 17;
    id.relay_incarnation = 23;
    r.protocol_version = 1;
    r.relay = &id;
    r.contract_marker = MARKER;
    expect_packed(&r.base, "tests/data/relay/relay_info.hex");

    size_t len;
    uint8_t *bytes = td_load_hex("tests/data/relay/relay_info.hex", &len);
    Dynamo__Kvrelay__V1__RelayInfo *d = dynamo__kvrelay__v1__relay_info__unpack(NULL, len, bytes);
    cr_assert_not_null(d);
    cr_expect_eq(d->protocol_version, 1);
    cr_expect_eq(d->relay->drt_instance_id, 17);
    cr_expect_eq(d->relay->relay_incarnation, 23);
    cr_expect_eq(d->contract_marker, MARKER);
    cr_expect_eq(kvr_relay_validate_envelope(d->protocol_version, d->contract_marker),
                 KVR_RELAY_IERR_OK);
    dynamo__kvrelay__v1__relay_info__free_unpacked(d, NULL);
    free(bytes);
}

Test(relay_proto, watch_catalog_request_bytes)
{
    Dynamo__Kvrelay__V1__WatchKvPoolCatalogRequest r =
        DYNAMO__KVRELAY__V1__WATCH_KV_POOL_CATALOG_REQUEST__INIT;
    r.subscriber_id = "pylon";
    r.contract_marker = MARKER;
    expect_packed(&r.base, "tests/data/relay/watch_catalog_request.hex");
}

/* The marker is a fixed32 at field 127: key varint FD 07, LE bytes 31 52 56 4B. */
Test(relay_proto, marker_field_everywhere)
{
    const ProtobufCMessageDescriptor *top[] = {
        &dynamo__kvrelay__v1__relay_info_request__descriptor,
        &dynamo__kvrelay__v1__relay_info__descriptor,
        &dynamo__kvrelay__v1__watch_kv_pool_catalog_request__descriptor,
        &dynamo__kvrelay__v1__kv_pool_catalog_update__descriptor,
        &dynamo__kvrelay__v1__subscribe_kv_pool_request__descriptor,
        &dynamo__kvrelay__v1__filter_update__descriptor,
        &dynamo__kvrelay__v1__subscribe_serving_readiness_request__descriptor,
        &dynamo__kvrelay__v1__serving_readiness_update__descriptor,
        &dynamo__kvrelay__v1__subscribe_kv_pool_load_request__descriptor,
        &dynamo__kvrelay__v1__kv_pool_load_update__descriptor,
        &dynamo__kvrelay__v1__subscribe_serving_load_request__descriptor,
        &dynamo__kvrelay__v1__serving_load_update__descriptor,
    };
    for (size_t i = 0; i < KVR_ARRAY_SIZE(top); i++) {
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(top[i], 127);
        cr_assert_not_null(f, "%s has no field 127", top[i]->name);
        cr_expect_str_eq(f->name, "contract_marker");
        cr_expect_eq(f->type, PROTOBUF_C_TYPE_FIXED32, "%s", top[i]->name);
    }
}

/* Service and RPC names, used for the HTTP/2 paths. */
Test(relay_proto, service_descriptor)
{
    const ProtobufCServiceDescriptor *s = &dynamo__kvrelay__v1__kv_event_relay__descriptor;
    cr_expect_str_eq(s->name, "dynamo.kvrelay.v1.KvEventRelay");
    cr_assert_eq(s->n_methods, 6);
    for (int i = 0; i < KVR_RELAY_RPC_COUNT; i++) {
        const char *m = kvr_relay_rpc_method((kvr_relay_rpc_t)i);
        const ProtobufCMethodDescriptor *md = protobuf_c_service_descriptor_get_method_by_name(s, m);
        cr_assert_not_null(md, "method %s", m);
        cr_expect_eq(md->input, kvr_relay_rpc_request_desc((kvr_relay_rpc_t)i));
        char path[128];
        snprintf(path, sizeof(path), "/dynamo.kvrelay.v1.KvEventRelay/%s", m);
        cr_expect_eq(kvr_relay_rpc_from_path(path, strlen(path)), i);
    }
    cr_expect_eq(kvr_relay_rpc_from_path("/dynamo.kvrelay.v1.KvEventRelay/Nope", 37), -1);
    const ProtobufCServiceDescriptor *h = &grpc__health__v1__health__descriptor;
    cr_expect_str_eq(h->name, "grpc.health.v1.Health");
    cr_expect_eq(h->n_methods, 2);
    cr_expect_eq(GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING, 1);
}

/* Spot checks of field numbers and types against the schema (§1.4). */
Test(relay_proto, field_numbers)
{
    struct {
        const ProtobufCMessageDescriptor *d;
        unsigned id;
        const char *name;
        ProtobufCType type;
    } f[] = {
        {&dynamo__kvrelay__v1__relay_identity__descriptor, 1, "drt_instance_id", PROTOBUF_C_TYPE_FIXED64},
        {&dynamo__kvrelay__v1__kv_pool_id__descriptor, 3, "dc_id", PROTOBUF_C_TYPE_FIXED64},
        {&dynamo__kvrelay__v1__ckf_format__descriptor, 2, "seed", PROTOBUF_C_TYPE_FIXED64},
        {&dynamo__kvrelay__v1__ckf_format__descriptor, 3, "bucket_count", PROTOBUF_C_TYPE_UINT64},
        {&dynamo__kvrelay__v1__producer_identity__descriptor, 2, "producer_incarnation", PROTOBUF_C_TYPE_FIXED64},
        {&dynamo__kvrelay__v1__producer_identity__descriptor, 3, "layout_generation", PROTOBUF_C_TYPE_UINT64},
        {&dynamo__kvrelay__v1__filter_update__descriptor, 7, "kind", PROTOBUF_C_TYPE_ENUM},
        {&dynamo__kvrelay__v1__filter_update__descriptor, 8, "payload", PROTOBUF_C_TYPE_BYTES},
        {&dynamo__kvrelay__v1__topology_entry__descriptor, 9, "adapters", PROTOBUF_C_TYPE_MESSAGE},
        {&dynamo__kvrelay__v1__topology_member__descriptor, 3, "pool_id", PROTOBUF_C_TYPE_MESSAGE},
        {&dynamo__kvrelay__v1__kv_pool_load_entry__descriptor, 5, "kv_expected_ranks", PROTOBUF_C_TYPE_UINT32},
        {&dynamo__kvrelay__v1__token_load_stats__descriptor, 6, "output_tokens_total", PROTOBUF_C_TYPE_UINT64},
        {&dynamo__kvrelay__v1__serving_load_update__descriptor, 7, "models", PROTOBUF_C_TYPE_MESSAGE},
        {&dynamo__kvrelay__v1__model_target__descriptor, 1, "base", PROTOBUF_C_TYPE_MESSAGE},
    };
    for (size_t i = 0; i < KVR_ARRAY_SIZE(f); i++) {
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(f[i].d, f[i].id);
        cr_assert_not_null(fd, "%s.%u", f[i].d->name, f[i].id);
        cr_expect_str_eq(fd->name, f[i].name);
        cr_expect_eq(fd->type, f[i].type, "%s.%s", f[i].d->name, f[i].name);
    }
    cr_expect_null(protobuf_c_message_descriptor_get_field(
        &dynamo__kvrelay__v1__kv_pool_load_entry__descriptor, 6));
    cr_expect_eq(DYNAMO__KVRELAY__V1__RELAY_ERROR_REASON__RELAY_ERROR_REASON_INTERNAL, 11);
    cr_expect_eq(DYNAMO__KVRELAY__V1__DATA_STATUS__DATA_STATUS_UNAVAILABLE, 3);
    cr_expect_eq(DYNAMO__KVRELAY__V1__WORKER_ROLE__WORKER_ROLE_LEGACY, 5);
}

/* proto3 `optional` (written as a one-field oneof): emitted when set, even to 0. */
Test(relay_proto, optional_presence)
{
    Dynamo__Kvrelay__V1__TokenLoadStats t = DYNAMO__KVRELAY__V1__TOKEN_LOAD_STATS__INIT;
    cr_expect_eq(protobuf_c_message_get_packed_size(&t.base), 0);
    t.active_prefill_tokens_present_case =
        DYNAMO__KVRELAY__V1__TOKEN_LOAD_STATS__ACTIVE_PREFILL_TOKENS_PRESENT_ACTIVE_PREFILL_TOKENS;
    t.active_prefill_tokens = 0;
    uint8_t buf[16];
    cr_assert_eq(protobuf_c_message_pack(&t.base, buf), 2);
    cr_expect_eq(buf[0], 0x08);
    cr_expect_eq(buf[1], 0x00);
    Dynamo__Kvrelay__V1__TokenLoadStats *d =
        dynamo__kvrelay__v1__token_load_stats__unpack(NULL, 2, buf);
    cr_assert_not_null(d);
    cr_expect_eq(d->active_prefill_tokens_present_case,
                 DYNAMO__KVRELAY__V1__TOKEN_LOAD_STATS__ACTIVE_PREFILL_TOKENS_PRESENT_ACTIVE_PREFILL_TOKENS);
    cr_expect_eq(d->active_decode_blocks_present_case,
                 DYNAMO__KVRELAY__V1__TOKEN_LOAD_STATS__ACTIVE_DECODE_BLOCKS_PRESENT__NOT_SET);
    dynamo__kvrelay__v1__token_load_stats__free_unpacked(d, NULL);

    /* a plain proto3 scalar at 0 is omitted */
    Dynamo__Kvrelay__V1__RelayInfo r = DYNAMO__KVRELAY__V1__RELAY_INFO__INIT;
    cr_expect_eq(protobuf_c_message_get_packed_size(&r.base), 0);
    /* TopologyMember.pool_id presence */
    Dynamo__Kvrelay__V1__KvPoolId pid = DYNAMO__KVRELAY__V1__KV_POOL_ID__INIT;
    Dynamo__Kvrelay__V1__TopologyMember tm = DYNAMO__KVRELAY__V1__TOPOLOGY_MEMBER__INIT;
    tm.pool_id_present_case = DYNAMO__KVRELAY__V1__TOPOLOGY_MEMBER__POOL_ID_PRESENT_POOL_ID;
    tm.pool_id = &pid;
    cr_assert_eq(protobuf_c_message_pack(&tm.base, buf), 2);
    cr_expect_eq(buf[0], 0x1a);
    cr_expect_eq(buf[1], 0x00);
}

/* §1.4, readers ignore unknown fields: ModelTarget `1a 00` (a future alternative at tag 3)
 * decodes as an unset oneof. */
Test(relay_proto, unknown_model_target_is_unset)
{
    size_t len;
    uint8_t *b = td_load_hex("tests/data/relay/model_target_unknown.hex", &len);
    Dynamo__Kvrelay__V1__ModelTarget *t = dynamo__kvrelay__v1__model_target__unpack(NULL, len, b);
    cr_assert_not_null(t);
    cr_expect_eq(t->target_case, DYNAMO__KVRELAY__V1__MODEL_TARGET__TARGET__NOT_SET);
    cr_expect_eq(t->pbc_base.n_unknown_fields, 1, "unknown fields are preserved");
    dynamo__kvrelay__v1__model_target__free_unpacked(t, NULL);
    free(b);
}
