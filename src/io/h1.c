/* h1.c — see h1.h for the design. */
#include "io/h1.h"

#include "base/clock.h"
#include "base/log.h"
#include "io/phr.h"
#include "io/uring.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <linux/tcp.h> /* struct tcp_info with the byte counters */
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define H1_IOV          64  /* spans per recvmsg/sendmsg */
#define H1_HEAD_READ    2048 /* bytes per read of a head (docs/dataplane.md) */
#define H1_MAX_HEADERS  64
#define H1_OUT_MAX      512 /* response head */
#define H1_LINGER_MS    2000
#define H1_ACCEPT_PAUSE_MS 100
#define H1_ACCEPT_SLACK 1      /* connections held beyond the least loaded worker's, still accepting */
#define H1_ACCEPT_STALL_MS 200 /* a worker given the turn whose loop has not moved for this long is passed over */
#define H1_RETRY_AFTER  "1"
#define H1_RECLAIM_MAX  16     /* idle connections closed at once when out of descriptors */
#define H1_PEER_BUCKETS 256
#define H1_PEER_MAX     65536  /* addresses remembered per worker (about 3 MiB); more go unlimited */
#define H1_PEER_KEEP_MS 60000  /* an address without connections is remembered this long */

static const char h2_preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define H2_PREFACE_LEN (sizeof(h2_preface) - 1)

enum {
    ST_SNIFF,   /* first bytes peeked: TLS / HTTP/2 go to h2o */
    ST_HEAD,    /* reading a request head */
    ST_BODY,    /* receiving a PUT body into its reservation */
    ST_DISCARD, /* consuming a body that is not stored (dedup hit, bodies of other methods) */
    ST_CHUNKED, /* collecting a chunked body */
    ST_COLLECT, /* collecting a batch request's body (Content-Length, at most 1 MiB) */
    ST_WAIT,    /* PUT waiting for the in-flight budget, nothing read */
    ST_SEND,    /* sending the response */
    ST_LINGER,  /* answered and closing: our side shut, the peer's remaining bytes discarded */
};

typedef struct h1c_s h1c_t;

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
    int listen_fd;
    kvr_uring_op_t accept_op;
    int accepting;        /* an accept is in flight */
    int draining;
    uint64_t accept_paused_until;
    int fd_exhausted;     /* logged once per episode */
    const int *accept_fds; /* by process slot: the eventfd that gives a worker the turn */
    int parked;           /* not accepting: the turn was given to a less loaded worker */
    int yield_to;         /* the worker last given the turn ... */
    uint64_t yield_hb;    /* ... its heartbeat when last seen moving ... */
    uint64_t yield_ms;    /* ... and when */
    uint32_t published;   /* our connection count as last stored in our process slot */
    char scratch[64];     /* a valid address for recv(MSG_TRUNC), which discards without copying */
    h1c_t *conns;         /* every open connection */
    uint64_t nconns;
    h1c_t *wait_head, *wait_tail; /* PUTs waiting for the in-flight budget, oldest first */
    h1c_t *idle_head, *idle_tail; /* connections between requests, longest idle first */
    uint64_t max_conns;   /* --max-connections, or what RLIMIT_NOFILE allows */
    uint32_t nreclaim;    /* closed to make room and not yet freed */
    int pressure;         /* an episode of making room: logged at its start and end ... */
    uint64_t pressure_ms; /* ... which ends a second after the last room was made */
    int fd_warned;        /* "pausing accept" logged in this episode */
    uint64_t reclaimed;   /* connections closed in this episode */
    h1peer_t *peers[H1_PEER_BUCKETS];
    uint32_t npeers;      /* addresses remembered: connected, or within H1_PEER_KEEP_MS */
    uint64_t peers_swept_ms;
    unsigned chunked_conns;
    uint64_t last_tick_ms;
    char date[40];        /* "Date: ...\r\n", refreshed every second */
    time_t date_sec;
};

struct h1c_s {
    h1c_t *prev, *next;
    h1c_t *wprev, *wnext; /* the wait queue, while in ST_WAIT */
    kvr_h1_t *s;
    int fd;
    uint8_t state;
    uint8_t rbusy, wbusy; /* an operation of each direction in flight */
    uint8_t closing;      /* shut down: freed once nothing is in flight */
    uint8_t keep;         /* keep-alive after this response */
    uint8_t expect100;
    uint8_t chunked;
    uint8_t in_req;       /* res holds a handled request: kvr_api_done owed */
    uint8_t sent100;
    uint8_t sniff_wait;   /* peeked, waiting for a decision at the next tick */
    uint8_t post_drain;   /* consuming the body of a request answered from its head */
    uint8_t lowat;        /* SO_RCVLOWAT is raised (--recv-lowat) for this body's receive */
    uint8_t in_idle;      /* on the idle list: may be closed to make room */
    uint8_t reclaimed;    /* closed to make room (counted in nreclaim until freed) */
    uint8_t cut;          /* the read in flight was cancelled: answer 408 when it completes */
    uint8_t rate_on;      /* rate_ms / rate_mark hold a --min-body-rate window */
    h1c_t *iprev, *inext; /* the idle list */
    h1peer_t *peer;       /* NULL when the address could not be had */
    uint64_t held;        /* reservation bytes counted in peer->held */
    uint64_t head_ms;     /* the current head's first byte (0: none yet) */
    uint64_t rate_ms;     /* start of the current --body-rate-window ... */
    uint64_t rate_mark;   /* ... and TCP_INFO bytes received + acked then */
    const char *cut_why;
    kvr_uring_op_t rop, wop;
    uint64_t last_ms;     /* last byte moved, or the state began */
    uint64_t linger_until;
    uint64_t tcp_in, tcp_out; /* TCP_INFO byte counters at the last look */
    uint64_t start_us;
    unsigned method;
    uint64_t body_len, body_got;
    uint64_t bytes_in, bytes_out;
    size_t hlen;          /* bytes in hbuf */
    size_t hused;         /* bytes of hbuf that belong to the current request */
    size_t last_len;      /* hlen at the last incomplete parse */
    kvr_api_req_t rq;     /* points into hbuf until the request is done */
    struct msghdr msg;
    struct iovec iov[H1_IOV + 1];
    size_t out_len;
    uint64_t resp_total, resp_sent;
    char *cbuf;           /* chunked body */
    size_t clen, cdec, ccap;
    struct phr_chunked_decoder dec;
    char out[H1_OUT_MAX];
    kvr_api_res_t res;
    char hbuf[KVR_H1_HEAD_MAX];
};

static void conn_read(h1c_t *c);
static void arm_accept(kvr_h1_t *s);
static void accept_turn(kvr_h1_t *s, int woken);
static void conn_write(h1c_t *c);
static void conn_next(h1c_t *c);
static void on_read(kvr_uring_op_t *op, int res);
static void on_write(kvr_uring_op_t *op, int res);
static void start_request(h1c_t *c);
static void conn_unlink(h1c_t *c);
static void begin_body(h1c_t *c);
static void wake_waiters(kvr_h1_t *s);

/* ------------------------------------------------------------------ connections */

/* The wait queue: FIFO, so that the budget a finished PUT frees goes to the oldest waiter. */
static void wait_enter(h1c_t *c)
{
    kvr_h1_t *s = c->s;

    c->state = ST_WAIT;
    c->wnext = NULL;
    c->wprev = s->wait_tail;
    if (s->wait_tail != NULL)
        s->wait_tail->wnext = c;
    else
        s->wait_head = c;
    s->wait_tail = c;
}

static void wait_leave(h1c_t *c)
{
    kvr_h1_t *s = c->s;

    if (c->wprev == NULL && s->wait_head != c)
        return; /* not queued */
    if (c->wprev != NULL)
        c->wprev->wnext = c->wnext;
    else
        s->wait_head = c->wnext;
    if (c->wnext != NULL)
        c->wnext->wprev = c->wprev;
    else
        s->wait_tail = c->wprev;
    c->wprev = c->wnext = NULL;
}

