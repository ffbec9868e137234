/*
 * grpc_client.h — a small gRPC client over one HTTP/2 (h2c) connection, on libnghttp2 and a
 * plain non-blocking socket. For kvrelay's own tools: kvrelay-watch and the benchmarks.
 *
 * One connection carries any number of calls. kvr_gclient_step() reads what the socket
 * has, delivers each complete response message to its call's callback, and writes what
 * nghttp2 has to send; drive it from poll() on kvr_gclient_fd(), or block in
 * kvr_gclient_wait().
 */
#ifndef KVR_IO_GRPC_CLIENT_H
#define KVR_IO_GRPC_CLIENT_H

#include "common.h"

typedef struct kvr_gclient_s kvr_gclient_t;
typedef struct kvr_gcall_s kvr_gcall_t;

/* Called for each response message; return nonzero to cancel the call. */
typedef int (*kvr_gcall_msg_cb)(void *ctx, kvr_gcall_t *call, const uint8_t *msg, size_t len);

struct kvr_gcall_s {
    int32_t stream_id;
    kvr_gcall_msg_cb cb;
    void *ctx;
    int done;        /* the stream closed */
    int grpc_status; /* from trailers (or Trailers-Only headers); -1 if none came */
    char grpc_message[256];
    char reason[64]; /* kv-relay-error-reason, "" if absent */
    uint8_t *buf;    /* message reassembly */
    size_t len, cap;
    kvr_gcall_t *next;
};

/* Connects to host:port (blocking connect with a timeout). NULL on failure (message in err). */
kvr_gclient_t *kvr_gclient_connect(const char *hostport, int timeout_ms, char *err, size_t errlen);
void kvr_gclient_close(kvr_gclient_t *c);
int kvr_gclient_fd(const kvr_gclient_t *c);

/* Sends `authorization: Bearer <token>` on every later call of c (a kvrelay under --tenants
 * serves its relay to the admin token, docs/tenancy.md). NULL or "" sends none. KVR_ERR for a
 * token that is too long or not a header value (spaces, controls, non-ASCII). */
int kvr_gclient_set_token(kvr_gclient_t *c, const char *token);

/* Starts a call of `path` with one request message (protobuf bytes). The call object is
 * owned by the client until kvr_gclient_close. NULL on failure. */
kvr_gcall_t *kvr_gclient_call(kvr_gclient_t *c, const char *path, const uint8_t *req, size_t req_len,
                              kvr_gcall_msg_cb cb, void *ctx);

/* Cancels a call (RST_STREAM CANCEL). */
void kvr_gclient_cancel(kvr_gclient_t *c, kvr_gcall_t *call);

/* Processes available input and flushes output. KVR_OK, or KVR_ERR when the connection is
 * gone (every open call is then marked done). */
int kvr_gclient_step(kvr_gclient_t *c);

/* Steps until `call` is done (call NULL: just for timeout_ms), at most timeout_ms.
 * KVR_OK when done, KVR_AGAIN on timeout, KVR_ERR when the connection died. */
int kvr_gclient_wait(kvr_gclient_t *c, kvr_gcall_t *call, int timeout_ms);

#endif
