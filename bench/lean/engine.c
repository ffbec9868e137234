/*
 * engine.c — lean_client's engine: a block's bytes from its key, the connections (one request
 * in flight each), the HTTP/1.1, memcached text and RESP requests and answers, one epoll loop per
 * thread, the latency histogram. No code in common with tools/kvrelay-bench.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

const char *const ek_name[EK_N] = {"status", "miss", "length", "corrupt", "short", "connect", "timeout", "protocol"};
const char *const proto_name[] = {"http", "memcache", "resp"};
const char *const wl_name[] = {"get", "put"};
opts_t O = {.conns = 16, .threads = 1, .verify = 1, .size = 16384, .keys = 1000, .duration = 10, .timeout = 10, .size_spec = "16K"};
run_t G;

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* ---------------------------------------------------------------- blocks */

void pool_init(void)
{
    size_t words = (O.size + POOL_SPAN) / 8 + 2;
    uint64_t s = 0x6c65616eull;
    G.pool = malloc(words * 8);
    if (G.pool == NULL) {
        fprintf(stderr, "lean_client: no memory for a %zu-byte pool\n", words * 8);
        exit(3);
    }
    for (size_t i = 0; i < words; i++) {
        s += 0x9e3779b97f4a7c15ull;
        put_le64(G.pool + 8 * i, mix64(s));
    }
}

/* The connection's key <prefix>-<n>, its stamp, pool offset and the sampled ranges of a GET. */
static void block_setup(conn_t *c, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull, w;
    c->klen = snprintf(c->key, sizeof(c->key), "%s-%" PRIu64, O.prefix, n);
    for (int i = 0; i < c->klen; i++)
        h = (h ^ (uint8_t)c->key[i]) * 0x100000001b3ull;
    h = mix64(h);
    c->h = h;
    c->off = (h >> 20) % 4096 * 8;
    put_le64(c->stamp, h);
    put_le64(c->stamp + 8, mix64(h ^ O.size));
    c->smp[0][0] = 0;
    c->smp[0][1] = 16;
    c->nsmp = 1;
    if (O.size >= 24) {
        w = 16 + (h >> 7) % ((O.size - 16) / 8) * 8;
        c->smp[1][0] = w;
        c->smp[1][1] = w + 8;
        c->smp[2][0] = O.size - 8;
        c->smp[2][1] = O.size;
        c->nsmp = 3;
    }
}