/* The idle list: connections with no request in progress (accepted and silent, or between
 * two requests), in the order they became idle. Out of descriptors or at --max-connections,
 * the longest idle are closed first to make room (nginx's "reusable connections"). */
static void idle_enter(h1c_t *c)
{
    kvr_h1_t *s = c->s;

    if (c->in_idle)
        return;
    c->in_idle = 1;
    c->inext = NULL;
    c->iprev = s->idle_tail;
    if (s->idle_tail != NULL)
        s->idle_tail->inext = c;
    else
        s->idle_head = c;
    s->idle_tail = c;
}

static void idle_leave(h1c_t *c)
{
    kvr_h1_t *s = c->s;

    if (!c->in_idle)
        return;
    c->in_idle = 0;
    if (c->iprev != NULL)
        c->iprev->inext = c->inext;
    else
        s->idle_head = c->inext;
    if (c->inext != NULL)
        c->inext->iprev = c->iprev;
    else
        s->idle_tail = c->iprev;
    c->iprev = c->inext = NULL;
}

/* ------------------------------------------------------------------ peers */

static unsigned peer_bucket(const uint8_t *a)
{
    uint32_t h = 2166136261u;

    for (int i = 0; i < 16; i++)
        h = (h ^ a[i]) * 16777619u;
    return h % H1_PEER_BUCKETS;
}

/* Finds or adds the connection's peer; without an address (or memory) it has none and is
 * not limited by address. */
static void peer_attach(h1c_t *c)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    uint8_t a[16] = {0};
    h1peer_t **b, *p;

    if (getpeername(c->fd, (struct sockaddr *)&ss, &len) < 0)
        return;
    if (ss.ss_family == AF_INET) {
        a[10] = a[11] = 0xff;
        memcpy(a + 12, &((struct sockaddr_in *)&ss)->sin_addr, 4);
    } else if (ss.ss_family == AF_INET6) {
        memcpy(a, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
    } else {
        return;
    }
    b = &c->s->peers[peer_bucket(a)];
    for (p = *b; p != NULL && memcmp(p->addr, a, 16) != 0; p = p->next)
        ;
    if (p == NULL) {
        if (c->s->npeers >= H1_PEER_MAX || (p = calloc(1, sizeof(*p))) == NULL)
            return;
        memcpy(p->addr, a, 16);
        p->next = *b;
        *b = p;
        c->s->npeers++;
    }
    p->conns++;
    p->last_ms = c->last_ms;
    c->peer = p;
}

/* The record outlives the address's last connection by H1_PEER_KEEP_MS (peer_sweep): a
 * client that opens a connection per request is still one of the worker's clients between
 * two of them. */
static void peer_detach(h1c_t *c)
{
    h1peer_t *p = c->peer;

    if (p == NULL)
        return;
    c->peer = NULL;
    p->conns--;
    p->last_ms = kvr_clock_ms();
}

static void peer_sweep(kvr_h1_t *s, uint64_t t)
{
    if (t - s->peers_swept_ms < 1000)
        return;
    s->peers_swept_ms = t;
    for (int i = 0; i < H1_PEER_BUCKETS; i++)
        for (h1peer_t **b = &s->peers[i], *p; (p = *b) != NULL;)
            if (p->conns == 0 && p->held == 0 && t - p->last_ms > H1_PEER_KEEP_MS) {
                *b = p->next;
                free(p);
                s->npeers--;
            } else {
                b = &p->next;
            }
}

/* What the peer holds of the budget follows the connection's reservation. The share binds
 * only while the worker has other clients to protect: a lone client (one engine, a bench
 * run) may use the whole budget. */
static uint64_t peer_held(const h1c_t *c)
{
    return c->peer != NULL && c->s->npeers > 1 ? c->peer->held : 0;
}

static void peer_take(h1c_t *c)
{
    if (c->res.put != KVR_API_PUT_RESERVED || c->peer == NULL)
        return;
    c->held = c->res.put_len;
    c->peer->held += c->held;
}

static void peer_give(h1c_t *c)
{
    if (c->peer != NULL)
        c->peer->held -= c->held;
    c->held = 0;
}

/* ------------------------------------------------------------------ making room */

static void conn_close(h1c_t *c);

/* Closes up to n of the longest-idle connections; returns how many. */
static unsigned reclaim(kvr_h1_t *s, unsigned n, const char *why)
{
    unsigned k = 0;

    while (k < n && s->idle_head != NULL) {
        h1c_t *c = s->idle_head;
        idle_leave(c);
        c->reclaimed = 1;
        s->nreclaim++;
        conn_close(c);
        k++;
    }
    if (k > 0) {
        if (!s->pressure)
            kvr_warn("h1: %s with %llu connections open: closing the longest-idle ones to make room", why,
                     (unsigned long long)s->nconns);
        s->pressure = 1;
        s->pressure_ms = kvr_clock_ms();
        s->reclaimed += k;
    }
    return k;
}

static void conn_free(h1c_t *c)
{
    kvr_h1_t *s = c->s;

    wait_leave(c);
    idle_leave(c);
    peer_give(c);
    peer_detach(c);
    if (c->reclaimed)
        s->nreclaim--;
    if (c->in_req) {
        kvr_api_done(s->api, &c->res, c->method, c->start_us, c->bytes_in, c->bytes_out);
        c->in_req = 0;
    }
    if (c->cbuf != NULL) {
        free(c->cbuf);
        s->chunked_conns--;
    }
    conn_unlink(c);
    close(c->fd);
    free(c);
    if (s->fd_exhausted && !s->accepting) { /* a descriptor is free now: take the next client */
        s->accept_paused_until = 0;
        arm_accept(s);
    } else if (s->pressure && !s->accepting) {
        accept_turn(s, 0);
    }
}

/* Ends the connection: in-flight operations complete with errors once the socket is shut;
 * the record goes with the last of them. */
static void conn_close(h1c_t *c)
{
    if (!c->closing) {
        c->closing = 1;
        wait_leave(c);
        idle_leave(c);
        shutdown(c->fd, SHUT_RDWR);
        /* An abandoned PUT gives its reservation back now, unless a receive into it is still
         * in flight: the kernel may yet copy bytes queued on the socket into those pages, so
         * they go back when it completes (conn_free), which the shutdown hastens. */
        if (c->in_req && c->res.put != KVR_API_PUT_NONE && !c->rbusy) {
            peer_give(c);
            kvr_api_put_end(c->s->api, &c->res, 0);
        }
    }
    if (!c->rbusy && !c->wbusy)
        conn_free(c);
}

static void conn_unlink(h1c_t *c)
{
    kvr_h1_t *s = c->s;

    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    s->nconns--;
}

/* Called from the peek's completion: nothing of ours is in flight and nothing was consumed. */
static void adopt_to_h2o(h1c_t *c)
{
    kvr_h1_t *s = c->s;

    if (kvr_http_adopt(s->http, c->fd) != KVR_OK) {
        /* h2o is at --h2o-max-connections: the client waits here and we look again later */
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "h1: TLS/h2c connection waits: %llu open in h2o",
                            (unsigned long long)kvr_http_connections(s->http));
        c->sniff_wait = 1;
        return;
    }
    idle_leave(c);
    peer_detach(c);
    conn_unlink(c); /* the descriptor lives on in h2o */
    free(c);
}

