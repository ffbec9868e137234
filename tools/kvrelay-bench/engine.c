/*
 * engine.c — one event loop per thread (epoll, level-triggered) over many keep-alive
 * connections, closed loop: each connection (each HTTP/2 stream slot with --streams) has one
 * request in flight and sends the next as soon as the answer is in. The relay workload's
 * PUT load is paced instead (pace_issue).
 *
 * Sending: every request is a queue of segments (owned header bytes, borrowed pool slices)
 * written with writev; a PUT body is never copied. HTTP/2 goes through a libnghttp2 client
 * session whose DATA frames are NO_COPY: nghttp2 hands over the 9-byte frame header and the
 * length, and the frame is queued as that header plus a slice of the pool.
 *
 * Receiving: 256 KiB reads into one buffer per thread. Response heads are parsed in place
 * (a head split across reads is carried in a small per-connection buffer); body bytes go to
 * a sink: XXH3-64 (a GET being verified), a small copy (the /exists JSON), or nowhere. With
 * one request in flight per connection a read never crosses into another response, so any
 * byte after the end of a response is a protocol error.
 */
#include "kvb.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
#endif

#define TBUF_CAP  (256u << 10)
#define HBUF_CAP  (16u << 10)
#define OQ_HIGH   (4u << 20)
#define IOV_BATCH 256
#define RETRY_NS  100000000ull /* a failed connect is retried after 100 ms */

enum { CS_DOWN, CS_CONNECTING, CS_UP };
enum { SINK_DROP, SINK_HASH, SINK_KEEP };
enum { RP_HEAD, RP_BODY };
#define EK_AUTO (-2) /* per request: EK_SHORT once a response began, else EK_CONNECT */

const char *const kvb_op_name[OP_N] = {"put", "get", "head", "exists", "delete"};
const char *const kvb_ek_name[EK_N] = {"corrupt", "status", "miss", "length", "short",
                                       "connect", "timeout", "protocol", "unpublished"};

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
    kvb_block_t blk;        /* PUT body */
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

static char auth_line[600]; /* "Authorization: Bearer T\r\n" or "" (HTTP/1.1) */
static char auth_h2[600];   /* "Bearer T" or "" (HTTP/2) */

void kvb_note_error(kvb_worker_t *w, int ek, const char *fmt, ...)
{
    va_list ap;
    if (w->sample[ek][0])
        return;
    va_start(ap, fmt);
    vsnprintf(w->sample[ek], sizeof(w->sample[ek]), fmt, ap);
    va_end(ap);
}

/* The first error of a kind, about a request: "<op> <key>: <what>". */
static void note_req(kvb_worker_t *w, int ek, const kvb_req_t *r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void note_req(kvb_worker_t *w, int ek, const kvb_req_t *r, const char *fmt, ...)
{
    char name[160], msg[200];
    va_list ap;
    if (w->sample[ek][0])
        return;
    kvb_key_name(r->key, name, sizeof(name));
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(w->sample[ek], sizeof(w->sample[ek]), "%s %.60s: %.120s", kvb_op_name[r->op], name, msg);
}

/* ---------------------------------------------------------------- output queue */

static void oq_push(outq_t *q, const uint8_t *p, size_t off, size_t len)
{
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 64;
        seg_t *v = realloc(q->v, cap * sizeof(*v));
        if (v == NULL)
            abort();
        q->v = v;
        q->cap = cap;
    }
    q->v[q->n].p = p;
    q->v[q->n].off = off;
    q->v[q->n].len = len;
    q->n++;
    q->bytes += len;
}

static void oq_own(outq_t *q, const void *p, size_t len)
{
    if (len == 0)
        return;
    if (q->olen + len > q->ocap) {
        size_t cap = q->ocap ? q->ocap * 2 : 4096;
        uint8_t *ob;
        while (cap < q->olen + len)
            cap *= 2;
        if ((ob = realloc(q->ob, cap)) == NULL)
            abort();
        q->ob = ob;
        q->ocap = cap;
    }
    memcpy(q->ob + q->olen, p, len);
    if (q->n > q->head && q->v[q->n - 1].p == NULL && q->v[q->n - 1].off + q->v[q->n - 1].len == q->olen) {
        q->v[q->n - 1].len += len;
        q->bytes += len;
    } else {
        oq_push(q, NULL, q->olen, len);
    }
    q->olen += len;
}

static void oq_reset(outq_t *q)
{
    q->head = q->n = q->done = q->olen = q->bytes = 0;
}

/* 1: everything written; 0: the socket is full; -1: error (errno). */
static int oq_flush(int fd, outq_t *q)
{
    struct iovec iov[IOV_BATCH];
    while (q->head < q->n) {
        int k = 0;
        size_t want = 0, left;
        ssize_t n;
        for (size_t i = q->head; i < q->n && k < IOV_BATCH; i++, k++) {
            const uint8_t *base = q->v[i].p ? q->v[i].p : q->ob + q->v[i].off;
            size_t skip = i == q->head ? q->done : 0;
            iov[k].iov_base = (void *)(base + skip);
            iov[k].iov_len = q->v[i].len - skip;
            want += iov[k].iov_len;
        }
        n = writev(fd, iov, k);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        q->bytes -= (size_t)n;
        left = (size_t)n;
        while (left > 0) {
            size_t rem = q->v[q->head].len - q->done;
            if (left >= rem) {
                left -= rem;
                q->head++;
                q->done = 0;
            } else {
                q->done += left;
                left = 0;
            }
        }
        if ((size_t)n < want)
            return 0;
    }
    oq_reset(q);
    return 1;
}

/* Queues bytes [off, off+len) of a block: the stamp is copied, the pool slice borrowed. */
static void oq_block(outq_t *q, const kvb_block_t *b, uint64_t off, uint64_t len)
{
    if (off < b->stamp_len) {
        size_t take = (size_t)(b->stamp_len - off) < len ? (size_t)(b->stamp_len - off) : (size_t)len;
        oq_own(q, b->stamp + off, take);
        off += take;
        len -= take;
    }
    if (len > 0)
        oq_push(q, b->rest + (off - b->stamp_len), 0, (size_t)len);
}

/* ---------------------------------------------------------------- worker and connections */