/* Compares the sampled ranges that fall in body bytes [pos, pos + n) with the block's. */
static int verify_chunk(const conn_t *c, uint64_t pos, const uint8_t *d, size_t n)
{
    for (int i = 0; i < c->nsmp; i++) {
        uint64_t lo = c->smp[i][0] > pos ? c->smp[i][0] : pos;
        uint64_t hi = c->smp[i][1] < pos + n ? c->smp[i][1] : pos + n;
        if (lo >= hi)
            continue;
        const uint8_t *want = lo < 16 ? c->stamp + lo : G.pool + c->off + lo - 16;
        if (memcmp(d + (lo - pos), want, hi - lo) != 0)
            return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- statistics */

static int bucket_of(uint64_t v)
{
    if (v < 256)
        return (int)v;
    int e = 63 - __builtin_clzll(v);
    return 256 + (e - 8) * 128 + (int)((v >> (e - 7)) & 127);
}

static double bucket_mid(int i)
{
    if (i < 256)
        return i;
    int e = (i - 256) / 128 + 8, sub = (i - 256) % 128;
    return (double)((128ull + (uint64_t)sub) << (e - 7)) + (double)(1ull << (e - 7)) / 2;
}

double quantile_ns(const stats_t *s, double q)
{
    uint64_t rank = (uint64_t)(q * (double)s->hn + 0.999999), seen = 0;
    if (s->hn == 0)
        return 0;
    if (rank < 1)
        rank = 1;
    for (int i = 0; i < NBUCK; i++) {
        seen += s->hist[i];
        if (seen >= rank) {
            double v = bucket_mid(i);
            return v > (double)s->hmax ? (double)s->hmax : v;
        }
    }
    return (double)s->hmax;
}

void stats_add(stats_t *to, const stats_t *from)
{
    to->ok += from->ok;
    to->bytes += from->bytes;
    to->misses += from->misses;
    to->hn += from->hn;
    to->hsum += from->hsum;
    to->hmax = from->hmax > to->hmax ? from->hmax : to->hmax;
    for (int k = 0; k < EK_N; k++)
        to->err[k] += from->err[k];
    for (int i = 0; i < 600; i++)
        to->status[i] += from->status[i];
    for (int i = 0; i < NBUCK; i++)
        to->hist[i] += from->hist[i];
}

uint64_t errs_of(const stats_t *s)
{
    uint64_t n = 0;
    for (int k = 0; k < EK_N; k++)
        n += s->err[k];
    return n;
}

/* Counts an error of kind k for c's request; the first of each kind is kept as a sample. */
static void count_error(thr_t *t, conn_t *c, int k, const char *fmt, ...)
{
    va_list ap;
    int n;
    t->st[G.phase].err[k]++;
    if (k == EK_MISS)
        t->st[G.phase].misses++;
    if (G.phase == 1 && k == EK_CONNECT) /* a connect error takes a request's place in --requests */
        __atomic_add_fetch(&G.issued, 1, __ATOMIC_RELAXED);
    if (t->sample[k][0])
        return;
    n = snprintf(t->sample[k], sizeof(t->sample[k]), "%s %s: ", c->op == W_PUT ? "PUT" : "GET", c->key);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(t->sample[k]))
        vsnprintf(t->sample[k] + n, sizeof(t->sample[k]) - (size_t)n, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------- connections */

static int stopping(void)
{
    if (G.phase == 0)
        return __atomic_load_n(&G.pre_next, __ATOMIC_RELAXED) >= O.keys;
    if (O.requests && __atomic_load_n(&G.issued, __ATOMIC_RELAXED) >= O.requests)
        return 1;
    return G.end_ns && now_ns() >= G.end_ns;
}

static int sock_open(void)
{
    int fd = socket(O.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), on = 1;
    if (fd >= 0)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    return fd;
}

static void ep_set(thr_t *t, conn_t *c, int op, uint32_t ev)
{
    struct epoll_event e = {.events = ev, .data.ptr = c};
    epoll_ctl(t->ep, op, c->fd, &e);
}

/* A connect that failed (err): counted, the socket closed, retried in 100 ms. */
static void connect_failed(thr_t *t, conn_t *c, int err)
{
    count_error(t, c, EK_CONNECT, "%s", strerror(err));
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->state = CS_DOWN;
    c->retry_at = now_ns() + 100000000ull;
    t->down++;
}

static void begin_connect(thr_t *t, conn_t *c)
{
    c->fd = sock_open();
    c->t0 = now_ns();
    if (c->fd < 0 || (connect(c->fd, (struct sockaddr *)&O.addr, O.addrlen) != 0 && errno != EINPROGRESS)) {
        connect_failed(t, c, errno);
        return;
    }
    c->state = CS_CONNECTING;
    t->busy++;
    ep_set(t, c, EPOLL_CTL_ADD, EPOLLOUT);
}

/* Closes c (its request, if any, already counted); reopens it unless the run is ending. */
static void conn_reset(thr_t *t, conn_t *c)
{
    if (c->state == CS_BUSY || c->state == CS_CONNECTING)
        t->busy--;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->state = CS_DOWN;
    c->sending = 0;
    if (G.phase == 1 && !stopping()) {
        begin_connect(t, c);
        return;
    }
    c->retry_at = now_ns(); /* reopened in the measured phase, if it is still running */
    t->down++;
}

static void fail(thr_t *t, conn_t *c, int k, const char *what)
{
    count_error(t, c, k, "%s", what);
    conn_reset(t, c);
}

static void send_some(thr_t *t, conn_t *c)
{
    while (c->iov_i < c->iov_n) {
        ssize_t n = writev(c->fd, c->iov + c->iov_i, c->iov_n - c->iov_i);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                if (!c->sending)
                    ep_set(t, c, EPOLL_CTL_MOD, EPOLLIN | EPOLLOUT);
                c->sending = 1;
                return;
            }
            fail(t, c, EK_SHORT, strerror(errno));
            return;
        }
        while (n > 0 && (size_t)n >= c->iov[c->iov_i].iov_len)
            n -= (ssize_t)c->iov[c->iov_i++].iov_len;
        if (n > 0) {
            c->iov[c->iov_i].iov_base = (char *)c->iov[c->iov_i].iov_base + n;
            c->iov[c->iov_i].iov_len -= (size_t)n;
        }
    }
    if (c->sending)
        ep_set(t, c, EPOLL_CTL_MOD, EPOLLIN);
    c->sending = 0;
}

/* Builds the request for c's key and operation: head, then (PUT) stamp, pool slice, trailer. */
static void build_request(conn_t *c)
{
    static const char crlf[] = "\r\n";
    unsigned long long sz = (unsigned long long)O.size;
    int n, put = c->op == W_PUT;
    if (O.proto == P_HTTP)
        n = put ? snprintf(c->req, sizeof(c->req), "PUT /kv/%s HTTP/1.1\r\nHost: lean\r\nContent-Length: %llu\r\n\r\n", c->key, sz)
                : snprintf(c->req, sizeof(c->req), "GET /kv/%s HTTP/1.1\r\nHost: lean\r\n\r\n", c->key);
    else if (O.proto == P_MC)
        n = put ? snprintf(c->req, sizeof(c->req), "set %s 0 0 %llu\r\n", c->key, sz)
                : snprintf(c->req, sizeof(c->req), "get %s\r\n", c->key);
    else
        n = put ? snprintf(c->req, sizeof(c->req), "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%llu\r\n", c->klen, c->key, sz)
                : snprintf(c->req, sizeof(c->req), "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", c->klen, c->key);
    c->iov[0] = (struct iovec){c->req, (size_t)n};
    c->iov_n = 1;
    c->iov_i = 0;
    if (put) {
        c->iov[1] = (struct iovec){c->stamp, 16};
        c->iov[2] = (struct iovec){G.pool + c->off, O.size - 16};
        c->iov_n = 3;
        if (O.proto != P_HTTP)
            c->iov[c->iov_n++] = (struct iovec){(void *)crlf, 2};
    }
}

/* Starts c's next request, or leaves it idle when the phase is over. */
static void next_request(thr_t *t, conn_t *c)
{
    uint64_t n;
    if (G.phase == 0) {
        n = __atomic_fetch_add(&G.pre_next, 1, __ATOMIC_RELAXED);
        if (n >= O.keys)
            return;
        c->op = W_PUT;
    } else {
        if (stopping())
            return;
        if (O.requests && __atomic_fetch_add(&G.issued, 1, __ATOMIC_RELAXED) >= O.requests)
            return;
        c->op = O.workload;
        if (c->op == W_PUT)
            n = __atomic_fetch_add(&G.put_next, 1, __ATOMIC_RELAXED);
        else if (O.round_robin)
            n = (t->rr++ * (uint64_t)O.threads + (uint64_t)t->id) % O.keys;
        else {
            t->rng ^= t->rng << 13;
            t->rng ^= t->rng >> 7;
            t->rng ^= t->rng << 17;
            n = t->rng % O.keys;
        }
    }
    block_setup(c, n);
    build_request(c);
    c->rstate = R_HEAD;
    c->hlen = 0;
    c->pend = -1;
    c->close_after = 0;
    c->state = CS_BUSY;
    t->busy++;
    c->t0 = now_ns();
    send_some(t, c);
}

/* ---------------------------------------------------------------- answers */

/* Sets the body to expect and the verdict of a GET answer of `len` body bytes. */
static void expect_get_body(conn_t *c, uint64_t len)
{
    c->body_len = len;
    if (len != O.size)
        c->pend = EK_LENGTH;
}

/* HTTP/1.x status line and headers in hbuf: status, Content-Length, Connection: close. */
static int head_http(conn_t *c)
{
    char *p = c->hbuf, *line, *eol;
    int status, have_len = 0;
    uint64_t len = 0;
    if (strncmp(p, "HTTP/1.", 7) || c->hlen < 16 || p[8] != ' ')
        return -1;
    status = atoi(p + 9);
    if (status < 100 || status > 599)
        return -1;
    c->body_len = 0;
    line = strstr(p, "\r\n");
    *line = 0; /* the status line alone stays in hbuf, for the sample of an error */
    for (line += 2; strncmp(line, "\r\n", 2); line = eol + 2) {
        eol = strstr(line, "\r\n");
        *eol = 0;
        if (!strncasecmp(line, "content-length:", 15)) {
            len = strtoull(line + 15, NULL, 10);
            have_len = 1;
        } else if (!strncasecmp(line, "transfer-encoding:", 18))
            return -1;
        else if (!strncasecmp(line, "connection:", 11) && strcasestr(line, "close"))
            c->close_after = 1;
    }
    if (!have_len && status != 204 && status != 304)
        return -1;
    c->trail_len = 0;
    c->status = status;
    if (c->op == W_PUT) {
        c->body_len = len;
        if (status != 200 && status != 201 && status != 204)
            c->pend = EK_STATUS;
    } else if (status == 200)
        expect_get_body(c, len);
    else {
        c->body_len = len;
        c->pend = status == 404 ? EK_MISS : EK_STATUS;
    }
    return 0;
}

/* One reply line in hbuf (without its CRLF) of memcached's text protocol or of RESP. */
static int head_line(conn_t *c)
{
    char *l = c->hbuf, k[KEY_CAP];
    unsigned flags;
    unsigned long long n;
    int is_err = !strncmp(l, "SERVER_ERROR", 12) || !strncmp(l, "CLIENT_ERROR", 12) || !strcmp(l, "ERROR") || l[0] == '-';
    c->body_len = 0;
    c->trail_len = 0;
    if (O.proto == P_RESP && l[0] == '-')
        is_err = 1;
    else if (O.proto == P_RESP && l[0] != '$' && l[0] != '+')
        is_err = -1;
    if (is_err) {
        c->pend = is_err > 0 ? EK_STATUS : EK_PROTOCOL;
        return is_err > 0 ? 0 : -1;
    }
    if (c->op == W_PUT) {
        if (strcmp(l, O.proto == P_MC ? "STORED" : "+OK"))
            c->pend = !strcmp(l, "NOT_STORED") ? EK_STATUS : EK_PROTOCOL;
        return c->pend == EK_PROTOCOL ? -1 : 0;
    }
    if (O.proto == P_MC && !strcmp(l, "END"))
        c->pend = EK_MISS;
    else if (O.proto == P_RESP && !strcmp(l, "$-1"))
        c->pend = EK_MISS;
    else if (O.proto == P_MC && sscanf(l, "VALUE %239s %u %llu", k, &flags, &n) == 3 && !strcmp(k, c->key)) {
        expect_get_body(c, n);
        c->trail = "\r\nEND\r\n";
        c->trail_len = 7;
    } else if (O.proto == P_RESP && l[0] == '$' && sscanf(l + 1, "%llu", &n) == 1) {
        expect_get_body(c, n);
        c->trail = "\r\n";
        c->trail_len = 2;
    } else
        return -1;
    return 0;
}

/* The answer is complete: its verdict is counted and the next request goes out. */
static void complete(thr_t *t, conn_t *c)
{
    uint64_t now = now_ns(), lat = now - c->t0;
    stats_t *s = &t->st[G.phase];
    if (O.proto == P_HTTP && c->status >= 0 && c->status < 600)
        s->status[c->status]++;
    t->busy--;
    c->state = CS_IDLE;
    t->last_ns = now;
    if (c->pend >= 0)
        count_error(t, c, c->pend, "%s", c->pend == EK_LENGTH ? "body length differs from --size" : c->pend == EK_CORRUPT ? "bytes differ from the block's"
                                                                                                                          : c->hbuf);
    else {
        s->ok++;
        s->bytes += O.size;
        s->hist[bucket_of(lat)]++;
        s->hn++;
        s->hsum += lat;
        if (lat > s->hmax)
            s->hmax = lat;
    }
}

/* After a complete answer with no byte beyond it: the next request, or a new connection. */
static void after_answer(thr_t *t, conn_t *c)
{
    if (c->sending) { /* answered before its body was sent: the stream is out of step */
        if (c->pend < 0)
            count_error(t, c, EK_STATUS, "answered before the request was sent");
        conn_reset(t, c);
    } else if (c->close_after)
        conn_reset(t, c);
    else
        next_request(t, c);
}

/* Feeds n received bytes to c's answer; -1 when c was reset, 0 otherwise. */
static int feed(thr_t *t, conn_t *c, const uint8_t *d, size_t n)
{
    while (n > 0) {
        if (c->state != CS_BUSY) {
            fail(t, c, EK_PROTOCOL, "bytes beyond the answer");
            return -1;
        }
        if (c->rstate == R_HEAD) {
            size_t old = c->hlen, take = n < HBUF_CAP - old ? n : HBUF_CAP - old, from = old > 3 ? old - 3 : 0, end = 0;
            const char *term = O.proto == P_HTTP ? "\r\n\r\n" : "\r\n";
            size_t tl = strlen(term);
            memcpy(c->hbuf + old, d, take);
            c->hlen = old + take;
            c->hbuf[c->hlen] = 0;
            for (size_t i = from; i + tl <= c->hlen && !end; i++)
                if (!memcmp(c->hbuf + i, term, tl))
                    end = i + tl;
            if (!end) {
                if (c->hlen == HBUF_CAP) {
                    fail(t, c, EK_PROTOCOL, "answer head over 2 KiB");
                    return -1;
                }
                return 0;
            }
            d += end - old;
            n -= end - old;
            c->hlen = end;
            c->hbuf[O.proto == P_HTTP ? end : end - 2] = 0;
            c->status = -1;
            if ((O.proto == P_HTTP ? head_http(c) : head_line(c)) != 0) {
                fail(t, c, EK_PROTOCOL, "unparseable answer head");
                return -1;
            }
            c->body_got = c->trail_got = 0;
            c->rstate = R_BODY;
        } else if (c->rstate == R_BODY) {
            size_t m = c->body_len - c->body_got < n ? (size_t)(c->body_len - c->body_got) : n;
            if (c->op == W_GET && c->pend < 0 && O.verify && verify_chunk(c, c->body_got, d, m) != 0)
                c->pend = EK_CORRUPT;
            c->body_got += m;
            d += m;
            n -= m;
        } else {
            size_t m = c->trail_len - c->trail_got < n ? c->trail_len - c->trail_got : n;
            if (memcmp(d, c->trail + c->trail_got, m) != 0) {
                fail(t, c, EK_PROTOCOL, "bad bytes after the value");
                return -1;
            }
            c->trail_got += m;
            d += m;
            n -= m;
        }
        if (c->rstate == R_BODY && c->body_got == c->body_len)
            c->rstate = R_TRAIL;
        if (c->rstate == R_TRAIL && c->trail_got == c->trail_len) {
            complete(t, c);
            if (n > 0) {
                fail(t, c, EK_PROTOCOL, "bytes beyond the answer");
                return -1;
            }
            after_answer(t, c);
            return c->state == CS_BUSY || c->state == CS_IDLE ? 0 : -1;
        }
    }
    return 0;
}

static void on_readable(thr_t *t, conn_t *c)
{
    for (int round = 0; round < 16; round++) {
        ssize_t n = read(c->fd, t->rbuf, RBUF_CAP);
        if (n > 0) {
            if (feed(t, c, t->rbuf, (size_t)n) < 0)
                return;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (c->state == CS_BUSY)
            count_error(t, c, EK_SHORT, "%s", n == 0 ? "connection closed inside an answer" : strerror(errno));
        conn_reset(t, c);
        return;
    }
}

static void on_connected(thr_t *t, conn_t *c)
{
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) {
        t->busy--;
        connect_failed(t, c, err);
        return;
    }
    t->busy--;
    c->state = CS_IDLE;
    ep_set(t, c, EPOLL_CTL_MOD, EPOLLIN);
    next_request(t, c);
}

/* Every 20 ms: requests past --timeout, and connections to reopen. */
static void scan(thr_t *t, uint64_t now)
{
    uint64_t limit = (uint64_t)(O.timeout * 1e9);
    if (now - t->last_scan < 20000000ull)
        return;
    t->last_scan = now;
    for (int i = 0; i < t->nconn; i++) {
        conn_t *c = &t->conns[i];
        if ((c->state == CS_BUSY || c->state == CS_CONNECTING) && now - c->t0 > limit)
            fail(t, c, c->state == CS_BUSY ? EK_TIMEOUT : EK_CONNECT, "no answer within --timeout");
        else if (c->state == CS_DOWN && c->retry_at && now >= c->retry_at && G.phase == 1 && !stopping()) {
            t->down--;
            c->retry_at = 0;
            begin_connect(t, c);
        }
    }
}

static void run_phase(thr_t *t)
{
    struct epoll_event ev[64];
    for (int i = 0; i < t->nconn; i++)
        if (t->conns[i].state == CS_IDLE)
            next_request(t, &t->conns[i]);
    while (t->busy > 0 || (G.phase == 1 && t->down > 0 && !stopping())) {
        int n = epoll_wait(t->ep, ev, 64, 10);
        for (int i = 0; i < n; i++) {
            conn_t *c = ev[i].data.ptr;
            if (c->state == CS_CONNECTING) {
                on_connected(t, c);
                continue;
            }
            if ((ev[i].events & EPOLLOUT) && c->sending) {
                send_some(t, c);
                if (c->fd < 0 || c->state != CS_BUSY)
                    continue;
            }
            if (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                on_readable(t, c);
        }
        scan(t, now_ns());
    }
}

void *thread_main(void *arg)
{
    thr_t *t = arg;
    if (O.preload)
        run_phase(t);
    if (pthread_barrier_wait(&G.bar) == PTHREAD_BARRIER_SERIAL_THREAD) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        G.cpu0_u = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
        G.cpu0_s = (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
        G.start_ns = now_ns();
        G.end_ns = O.duration > 0 ? G.start_ns + (uint64_t)(O.duration * 1e9) : 0;
        G.put_next = O.preload ? O.keys : 0;
        G.phase = 1;
    }
    pthread_barrier_wait(&G.bar);
    t->last_ns = 0;
    run_phase(t);
    return NULL;
}

thr_t *setup_threads(void)
{
    thr_t *ts = calloc((size_t)O.threads, sizeof(*ts));
    if (ts == NULL)
        exit(3);
    for (int i = 0; i < O.threads; i++) {
        thr_t *t = &ts[i];
        t->id = i;
        t->rng = mix64(0x5eedull + (uint64_t)i) | 1;
        t->nconn = O.conns / O.threads + (i < O.conns % O.threads);
        t->conns = calloc((size_t)t->nconn, sizeof(conn_t));
        t->rbuf = malloc(RBUF_CAP);
        t->ep = epoll_create1(EPOLL_CLOEXEC);
        if (t->conns == NULL || t->rbuf == NULL || t->ep < 0)
            exit(3);
        for (int j = 0; j < t->nconn; j++) {
            conn_t *c = &t->conns[j];
            int fd = socket(O.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), on = 1;
            if (fd < 0 || connect(fd, (struct sockaddr *)&O.addr, O.addrlen) != 0) {
                fprintf(stderr, "lean_client: cannot connect to %s: %s\n", O.target, strerror(errno));
                exit(3);
            }
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            c->fd = fd;
            c->state = CS_IDLE;
            ep_set(t, c, EPOLL_CTL_ADD, EPOLLIN);
        }
    }
    return ts;
}

void free_threads(thr_t *ts)
{
    for (int i = 0; i < O.threads; i++) {
        thr_t *t = &ts[i];
        for (int j = 0; j < t->nconn; j++)
            if (t->conns[j].fd >= 0)
                close(t->conns[j].fd);
        close(t->ep);
        free(t->conns);
        free(t->rbuf);
    }
    free(ts);
}