static void conn_new(kvr_h1_t *s, int fd)
{
    h1c_t *c = malloc(sizeof(*c));
    int one = 1;

    if (c == NULL) {
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "h1: out of memory for a connection");
        close(fd);
        return;
    }
    memset(c, 0, offsetof(h1c_t, out));
    kvr_api_res_reset(&c->res);
    c->s = s;
    c->fd = fd;
    c->rop.cb = on_read;
    c->rop.data = c;
    c->wop.cb = on_write;
    c->wop.data = c;
    c->last_ms = kvr_clock_ms();
    c->state = ST_SNIFF;
    c->next = s->conns;
    if (s->conns != NULL)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    peer_attach(c);
    idle_enter(c); /* silent so far: the first to go when room is needed */
    conn_read(c);
}

/* ------------------------------------------------------------------ responses */

static void refresh_date(kvr_h1_t *s)
{
    time_t t = time(NULL);
    struct tm tm;

    if (t == s->date_sec)
        return;
    s->date_sec = t;
    gmtime_r(&t, &tm);
    strftime(s->date, sizeof(s->date), "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
}

/* A response head is assembled by hand rather than with snprintf, which cost about 2 % of a
 * worker's CPU at 16 KiB GETs. Every append is bounded by the head buffer; the strings are the
 * server's own (status reasons, content types, one extra header), so nothing is ever cut. */
typedef struct {
    char *p;
    char *end;
} h1_head_t;

static void head_str(h1_head_t *h, const char *str)
{
    size_t n = strlen(str);

    if (n > (size_t)(h->end - h->p))
        n = (size_t)(h->end - h->p);
    memcpy(h->p, str, n);
    h->p += n;
}

static void head_u64(h1_head_t *h, uint64_t v)
{
    char tmp[20];
    size_t n = 0;

    do {
        tmp[sizeof(tmp) - ++n] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    if (n > (size_t)(h->end - h->p))
        n = (size_t)(h->end - h->p);
    memcpy(h->p, tmp + sizeof(tmp) - n, n);
    h->p += n;
}

/* Builds the response head and starts sending head + body. */
static void respond(h1c_t *c)
{
    kvr_api_res_t *res = &c->res;
    kvr_h1_t *s = c->s;
    h1_head_t h = {c->out, c->out + sizeof(c->out)};

    if (res->close || s->draining)
        c->keep = 0;
    refresh_date(s);
    head_str(&h, "HTTP/1.1 ");
    head_u64(&h, (uint64_t)res->status);
    head_str(&h, " ");
    head_str(&h, res->reason);
    head_str(&h, "\r\nServer: kvrelay\r\n");
    head_str(&h, s->date);
    head_str(&h, "Content-Length: ");
    head_u64(&h, res->length);
    head_str(&h, "\r\n");
    if (res->ctype != NULL) {
        head_str(&h, "Content-Type: ");
        head_str(&h, res->ctype);
        head_str(&h, "\r\n");
    }
    if (res->hdr_name != NULL) {
        head_str(&h, res->hdr_name);
        head_str(&h, ": ");
        head_str(&h, res->hdr_value);
        head_str(&h, "\r\n");
    }
    head_str(&h, c->keep ? "\r\n" : "Connection: close\r\n\r\n");
    c->out_len = (size_t)(h.p - c->out);
    c->resp_total = c->out_len + (res->head_only ? 0 : res->length);
    c->resp_sent = 0;
    c->state = ST_SEND;
    c->rate_on = 0;
    c->last_ms = kvr_clock_ms();
    conn_write(c);
}

/* An error found by the transport itself (framing, limits): JSON, then the connection ends. */
static void respond_error_hdr(h1c_t *c, int status, const char *code, const char *msg, const char *hname,
                              const char *hval)
{
    if (!c->in_req) {
        kvr_api_res_reset(&c->res);
        c->in_req = 1;
        c->start_us = kvr_clock_us();
    }
    if (c->res.put != KVR_API_PUT_NONE) {
        peer_give(c);
        kvr_api_put_end(c->s->api, &c->res, 0);
    }
    if (c->res.pinned) {
        kvr_store_unpin(c->s->api->store, &c->res.ref);
        c->res.pinned = 0;
    }
    free(c->res.heap);
    c->res.heap = NULL;
    kvr_api_error(&c->res, status, code, msg);
    c->res.hdr_name = hname;
    c->res.hdr_value = hval;
    c->keep = 0;
    respond(c);
}

static void respond_error(h1c_t *c, int status, const char *code, const char *msg)
{
    respond_error_hdr(c, status, code, msg, NULL, NULL);
}

/* Fills the iovecs for what is left to send. */
static size_t send_iov(h1c_t *c)
{
    kvr_api_res_t *res = &c->res;
    uint64_t off = c->resp_sent;
    size_t n = 0;

    if (off < c->out_len) {
        c->iov[n].iov_base = c->out + off;
        c->iov[n].iov_len = c->out_len - off;
        n++;
        off = 0;
    } else {
        off -= c->out_len;
    }
    if (res->head_only || off >= res->length)
        return n;
    if (res->body == KVR_API_BODY_BLOCK) {
        n += kvr_api_block_iov(c->s->api, res, off, c->iov + n, H1_IOV);
    } else {
        c->iov[n].iov_base = (char *)kvr_api_body_bytes(res) + off;
        c->iov[n].iov_len = res->length - off;
        n++;
    }
    return n;
}

static int zc_wanted(const h1c_t *c)
{
    uint64_t min = c->s->cfg->send_zc_min;

    return min > 0 && c->state == ST_SEND && c->res.body == KVR_API_BODY_BLOCK && !c->res.head_only &&
           c->res.length >= min;
}

static void conn_write(h1c_t *c)
{
    memset(&c->msg, 0, sizeof(c->msg));
    c->msg.msg_iov = c->iov;
    c->msg.msg_iovlen = send_iov(c);
    /* One completion for the whole response (or the 64 spans of this batch). With
     * --send-zc-min, a large block goes out zero-copy: the completion comes once the kernel
     * lets go of its pages, and the pin is held until then (kvr_api_done after it). */
    if ((zc_wanted(c) ? kvr_uring_sendmsg_zc : kvr_uring_sendmsg)(&c->s->ring, c->fd, &c->msg, MSG_WAITALL,
                                                                    &c->wop) != KVR_OK) {
        conn_close(c);
        return;
    }
    c->wbusy = 1;
}

/* The response is out: account for it, then the next request or the end. */
static void response_done(h1c_t *c)
{
    if (c->keep && c->res.drain && !c->expect100) {
        /* Answered from the head: the body follows and is consumed before the next request
         * (body_complete comes back here with drain cleared). */
        c->res.drain = 0;
        c->post_drain = 1;
        c->state = ST_DISCARD;
        c->last_ms = kvr_clock_ms();
        begin_body(c);
        return;
    }
    kvr_api_done(c->s->api, &c->res, c->method, c->start_us, c->bytes_in, c->bytes_out);
    c->in_req = 0;
    if (!c->keep || c->res.drain) {
        /* Lingering close: our side ends now; whatever the peer still sends is discarded for
         * a moment so that it reads our answer instead of a reset. */
        shutdown(c->fd, SHUT_WR);
        c->state = ST_LINGER;
        c->last_ms = kvr_clock_ms();
        c->linger_until = c->last_ms + H1_LINGER_MS;
        conn_read(c);
        return;
    }
    conn_next(c);
}

static void on_write(kvr_uring_op_t *op, int res)
{
    h1c_t *c = op->data;

    c->wbusy = 0;
    if (c->closing || res <= 0) {
        conn_close(c);
        return;
    }
    c->last_ms = kvr_clock_ms();
    if (c->state == ST_SEND)
        c->resp_sent += (uint64_t)res;
    if (c->resp_sent > c->out_len)
        c->bytes_out = c->resp_sent - c->out_len;
    if (c->state == ST_SEND && c->resp_sent < c->resp_total) {
        conn_write(c);
        return;
    }
    if (c->state == ST_SEND) {
        response_done(c);
        return;
    }
    /* "100 Continue" went out: the body may come now. */
    conn_read(c);
}

/* ------------------------------------------------------------------ request heads */

static int hdr_is(const struct phr_header *h, const char *name)
{
    size_t n = strlen(name);
    return h->name_len == n && strncasecmp(h->name, name, n) == 0;
}

static int val_is(const struct phr_header *h, const char *v)
{
    size_t n = strlen(v);
    return h->value_len == n && strncasecmp(h->value, v, n) == 0;
}

/* Strict Content-Length: digits only, no overflow. */
static int parse_length(const char *p, size_t n, uint64_t *out)
{
    uint64_t v = 0;

    if (n == 0 || n > 19)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    *out = v;
    return 0;
}

/* One Transfer-Encoding field value, a list of codings (RFC 9110 §5.6.1: empty elements and
 * the whitespace around commas are ignored): counts the chunked ones and the others. */
static void te_codings(const struct phr_header *h, unsigned *chunked, unsigned *other)
{
    const char *p = h->value, *end = h->value + h->value_len;

    while (p < end) {
        const char *e = memchr(p, ',', (size_t)(end - p)), *b = p, *t;
        if (e == NULL)
            e = end;
        p = e < end ? e + 1 : end;
        while (b < e && (*b == ' ' || *b == '\t'))
            b++;
        for (t = e; t > b && (t[-1] == ' ' || t[-1] == '\t'); t--)
            ;
        if (t == b)
            continue;
        if (t - b == 7 && strncasecmp(b, "chunked", 7) == 0)
            (*chunked)++;
        else
            (*other)++; /* gzip, identity, parameters: nothing but plain chunked is decoded */
    }
}

/* Framing and the headers the request layer needs. 0, or -1 after answering an error. */
static int read_headers(h1c_t *c, const struct phr_header *hd, size_t nh, int minor)
{
    int have_len = 0, te = 0, conn_close_hdr = 0, conn_keep = 0;
    unsigned te_chunked = 0, te_other = 0;
    uint64_t len = 0, l;

    /* RFC 9112 §5.2: obs-fold is refused before any field is read. picohttpparser reports a
     * continuation line as a field of its own with no name, after the field it continues, so
     * in one pass "Transfer-Encoding:\r\n chunked" was first seen as an empty coding (501). */
    for (size_t i = 0; i < nh; i++)
        if (hd[i].name == NULL) {
            respond_error(c, 400, "InvalidRequest", "obsolete header line folding");
            return -1;
        }
    for (size_t i = 0; i < nh; i++) {
        const struct phr_header *h = &hd[i];
        if (hdr_is(h, "content-length")) {
            if (parse_length(h->value, h->value_len, &l) < 0 || (have_len && l != len)) {
                respond_error(c, 400, "InvalidRequest", "invalid or conflicting Content-Length");
                return -1;
            }
            have_len = 1;
            len = l;
        } else if (hdr_is(h, "transfer-encoding")) {
            te = 1; /* every field counts: two fields are one list (RFC 9110 §5.3) */
            te_codings(h, &te_chunked, &te_other);
        } else if (hdr_is(h, "connection")) {
            conn_close_hdr |= val_is(h, "close");
            conn_keep |= val_is(h, "keep-alive");
        } else if (hdr_is(h, "expect")) {
            if (!val_is(h, "100-continue")) {
                respond_error(c, 400, "InvalidRequest", "unsupported Expect");
                return -1;
            }
            c->expect100 = 1;
        } else if (hdr_is(h, "authorization")) {
            c->rq.auth = h->value;
            c->rq.auth_len = h->value_len;
        } else if (hdr_is(h, "x-kv-sequence-hash")) {
            c->rq.seq_hash = h->value;
            c->rq.seq_hash_len = h->value_len;
        }
    }
    /* Malformed framing first (400): chunked applied twice (RFC 9112 §7: never more than
     * once), a Transfer-Encoding that names no coding, or one beside a Content-Length. Then a
     * coding we cannot decode (501, RFC 9112 §6.1). Every one leaves the body's length
     * unknown: the answer closes the connection. */
    if (te && (te_chunked > 1 || te_chunked + te_other == 0)) {
        respond_error(c, 400, "InvalidRequest",
                      te_chunked > 1 ? "chunked applied more than once" : "empty Transfer-Encoding");
        return -1;
    }
    if (te && have_len) { /* RFC 9112 §6.1: a request smuggling vector; refuse and close */
        respond_error(c, 400, "InvalidRequest", "Content-Length together with Transfer-Encoding");
        return -1;
    }
    if (te_other > 0) {
        respond_error(c, 501, "NotImplemented", "only Transfer-Encoding: chunked is supported");
        return -1;
    }
    if (!te && !have_len && (c->method == KVR_M_PUT || c->method == KVR_M_POST)) {
        respond_error(c, 411, "InvalidRequest", "a PUT or POST needs Content-Length or chunked encoding");
        return -1;
    }
    c->keep = minor >= 1 ? !conn_close_hdr : conn_keep;
    c->chunked = (uint8_t)te;
    c->body_len = len;
    c->rq.body_len = len;
    c->rq.length_unknown = te;
    return 0;
}

/* Bytes of the body that came in with the head. */
static size_t preread(const h1c_t *c)
{
    return c->hlen - c->hused;
}

static void begin_body(h1c_t *c);
static void wake_waiters(kvr_h1_t *s);
static void response_done(h1c_t *c);

/* Parses a complete head out of hbuf; asks for more when it is not complete. */
static void parse_head(h1c_t *c)
{
    const char *method, *path;
    size_t mlen, plen, nh = H1_MAX_HEADERS;
    struct phr_header hd[H1_MAX_HEADERS];
    int minor, n;

    n = phr_parse_request(c->hbuf, c->hlen, &method, &mlen, &path, &plen, &minor, hd, &nh, c->last_len);
    if (n == -2) {
        if (c->hlen >= KVR_API_MAX_HEAD) {
            respond_error(c, 431, "InvalidRequest", "request headers larger than 16 KiB");
            return;
        }
        c->last_len = c->hlen;
        conn_read(c);
        return;
    }
    c->start_us = kvr_clock_us();
    c->in_req = 1;
    kvr_api_res_reset(&c->res);
    memset(&c->rq, 0, sizeof(c->rq));
    c->expect100 = c->sent100 = c->post_drain = 0;
    c->bytes_in = c->bytes_out = 0;
    c->body_got = 0;
    c->method = n > 0 ? kvr_api_method(method, mlen) : KVR_M_OTHER;
    if (n < 0) {
        respond_error(c, 400, "InvalidRequest", "malformed request head");
        return;
    }
    if ((size_t)n > KVR_API_MAX_HEAD) {
        respond_error(c, 431, "InvalidRequest", "request headers larger than 16 KiB");
        return;
    }
    c->hused = (size_t)n;
    c->last_len = 0;
    c->rq.method = c->method;
    c->rq.path = path;
    c->rq.path_len = plen;
    for (size_t i = 0; i < plen; i++)
        if (path[i] == '?') {
            c->rq.path_len = i;
            break;
        }
    c->rq.head_bytes = (size_t)n;
    if (read_headers(c, hd, nh, minor) < 0)
        return;
    start_request(c);
}

/* Asks the request layer; carries out what it decides. */
static void start_request(h1c_t *c)
{
    kvr_api_res_t *res = &c->res;

    if (c->method != KVR_M_PUT && c->method != KVR_M_POST && (c->body_len > 0 || c->chunked)) {
        if (c->chunked || c->body_len > c->s->cfg->max_block_size) {
            respond_error(c, c->chunked ? 400 : 413, c->chunked ? "InvalidRequest" : "EntityTooLarge",
                          "this request's body is not accepted");
            return;
        }
        kvr_api_handle(c->s->api, &c->rq, res);
        c->state = ST_DISCARD; /* answered once the unused body has been consumed */
        begin_body(c);
        return;
    }
    c->rq.peer_held = peer_held(c);
    kvr_api_handle(c->s->api, &c->rq, res);
    peer_take(c);
    switch (res->put) {
    case KVR_API_BODY_WANTED:
        if (c->s->chunked_conns >= KVR_H1_CHUNKED_CONNS || (c->cbuf = malloc(c->body_len + 1)) == NULL) {
            res->put = KVR_API_PUT_NONE;
            respond_error_hdr(c, 503, "Busy", "too many request bodies in memory in this worker; retry",
                              "retry-after", H1_RETRY_AFTER);
            return;
        }
        c->s->chunked_conns++;
        c->state = ST_COLLECT;
        begin_body(c);
        return;
    case KVR_API_PUT_WAIT:
        wait_enter(c);
        c->last_ms = kvr_clock_ms();
        return;
    case KVR_API_PUT_RESERVED:
        c->state = ST_BODY;
        begin_body(c);
        return;
    case KVR_API_PUT_DEDUP:
        c->state = ST_DISCARD;
        begin_body(c);
        return;
    case KVR_API_PUT_DEFERRED:
        if (c->s->chunked_conns >= KVR_H1_CHUNKED_CONNS) {
            respond_error_hdr(c, 503, "Busy", "too many chunked uploads in this worker; retry", "retry-after",
                              H1_RETRY_AFTER);
            return;
        }
        c->s->chunked_conns++;
        c->cbuf = NULL;
        c->clen = c->cdec = c->ccap = 0;
        memset(&c->dec, 0, sizeof(c->dec));
        c->dec.consume_trailer = 1;
        c->state = ST_CHUNKED;
        begin_body(c);
        return;
    default:
        respond(c);
    }
}

/* ------------------------------------------------------------------ bodies */

static void body_complete(h1c_t *c)
{
    kvr_api_res_t *res = &c->res;

    c->hused += c->body_len < preread(c) ? c->body_len : preread(c);
    if (c->post_drain) {
        c->post_drain = 0;
        response_done(c);
        return;
    }
    if (c->state == ST_COLLECT) {
        kvr_api_batch(c->s->api, &c->rq, c->cbuf, c->body_len, res);
        free(c->cbuf);
        c->cbuf = NULL;
        c->s->chunked_conns--;
    } else if (res->put != KVR_API_PUT_NONE) {
        peer_give(c);
        kvr_api_put_end(c->s->api, res, 1);
    }
    respond(c);
}

/* "100 Continue": the body may come now; on_write starts its read. */
static void send_continue(h1c_t *c)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";

    c->sent100 = 1;
    if (kvr_uring_send(&c->s->ring, c->fd, cont, sizeof(cont) - 1, &c->wop) != KVR_OK) {
        conn_close(c);
        return;
    }
    c->wbusy = 1;
}

/* Consumes what arrived with the head, then reads the rest (after "100 Continue"). */
static void begin_body(h1c_t *c)
{
    size_t pre = preread(c);

    c->last_ms = kvr_clock_ms();
    c->rate_on = 0;
    if (c->state == ST_CHUNKED) {
        /* the preread bytes are taken in conn_read's chunked path; with none, a client that
         * asked for "100 Continue" waits for it before the first chunk */
        if (pre == 0 && c->expect100 && !c->sent100)
            send_continue(c);
        else
            conn_read(c);
        return;
    }
    if (pre > c->body_len)
        pre = (size_t)c->body_len;
    if (c->state == ST_BODY && pre > 0)
        kvr_api_put_write(c->s->api, &c->res, 0, c->hbuf + c->hused, pre);
    if (c->state == ST_COLLECT && pre > 0)
        memcpy(c->cbuf, c->hbuf + c->hused, pre);
    c->body_got = pre;
    c->bytes_in = pre;
    if (c->body_got == c->body_len) {
        body_complete(c);
        return;
    }
    if (c->expect100 && !c->sent100) {
        send_continue(c);
        return;
    }
    conn_read(c);
}

/* Chunked: new raw bytes are at cbuf[cdec, clen); decode them in place. */
static void chunked_input(h1c_t *c)
{
    size_t n = c->clen - c->cdec;
    ssize_t left = phr_decode_chunked(&c->dec, c->cbuf + c->cdec, &n);

    c->clen = c->cdec + n; /* decoded prefix; the decoder dropped the framing */
    c->cdec = c->clen;
    if (left == -1) {
        respond_error(c, 400, "InvalidRequest", "malformed chunked body");
        return;
    }
    if (c->cdec > KVR_H1_CHUNKED_MAX) {
        respond_error(c, 413, "EntityTooLarge", "chunked body larger than 8 MiB");
        return;
    }
    if (left == -2) {
        conn_read(c);
        return;
    }
    /* The body is whole. The request is decided now, while c->rq (path, Authorization,
     * X-KV-Sequence-Hash) still points into the head in hbuf. */
    c->rq.length_unknown = 0;
    c->rq.body_len = c->body_len = c->cdec;
    c->bytes_in = c->cdec;
    kvr_api_res_reset(&c->res);
    c->rq.peer_held = peer_held(c);
    kvr_api_handle(c->s->api, &c->rq, &c->res);
    if (c->res.put == KVR_API_PUT_WAIT) { /* the body is here already: no budget to wait for */
        c->rq.buffered = 1;
        kvr_api_res_reset(&c->res);
        kvr_api_handle(c->s->api, &c->rq, &c->res);
    }
    peer_take(c);
    if (c->res.put == KVR_API_PUT_RESERVED)
        kvr_api_put_write(c->s->api, &c->res, 0, c->cbuf, c->cdec);
    /* Only then may the bytes after the body's end, the next requests, replace the head:
     * copied earlier they overwrote the path the request layer was about to read (a pipelined
     * "GET /healthz" turned the PUT before it into a 404). They are at most one read, which
     * conn_read bounds by the head buffer, so they always fit. */
    if (left > 0 && (size_t)left <= sizeof(c->hbuf)) {
        memcpy(c->hbuf, c->cbuf + c->cdec, (size_t)left);
        c->hlen = (size_t)left;
    } else {
        c->hlen = 0;
        if (left > 0)
            c->keep = 0; /* cannot happen (see conn_read); never parse a torn request */
    }
    free(c->cbuf);
    c->cbuf = NULL;
    c->s->chunked_conns--;
    c->hused = 0;    /* every preread byte went into cbuf; hbuf holds only what follows */
    c->body_len = 0; /* body_complete must not count preread again */
    body_complete(c);
}

static int chunked_grow(h1c_t *c, size_t need)
{
    size_t cap = c->ccap ? c->ccap : 64u << 10;
    char *p;

    while (cap < need)
        cap *= 2;
    if (cap > KVR_H1_CHUNKED_MAX + (64u << 10))
        cap = KVR_H1_CHUNKED_MAX + (64u << 10);
    if (cap < need)
        return -1;
    if (cap == c->ccap)
        return 0;
    p = realloc(c->cbuf, cap);
    if (p == NULL)
        return -1;
    c->cbuf = p;
    c->ccap = cap;
    return 0;
}

/* ------------------------------------------------------------------ reads */

/* --recv-lowat L: while a PUT body is received, the socket wakes the ring (and so the
 * receive's retry, and the window update it sends) once L bytes are queued instead of once per
 * arriving segment. A receive must never wait for bytes that will not come, so the raised mark
 * covers the body but its last L bytes: those, and every other read, run at the default mark
 * of 1. Returns the bytes the next body receive may ask for. */
static uint64_t body_lowat(h1c_t *c, uint64_t want)
{
    uint64_t l = c->s->cfg->recv_lowat;
    int v;

    if (l > 0 && want >= 2 * l) {
        if (!c->lowat) {
            v = (int)l;
            if (setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) == 0)
                c->lowat = 1;
        }
        return c->lowat ? want - l : want;
    }
    if (c->lowat) {
        v = 1;
        setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v));
        c->lowat = 0;
    }
    return want;
}