kvb_worker_t *kvb_worker_new(int id)
{
    kvb_worker_t *w = aligned_alloc(64, KVR_ALIGN_UP(sizeof(*w), (size_t)64));
    if (w == NULL)
        return NULL;
    memset(w, 0, sizeof(*w));
    w->id = id;
    w->ep = epoll_create1(EPOLL_CLOEXEC);
    w->tbuf = aligned_alloc(4096, TBUF_CAP);
    w->st = calloc(1, sizeof(kvb_stats_t));
    w->pre = calloc(1, sizeof(kvb_stats_t));
    w->rng = kvb_mix64(((uint64_t)id << 32) ^ kvb_now());
    if (w->ep < 0 || w->tbuf == NULL || w->st == NULL || w->pre == NULL)
        return NULL;
    if (G.token != NULL && G.token[0]) {
        snprintf(auth_line, sizeof(auth_line), "Authorization: Bearer %.500s\r\n", G.token);
        snprintf(auth_h2, sizeof(auth_h2), "Bearer %.500s", G.token);
    }
    return w;
}

int kvb_worker_add_conn(kvb_worker_t *w)
{
    kvb_conn_t *c = calloc(1, sizeof(*c));
    kvb_conn_t **v = realloc(w->conns, (size_t)(w->nconns + 1) * sizeof(*v));
    kvb_conn_t **r = realloc(w->reopen, (size_t)(w->nconns + 1) * sizeof(*r));
    kvb_conn_t **rb = realloc(w->reopen_b, (size_t)(w->nconns + 1) * sizeof(*rb));
    if (c == NULL || v == NULL || r == NULL || rb == NULL)
        return -1;
    w->conns = v;
    w->reopen = r;
    w->reopen_b = rb;
    c->kind = KVB_FD_CONN;
    c->w = w;
    c->id = w->nconns;
    c->fd = -1;
    c->nreqs = G.http2 ? G.streams : 1;
    c->reqs = calloc((size_t)c->nreqs, sizeof(kvb_req_t));
    if (c->reqs == NULL)
        return -1;
    for (int i = 0; i < c->nreqs; i++)
        if (G.verify && (c->reqs[i].xs = XXH3_createState()) == NULL)
            return -1;
    w->conns[w->nconns++] = c;
    return 0;
}

