/*
 * fuzz_relay_req.c — libFuzzer driver for the dynamo.kvrelay.v1 request path: protobuf-c
 * decoding plus kvr_relay_validate_request() (docs/relay-contract.md), and the consumer
 * side of FilterUpdate (kvr_relay_filter_update_fields + a mirror, docs/relay-contract.md §6).
 *
 * Input: one selector byte, then message bytes. selector % 7 < 6 picks the RPC whose
 * request the bytes are; 6 means "a FilterUpdate from a server".
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "wire/mirror.h"
#include "wire/relay_validate.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void fuzz_request(kvr_relay_rpc_t rpc, const uint8_t *data, size_t size)
{
    ProtobufCMessage *msg = NULL;
    kvr_relay_verdict_t v = kvr_relay_validate_request(rpc, data, size, &msg);
    if (v.grpc_status == KVR_GRPC_OK) {
        check(msg != NULL && v.reason == KVR_RELAY_REASON_NONE);
        /* a valid request re-encodes and validates again */
        size_t n = protobuf_c_message_get_packed_size(msg);
        uint8_t *buf = malloc(n ? n : 1);
        check(protobuf_c_message_pack(msg, buf) == n);
        protobuf_c_message_free_unpacked(msg, NULL);
        kvr_relay_verdict_t again = kvr_relay_validate_request(rpc, buf, n, NULL);
        check(again.grpc_status == KVR_GRPC_OK);
        free(buf);
    } else {
        check(msg == NULL);
        if (v.reason != KVR_RELAY_REASON_NONE) {
            check(kvr_relay_reason_name(v.reason) != NULL);
            check(kvr_relay_reason_grpc(v.reason) == v.grpc_status);
        }
    }
}

static void fuzz_filter_update(const uint8_t *data, size_t size)
{
    if (!kvr_relay_wire_check(&dynamo__kvrelay__v1__filter_update__descriptor, data, size))
        return;
    Dynamo__Kvrelay__V1__FilterUpdate *u =
        dynamo__kvrelay__v1__filter_update__unpack(NULL, size, data);
    if (!u)
        return;
    kvr_mirror_update_t mu;
    if (kvr_relay_filter_update_fields(u, &mu) == KVR_RELAY_IERR_OK) {
        check(kvr_relay_producer_equal(u->producer, u->producer));
        kvr_mirror_t m;
        if (mu.bucket_count <= 65536 &&
            kvr_mirror_init(&m, mu.seed, mu.bucket_count, mu.dc_id) == KVR_OK) {
            (void)kvr_mirror_apply(&m, &mu);
            (void)kvr_mirror_contains(&m, 1);
            kvr_mirror_destroy(&m);
        }
    }
    dynamo__kvrelay__v1__filter_update__free_unpacked(u, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int sel = data[0] % 7;
    if (sel < KVR_RELAY_RPC_COUNT)
        fuzz_request((kvr_relay_rpc_t)sel, data + 1, size - 1);
    else
        fuzz_filter_update(data + 1, size - 1);
    (void)kvr_relay_check_subscriber_id(data, size < 200 ? size : 200);
    return 0;
}
