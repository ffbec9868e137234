/*
 * h1_int.h — what the parts of the io_uring HTTP/1.1 server share; nothing outside
 * src/io/h1*.c includes it (h1.h is the public API). The parts, one idea each:
 *
 *   h1.c           the connection machine: a connection's life, responses, bodies, reads,
 *                  and the server's creation, flush and drain
 *   h1_head.c      request heads: parsing and the framing checks (Content-Length,
 *                  Transfer-Encoding, obs-fold, Expect)
 *   h1_chunked.c   chunked request bodies, collected in a heap buffer
 *   h1_sniff.c     the first bytes: TLS and HTTP/2 go to h2o
 *   h1_accept.c    accept, the workers' accept turns, and making room by closing idle
 *                  connections
 *   h1_wait.c      admitting the PUTs that wait for the in-flight budget
 *   h1_peer.c      the table of client addresses (--peer-inflight-share)
 *   h1_deadline.c  the tick: every state's deadline and --min-body-rate
 *   h1_disk.c      a GET whose block is read from the disk tier
 *   h1_loop.c      the worker's loop waiting in the ring, h2o's epoll descriptor polled through it
 *
 * What runs on every read or request is inline below: the idle list, the wait queue, a
 * peer's share of the budget.
 *
 * All of it runs on the worker's one thread: no locks.
 */
#ifndef KVR_IO_H1_INT_H
#define KVR_IO_H1_INT_H

#include "io/h1.h"

#include "base/clock.h"
#include "io/phr.h"
#include "io/uring.h"

#include <sys/socket.h>
#include <time.h>

#define H1_IOV          64  /* spans per recvmsg/sendmsg */
#define H1_OUT_MAX      512 /* response head */
#define H1_RETRY_AFTER  "1"
#define H1_PEER_BUCKETS 256

/* The HTTP/2 connection preface (RFC 9113, section 3.4); h1_sniff.c compares against it. */
#define H1_H2_PREFACE     "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define H1_H2_PREFACE_LEN (sizeof(H1_H2_PREFACE) - 1)

enum {
    ST_SNIFF,   /* first bytes peeked: TLS / HTTP/2 go to h2o */
    ST_HEAD,    /* reading a request head */
    ST_BODY,    /* receiving a PUT body into its reservation */
    ST_DISCARD, /* consuming a body that is not stored (dedup hit, bodies of other methods) */
    ST_CHUNKED, /* collecting a chunked body */
    ST_COLLECT, /* collecting a batch request's body (Content-Length, at most 1 MiB) */
    ST_WAIT,    /* PUT waiting for the in-flight budget, nothing read */
    ST_DISK,    /* GET reading its block from the disk tier into a reservation (h1_disk.c) */
    ST_SEND,    /* sending the response */
    ST_LINGER,  /* answered and closing: our side shut, the peer's remaining bytes discarded */
};

typedef struct h1c_s h1c_t;

/* A link of a circular list whose own link is the head (nginx's ngx_queue_t). A link that is
 * on no list has next == NULL, which is what a zeroed connection starts with. */
typedef struct h1_link_s {
    struct h1_link_s *prev, *next;
} h1_link_t;

/* The connection that holds link l as its member `field`. */
#define H1_CONN_OF(l, field) ((h1c_t *)(void *)((char *)(l)-offsetof(h1c_t, field)))

/* A client address and what its connections hold in this worker (--peer-inflight-share). */
typedef struct h1peer_s {
    struct h1peer_s *next;
    uint8_t addr[16]; /* IPv6, or IPv4-mapped */
    uint32_t conns;
    uint64_t held;    /* bytes of PUT reservations */
    uint64_t last_ms; /* when a connection of it last came or went */
} h1peer_t;