/* Caps iov[0..n) at max bytes in all; returns the new count. */
static int iov_cap(struct iovec *iov, int n, uint64_t max)
{
    uint64_t sum = 0;

    for (int i = 0; i < n; i++) {
        if (sum + iov[i].iov_len >= max) {
            iov[i].iov_len = max - sum;
            return iov[i].iov_len > 0 ? i + 1 : i;
        }
        sum += iov[i].iov_len;
    }
    return n;
}

static void conn_read(h1c_t *c)
{
    kvr_h1_t *s = c->s;
    uint64_t want;
    int rc;

    if (c->closing) {
        conn_close(c);
        return;
    }
    if (c->lowat && c->state != ST_BODY)
        body_lowat(c, 0);
    switch (c->state) {
    case ST_SNIFF:
        rc = kvr_uring_recv_flags(&s->ring, c->fd, c->hbuf, H2_PREFACE_LEN, MSG_PEEK, &c->rop);
        break;
    case ST_HEAD: {
        /* At most H1_HEAD_READ per read: a head is a few hundred bytes, and what the read takes
         * beyond it is body that must then be copied from here into the arena (a user-space copy
         * the kernel would otherwise do straight into the reservation). */
        size_t room = sizeof(c->hbuf) - c->hlen;
        rc = kvr_uring_recv(&s->ring, c->fd, c->hbuf + c->hlen, room < H1_HEAD_READ ? room : H1_HEAD_READ, &c->rop);
        break;
    }
    case ST_BODY:
        memset(&c->msg, 0, sizeof(c->msg));
        c->msg.msg_iov = c->iov;
        c->msg.msg_iovlen = kvr_api_txn_iov(s->api, &c->res, c->body_got, c->iov, H1_IOV);
        if (s->cfg->recv_lowat > 0 || c->lowat)
            c->msg.msg_iovlen = iov_cap(c->iov, (int)c->msg.msg_iovlen, body_lowat(c, c->body_len - c->body_got));
        /* One completion for the body (or the 64 spans of this batch): the kernel waits for all
         * of it; progress in between is seen through TCP_INFO (moved()). */
        rc = kvr_uring_recvmsg(&s->ring, c->fd, &c->msg, MSG_WAITALL, &c->rop);
        break;
    case ST_COLLECT:
        c->iov[0].iov_base = c->cbuf + c->body_got;
        c->iov[0].iov_len = c->body_len - c->body_got;
        memset(&c->msg, 0, sizeof(c->msg));
        c->msg.msg_iov = c->iov;
        c->msg.msg_iovlen = 1;
        rc = kvr_uring_recvmsg(&s->ring, c->fd, &c->msg, MSG_WAITALL, &c->rop);
        break;
    case ST_DISCARD:
    case ST_LINGER:
        want = c->state == ST_LINGER ? (1u << 30) : c->body_len - c->body_got;
        rc = kvr_uring_recv_flags(&s->ring, c->fd, s->scratch, want > (1u << 30) ? (1u << 30) : want, MSG_TRUNC,
                                  &c->rop);
        break;
    case ST_CHUNKED:
        if (preread(c) > 0) { /* bytes that came with the head first */
            size_t pre = preread(c);
            if (chunked_grow(c, c->clen + pre) < 0) {
                respond_error(c, 413, "EntityTooLarge", "chunked body larger than 8 MiB");
                return;
            }
            memcpy(c->cbuf + c->clen, c->hbuf + c->hused, pre);
            c->clen += pre;
            c->hused = c->hlen;
            chunked_input(c);
            return;
        }
        if (chunked_grow(c, c->clen + (16u << 10)) < 0) {
            respond_error(c, 413, "EntityTooLarge", "chunked body larger than 8 MiB");
            return;
        }
        /* At most a head buffer per read: what a read takes beyond the body's end is the next
         * requests, and chunked_input must be able to hand all of it back to the head buffer. */
        want = c->ccap - c->clen;
        if (want > sizeof(c->hbuf))
            want = sizeof(c->hbuf);
        rc = kvr_uring_recv(&s->ring, c->fd, c->cbuf + c->clen, (size_t)want, &c->rop);
        break;
    default:
        return;
    }
    if (rc != KVR_OK) {
        conn_close(c);
        return;
    }
    c->rbusy = 1;
}

