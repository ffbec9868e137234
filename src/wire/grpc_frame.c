/* grpc_frame.c — see grpc_frame.h. */
#include "wire/grpc_frame.h"

#include "wire/relay_validate.h"

#include <stdio.h>

size_t kvr_grpc_packed_size(const ProtobufCMessage *m)
{
    return KVR_GRPC_PREFIX + protobuf_c_message_get_packed_size(m);
}

size_t kvr_grpc_pack(const ProtobufCMessage *m, uint8_t *dst)
{
    size_t len = protobuf_c_message_get_packed_size(m);

    kvr_grpc_put_prefix(dst, len);
    protobuf_c_message_pack(m, dst + KVR_GRPC_PREFIX);
    return KVR_GRPC_PREFIX + len;
}

kvr_grpc_one_t kvr_grpc_one_message(const uint8_t *body, size_t len, const uint8_t **msg, size_t *mlen)
{
    if (len < KVR_GRPC_PREFIX || kvr_be32(body + 1) != len - KVR_GRPC_PREFIX)
        return KVR_GRPC_ONE_MALFORMED;
    if (body[0] != 0)
        return KVR_GRPC_ONE_COMPRESSED;
    *msg = body + KVR_GRPC_PREFIX;
    *mlen = len - KVR_GRPC_PREFIX;
    return KVR_GRPC_ONE_OK;
}

void kvr_grpc_status_md(kvr_grpc_status_md_t *md, int status, const char *msg, int reason)
{
    const char *rname = reason > 0 ? kvr_relay_reason_name(reason) : NULL;

    snprintf(md->code, sizeof(md->code), "%d", status);
    md->n = 0;
    md->name[md->n] = "grpc-status";
    md->value[md->n++] = md->code;
    if (msg != NULL) {
        md->name[md->n] = "grpc-message";
        md->value[md->n++] = msg;
    }
    if (rname != NULL) {
        md->name[md->n] = KVR_RELAY_REASON_TRAILER;
        md->value[md->n++] = rname;
    }
}