static void conn_events(kvb_conn_t *c, uint32_t want)
{
    struct epoll_event ev;
    if (want == c->evmask || c->fd < 0)
        return;
    ev.events = want;
    ev.data.ptr = c;
    epoll_ctl(c->w->ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->evmask = want;
}

static void schedule_reopen(kvb_conn_t *c, uint64_t at)
{
    c->retry_at = at;
    if (!c->in_reopen) {
        c->in_reopen = 1;
        c->w->reopen[c->w->nreopen++] = c;
    }
}

static int claim(kvb_worker_t *w, int *op, uint64_t *key);

/* Records the outcome of one request. ek: -1 success, else an error kind. */
static void req_finish(kvb_conn_t *c, kvb_req_t *r, int ek, int miss)
{
    kvb_worker_t *w = c->w;
    uint64_t now = kvb_now();
    kvb_stats_t *s = r->phase == PH_PRELOAD ? w->pre : w->st;
    int counted = r->phase == PH_PRELOAD || r->measured;

    if (ek < 0 && miss && !G.misses_ok)
        ek = EK_MISS;
    if (ek == EK_MISS)
        note_req(w, EK_MISS, r, "absent");
    r->active = 0;
    c->inflight--;
    w->active--;
    if (counted) {
        if (G.proto == PROTO_HTTP && r->status > 0 && r->status < 600)
            s->status[r->op][r->status]++;
        if (ek >= 0) {
            s->err[r->op][ek]++;
        } else {
            s->ok[r->op]++;
            if (miss)
                s->miss_ok[r->op]++;
            else if (r->op == OP_PUT || r->op == OP_GET)
                s->bytes[r->op] += r->size;
            kvb_hist_add(&s->lat[r->op], now - r->t0);
        }
        if (r->phase == PH_MAIN) {
            __atomic_store_n(&w->p_done, w->p_done + 1, __ATOMIC_RELAXED);
            if (ek >= 0)
                __atomic_store_n(&w->p_errors, w->p_errors + 1, __ATOMIC_RELAXED);
            else if (!miss && (r->op == OP_PUT || r->op == OP_GET))
                __atomic_store_n(&w->p_bytes, w->p_bytes + r->size, __ATOMIC_RELAXED);
            w->t_last_done = now;
        }
    }
    if (ek < 0 && !miss) {
        /* the preload computes each block's checksum once, outside the measurement */
        if (r->phase == PH_PRELOAD && G.verify && G.workload != WL_PUT)
            (void)kvb_block_checksum(r->key);
        if (r->seqhash)
            kvb_relay_ack(r->seqhash, now, r->measured);
    }
}

static void conn_close_fd(kvb_conn_t *c)
{
    if (c->h2 != NULL) {
        nghttp2_session_del(c->h2);
        c->h2 = NULL;
    }
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->evmask = 0;
    c->state = CS_DOWN;
    oq_reset(&c->oq);
    c->hlen = 0;
    c->rphase = RP_HEAD;
    c->close_after = 0;
}

/* The connection failed (or must be dropped): every request on it ends with `ek`. */
static void conn_fail(kvb_conn_t *c, int ek, const char *why)
{
    for (int i = 0; i < c->nreqs; i++) {
        kvb_req_t *r = &c->reqs[i];
        int k = ek;
        if (!r->active)
            continue;
        if (k == EK_AUTO)
            k = (r->head_done || (c->rphase == RP_HEAD && c->hlen > 0)) ? EK_SHORT : EK_CONNECT;
        note_req(c->w, k, r, "%s", why);
        req_finish(c, r, k, 0);
    }
    conn_close_fd(c);
    schedule_reopen(c, kvb_now());
}

static void connect_failed(kvb_conn_t *c, int err)
{
    kvb_worker_t *w = c->w;
    int op;
    uint64_t key;

    conn_close_fd(c);
    if (w->issuing && claim(w, &op, &key)) { /* one failed attempt counts as one request */
        kvb_stats_t *s = w->phase == PH_PRELOAD ? w->pre : w->st;
        int measured = w->phase == PH_PRELOAD || kvb_now() >= C.t_measure;
        if (measured) {
            s->err[op][EK_CONNECT]++;
            if (w->phase == PH_MAIN) {
                __atomic_store_n(&w->p_done, w->p_done + 1, __ATOMIC_RELAXED);
                __atomic_store_n(&w->p_errors, w->p_errors + 1, __ATOMIC_RELAXED);
            }
        }
        kvb_note_error(w, EK_CONNECT, "connect %s: %s", G.target, strerror(err));
    }
    schedule_reopen(c, kvb_now() + RETRY_NS);
}

static void conn_up(kvb_conn_t *c);

static void conn_open(kvb_conn_t *c)
{
    int on = 1, fd;
    struct epoll_event ev;

    fd = socket(G.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        connect_failed(c, errno);
        return;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    if (connect(fd, (struct sockaddr *)&G.addr, G.addrlen) < 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        connect_failed(c, e);
        return;
    }
    c->fd = fd;
    c->state = CS_CONNECTING;
    c->t_connect = kvb_now();
    ev.events = EPOLLOUT;
    ev.data.ptr = c;
    epoll_ctl(c->w->ep, EPOLL_CTL_ADD, fd, &ev);
    c->evmask = EPOLLOUT;
}

/* ---------------------------------------------------------------- choosing requests */

static int pick_op(kvb_worker_t *w)
{
    switch (G.workload) {
    case WL_GET:
        return OP_GET;
    case WL_HEAD:
        return OP_HEAD;
    case WL_EXISTS:
        return OP_EXISTS;
    case WL_MIXED: {
        unsigned r = (unsigned)(kvb_rand(&w->rng) % G.mix_total), acc = 0;
        for (int o = 0; o < OP_N; o++) {
            acc += G.mix[o];
            if (r < acc)
                return o;
        }
        return OP_GET;
    }
    default:
        return OP_PUT;
    }
}

/* PUT keys: each thread walks its share of the key space (t, t+T, t+2T, ...) in order, so a
 * PUT is of a key not yet PUT by this run until the share wraps; with --dedup R a share R
 * of PUTs repeats a key this thread already PUT (same key, same size: a dedup hit). */
static uint64_t put_key(kvb_worker_t *w)
{
    uint64_t T = (uint64_t)G.threads, t = (uint64_t)w->id, part;
    part = G.keys > t ? (G.keys - t + T - 1) / T : 0;
    if (part == 0)
        return kvb_pick_key(&w->rng);
    if (G.dedup > 0 && w->put_cursor > 0 &&
        (double)(kvb_rand(&w->rng) >> 11) * (1.0 / 9007199254740992.0) < G.dedup) {
        uint64_t have = w->put_cursor < part ? w->put_cursor : part;
        return t + T * (kvb_rand(&w->rng) % have);
    }
    return t + T * (w->put_cursor++ % part);
}

static int claim(kvb_worker_t *w, int *op, uint64_t *key)
{
    uint64_t now;
    if (C.stop)
        return 0;
    if (w->phase == PH_PRELOAD) {
        uint64_t k = __atomic_fetch_add(&C.preload_next, 1, __ATOMIC_RELAXED);
        if (k >= G.keys)
            return 0;
        *op = OP_PUT;
        *key = k;
        return 1;
    }
    now = kvb_now();
    if (C.t_deadline && now >= C.t_deadline)
        return 0;
    if (G.requests && now >= C.t_measure && __atomic_fetch_add(&C.claimed, 1, __ATOMIC_RELAXED) >= G.requests)
        return 0;
    if (w->paced) {
        *op = OP_PUT;
        *key = w->relay_next++;
        return 1;
    }
    *op = pick_op(w);
    *key = *op == OP_PUT ? put_key(w) : kvb_pick_key(&w->rng);
    return 1;
}

/* ---------------------------------------------------------------- evaluation */

/* What an HTTP status means for the request (HTTP/1.1 and HTTP/2 alike); sets the sink. */
static void http_classify(kvb_req_t *r)
{
    int st = r->status;
    r->sink = SINK_DROP;
    switch (r->op) {
    case OP_PUT:
        /* 201 new, 200 a dedup hit (kvrelay); 204 an overwrite (WebDAV servers such as nginx) */
        if (st != 201 && st != 200 && st != 204)
            r->ek = EK_STATUS;
        break;
    case OP_GET:
        if (st == 200) {
            if (r->clen >= 0 && (uint64_t)r->clen != r->size)
                r->ek = EK_LENGTH;
            else if (G.verify)
                r->sink = SINK_HASH;
        } else if (st == 404) {
            r->miss = 1;
        } else {
            r->ek = EK_STATUS;
        }
        break;
    case OP_HEAD:
        if (st == 200) {
            if (r->clen < 0 || (uint64_t)r->clen != r->size)
                r->ek = EK_LENGTH;
        } else if (st == 404) {
            r->miss = 1;
        } else {
            r->ek = EK_STATUS;
        }
        break;
    case OP_EXISTS:
        if (st == 200)
            r->sink = SINK_KEEP;
        else
            r->ek = EK_STATUS;
        break;
    case OP_DELETE:
        if (st == 404)
            r->miss = 1;
        else if (st != 200)
            r->ek = EK_STATUS;
        break;
    }
}

/* The whole response is in: the last checks, then the outcome. */
static void req_complete(kvb_conn_t *c, kvb_req_t *r)
{
    kvb_worker_t *w = c->w;
    if (r->ek < 0 && !r->miss && G.proto == PROTO_HTTP && r->op == OP_EXISTS) {
        r->keep[r->keeplen] = '\0';
        if (strstr(r->keep, "\"exists\":true") != NULL) {
        } else if (strstr(r->keep, "\"exists\":false") != NULL) {
            r->miss = 1;
        } else {
            r->ek = EK_PROTOCOL;
            note_req(w, EK_PROTOCOL, r, "body %.100s", r->keep);
        }
    }
    if (r->ek < 0 && !r->miss && r->op == OP_GET) {
        if (r->got != r->size) {
            r->ek = r->got < r->size ? EK_SHORT : EK_LENGTH;
            note_req(w, r->ek, r, "%llu body bytes, %llu PUT", (unsigned long long)r->got, (unsigned long long)r->size);
        } else if (r->sink == SINK_HASH) {
            uint64_t got = XXH3_64bits_digest(r->xs), want = kvb_block_checksum(r->key);
            if (got != want) {
                r->ek = EK_CORRUPT;
                note_req(w, EK_CORRUPT, r, "%llu bytes with XXH3 %016llx, the block PUT has %016llx",
                         (unsigned long long)r->got, (unsigned long long)got, (unsigned long long)want);
            }
        }
    }
    if (r->ek == EK_STATUS) {
        r->keep[r->keeplen < sizeof(r->keep) ? r->keeplen : sizeof(r->keep) - 1] = '\0';
        if (G.proto == PROTO_HTTP)
            note_req(w, EK_STATUS, r, "HTTP %d %.100s", r->status, r->keep);
        else
            note_req(w, EK_STATUS, r, "reply %.100s", r->keep);
    } else if (r->ek == EK_LENGTH) {
        note_req(w, EK_LENGTH, r, "length %lld, %llu PUT", (long long)r->clen, (unsigned long long)r->size);
    }
    req_finish(c, r, r->ek, r->miss);
}

/* ---------------------------------------------------------------- stream protocols */

static const char *const http_method[OP_N] = {"PUT", "GET", "HEAD", "GET", "DELETE"};

static void build_stream_request(kvb_conn_t *c, kvb_req_t *r)
{
    char h[2600], k[1100];
    int n = 0;
    size_t kl;

    if (G.proto == PROTO_HTTP) {
        kvb_key_path(r->key, k, sizeof(k));
        n = snprintf(h, sizeof(h), "%s /kv/%s%s HTTP/1.1\r\nHost: %s\r\n%s", http_method[r->op], k,
                     r->op == OP_EXISTS ? "/exists" : "", G.target, auth_line);
        if (r->op == OP_PUT) {
            n += snprintf(h + n, sizeof(h) - (size_t)n, "Content-Length: %llu\r\n", (unsigned long long)r->size);
            if (r->seqhash)
                n += snprintf(h + n, sizeof(h) - (size_t)n, "X-KV-Sequence-Hash: %llu\r\n",
                              (unsigned long long)r->seqhash);
        }
        n += snprintf(h + n, sizeof(h) - (size_t)n, "\r\n");
        oq_own(&c->oq, h, (size_t)n);
        if (r->op == OP_PUT)
            oq_block(&c->oq, &r->blk, 0, r->size);
        return;
    }
    kl = kvb_key_name(r->key, k, sizeof(k));
    if (G.proto == PROTO_RESP) {
        static const char *const cmd[OP_N] = {"SET", "GET", "STRLEN", "EXISTS", "DEL"};
        const char *m = cmd[r->op];
        n = snprintf(h, sizeof(h), "*%d\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n", r->op == OP_PUT ? 3 : 2, strlen(m), m, kl, k);
        if (r->op == OP_PUT)
            n += snprintf(h + n, sizeof(h) - (size_t)n, "$%llu\r\n", (unsigned long long)r->size);
        oq_own(&c->oq, h, (size_t)n);
        if (r->op == OP_PUT) {
            oq_block(&c->oq, &r->blk, 0, r->size);
            oq_own(&c->oq, "\r\n", 2);
        }
        return;
    }
    switch (r->op) { /* memcached text protocol; meta get (mg) for HEAD (with its size) and exists */
    case OP_PUT:
        n = snprintf(h, sizeof(h), "set %s 0 0 %llu\r\n", k, (unsigned long long)r->size);
        break;
    case OP_GET:
        n = snprintf(h, sizeof(h), "get %s\r\n", k);
        break;
    case OP_HEAD:
        n = snprintf(h, sizeof(h), "mg %s s\r\n", k);
        break;
    case OP_EXISTS:
        n = snprintf(h, sizeof(h), "mg %s\r\n", k);
        break;
    default:
        n = snprintf(h, sizeof(h), "delete %s\r\n", k);
        break;
    }
    oq_own(&c->oq, h, (size_t)n);
    if (r->op == OP_PUT) {
        oq_block(&c->oq, &r->blk, 0, r->size);
        oq_own(&c->oq, "\r\n", 2);
    }
}

static int ci_prefix(const uint8_t *p, size_t n, const char *s)
{
    size_t l = strlen(s);
    return n >= l && strncasecmp((const char *)p, s, l) == 0;
}

/* HTTP/1.1 head. 1: parsed (*used bytes), 0: incomplete, -1: malformed. */
static int http_head(kvb_conn_t *c, kvb_req_t *r, const uint8_t *p, size_t n, size_t *used)
{
    const uint8_t *end = memmem(p, n, "\r\n\r\n", 4), *line;
    if (end == NULL)
        return n > 2 && memcmp(p, "HTTP/", n < 5 ? n : 5) != 0 ? -1 : 0;
    if (end - p < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ' || p[9] < '1' || p[9] > '5' || p[10] < '0' ||
        p[10] > '9' || p[11] < '0' || p[11] > '9')
        return -1;
    r->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    line = (const uint8_t *)memchr(p, '\n', (size_t)(end + 2 - p)) + 1;
    while (line < end + 2) {
        const uint8_t *eol = memmem(line, (size_t)(end + 2 - line), "\r\n", 2);
        size_t ll = (size_t)(eol - line);
        if (ci_prefix(line, ll, "content-length:")) {
            const uint8_t *v = line + 15;
            int64_t x = 0;
            while (v < eol && (*v == ' ' || *v == '\t'))
                v++;
            if (v == eol)
                return -1;
            for (; v < eol && *v >= '0' && *v <= '9'; v++)
                x = x * 10 + (*v - '0');
            r->clen = x;
        } else if (ci_prefix(line, ll, "transfer-encoding:")) {
            if (memmem(line, ll, "chunked", 7) != NULL)
                return -1; /* kvrelay always sends Content-Length; not supported */
        } else if (ci_prefix(line, ll, "connection:")) {
            if (memmem(line, ll, "close", 5) != NULL)
                c->close_after = 1;
        }
        line = eol + 2;
    }
    *used = (size_t)(end + 4 - p);
    if (r->status < 200)
        return -1; /* interim responses: never asked for (no Expect) */
    http_classify(r);
    if (r->op == OP_HEAD || r->status == 204 || r->status == 304)
        c->body_left = 0;
    else if (r->clen < 0)
        return -1;
    else
        c->body_left = (uint64_t)r->clen;
    c->trailer = "";
    c->tlen = c->tpos = 0;
    return 1;
}

/* RESP2 / memcached: one line, maybe a body and a fixed trailer. */
static int line_head(kvb_conn_t *c, kvb_req_t *r, const uint8_t *p, size_t n, size_t *used)
{
    const uint8_t *eol = memmem(p, n, "\r\n", 2);
    char line[512];
    size_t ll;

    if (eol == NULL)
        return 0;
    ll = (size_t)(eol - p);
    *used = ll + 2;
    if (ll >= sizeof(line))
        ll = sizeof(line) - 1;
    memcpy(line, p, ll);
    line[ll] = '\0';
    c->body_left = 0;
    c->trailer = "";
    c->tlen = c->tpos = 0;
    r->sink = SINK_DROP;
    if (G.proto == PROTO_RESP) {
        long long v = strtoll(line + 1, NULL, 10);
        switch (line[0]) {
        case '+':
            if (r->op != OP_PUT || strcmp(line, "+OK") != 0)
                return -1;
            return 1;
        case '-':
            r->ek = EK_STATUS;
            snprintf(r->keep, sizeof(r->keep), "%.200s", line);
            r->keeplen = strlen(r->keep);
            return 1;
        case ':':
            if (r->op == OP_HEAD) {
                if (v == 0)
                    r->miss = 1;
                else if ((uint64_t)v != r->size)
                    r->clen = v, r->ek = EK_LENGTH;
            } else if (r->op == OP_EXISTS || r->op == OP_DELETE) {
                if (v == 0)
                    r->miss = 1;
            } else {
                return -1;
            }
            return 1;
        case '$':
            if (r->op != OP_GET)
                return -1;
            if (v < 0) {
                r->miss = 1;
                return 1;
            }
            r->clen = v;
            c->body_left = (uint64_t)v;
            c->trailer = "\r\n";
            c->tlen = 2;
            if ((uint64_t)v != r->size)
                r->ek = EK_LENGTH;
            else if (G.verify)
                r->sink = SINK_HASH;
            return 1;
        default:
            return -1;
        }
    }
    /* memcached */
    if (!strncmp(line, "VALUE ", 6)) {
        const char *sp = strrchr(line, ' ');
        long long v = strtoll(sp + 1, NULL, 10);
        if (r->op != OP_GET || v < 0)
            return -1;
        r->clen = v;
        c->body_left = (uint64_t)v;
        c->trailer = "\r\nEND\r\n";
        c->tlen = 7;
        if ((uint64_t)v != r->size)
            r->ek = EK_LENGTH;
        else if (G.verify)
            r->sink = SINK_HASH;
        return 1;
    }
    if (!strcmp(line, "STORED") && r->op == OP_PUT)
        return 1;
    if ((!strcmp(line, "END") && r->op == OP_GET) || (!strcmp(line, "EN") && (r->op == OP_HEAD || r->op == OP_EXISTS)) ||
        (!strcmp(line, "NOT_FOUND") && r->op == OP_DELETE)) {
        r->miss = 1;
        return 1;
    }
    if (!strcmp(line, "DELETED") && r->op == OP_DELETE)
        return 1;
    if (!strncmp(line, "HD", 2) && (line[2] == '\0' || line[2] == ' ') && (r->op == OP_HEAD || r->op == OP_EXISTS)) {
        if (r->op == OP_HEAD) {
            const char *s = strstr(line, " s");
            long long v = s ? strtoll(s + 2, NULL, 10) : -1;
            if (v < 0 || (uint64_t)v != r->size)
                r->clen = v, r->ek = EK_LENGTH;
        }
        return 1;
    }
    if (!strncmp(line, "SERVER_ERROR", 12) || !strncmp(line, "CLIENT_ERROR", 12) || !strcmp(line, "ERROR") ||
        !strcmp(line, "NOT_STORED") || !strcmp(line, "EXISTS")) {
        r->ek = EK_STATUS;
        snprintf(r->keep, sizeof(r->keep), "%.200s", line);
        r->keeplen = strlen(r->keep);
        return 1;
    }
    return -1;
}

static inline void sink_bytes(kvb_req_t *r, const uint8_t *p, size_t n)
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

static void conn_fill(kvb_conn_t *c);

static void protocol_error(kvb_conn_t *c, const char *what, const uint8_t *p, size_t n)
{
    char shown[81];
    size_t k = 0;
    for (size_t i = 0; i < n && k < 80; i++)
        shown[k++] = (p[i] >= 32 && p[i] < 127) ? (char)p[i] : '.';
    shown[k] = '\0';
    {
        char why[200];
        snprintf(why, sizeof(why), "%s: \"%s\"", what, shown);
        conn_fail(c, EK_PROTOCOL, why);
    }
}

/* Bytes of the response being read. 1: the connection moved on (response done, or failed). */
static int stream_input(kvb_conn_t *c, const uint8_t *p, size_t n)
{
    kvb_req_t *r = &c->reqs[0];

    if (!r->active) {
        char why[100];
        snprintf(why, sizeof(why), "%zu bytes nobody asked for", n);
        kvb_note_error(c->w, EK_PROTOCOL, "%s", why);
        conn_fail(c, EK_PROTOCOL, why);
        return 1;
    }
    if (c->rphase == RP_HEAD) {
        const uint8_t *hp = p;
        size_t hn = n, used = 0, old = c->hlen;
        int rc;
        if (old) {
            size_t take = HBUF_CAP - old < n ? HBUF_CAP - old : n;
            memcpy(c->hbuf + old, p, take);
            c->hlen += take;
            hp = c->hbuf;
            hn = c->hlen;
        }
        rc = G.proto == PROTO_HTTP ? http_head(c, r, hp, hn, &used) : line_head(c, r, hp, hn, &used);
        if (rc < 0) {
            protocol_error(c, "malformed response", hp, hn);
            return 1;
        }
        if (rc == 0) {
            if (old == 0) {
                if (n >= HBUF_CAP) {
                    protocol_error(c, "response head too long", p, n);
                    return 1;
                }
                if (c->hbuf == NULL && (c->hbuf = malloc(HBUF_CAP)) == NULL) { /* a head split across reads */
                    protocol_error(c, "out of memory", p, n);
                    return 1;
                }
                memcpy(c->hbuf, p, n);
                c->hlen = n;
            } else if (c->hlen == HBUF_CAP) {
                protocol_error(c, "response head too long", c->hbuf, c->hlen);
                return 1;
            }
            return 0;
        }
        p += used - old;
        n -= used - old;
        c->hlen = 0;
        r->head_done = 1;
        c->rphase = RP_BODY;
    }
    if (c->body_left) {
        size_t take = c->body_left < n ? (size_t)c->body_left : n;
        sink_bytes(r, p, take);
        p += take;
        n -= take;
        c->body_left -= take;
    }
    if (c->body_left == 0) {
        while (n > 0 && c->tpos < c->tlen) {
            if (*p != (uint8_t)c->trailer[c->tpos]) {
                protocol_error(c, "bad bytes after the body", p, n);
                return 1;
            }
            p++;
            n--;
            c->tpos++;
        }
        if (c->tpos == c->tlen) {
            int drop = c->close_after || c->oq.bytes > 0; /* answered before the body was sent */
            if (n > 0) {
                protocol_error(c, "bytes after the response", p, n);
                return 1;
            }
            c->rphase = RP_HEAD;
            req_complete(c, r);
            if (drop) {
                conn_close_fd(c);
                schedule_reopen(c, kvb_now());
            } else {
                conn_fill(c);
            }
            return 1;
        }
    }
    return 0;
}

static void stream_flush(kvb_conn_t *c)
{
    int rc = oq_flush(c->fd, &c->oq);
    if (rc < 0) {
        char why[128];
        snprintf(why, sizeof(why), "write: %s", strerror(errno));
        conn_fail(c, EK_AUTO, why);
    } else {
        conn_events(c, rc ? EPOLLIN : EPOLLIN | EPOLLOUT);
    }
}

static void stream_readable(kvb_conn_t *c)
{
    kvb_worker_t *w = c->w;
    for (;;) {
        ssize_t n = read(c->fd, w->tbuf, TBUF_CAP);
        if (n > 0) {
            if (stream_input(c, w->tbuf, (size_t)n))
                return;
            continue;
        }
        if (n == 0) {
            conn_fail(c, EK_AUTO, "connection closed by the server");
            return;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            char why[128];
            snprintf(why, sizeof(why), "read: %s", strerror(errno));
            conn_fail(c, EK_AUTO, why);
        }
        return;
    }
}

/* ---------------------------------------------------------------- HTTP/2 (h2c, prior knowledge) */

static ssize_t h2_send_cb(nghttp2_session *s, const uint8_t *data, size_t len, int flags, void *user)
{
    kvb_conn_t *c = user;
    if (c->oq.bytes >= OQ_HIGH)
        return NGHTTP2_ERR_WOULDBLOCK;
    oq_own(&c->oq, data, len);
    return (ssize_t)len;
}

static int h2_send_data_cb(nghttp2_session *s, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                           nghttp2_data_source *src, void *user)
{
    kvb_conn_t *c = user;
    kvb_req_t *r = src->ptr;
    if (c->oq.bytes >= OQ_HIGH)
        return NGHTTP2_ERR_WOULDBLOCK;
    oq_own(&c->oq, framehd, 9);
    oq_block(&c->oq, &r->blk, r->wr_off, length);
    r->wr_off += length;
    return 0;
}

static ssize_t h2_read_cb(nghttp2_session *s, int32_t id, uint8_t *buf, size_t length, uint32_t *flags,
                          nghttp2_data_source *src, void *user)
{
    kvb_req_t *r = src->ptr;
    uint64_t left = r->size - r->rd_off;
    size_t n = left < length ? (size_t)left : length;
    r->rd_off += n;
    *flags |= NGHTTP2_DATA_FLAG_NO_COPY;
    if (r->rd_off == r->size)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static int h2_on_header(nghttp2_session *s, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                        const uint8_t *value, size_t valuelen, uint8_t flags, void *user)
{
    kvb_req_t *r;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_RESPONSE)
        return 0;
    r = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
    if (r == NULL || !r->active)
        return 0;
    if (namelen == 7 && !memcmp(name, ":status", 7) && valuelen == 3)
        r->status = (value[0] - '0') * 100 + (value[1] - '0') * 10 + (value[2] - '0');
    else if (namelen == 14 && !memcmp(name, "content-length", 14)) {
        int64_t x = 0;
        for (size_t i = 0; i < valuelen && value[i] >= '0' && value[i] <= '9'; i++)
            x = x * 10 + (value[i] - '0');
        r->clen = x;
    }
    return 0;
}

static int h2_on_frame_recv(nghttp2_session *s, const nghttp2_frame *frame, void *user)
{
    kvb_req_t *r;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_RESPONSE)
        return 0;
    r = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
    if (r == NULL || !r->active || r->head_done)
        return 0;
    r->head_done = 1;
    http_classify(r);
    return 0;
}

static int h2_on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *user)
{
    kvb_req_t *r = nghttp2_session_get_stream_user_data(s, id);
    if (r != NULL && r->active)
        sink_bytes(r, data, len);
    return 0;
}

