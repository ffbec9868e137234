/*
 * engine_int.h — the engine's own header, shared by its three files and by nothing else:
 *
 *   engine.c        output queues, workers and connections, choosing requests, the event loop
 *   engine_proto.c  responses: what a status means, the stream protocols (HTTP/1.1, RESP2,
 *                   memcached text) from request bytes to a finished request
 *   engine_h2.c     HTTP/2 (h2c, prior knowledge) through a libnghttp2 client session
 *
 * The three are one module (they call each other as the event loop's callbacks do: a response
 * completes a request, which fills the connection with the next one); the rest of the tool sees
 * only engine.h.
 */
#ifndef KVB_ENGINE_INT_H
#define KVB_ENGINE_INT_H

#include "engine.h"
#include "data.h"

#include <nghttp2/nghttp2.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#define TBUF_CAP  (256u << 10)
#define HBUF_CAP  (16u << 10)
#define OQ_HIGH   (4u << 20)
#define IOV_BATCH 256
#define RETRY_NS  100000000ull /* a failed connect is retried after 100 ms */

enum { CS_DOWN,
       CS_CONNECTING,
       CS_UP };
enum { SINK_DROP,
       SINK_HASH,
       SINK_KEEP };
enum { RP_HEAD,
       RP_BODY };
#define EK_AUTO (-2) /* per request: EK_SHORT once a response began, else EK_CONNECT */

typedef struct seg {
    const uint8_t *p; /* borrowed bytes, or NULL: owned bytes at ob + off */
    size_t off, len;
} seg_t;

typedef struct outq {
    seg_t *v;
    size_t head, n, cap;
    size_t done; /* bytes of v[head] already written */
    uint8_t *ob;
    size_t olen, ocap;
    size_t bytes; /* not yet written */
} outq_t;

typedef struct kvb_req {
    int active, op, phase, measured;
    uint64_t key, size, t0;
    int status;
    int64_t clen;
    uint64_t got;
    int sink, ek, miss, head_done;
    char keep[256];
    size_t keeplen;
    XXH3_state_t *xs;
    kvb_block_t blk;         /* PUT body */
    uint64_t rd_off, wr_off; /* HTTP/2 body positions (nghttp2 read / send callbacks) */
    uint64_t seqhash;
} kvb_req_t;

struct kvb_conn {
    int kind; /* KVB_FD_CONN: first, as in every object registered with epoll */
    kvb_worker_t *w;
    int id, fd, state, in_reopen;
    uint32_t evmask;
    uint64_t t_connect, retry_at;
    outq_t oq;
    kvb_req_t *reqs;
    int nreqs, inflight;
    /* stream protocols (HTTP/1.1, RESP, memcache): the response being read */
    int rphase, close_after;
    uint64_t body_left;
    const char *trailer;
    size_t tlen, tpos, hlen;
    uint8_t *hbuf; /* allocated at the first head split across reads */
    /* HTTP/2 */
    nghttp2_session *h2;
};

/* Body bytes of a response into its sink: the verification checksum, a small copy, or nowhere. */
static inline void kvb_sink_bytes(kvb_req_t *r, const uint8_t *p, size_t n)
{
    r->got += n;
    if (r->sink == SINK_HASH) {
        XXH3_64bits_update(r->xs, p, n);
    } else if (r->sink == SINK_KEEP && r->keeplen < sizeof(r->keep) - 1) {
        size_t take = sizeof(r->keep) - 1 - r->keeplen;
        if (take > n)
            take = n;
        memcpy(r->keep + r->keeplen, p, take);
        r->keeplen += take;
    }
}

extern char kvb_auth_line[600]; /* "Authorization: Bearer T\r\n" or "" (HTTP/1.1) */
extern char kvb_auth_h2[600];   /* "Bearer T" or "" (HTTP/2) */
extern const char *const kvb_http_method[OP_N];

/* ---------------------------------------------------------------- engine.c */

/* The first error of a kind, for the report: free text, or "<op> <key>: <what>" about a request. */
void kvb_note_error(kvb_worker_t *w, int ek, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void kvb_note_req(kvb_worker_t *w, int ek, const kvb_req_t *r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Output queue: owned bytes are copied, a block's pool slice is borrowed. */
void kvb_oq_own(outq_t *q, const void *p, size_t len);
void kvb_oq_block(outq_t *q, const kvb_block_t *b, uint64_t off, uint64_t len);
int kvb_oq_flush(int fd, outq_t *q); /* 1: everything written; 0: the socket is full; -1: error */
void kvb_conn_events(kvb_conn_t *c, uint32_t want);
void kvb_schedule_reopen(kvb_conn_t *c, uint64_t at);
void kvb_req_finish(kvb_conn_t *c, kvb_req_t *r, int ek, int miss); /* ek: -1 success, else a kind */
void kvb_conn_close_fd(kvb_conn_t *c);
void kvb_conn_fail(kvb_conn_t *c, int ek, const char *why); /* every request on it ends with ek */
/* One read into the worker's buffer (EINTR retried): > 0 the bytes read; 0 nothing more for now;
 * -1 the server closed the connection or the read failed, already failed with kvb_conn_fail. */
ssize_t kvb_conn_read(kvb_conn_t *c);
void kvb_conn_fill(kvb_conn_t *c); /* start requests on free slots */

/* ---------------------------------------------------------------- engine_proto.c */

void kvb_http_classify(kvb_req_t *r);               /* what an HTTP status means; sets the sink */
void kvb_req_complete(kvb_conn_t *c, kvb_req_t *r); /* the whole response is in */
void kvb_build_stream_request(kvb_conn_t *c, kvb_req_t *r);
void kvb_stream_flush(kvb_conn_t *c);
void kvb_stream_readable(kvb_conn_t *c);

/* ---------------------------------------------------------------- engine_h2.c */

int kvb_h2_init(kvb_conn_t *c);
void kvb_h2_flush(kvb_conn_t *c); /* moves nghttp2's output to the socket */
void kvb_h2_readable(kvb_conn_t *c);
void kvb_h2_submit(kvb_conn_t *c, kvb_req_t *r);

#endif