struct kvr_h1_s {
    const kvr_config_t *cfg;
    kvr_api_t *api;
    kvr_http_t *http;
    kvr_uring_t ring;
    int own_wait;          /* the worker's loop waits in ring, not in h2o (kvr_h1_turn) */
    int h2o_fd;            /* h2o's epoll descriptor, polled through ring (own_wait) */
    int h2o_polled;        /* a poll of it is in flight */
    int h2o_ready;         /* it reported readiness since the last wait */
    kvr_uring_op_t h2o_op; /* that poll */
    uint64_t h2o_poll_err; /* when it last failed (ms): not armed again for a tick */
    uint64_t h2o_ran;      /* when h2o last ran in kvr_h1_turn (ms) */
    int listen_fd;
    kvr_uring_op_t accept_op;
    int accepting; /* an accept is in flight */
    int draining;
    uint64_t accept_paused_until;
    int full;              /* not accepting: at --max-connections with none idle (one pause counted) */
    int full_warned;       /* this pressure episode has logged that none was idle */
    int fd_exhausted;      /* logged once per episode */
    const int *accept_fds; /* by process slot: the eventfd that gives a worker the turn */
    int parked;            /* not accepting: the turn was given to a less loaded worker */
    int yield_to;          /* the worker last given the turn ... */
    uint64_t yield_hb;     /* ... its heartbeat when last seen moving ... */
    uint64_t yield_ms;     /* ... and when */
    uint32_t published;    /* our connection count as last stored in our process slot */
    char scratch[64];      /* a valid address for recv(MSG_TRUNC), which discards without copying */
    h1c_t *conns;          /* every open connection */
    uint64_t nconns;
    h1_link_t wait;       /* PUTs waiting for the in-flight budget, oldest first */
    h1_link_t idle;       /* connections between requests, longest idle first */
    uint64_t max_conns;   /* --max-connections, or what RLIMIT_NOFILE allows */
    uint32_t nreclaim;    /* closed to make room and not yet freed */
    int pressure;         /* an episode of making room: logged at its start and end ... */
    uint64_t pressure_ms; /* ... which ends a second after the last room was made */
    int fd_warned;        /* "pausing accept" logged in this episode */
    uint64_t reclaimed;   /* connections closed in this episode */
    h1peer_t *peers[H1_PEER_BUCKETS];
    uint32_t npeers; /* addresses remembered: connected, or within H1_PEER_KEEP_MS */
    uint64_t peers_swept_ms;
    unsigned chunked_conns;
    uint64_t last_tick_ms;
    char date[40]; /* "Date: ...\r\n", refreshed every second */
    time_t date_sec;
};

struct h1c_s {
    h1c_t *prev, *next;
    h1_link_t wlink; /* on s->wait, while in ST_WAIT */
    h1_link_t ilink; /* on s->idle: may be closed to make room */
    kvr_h1_t *s;
    int fd;
    uint8_t state;
    uint8_t rbusy, wbusy; /* an operation of each direction in flight */
    uint8_t closing;      /* shut down: freed once nothing is in flight */
    uint8_t keep;         /* keep-alive after this response */
    uint8_t expect100;
    uint8_t chunked;
    uint8_t in_req; /* res holds a handled request: kvr_api_done owed */
    uint8_t sent100;
    uint8_t sniff_wait; /* peeked, waiting for a decision at the next tick */
    uint8_t post_drain; /* consuming the body of a request answered from its head */
    uint8_t lowat;      /* SO_RCVLOWAT is raised (--recv-lowat) for this body's receive */
    uint8_t reclaimed;  /* closed to make room (counted in nreclaim until freed) */
    uint8_t cut;        /* the read in flight was cancelled: answer 408 when it completes */
    uint8_t rate_on;    /* rate_ms / rate_mark hold a --min-body-rate window */
    h1peer_t *peer;     /* NULL when the address could not be had */
    uint64_t held;      /* reservation bytes counted in peer->held */
    uint64_t head_ms;   /* the current head's first byte (0: none yet) */
    uint64_t rate_ms;   /* start of the current --body-rate-window ... */
    uint64_t rate_mark; /* ... and TCP_INFO bytes received + acked then */
    const char *cut_why;
    kvr_uring_op_t rop, wop;
    uint64_t last_ms; /* last byte moved, or the state began */
    uint64_t linger_until;
    uint64_t tcp_in, tcp_out; /* TCP_INFO byte counters at the last look */
    uint64_t start_us;
    unsigned method;
    uint64_t body_len, body_got;
    uint64_t bytes_in, bytes_out;
    size_t hlen;      /* bytes in hbuf */
    size_t hused;     /* bytes of hbuf that belong to the current request */
    size_t last_len;  /* hlen at the last incomplete parse */
    kvr_api_req_t rq; /* points into hbuf until the request is done */
    struct msghdr msg;
    struct iovec iov[H1_IOV + 1];
    size_t out_len;
    uint64_t resp_total, resp_sent;
    char *cbuf; /* chunked body */
    size_t clen, cdec, ccap;
    struct phr_chunked_decoder dec;
    char out[H1_OUT_MAX]; /* from here on, not cleared for a new connection */
    kvr_api_res_t res;
    char hbuf[KVR_H1_HEAD_MAX];
};