static int h2_on_close(nghttp2_session *s, int32_t id, uint32_t err, void *user)
{
    kvb_conn_t *c = user;
    kvb_req_t *r = nghttp2_session_get_stream_user_data(s, id);

    if (r == NULL || !r->active)
        return 0;
    if (err != NGHTTP2_NO_ERROR) {
        int ek = r->head_done ? EK_SHORT : EK_CONNECT;
        note_req(c->w, ek, r, "stream reset (%s)", nghttp2_http2_strerror(err));
        req_finish(c, r, ek, 0);
    } else if (!r->head_done || r->status == 0) {
        note_req(c->w, EK_PROTOCOL, r, "stream closed without a response");
        req_finish(c, r, EK_PROTOCOL, 0);
    } else {
        if (r->op == OP_HEAD && r->got > 0 && r->ek < 0) {
            r->ek = EK_PROTOCOL;
            note_req(c->w, EK_PROTOCOL, r, "a body in the answer to HEAD");
        }
        req_complete(c, r);
    }
    return 0;
}

static int h2_init(kvb_conn_t *c)
{
    nghttp2_session_callbacks *cb;
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                   {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 16u << 20},
                                   {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, 1u << 20}};
    if (nghttp2_session_callbacks_new(&cb) != 0)
        return -1;
    nghttp2_session_callbacks_set_send_callback(cb, h2_send_cb);
    nghttp2_session_callbacks_set_send_data_callback(cb, h2_send_data_cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, h2_on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, h2_on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2_on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2_on_close);
    if (nghttp2_session_client_new(&c->h2, cb, c) != 0) {
        nghttp2_session_callbacks_del(cb);
        c->h2 = NULL;
        return -1;
    }
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, KVR_ARRAY_SIZE(iv));
    nghttp2_session_set_local_window_size(c->h2, NGHTTP2_FLAG_NONE, 0, 1 << 30);
    return 0;
}