/* The first bytes decide who serves the connection. */
static void sniffed(h1c_t *c, int n)
{
    size_t cmp = (size_t)n < H2_PREFACE_LEN ? (size_t)n : H2_PREFACE_LEN;

    if (c->head_ms == 0)
        c->head_ms = kvr_clock_ms(); /* --header-timeout runs from here */
    if (kvr_http_tls(c->s->http)) { /* a TLS port serves TLS only: h2o refuses the rest */
        adopt_to_h2o(c);
        return;
    }
    if (memcmp(c->hbuf, h2_preface, cmp) == 0) {
        if (cmp >= 4) { /* "PRI " is the HTTP/2 preface and nothing else */
            adopt_to_h2o(c);
            return;
        }
        c->sniff_wait = 1; /* too few bytes to tell: look again at the next tick */
        return;
    }
    c->state = ST_HEAD;
    c->hlen = 0;
    conn_read(c);
}

static void on_read(kvr_uring_op_t *op, int res)
{
    h1c_t *c = op->data;

    c->rbusy = 0;
    idle_leave(c);
    if (c->closing) {
        conn_close(c);
        return;
    }
    if (c->cut) { /* cancelled by the tick: a deadline passed (kvr_h1_tick) */
        c->cut = 0;
        if (c->state == ST_HEAD)
            c->method = KVR_M_OTHER; /* counted as no method: the head never said one */
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "h1: 408 after %s", c->cut_why);
        respond_error(c, 408, "RequestTimeout", c->cut_why);
        return;
    }
    if (res <= 0) {
        if (c->state == ST_BODY || c->state == ST_DISCARD || c->state == ST_CHUNKED || c->state == ST_COLLECT)
            KVR_LOG_RATELIMITED(KVR_LOG_DEBUG, "h1: connection ended inside a body (%d)", res);
        conn_close(c);
        return;
    }
    if (c->state == ST_SNIFF) { /* a peek moves nothing: it does not count as progress */
        sniffed(c, res);
        return;
    }
    c->last_ms = kvr_clock_ms();
    switch (c->state) {
    case ST_HEAD:
        if (c->head_ms == 0)
            c->head_ms = c->last_ms;
        c->hlen += (size_t)res;
        parse_head(c);
        return;
    case ST_BODY:
    case ST_DISCARD:
    case ST_COLLECT:
        c->body_got += (uint64_t)res;
        c->bytes_in += (uint64_t)res;
        if (c->body_got >= c->body_len)
            body_complete(c);
        else
            conn_read(c);
        return;
    case ST_CHUNKED:
        c->clen += (size_t)res;
        chunked_input(c);
        return;
    case ST_LINGER:
        conn_read(c);
        return;
    default:
        return;
    }
}

