/*
 * grpc_frame.h — gRPC over HTTP/2 framing, as pure codecs (no I/O): the 5-byte message
 * prefix (compressed flag, u32 big-endian length), the "exactly one request message" rule
 * of a unary-request call, and the status metadata (grpc-status, grpc-message and the
 * relay's kv-relay-error-reason) that ends every call, in Trailers-Only headers or trailers
 * (docs/relay-contract.md).
 */
#ifndef KVR_WIRE_GRPC_FRAME_H
#define KVR_WIRE_GRPC_FRAME_H

#include "common.h"

#include <protobuf-c/protobuf-c.h>

#define KVR_GRPC_PREFIX      5          /* compressed flag + u32 BE length */
#define KVR_GRPC_MAX_MESSAGE (8u << 20) /* largest request message accepted */

/* Writes the prefix of an uncompressed message of len bytes at p; returns p + 5. */
static inline uint8_t *kvr_grpc_put_prefix(uint8_t *p, size_t len)
{
    p[0] = 0;
    return kvr_put_be32(p + 1, (uint32_t)len);
}

/* Bytes kvr_grpc_pack writes for m: its prefix and packed size. */
size_t kvr_grpc_packed_size(const ProtobufCMessage *m);
/* Packs m with its prefix into dst (kvr_grpc_packed_size(m) bytes); returns that size. */
size_t kvr_grpc_pack(const ProtobufCMessage *m, uint8_t *dst);

typedef enum {
    KVR_GRPC_ONE_OK = 0,
    KVR_GRPC_ONE_MALFORMED,  /* not exactly one complete message */
    KVR_GRPC_ONE_COMPRESSED, /* the message has the compressed flag (no encoding is offered) */
} kvr_grpc_one_t;

/* A request body that must hold exactly one message: on KVR_GRPC_ONE_OK, *msg and *mlen
 * are its bytes (inside body). */
kvr_grpc_one_t kvr_grpc_one_message(const uint8_t *body, size_t len, const uint8_t **msg, size_t *mlen);

/* The metadata that ends a call: name[i]/value[i] for i < n; values point into md or at
 * static or caller strings (msg), so md must outlive their use. */
typedef struct {
    char code[12];
    size_t n;
    const char *name[3];
    const char *value[3];
} kvr_grpc_status_md_t;

/* grpc-status `status`; grpc-message `msg` unless NULL; the relay's reason trailer when
 * reason > 0 and has a name. */
void kvr_grpc_status_md(kvr_grpc_status_md_t *md, int status, const char *msg, int reason);

#endif