/* ------------------------------------------------------------------ lists and shares */

static inline void h1_list_init(h1_link_t *list)
{
    list->prev = list->next = list;
}

static inline int h1_list_empty(const h1_link_t *list)
{
    return list->next == list;
}

static inline int h1_linked(const h1_link_t *l)
{
    return l->next != NULL;
}

static inline void h1_list_append(h1_link_t *list, h1_link_t *l)
{
    l->prev = list->prev;
    l->next = list;
    list->prev->next = l;
    list->prev = l;
}

/* Takes l off its list; nothing when it is on none. */
static inline void h1_list_remove(h1_link_t *l)
{
    if (l->next == NULL)
        return;
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = NULL;
}

/* The idle list: connections with no request in progress (accepted and silent, or between
 * two requests), in the order they became idle. Out of descriptors or at --max-connections,
 * the longest idle are closed first to make room (nginx's "reusable connections"). Inline:
 * every completed read leaves it. */
static inline int h1_idle(const h1c_t *c)
{
    return h1_linked(&c->ilink);
}

static inline void h1_idle_enter(h1c_t *c)
{
    if (!h1_idle(c))
        h1_list_append(&c->s->idle, &c->ilink);
}

static inline void h1_idle_leave(h1c_t *c)
{
    h1_list_remove(&c->ilink);
}

/* The wait queue: FIFO, so that the budget a finished PUT frees goes to the oldest waiter.
 * Each PUT that joins it is counted, and the queue's length is a level in our stats block
 * (/metrics: kvrelay_put_budget_waits_total, kvrelay_put_budget_waiting). */
static inline void h1_wait_enter(h1c_t *c)
{
    c->state = ST_WAIT;
    h1_list_append(&c->s->wait, &c->wlink);
    kvr_stat_add(c->s->api->store->my_stats, KVR_ST_PUT_BUDGET_WAITS, 1);
    kvr_stat_add(c->s->api->store->my_stats, KVR_ST_PUT_BUDGET_WAITING, 1);
}

static inline void h1_wait_leave(h1c_t *c)
{
    if (!h1_linked(&c->wlink))
        return;
    h1_list_remove(&c->wlink);
    kvr_stat_sub(c->s->api->store->my_stats, KVR_ST_PUT_BUDGET_WAITING, 1);
}

/* What the peer holds of the budget follows the connection's reservation. The share binds
 * only while the worker has other clients to protect: a lone client (one engine, a bench
 * run) may use the whole budget. */
static inline uint64_t h1_peer_held(const h1c_t *c)
{
    return c->peer != NULL && c->s->npeers > 1 ? c->peer->held : 0;
}

static inline void h1_peer_take(h1c_t *c)
{
    if (c->res.put != KVR_API_PUT_RESERVED || c->peer == NULL)
        return;
    c->held = c->res.put_len;
    c->peer->held += c->held;
}

static inline void h1_peer_give(h1c_t *c)
{
    if (c->peer != NULL)
        c->peer->held -= c->held;
    c->held = 0;
}

/* Bytes of the body that came in with the head. */
static inline size_t h1_preread(const h1c_t *c)
{
    return c->hlen - c->hused;
}