/* Keep-alive: the next request, which may already be (partly) in the head buffer. */
static void conn_next(h1c_t *c)
{
    size_t left = c->hlen - c->hused;

    if (left > 0)
        memmove(c->hbuf, c->hbuf + c->hused, left);
    c->hlen = left;
    c->hused = 0;
    c->last_len = 0;
    c->state = ST_HEAD;
    c->last_ms = kvr_clock_ms();
    c->head_ms = left > 0 ? c->last_ms : 0;
    if (c->s->draining) {
        conn_close(c);
        return;
    }
    if (left > 0) {
        parse_head(c);
    } else {
        idle_enter(c);
        conn_read(c);
    }
}

/* ------------------------------------------------------------------ accept */

/* The client connections we hold: ours and those handed to h2o. */
static uint32_t held(const kvr_h1_t *s)
{
    return (uint32_t)(s->nconns + kvr_http_connections(s->http));
}

static void arm_accept(kvr_h1_t *s)
{
    if (s->accepting || s->draining || s->listen_fd < 0)
        return;
    if (held(s) - s->nreclaim >= s->max_conns && s->idle_head == NULL) {
        /* at --max-connections and nothing idle to close: newcomers wait in the listener's
         * queue (or are taken by another worker) until a connection here ends */
        if (!s->pressure)
            kvr_warn("h1: %llu connections open, none idle (--max-connections %llu): not accepting until one ends",
                     (unsigned long long)held(s), (unsigned long long)s->max_conns);
        s->pressure = 1;
        s->pressure_ms = kvr_clock_ms();
        return;
    }
    if (kvr_uring_accept(&s->ring, s->listen_fd, &s->accept_op) == KVR_OK)
        s->accepting = 1;
}

