/*
 * test_relay_msg.c — the FilterUpdate encoder (src/wire/relay_msg.c): the envelope's fields,
 * the payload left for the caller at the end of the message, no room, no payload.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "wire/grpc_frame.h"
#include "wire/relay.pb-c.h"
#include "wire/relay_msg.h"
#include "wire/relay_validate.h"

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