/* Moves nghttp2's output to the socket. */
static void h2_flush(kvb_conn_t *c)
{
    for (int i = 0; i < 64; i++) {
        int rc;
        if (c->oq.bytes < OQ_HIGH && nghttp2_session_send(c->h2) != 0) {
            conn_fail(c, EK_AUTO, "HTTP/2 session error");
            return;
        }
        if (c->oq.bytes == 0)
            break;
        rc = oq_flush(c->fd, &c->oq);
        if (rc < 0) {
            char why[128];
            snprintf(why, sizeof(why), "write: %s", strerror(errno));
            conn_fail(c, EK_AUTO, why);
            return;
        }
        if (rc == 0) {
            conn_events(c, EPOLLIN | EPOLLOUT);
            return;
        }
    }
    conn_events(c, EPOLLIN);
    if (!nghttp2_session_want_read(c->h2) && !nghttp2_session_want_write(c->h2))
        conn_fail(c, EK_AUTO, "HTTP/2 session ended (GOAWAY)");
}

static void h2_readable(kvb_conn_t *c)
{
    kvb_worker_t *w = c->w;
    for (;;) {
        ssize_t n = read(c->fd, w->tbuf, TBUF_CAP);
        if (n > 0) {
            ssize_t rv = nghttp2_session_mem_recv(c->h2, w->tbuf, (size_t)n);
            if (rv < 0) {
                char why[128];
                snprintf(why, sizeof(why), "HTTP/2: %s", nghttp2_strerror((int)rv));
                conn_fail(c, EK_PROTOCOL, why);
                return;
            }
            continue;
        }
        if (n == 0) {
            conn_fail(c, EK_AUTO, "connection closed by the server");
            return;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            char why[128];
            snprintf(why, sizeof(why), "read: %s", strerror(errno));
            conn_fail(c, EK_AUTO, why);
            return;
        }
        break;
    }
    conn_fill(c);
}