/* 1 when the worker in slot `to`, given the turn, has not looped for H1_ACCEPT_STALL_MS (or no
 * longer serves): we accept in its place. */
static int turn_stalled(kvr_h1_t *s, int to, uint64_t t)
{
    uint32_t conns;
    uint64_t hb;

    if (!kvr_seg_worker_load(s->api->seg, to, &conns, &hb))
        return 1;
    if (to != s->yield_to || hb != s->yield_hb) {
        s->yield_to = to;
        s->yield_hb = hb;
        s->yield_ms = t;
        return 0;
    }
    return t - s->yield_ms >= H1_ACCEPT_STALL_MS;
}

/*
 * Accept turns (docs/concurrency.md): publishes our connection count, then accepts while we
 * hold at most H1_ACCEPT_SLACK more than the least loaded worker; past that, once our accept
 * in flight has completed, we stop and wake that worker, which then takes the turn. Called
 * after each accept, when our count changes, when woken (`woken`: a turn given to us is passed
 * on, never dropped, if by our counts it is another's), and every tick.
 */
static void accept_turn(kvr_h1_t *s, int woken)
{
    uint32_t n = held(s);
    int to;

    if (n != s->published) {
        kvr_seg_set_conns(s->api->seg, n);
        s->published = n;
    }
    if (s->draining || s->fd_exhausted)
        return;
    to = kvr_seg_accept_yield(s->api->seg, n, H1_ACCEPT_SLACK);
    if (to < 0 || turn_stalled(s, to, kvr_clock_ms())) {
        s->parked = 0;
        arm_accept(s);
    } else if ((!s->parked || woken) && !s->accepting) {
        s->parked = 1;
        kvr_relay_wake(s->accept_fds[to]);
    }
}

static void on_turn(void *data)
{
    kvr_h1_t *s = data;
    uint64_t v;

    (void)!read(s->accept_fds[s->api->seg->slot], &v, sizeof(v));
    accept_turn(s, 1);
}

static void on_accept(kvr_uring_op_t *op, int res)
{
    kvr_h1_t *s = op->data;

    s->accepting = 0;
    if (res >= 0) {
        if (s->fd_exhausted && s->fd_warned)
            kvr_info("h1: accepting again (%llu connections open)", (unsigned long long)s->nconns);
        s->fd_exhausted = s->fd_warned = 0;
        if (s->draining) {
            close(res);
        } else {
            conn_new(s, res);
            /* past --max-connections the longest idle goes (the newcomer is the newest) */
            if (held(s) - s->nreclaim > s->max_conns && s->idle_head != NULL && s->idle_head != s->idle_tail)
                reclaim(s, 1, "at --max-connections");
        }
        accept_turn(s, 0);
        return;
    }
    if (res == -EMFILE || res == -ENFILE || res == -ENOBUFS || res == -ENOMEM) {
        /* Out of descriptors: close the longest-idle connections and accept again as soon as
         * one is freed (conn_free); with none idle, stop accepting for a moment as nginx does
         * and keep serving what is open. */
        if (!s->fd_warned && s->idle_head == NULL) {
            kvr_warn("h1: cannot accept (%s) with %llu connections open, none idle; pausing accept",
                     strerror(-res), (unsigned long long)s->nconns);
            s->fd_warned = 1;
        }
        s->fd_exhausted = 1;
        s->accept_paused_until = kvr_clock_ms() + H1_ACCEPT_PAUSE_MS;
        reclaim(s, H1_RECLAIM_MAX, strerror(-res));
        return;
    }
    if (res != -ECANCELED)
        arm_accept(s);
}

static void on_ring(void *data)
{
    kvr_h1_t *s = data;
    kvr_uring_process(&s->ring);
    kvr_uring_flush(&s->ring);
}

kvr_h1_t *kvr_h1_create(const kvr_config_t *cfg, kvr_api_t *api, kvr_http_t *http, int listen_fd,
                        const int *accept_fds)
{
    kvr_h1_t *s = calloc(1, sizeof(*s));

    if (s == NULL)
        return NULL;
    s->cfg = cfg;
    s->api = api;
    s->http = http;
    s->listen_fd = listen_fd;
    s->accept_fds = accept_fds;
    s->yield_to = -1;
    s->max_conns = cfg->max_connections;
    if (s->max_conns == 0) {
        /* what the descriptor limit leaves after a reserve for the listeners, rings, eventfds,
         * the segment, the log and h2o's own */
        struct rlimit rl;
        uint64_t lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 1u << 20;
        s->max_conns = lim - (lim / 4 < 64 ? lim / 4 : 64);
    }
    kvr_info("h1: at most %llu client connections (%s)", (unsigned long long)s->max_conns,
             cfg->max_connections ? "--max-connections" : "RLIMIT_NOFILE less a reserve");
    if (kvr_uring_init(&s->ring, 1024) != KVR_OK) {
        free(s);
        return NULL;
    }
    s->accept_op.cb = on_accept;
    s->accept_op.data = s;
    if (kvr_http_watch_fd(http, s->ring.efd, on_ring, s) != KVR_OK ||
        kvr_http_watch_fd(http, accept_fds[api->seg->slot], on_turn, s) != KVR_OK) {
        kvr_uring_exit(&s->ring);
        free(s);
        return NULL;
    }
    s->last_tick_ms = kvr_clock_ms();
    arm_accept(s);
    kvr_uring_flush(&s->ring);
    return s;
}

void kvr_h1_flush(kvr_h1_t *s)
{
    if (s->wait_head != NULL)
        wake_waiters(s);
    if (held(s) != s->published)
        accept_turn(s, 0);
    kvr_uring_flush(&s->ring);
}

/* The kernel's byte counters of the connection: received, and sent and acknowledged. */
static int tcp_bytes(const h1c_t *c, uint64_t *in, uint64_t *out)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);

    if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0 || len < sizeof(ti))
        return -1;
    *in = ti.tcpi_bytes_received;
    *out = ti.tcpi_bytes_acked;
    return 0;
}

/* An operation that waits for a whole body or response (MSG_WAITALL) completes only at its
 * end, so the timeout looks at the kernel's own counters: bytes received or acknowledged since
 * the last look are progress. Every other read completes with what arrived and moves last_ms
 * itself. */
static int moved(h1c_t *c)
{
    uint64_t in, out;

    if (c->state != ST_BODY && c->state != ST_COLLECT && c->state != ST_SEND)
        return 0;
    if (tcp_bytes(c, &in, &out) < 0 || (in == c->tcp_in && out == c->tcp_out))
        return 0;
    c->tcp_in = in;
    c->tcp_out = out;
    return 1;
}

/* A transfer that holds something others need (a reservation, a body buffer, a pinned block)
 * while an operation of it is in flight: --min-body-rate applies. */