/* ------------------------------------------------------------------ h1.c */

void kvr_h1_conn_new(kvr_h1_t *s, int fd);
/* Submits the read the connection's state wants (or carries on with bytes already here). */
void kvr_h1_conn_read(h1c_t *c);
/* Ends the connection: in-flight operations complete with errors once the socket is shut;
 * the record goes with the last of them. */
void kvr_h1_conn_close(h1c_t *c);
/* Frees the record of a connection that nothing is in flight on, without closing its
 * descriptor: h2o serves it now. */
void kvr_h1_conn_release(h1c_t *c);
/* Builds the response head for c->res and starts sending head + body. */
void kvr_h1_respond(h1c_t *c);
/* An error found by the transport itself (framing, limits): JSON, then the connection ends.
 * hname/hval: one extra header, or NULL. */
void kvr_h1_respond_error_hdr(h1c_t *c, int status, const char *code, const char *msg, const char *hname,
                              const char *hval);
void kvr_h1_respond_error(h1c_t *c, int status, const char *code, const char *msg);
/* Asks the request layer about a parsed head; carries out what it decides. */
void kvr_h1_start_request(h1c_t *c);
/* Consumes what arrived with the head, then reads the rest (after "100 Continue"). */
void kvr_h1_begin_body(h1c_t *c);
/* The body is whole: the request is answered. */
void kvr_h1_body_complete(h1c_t *c);

/* ------------------------------------------------------------------ the other parts */

/* h1_head.c: parses a complete head out of hbuf; asks for more when it is not complete. */
void kvr_h1_parse_head(h1c_t *c);

/* h1_chunked.c. start: the request layer deferred a chunked PUT (503 past
 * KVR_H1_CHUNKED_CONNS). read: conn_read in ST_CHUNKED, the bytes that came with the head
 * first. input: new raw bytes are at cbuf[cdec, clen); decodes them in place. */
void kvr_h1_chunked_start(h1c_t *c);
void kvr_h1_chunked_read(h1c_t *c);
void kvr_h1_chunked_input(h1c_t *c);

/* h1_sniff.c: the peek of n bytes completed; decides who serves the connection. */
void kvr_h1_sniffed(h1c_t *c, int n);

/* h1_accept.c */
/* Sets up the accept operation and watches our turn eventfd: KVR_OK, or KVR_ERR. */
int kvr_h1_accept_init(kvr_h1_t *s);
/* Submits an accept unless one is in flight, we drain, or we are full with nothing idle. */
void kvr_h1_arm_accept(kvr_h1_t *s);
/* Publishes our count and accepts, or hands the turn on (docs/concurrency.md, "Accept turns"). */
void kvr_h1_accept_turn(kvr_h1_t *s, int woken);
/* From the tick: takes a connection left in the listener's queue while our accept waits. */
void kvr_h1_accept_queued(kvr_h1_t *s);
/* The client connections we hold: ours and those handed to h2o. */
uint32_t kvr_h1_held(const kvr_h1_t *s);

/* h1_wait.c: once per loop iteration, admits the oldest waiters the budget now fits. */
void kvr_h1_wake_waiters(kvr_h1_t *s);

/* h1_peer.c: attach at accept, detach at close; sweep forgets addresses long without one. */
void kvr_h1_peer_attach(h1c_t *c);
void kvr_h1_peer_detach(h1c_t *c);
void kvr_h1_peer_sweep(kvr_h1_t *s, uint64_t t);

/* h1_disk.c: a GET the request layer sends to the disk tier (res.dk set): the record is read
 * on the worker's ring (the connection's read op: rbusy), then the response goes out. The tick's
 * --io-timeout applies to each read. */
void kvr_h1_disk_start(h1c_t *c);
void kvr_h1_disk_done(h1c_t *c, int res);

/* h1_loop.c: makes the worker's loop wait in s->ring (kvr_h1_turn) when the engine is io_uring
 * and h2o's epoll descriptor is found; 1 if so, 0 when the loop keeps waiting in h2o. */
int kvr_h1_own_wait(kvr_h1_t *s);

#endif