/* ---------------------------------------------------------------- requests */

static kvb_req_t *free_slot(kvb_conn_t *c)
{
    if (c->state != CS_UP || c->inflight >= c->nreqs)
        return NULL;
    for (int i = 0; i < c->nreqs; i++)
        if (!c->reqs[i].active)
            return &c->reqs[i];
    return NULL;
}

/* Starts a request on a free slot. HTTP/2: submitted only (the caller flushes). */
static void req_start(kvb_conn_t *c, kvb_req_t *r, int op, uint64_t key)
{
    kvb_worker_t *w = c->w;
    r->active = 1;
    r->op = op;
    r->key = key;
    r->size = kvb_key_size(key);
    r->phase = w->phase;
    r->t0 = kvb_now();
    r->measured = w->phase == PH_MAIN && r->t0 >= C.t_measure;
    r->status = 0;
    r->clen = -1;
    r->got = 0;
    r->sink = SINK_DROP;
    r->ek = -1;
    r->miss = 0;
    r->head_done = 0;
    r->keeplen = 0;
    r->rd_off = r->wr_off = 0;
    r->seqhash = w->paced ? kvb_relay_seq_hash(key) : 0;
    if (op == OP_GET && G.verify)
        XXH3_64bits_reset(r->xs);
    if (op == OP_PUT)
        kvb_block(key, &r->blk);
    c->inflight++;
    w->active++;
    if (!G.http2) {
        c->rphase = RP_HEAD;
        c->hlen = 0;
        build_stream_request(c, r);
        stream_flush(c);
        return;
    }
    {
        char path[1200], clen[24], seq[24], k[1100];
        nghttp2_nv nv[8];
        int nn = 0;
        nghttp2_data_provider prd;
        int32_t id;
#define NV(n_, v_) nv[nn++] = (nghttp2_nv){(uint8_t *)(n_), (uint8_t *)(v_), strlen(n_), strlen(v_), NGHTTP2_NV_FLAG_NONE}
        kvb_key_path(key, k, sizeof(k));
        snprintf(path, sizeof(path), "/kv/%s%s", k, op == OP_EXISTS ? "/exists" : "");
        NV(":method", http_method[op]);
        NV(":scheme", "http");
        NV(":authority", G.target);
        NV(":path", path);
        if (auth_h2[0])
            NV("authorization", auth_h2);
        if (op == OP_PUT) {
            snprintf(clen, sizeof(clen), "%llu", (unsigned long long)r->size);
            NV("content-length", clen);
            if (r->seqhash) {
                snprintf(seq, sizeof(seq), "%llu", (unsigned long long)r->seqhash);
                NV("x-kv-sequence-hash", seq);
            }
        }
#undef NV
        prd.source.ptr = r;
        prd.read_callback = h2_read_cb;
        id = nghttp2_submit_request(c->h2, NULL, nv, (size_t)nn, op == OP_PUT ? &prd : NULL, r);
        if (id < 0) {
            note_req(w, EK_CONNECT, r, "cannot submit (%s)", nghttp2_strerror(id));
            req_finish(c, r, EK_CONNECT, 0);
        }
    }
}