static int rated(const h1c_t *c)
{
    switch (c->state) {
    case ST_BODY:
    case ST_DISCARD:
    case ST_CHUNKED:
    case ST_COLLECT:
        return c->rbusy;
    case ST_SEND:
        return c->wbusy && c->res.body == KVR_API_BODY_BLOCK;
    default:
        return 0;
    }
}

/* Bytes the transfer still has to move (an upper bound: a MSG_WAITALL operation reports
 * only at its end). */
static uint64_t transfer_left(const h1c_t *c)
{
    if (c->state == ST_SEND)
        return c->resp_total - c->resp_sent;
    if (c->state == ST_CHUNKED)
        return UINT64_MAX;
    return c->body_len - c->body_got;
}

/* Ends the request in progress at a deadline: a read in flight is cancelled and answered 408
 * from its completion (on_read), when the kernel no longer writes into what it holds; in the
 * middle of a response, or of a body after its answer, the connection just ends. */
static void cut(h1c_t *c, const char *why)
{
    if (c->state == ST_SEND || c->post_drain || !c->rbusy) {
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "h1: connection cut: %s", why);
        conn_close(c);
        return;
    }
    c->cut = 1;
    c->cut_why = why;
    if (kvr_uring_cancel(&c->s->ring, &c->rop) != KVR_OK)
        conn_close(c);
}

/* --min-body-rate: every --body-rate-window, a rated transfer must have moved the rate times
 * the window, or all it had left. The window's first mark is taken at the first tick that
 * finds the transfer still going, so a request that ends within 50 ms costs no syscall. */
static void check_rate(kvr_h1_t *s, h1c_t *c, uint64_t t)
{
    uint64_t in, out, need;

    if (c->rate_on && t - c->rate_ms < s->cfg->body_rate_window_ms)
        return; /* inside the window: no syscall */
    if (tcp_bytes(c, &in, &out) < 0)
        return;
    if (c->rate_on) {
        need = s->cfg->min_body_rate * (t - c->rate_ms) / 1000;
        if (need > transfer_left(c))
            need = transfer_left(c);
        if (in + out - c->rate_mark < need) {
            cut(c, "the body moved slower than --min-body-rate");
            return;
        }
    }
    c->rate_on = 1;
    c->rate_ms = t;
    c->rate_mark = in + out;
}

/* A PUT that waited for the in-flight budget asks again. 1 when it is on its way (or
 * answered), 0 when it still waits. */
static int retry_wait(h1c_t *c)
{
    kvr_api_res_reset(&c->res);
    c->rq.peer_held = peer_held(c);
    kvr_api_handle(c->s->api, &c->rq, &c->res);
    if (c->res.put == KVR_API_PUT_WAIT)
        return 0;
    peer_take(c);
    wait_leave(c);
    c->state = c->res.put == KVR_API_PUT_RESERVED ? ST_BODY : ST_DISCARD;
    if (c->res.put == KVR_API_PUT_RESERVED || c->res.put == KVR_API_PUT_DEDUP)
        begin_body(c);
    else
        respond(c);
    return 1;
}

/* Once per loop iteration: the budget that PUTs ended since gives the oldest waiters their
 * turn at once (not at the next tick), in arrival order. */
static void wake_waiters(kvr_h1_t *s)
{
    h1c_t *c, *next;

    for (c = s->wait_head; c != NULL && kvr_api_put_fits(s->api, c->rq.body_len); c = next) {
        next = c->wnext;
        if (!kvr_api_peer_fits(s->api, peer_held(c), c->rq.body_len))
            continue; /* its address holds its share: the ones behind it go first */
        if (!retry_wait(c))
            break;
    }
}

/* Every tick while our accept is in flight: a connection that waits in the listener's queue
 * means the wake-up went to a worker that does not run (stopped, or stuck in a long
 * operation: the kernel wakes one waiter of a shared listener, and that one's accept runs only
 * when its process does). We take it here, within a tick, instead of leaving it there. */
static void accept_queued(kvr_h1_t *s)
{
    struct pollfd p = {.fd = s->listen_fd, .events = POLLIN};
    int fd;

    if (!s->accepting || s->draining || s->listen_fd < 0 || poll(&p, 1, 0) != 1)
        return;
    fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    kvr_uring_fd_new(&s->ring, fd); /* not through the engine's accept: it must hear of it */
    conn_new(s, fd);
}

void kvr_h1_tick(kvr_h1_t *s)
{
    uint64_t t;
    h1c_t *c, *next;

    /* first: a connection it opens starts its clock at kvr_clock_ms(), which must not be later than
     * the t the timeouts below compare against (t - last_ms would wrap and cut it at once) */
    accept_queued(s);
    t = kvr_clock_ms();
    if (s->fd_exhausted && !s->accepting && t >= s->accept_paused_until)
        arm_accept(s);
    accept_turn(s, 0);
    if (t - s->last_tick_ms > 1000) /* we did not run: nobody's rate is to blame for the gap */
        for (c = s->conns; c != NULL; c = c->next)
            c->rate_on = 0;
    s->last_tick_ms = t;
    peer_sweep(s, t);
    if (s->pressure && t - s->pressure_ms > 1000 && s->nreclaim == 0 && !s->fd_exhausted &&
        held(s) < s->max_conns - s->max_conns / 8) {
        kvr_info("h1: room again: %llu connections open, %llu idle ones closed to make room",
                 (unsigned long long)s->nconns, (unsigned long long)s->reclaimed);
        s->pressure = 0;
        s->reclaimed = 0;
    }
    for (c = s->conns; c != NULL; c = next) {
        next = c->next;
        if (c->closing || c->cut)
            continue;
        if (s->cfg->min_body_rate > 0 && rated(c) && (check_rate(s, c, t), c->closing || c->cut))
            continue;
        if (c->state == ST_WAIT) { /* wake_waiters admits; here only the time limit */
            if (t - c->last_ms > s->cfg->io_timeout_ms) {
                wait_leave(c);
                respond_error_hdr(c, 503, "Busy", "too many PUT bodies in flight; retry", "retry-after",
                                  H1_RETRY_AFTER);
            }
        } else if (c->state == ST_SNIFF && c->sniff_wait && !c->rbusy) {
            c->sniff_wait = 0;
            conn_read(c); /* the peek saw too few bytes to decide, or h2o was full */
            if (t - c->last_ms > s->cfg->io_timeout_ms || t - c->head_ms > s->cfg->header_timeout_ms)
                conn_close(c);
        } else if (c->state == ST_LINGER) {
            if (t > c->linger_until)
                conn_close(c);
        } else if (c->in_idle) { /* silent since accepted, or between requests */
            if (t - c->last_ms > s->cfg->idle_timeout_ms || s->draining)
                conn_close(c);
        } else if (c->state == ST_HEAD && c->head_ms != 0) { /* a head is coming in */
            if (t - c->head_ms > s->cfg->header_timeout_ms)
                cut(c, "the request head was not complete within --header-timeout");
            else if (t - c->last_ms > s->cfg->io_timeout_ms)
                cut(c, "no byte of the request head for --io-timeout");
        } else if (t - c->last_ms > s->cfg->io_timeout_ms && (c->rbusy || c->wbusy) && moved(c)) {
            c->last_ms = t; /* a long transfer in one operation, still moving */
        } else if (t - c->last_ms > s->cfg->io_timeout_ms) {
            KVR_LOG_RATELIMITED(KVR_LOG_WARN, "h1: cutting a connection with no progress for %llu ms",
                                (unsigned long long)(t - c->last_ms));
            conn_close(c);
        }
    }
    kvr_uring_flush(&s->ring);
}

void kvr_h1_start_drain(kvr_h1_t *s)
{
    if (s->draining)
        return;
    s->draining = 1;
    if (s->accepting)
        kvr_uring_cancel(&s->ring, &s->accept_op);
    kvr_h1_tick(s);
}

uint64_t kvr_h1_connections(const kvr_h1_t *s)
{
    return s->nconns;
}
