/*
 * test_grpc_frame.c — gRPC framing (wire/grpc_frame.h): prefixes, the one-message rule and
 * the status metadata; and the relay service's table of RPCs (io/grpc_relay.c): one entry per
 * dynamo.kvrelay.v1 method, each at the index and :path wire/relay_validate.h knows it by;
 * and the FilterUpdate encoder (wire/relay_msg.h).
 */
#include <criterion/criterion.h>

#include "io/grpc_int.h"
#include "wire/grpc_frame.h"
#include "wire/health.pb-c.h"
#include "wire/relay_msg.h"
#include "wire/relay_validate.h"

Test(grpc_frame, pack_writes_the_prefix)
{
    Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    uint8_t buf[64];
    const uint8_t *msg;
    size_t n, mlen;

    rq.service = "abc";
    n = kvr_grpc_pack(&rq.base, buf);
    cr_assert_eq(n, kvr_grpc_packed_size(&rq.base));
    cr_assert_eq(n, 5 + 5); /* tag, length, "abc" */
    cr_expect_eq(buf[0], 0);
    cr_expect_eq(kvr_be32(buf + 1), 5);
    cr_assert_eq(kvr_grpc_one_message(buf, n, &msg, &mlen), KVR_GRPC_ONE_OK);
    cr_expect_eq(msg, buf + 5);
    cr_expect_eq(mlen, 5);
}

Test(grpc_frame, one_message_rule)
{
    uint8_t b[16] = {0, 0, 0, 0, 2, 'h', 'i'};
    const uint8_t *msg = NULL;
    size_t mlen = 0;

    cr_expect_eq(kvr_grpc_one_message(b, 4, &msg, &mlen), KVR_GRPC_ONE_MALFORMED); /* short prefix */
    cr_expect_eq(kvr_grpc_one_message(b, 6, &msg, &mlen), KVR_GRPC_ONE_MALFORMED); /* truncated */
    cr_expect_eq(kvr_grpc_one_message(b, 8, &msg, &mlen), KVR_GRPC_ONE_MALFORMED); /* trailing byte */
    cr_expect_eq(kvr_grpc_one_message(b, 7, &msg, &mlen), KVR_GRPC_ONE_OK);
    cr_expect_eq(mlen, 2);
    b[0] = 1;
    cr_expect_eq(kvr_grpc_one_message(b, 7, &msg, &mlen), KVR_GRPC_ONE_COMPRESSED);
    kvr_put_be32(b + 1, 0);
    b[0] = 0;
    cr_expect_eq(kvr_grpc_one_message(b, 5, &msg, &mlen), KVR_GRPC_ONE_OK); /* an empty message */
    cr_expect_eq(mlen, 0);
}

Test(grpc_frame, status_metadata)
{
    kvr_grpc_status_md_t md;

    kvr_grpc_status_md(&md, 0, NULL, 0);
    cr_assert_eq(md.n, 1);
    cr_expect_str_eq(md.name[0], "grpc-status");
    cr_expect_str_eq(md.value[0], "0");
    kvr_grpc_status_md(&md, 8, "Relay stream limit reached", KVR_RELAY_REASON_RESOURCE_LIMIT);
    cr_assert_eq(md.n, 3);
    cr_expect_str_eq(md.value[0], "8");
    cr_expect_str_eq(md.name[1], "grpc-message");
    cr_expect_str_eq(md.value[1], "Relay stream limit reached");
    cr_expect_str_eq(md.name[2], "kv-relay-error-reason");
    cr_expect_str_eq(md.value[2], kvr_relay_reason_name(KVR_RELAY_REASON_RESOURCE_LIMIT));
    kvr_grpc_status_md(&md, 13, NULL, 9999); /* a reason without a name sends no trailer */
    cr_expect_eq(md.n, 1);
}

Test(grpc_methods, one_relay_entry_per_method)
{
    cr_assert_eq(kvr_grpc_relay_nmethods, KVR_RELAY_RPC_COUNT);
    for (size_t i = 0; i < kvr_grpc_relay_nmethods; i++) {
        const kvr_grpc_method_t *m = &kvr_grpc_relay_methods[i];
        cr_assert_not_null(m->path, "entry %zu", i);
        cr_expect_eq(m->rpc, (int)i);
        cr_expect_eq(kvr_relay_rpc_from_path(m->path, strlen(m->path)), (int)i, "%s", m->path);
        cr_expect_not_null(m->call, "%s", m->path);
        cr_expect_not_null(m->done, "%s: its permit must go back", m->path);
    }
    cr_assert_eq(kvr_grpc_health_nmethods, 2);
    cr_expect_str_eq(kvr_grpc_health_methods[0].path, "/grpc.health.v1.Health/Check");
    cr_expect_str_eq(kvr_grpc_health_methods[1].path, "/grpc.health.v1.Health/Watch");
}

Test(relay_msg, filter_update_envelope_and_payload)
{
    Dynamo__Kvrelay__V1__RelayIdentity rel = DYNAMO__KVRELAY__V1__RELAY_IDENTITY__INIT;
    Dynamo__Kvrelay__V1__ProducerIdentity prod = DYNAMO__KVRELAY__V1__PRODUCER_IDENTITY__INIT;
    kvr_wire_filter_update_t u = {&rel, &prod, 7, 9, 123456,
                                  DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_HEARTBEAT};
    Dynamo__Kvrelay__V1__FilterUpdate *fu;
    uint8_t buf[KVR_RELAY_ENVELOPE_MAX + 300], *payload = NULL;
    const uint8_t *msg;
    size_t n, mlen;

    rel.relay_incarnation = 42;
    prod.layout_generation = 3;
    n = kvr_wire_filter_update(&u, 200, buf, sizeof(buf), &payload);
    cr_assert_gt(n, 200);
    cr_assert_eq(payload + 200, buf + n, "the payload ends the message");
    memset(payload, 0xAB, 200);
    cr_assert_eq(kvr_grpc_one_message(buf, n, &msg, &mlen), KVR_GRPC_ONE_OK);
    fu = dynamo__kvrelay__v1__filter_update__unpack(NULL, mlen, msg);
    cr_assert_not_null(fu);
    cr_expect_eq(fu->protocol_version, KVR_RELAY_PROTOCOL_VERSION);
    cr_expect_eq(fu->contract_marker, KVR_RELAY_CONTRACT_MARKER);
    cr_expect_eq(fu->relay->relay_incarnation, 42);
    cr_expect_eq(fu->producer->layout_generation, 3);
    cr_expect_eq(fu->base_sequence, 7);
    cr_expect_eq(fu->sequence, 9);
    cr_expect_eq(fu->send_ts_us, 123456);
    cr_expect_eq(fu->kind, DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_HEARTBEAT);
    cr_assert_eq(fu->payload.len, 200);
    cr_expect_eq(fu->payload.data[0], 0xAB);
    cr_expect_eq(fu->payload.data[199], 0xAB);
    dynamo__kvrelay__v1__filter_update__free_unpacked(fu, NULL);
    /* no room: 0, nothing promised */
    cr_expect_eq(kvr_wire_filter_update(&u, 200, buf, n - 1, &payload), 0);
    /* no payload: field 8 absent */
    n = kvr_wire_filter_update(&u, 0, buf, sizeof(buf), &payload);
    cr_assert_eq(payload, buf + n);
}