static void conn_fill(kvb_conn_t *c)
{
    kvb_worker_t *w = c->w;
    kvb_req_t *r;
    if (c->state != CS_UP)
        return;
    if (!(w->paced && w->phase == PH_MAIN)) {
        while (w->issuing && (r = free_slot(c)) != NULL) {
            int op;
            uint64_t key;
            if (!claim(w, &op, &key)) {
                w->issuing = 0;
                break;
            }
            req_start(c, r, op, key);
            if (c->state != CS_UP)
                return;
        }
    }
    if (G.http2 && c->state == CS_UP)
        h2_flush(c);
}

static void conn_up(kvb_conn_t *c)
{
    c->state = CS_UP;
    conn_events(c, EPOLLIN);
    if (G.http2 && h2_init(c) != 0) {
        conn_fail(c, EK_CONNECT, "nghttp2 session");
        return;
    }
    conn_fill(c);
}

static void conn_event(kvb_conn_t *c, uint32_t ev)
{
    if (c->state == CS_DOWN)
        return; /* an event of a socket closed earlier in this batch */
    if (c->state == CS_CONNECTING) {
        int err = 0;
        socklen_t sl = sizeof(err);
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0)
            err = errno;
        if (err != 0)
            connect_failed(c, err);
        else if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))
            conn_up(c);
        return;
    }
    if (ev & EPOLLOUT) {
        if (G.http2)
            h2_flush(c);
        else
            stream_flush(c);
        if (c->state != CS_UP)
            return;
    }
    if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
        if (G.http2)
            h2_readable(c);
        else
            stream_readable(c);
    }
}

