/*
 * grpc_int.h — what the parts of the worker's gRPC server share; nothing outside
 * src/io/grpc_*.c includes it. The parts, split as h2o splits codecs from connections:
 *
 *   grpc_conn.c    connection plumbing: accept, the nghttp2 session, recv/send on the
 *                  worker's ring (io/uring.h), keepalive pings, request reassembly and the
 *                  framing checks, a stream's queued output and how it ends, the loop glue
 *   grpc_relay.c   dynamo.kvrelay.v1.KvEventRelay: a table of RPCs, one entry per method
 *   grpc_health.c  grpc.health.v1.Health
 *   wire/grpc_frame.h  message prefixes and status metadata (pure codecs)
 *
 * A service is a table of kvr_grpc_method_t; the connection finds a call's entry by its
 * :path once the request is complete and calls into it from then on.
 */
#ifndef KVR_IO_GRPC_INT_H
#define KVR_IO_GRPC_INT_H

#define H2O_USE_LIBUV 0
#include "core/relay_int.h"
#include "core/tenants_table.h"
#include "io/grpc.h"
#include "io/uring.h"
#include "wire/grpc_frame.h"

#include <h2o.h>
#include <nghttp2/nghttp2.h>

typedef struct gconn_s gconn_t;
typedef struct gstream_s gstream_t;

/* A stream's phase. The services use WAIT_ADMIT..PERIODIC; ENDING is set by stream_end. */
enum { PH_NONE,
       PH_WAIT_ADMIT,
       PH_SNAPSHOT,
       PH_DELTAS,
       PH_PERIODIC,
       PH_ENDING };

typedef struct kvr_grpc_method_s {
    const char *path; /* :path, "/<package>.<Service>/<Method>" */
    int rpc;          /* kvr_relay_rpc_t for the relay's methods, -1 for others */
    /* The one request message arrived and passed the framing checks: answer or start. */
    void (*call)(gstream_t *s, const uint8_t *msg, size_t len);
    /* Optional, each only while the call has not ended: */
    void (*tick)(gstream_t *s, uint64_t now_ms); /* periodic work (kvr_grpc_tick) */
    void (*refill)(gstream_t *s, size_t budget); /* nghttp2 can send `budget` and none is queued */
    void (*wake)(gstream_t *s);                  /* the publisher published or admitted */
    void (*cancel)(gstream_t *s);                /* the server drains: give back the shared state */
    /* Optional, always, once: the stream is freed (after any cancel). */
    void (*done)(gstream_t *s);
} kvr_grpc_method_t;

extern const kvr_grpc_method_t kvr_grpc_relay_methods[];
extern const size_t kvr_grpc_relay_nmethods;
extern const kvr_grpc_method_t kvr_grpc_health_methods[];
extern const size_t kvr_grpc_health_nmethods;

struct gstream_s {
    gstream_t *next, *prev;
    gconn_t *conn;
    int32_t id;
    char path[160];
    int path_len;
    int grpc_ct; /* content-type is application/grpc* */
    int auth;    /* the authorization metadata: GAUTH_* (grpc_conn.c) */
    int scope;   /* the namespace whose pools it sees, or -1: every pool */
    char *token; /* its bearer token, to check again after a reload */
    size_t token_len;
    uint64_t auth_gen;               /* the tenants table's generation it was last checked against */
    const kvr_grpc_method_t *method; /* NULL until the request is complete, or unknown */
    uint8_t *req;
    size_t req_len, req_cap;
    int too_big;

    int responded; /* headers submitted */
    int admitted;  /* stream type holding a permit, or -1 */
    int phase;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    int deferred;
    int end_status; /* >= 0: end with these trailers once out is drained */
    int end_reason;
    const char *end_msg;

    /* pool streams */
    int sub;
    uint32_t pool;
    uint64_t generation;
    uint32_t next_chunk, chunk_count;
    uint64_t snap_seq;
    uint64_t last_seq;     /* last sequence sent (for heartbeats) */
    uint64_t last_send_ms; /* for heartbeats and progress */
    uint64_t progress_ms;
    /* periodic streams */
    uint64_t next_emit_ms;
    uint64_t sent_revision;
    uint64_t sent_view[2 + KVR_POOLS_MAX / 64]; /* the catalog it sent: generation, publisher up,
                                                 * a bit per pool listed (grpc_relay.c) */
    uint64_t window_seq;
};

struct gconn_s {
    gconn_t *next, *prev;
    kvr_grpc_t *g;
    int fd;
    nghttp2_session *session;
    gstream_t streams; /* list head */
    uint8_t *rbuf;
    kvr_uring_op_t rop, wop;
    int reading, writing, closing, dead;
    uint8_t *wbuf; /* in flight */
    size_t wlen, woff, wcap;
    uint8_t *pbuf; /* gathering */
    size_t plen, pcap;
    uint64_t last_ping_ms, ping_sent_ms;
    int ping_outstanding;
};

struct kvr_grpc_s {
    const kvr_config_t *cfg;
    kvr_seg_t *seg;
    kvr_store_t *store;
    kvr_relay_t *relay;
    h2o_evloop_t *loop;
    kvr_uring_t uring;
    h2o_socket_t *uring_sock, *wake_sock;
    int listen_fd, wake_fd;
    kvr_uring_op_t accept_op;
    int accepting;
    gconn_t conns;
    unsigned nconns;
    int draining;
    nghttp2_session_callbacks *cbs;
    h2o_timeout_t kick_timeout;
    h2o_timeout_entry_t kick_entry;
    uint64_t last_kick_ms;
    kvr_tenants_view_t *tenants; /* this worker's view of the tenants table (relay calls) */
};

/* What grpc_conn.c offers the services. */
/* Room for `add` more bytes of output (KVR_OK or KVR_ERR: out of memory). */
int kvr_grpc_out_reserve(gstream_t *s, size_t add);
/* Queues one message with its prefix. */
int kvr_grpc_out_message(gstream_t *s, const ProtobufCMessage *m);
/* Submits the response headers (once); the queued output follows as nghttp2 asks. */
void kvr_grpc_send_headers(gstream_t *s);
/* New output is queued: make nghttp2 ask for it. */
void kvr_grpc_stream_kick(gstream_t *s);
/* Ends the call: Trailers-Only before any response, else trailers after the queued data. */
void kvr_grpc_stream_end(gstream_t *s, int status, int reason, const char *msg);

#endif
