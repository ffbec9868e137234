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
 *
 * This file: output queues, workers and connections, choosing requests, the event loop. The
 * responses are engine_proto.c's, HTTP/2 is engine_h2.c's (engine_int.h).
 */
#include "engine_int.h"
#include "relay.h"

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

char kvb_auth_line[600]; /* "Authorization: Bearer T\r\n" or "" (HTTP/1.1) */
char kvb_auth_h2[600];   /* "Bearer T" or "" (HTTP/2) */

void kvb_note_error(kvb_worker_t *w, int ek, const char *fmt, ...)
{
    va_list ap;
    if (w->sample[ek][0])
        return;
    va_start(ap, fmt);
    vsnprintf(w->sample[ek], sizeof(w->sample[ek]), fmt, ap);
    va_end(ap);
}

void kvb_note_req(kvb_worker_t *w, int ek, const kvb_req_t *r, const char *fmt, ...)
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

void kvb_oq_own(outq_t *q, const void *p, size_t len)
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
int kvb_oq_flush(int fd, outq_t *q)
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
void kvb_oq_block(outq_t *q, const kvb_block_t *b, uint64_t off, uint64_t len)
{
    if (off < b->stamp_len) {
        size_t take = (size_t)(b->stamp_len - off) < len ? (size_t)(b->stamp_len - off) : (size_t)len;
        kvb_oq_own(q, b->stamp + off, take);
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
        snprintf(kvb_auth_line, sizeof(kvb_auth_line), "Authorization: Bearer %.500s\r\n", G.token);
        snprintf(kvb_auth_h2, sizeof(kvb_auth_h2), "Bearer %.500s", G.token);
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

void kvb_conn_events(kvb_conn_t *c, uint32_t want)
{
    struct epoll_event ev;
    if (want == c->evmask || c->fd < 0)
        return;
    ev.events = want;
    ev.data.ptr = c;
    epoll_ctl(c->w->ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->evmask = want;
}

void kvb_schedule_reopen(kvb_conn_t *c, uint64_t at)
{
    c->retry_at = at;
    if (!c->in_reopen) {
        c->in_reopen = 1;
        c->w->reopen[c->w->nreopen++] = c;
    }
}

static int claim(kvb_worker_t *w, int *op, uint64_t *key);

/* Records the outcome of one request. ek: -1 success, else an error kind. */
void kvb_req_finish(kvb_conn_t *c, kvb_req_t *r, int ek, int miss)
{
    kvb_worker_t *w = c->w;
    uint64_t now = kvb_now();
    kvb_stats_t *s = r->phase == PH_PRELOAD ? w->pre : w->st;
    int counted = r->phase == PH_PRELOAD || r->measured;

    if (ek < 0 && miss && !G.misses_ok)
        ek = EK_MISS;
    if (ek == EK_MISS)
        kvb_note_req(w, EK_MISS, r, "absent");
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

void kvb_conn_close_fd(kvb_conn_t *c)
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
ssize_t kvb_conn_read(kvb_conn_t *c)
{
    for (;;) {
        ssize_t n = read(c->fd, c->w->tbuf, TBUF_CAP);
        char why[128];

        if (n > 0)
            return n;
        if (n == 0) {
            kvb_conn_fail(c, EK_AUTO, "connection closed by the server");
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        snprintf(why, sizeof(why), "read: %s", strerror(errno));
        kvb_conn_fail(c, EK_AUTO, why);
        return -1;
    }
}

void kvb_conn_fail(kvb_conn_t *c, int ek, const char *why)
{
    for (int i = 0; i < c->nreqs; i++) {
        kvb_req_t *r = &c->reqs[i];
        int k = ek;
        if (!r->active)
            continue;
        if (k == EK_AUTO)
            k = (r->head_done || (c->rphase == RP_HEAD && c->hlen > 0)) ? EK_SHORT : EK_CONNECT;
        kvb_note_req(c->w, k, r, "%s", why);
        kvb_req_finish(c, r, k, 0);
    }
    kvb_conn_close_fd(c);
    kvb_schedule_reopen(c, kvb_now());
}

static void connect_failed(kvb_conn_t *c, int err)
{
    kvb_worker_t *w = c->w;
    int op;
    uint64_t key;

    kvb_conn_close_fd(c);
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
    kvb_schedule_reopen(c, kvb_now() + RETRY_NS);
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
        kvb_build_stream_request(c, r);
        kvb_stream_flush(c);
        return;
    }
    kvb_h2_submit(c, r);
}

void kvb_conn_fill(kvb_conn_t *c)
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
        kvb_h2_flush(c);
}

static void conn_up(kvb_conn_t *c)
{
    c->state = CS_UP;
    kvb_conn_events(c, EPOLLIN);
    if (G.http2 && kvb_h2_init(c) != 0) {
        kvb_conn_fail(c, EK_CONNECT, "nghttp2 session");
        return;
    }
    kvb_conn_fill(c);
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
            kvb_h2_flush(c);
        else
            kvb_stream_flush(c);
        if (c->state != CS_UP)
            return;
    }
    if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
        if (G.http2)
            kvb_h2_readable(c);
        else
            kvb_stream_readable(c);
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
                kvb_h2_flush(w->conns[i]);
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
                kvb_conn_fail(c, EK_TIMEOUT, why);
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
            kvb_schedule_reopen(c, c->retry_at);
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
            kvb_conn_fill(c);
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
        kvb_conn_close_fd(w->conns[i]);
    if (w->relay != NULL)
        kvb_relay_close(w);
    return NULL;
}