/* Paced issuing (relay): PUT number i is due at t_start + i / rate. */
static void pace_issue(kvb_worker_t *w, uint64_t now)
{
    double due;
    int rr = 0;
    if (!w->issuing)
        return;
    if (C.stop || (C.t_deadline && now >= C.t_deadline)) {
        w->issuing = 0;
        return;
    }
    due = (double)(now - C.t_start) * G.rate / 1e9;
    while ((double)w->paced_sent < due) {
        kvb_conn_t *c = NULL;
        kvb_req_t *r = NULL;
        int op;
        uint64_t key;
        for (int i = 0; i < w->nconns && r == NULL; i++) {
            c = w->conns[(rr + i) % w->nconns];
            r = free_slot(c);
        }
        if (r == NULL)
            break; /* every connection busy: the load is late, not dropped */
        rr = (c->id + 1) % w->nconns;
        if (!claim(w, &op, &key)) {
            w->issuing = 0;
            break;
        }
        w->paced_sent++;
        req_start(c, r, op, key);
    }
    if (G.http2)
        for (int i = 0; i < w->nconns; i++)
            if (w->conns[i]->state == CS_UP && w->conns[i]->oq.bytes == 0)
                h2_flush(w->conns[i]);
}

static void tick(kvb_worker_t *w, uint64_t now)
{
    uint64_t limit = (uint64_t)(G.timeout * 1e9);
    for (int i = 0; i < w->nconns; i++) {
        kvb_conn_t *c = w->conns[i];
        if (c->state == CS_CONNECTING && now > c->t_connect + limit) {
            connect_failed(c, ETIMEDOUT);
            continue;
        }
        if (c->state != CS_UP || c->inflight == 0)
            continue;
        for (int j = 0; j < c->nreqs; j++)
            if (c->reqs[j].active && now > c->reqs[j].t0 + limit) {
                char why[64];
                snprintf(why, sizeof(why), "no response in %.1f s", G.timeout);
                conn_fail(c, EK_TIMEOUT, why);
                break;
            }
    }
}

static void reopen_due(kvb_worker_t *w, uint64_t now)
{
    int n = w->nreopen;
    kvb_conn_t **list = w->reopen;

    /* conn_open may fail and queue the connection again: work on the other list */
    w->reopen = w->reopen_b;
    w->reopen_b = list;
    w->nreopen = 0;
    for (int i = 0; i < n; i++) {
        kvb_conn_t *c = list[i];
        c->in_reopen = 0;
        if (c->state != CS_DOWN)
            continue;
        if (w->issuing && c->retry_at <= now)
            conn_open(c);
        else
            schedule_reopen(c, c->retry_at);
    }
}

static void run_phase(kvb_worker_t *w, int phase)
{
    struct epoll_event evs[256];
    uint64_t last_tick = kvb_now();
    int puts_done = 0;

    w->phase = phase;
    w->issuing = w->nconns > 0;
    for (int i = 0; i < w->nconns; i++) {
        kvb_conn_t *c = w->conns[i];
        if (c->state == CS_DOWN && !c->in_reopen)
            conn_open(c);
        else if (c->state == CS_UP)
            conn_fill(c);
    }
    for (;;) {
        int timeout = w->paced && w->issuing ? 1 : 10;
        int n = epoll_wait(w->ep, evs, KVR_ARRAY_SIZE(evs), timeout);
        uint64_t now;
        for (int i = 0; i < n; i++) {
            int kind = *(int *)evs[i].data.ptr;
            if (kind == KVB_FD_CONN)
                conn_event(evs[i].data.ptr, evs[i].events);
            else
                kvb_relay_event(w, evs[i].data.ptr, evs[i].events);
        }
        now = kvb_now();
        if (C.stop)
            w->issuing = 0;
        if (w->paced && phase == PH_MAIN)
            pace_issue(w, now);
        else if (w->issuing && C.t_deadline && now >= C.t_deadline && phase == PH_MAIN)
            w->issuing = 0;
        if (w->nreopen)
            reopen_due(w, now);
        if (now - last_tick >= 10000000ull) {
            tick(w, now);
            if (w->relay != NULL)
                kvb_relay_tick(w, now);
            last_tick = now;
        }
        if (!w->issuing && w->active == 0) {
            if (w->paced && phase == PH_MAIN && !puts_done) {
                kvb_relay_puts_done();
                puts_done = 1;
            }
            if (!(w->relay != NULL && phase == PH_MAIN && kvb_relay_busy(w, now)))
                break;
        }
    }
}

void *kvb_worker_main(void *arg)
{
    kvb_worker_t *w = arg;
    if (w->relay != NULL && kvb_relay_setup(w) != 0) {
        C.fatal = 1;
        C.stop = 1;
    }
    if (G.preload && !C.stop)
        run_phase(w, PH_PRELOAD);
    pthread_barrier_wait(&C.bar); /* preload done everywhere */
    pthread_barrier_wait(&C.bar); /* main set the clock */
    if (!C.fatal)
        run_phase(w, PH_MAIN);
    for (int i = 0; i < w->nconns; i++)
        conn_close_fd(w->conns[i]);
    if (w->relay != NULL)
        kvb_relay_close(w);
    return NULL;
}
