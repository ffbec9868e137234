/* relay_msg.c — see relay_msg.h. */
#include "wire/relay_msg.h"

#include "wire/grpc_frame.h"
#include "wire/relay_validate.h"

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

size_t kvr_wire_filter_update(const kvr_wire_filter_update_t *u, size_t payload_len, uint8_t *dst, size_t cap,
                              uint8_t **payload)
{
    Dynamo__Kvrelay__V1__FilterUpdate fu = DYNAMO__KVRELAY__V1__FILTER_UPDATE__INIT;
    size_t env, total;
    uint8_t *p;

    fu.protocol_version = KVR_RELAY_PROTOCOL_VERSION;
    fu.relay = (Dynamo__Kvrelay__V1__RelayIdentity *)u->relay;
    fu.producer = (Dynamo__Kvrelay__V1__ProducerIdentity *)u->producer;
    fu.base_sequence = u->base_seq;
    fu.sequence = u->seq;
    fu.send_ts_us = u->send_ts_us;
    fu.kind = (Dynamo__Kvrelay__V1__FilterUpdateKind)u->kind;
    fu.contract_marker = KVR_RELAY_CONTRACT_MARKER;
    env = dynamo__kvrelay__v1__filter_update__get_packed_size(&fu);
    /* Field 8 (payload) follows the packed envelope; decoders accept fields in any order. */
    total = env + (payload_len > 0 ? 1 + varint_len(payload_len) + payload_len : 0);
    if (KVR_GRPC_PREFIX + total > cap || total > UINT32_MAX)
        return 0;
    p = kvr_grpc_put_prefix(dst, total);
    p += dynamo__kvrelay__v1__filter_update__pack(&fu, p);
    if (payload_len > 0) {
        *p++ = (8 << 3) | 2;
        p = put_varint(p, payload_len);
    }
    *payload = p;
    return KVR_GRPC_PREFIX + total;
}
