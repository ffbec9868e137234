/*
 * kvrelay-top — a live view of one kvrelay server, as `redis-cli --stat` or `memcached-tool
 * HOST display` give for theirs: request rates by method, GB/s in and out, the GET hit ratio,
 * arena fill, evictions/s, pins, processes and the top error statuses.
 *
 *   kvrelay-top                                  127.0.0.1:9130, every second, until interrupted
 *   kvrelay-top -a 10.0.0.5:9130 -i 5 -n 12      a minute of 5-second samples, then exit
 *   kvrelay-top --token-file /var/run/kvrelay/token/token     a server that wants a bearer token
 *                                                (under --tenants, /metrics wants the admin token)
 *
 * Each sample is two GETs, /kv/stats and /metrics, each on its own HTTP/1.1 connection
 * (plain sockets, Connection: close); no TLS. Rates are over the last interval: the first
 * sample is printed one interval after the start, so that every sample has them. Counters are
 * the server's own totals (all its workers, across restarts), so the view of any one client of
 * a pod is the pod's. kvrelay-top's own two GETs count among the server's requests.
 *
 * On a terminal it redraws one screen per sample. When stdout is not a terminal (a pipe, a
 * file, a test), or with --plain, it prints one line per sample, key=value pairs separated by
 * spaces, no escape sequences:
 *
 *   ts          wall clock, Unix seconds
 *   req_s       requests/s, all methods; get_s put_s head_s delete_s other_s by method
 *   in_gbps     request body bytes received, GB/s (10^9); out_gbps response bytes sent
 *   requests    requests served so far (every method and status)
 *   hits misses GETs of blocks that found / did not find them, so far (/kv/stats)
 *   hit_ratio   hits / (hits + misses) so far; hit_ratio_now the same over the interval;
 *               "-" when there was no GET of a block
 *   fill        1 - free / capacity of the block arena (pages held by blocks)
 *   blocks resident_bytes logical_bytes capacity_bytes dedup_hits   the store (/kv/stats)
 *   evict_s evictions   blocks evicted per second, and so far
 *   pins        blocks pinned by GETs in flight
 *   workers restarts subscribers   worker processes, workers replaced, relay subscribers
 *   errors      the five commonest statuses >= 400 so far, "404:12,409:1", or "-"
 *
 * Exit status: 0 after -n samples, 1 when the server cannot be read (the reason on stderr),
 * 2 for a command line in error.
 */
#include "base/clock.h"
#include "common.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define TOP_BODY_MAX   (8u << 20) /* largest response read: /metrics is ~16 KiB */
#define TOP_IO_TIMEOUT 5          /* seconds for connect, send and each receive */
#define TOP_STATUSES   32         /* distinct status labels kept */
#define TOP_ERRORS     5          /* error statuses shown */

static const char *const methods[] = {"GET", "PUT", "HEAD", "DELETE", "other"};
#define TOP_METHODS KVR_ARRAY_SIZE(methods)

typedef struct {
    char name[8]; /* "404", "other" */
    uint64_t n;
} status_t;

/* One reading of the server. */
typedef struct {
    double mono; /* CLOCK_MONOTONIC seconds when read */
    double wall; /* CLOCK_REALTIME seconds */
    uint64_t req[TOP_METHODS], requests;
    status_t st[TOP_STATUSES];
    size_t nst;
    uint64_t bytes_in, bytes_out, free_bytes, capacity, pins, workers, restarts, subscribers;
    uint64_t hits, misses, evictions, blocks, resident, logical, dedup_hits;
} sample_t;

typedef struct {
    char host[256], port[16];
    const char *addr;
    char token[512];
    double interval;
    long count;
    int plain;
} args_t;

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

/* ------------------------------------------------------------------ HTTP/1.1 GET */

/* Appends n bytes; -1 past TOP_BODY_MAX or out of memory. */
static int buf_add(buf_t *b, const char *s, size_t n)
{
    if (b->len + n + 1 > TOP_BODY_MAX)
        return -1;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static int dial(const args_t *a, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    struct timeval tv = {.tv_sec = TOP_IO_TIMEOUT};
    int fd = -1, rc;

    rc = getaddrinfo(a->host, a->port, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "%s: %s", a->host, gai_strerror(rc));
        return -1;
    }
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0)
            continue;
        /* SO_SNDTIMEO bounds connect() too (socket(7)). */
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        snprintf(err, errlen, "connect %s:%s: %s", a->host, a->port, strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* Case-insensitive search for header `name` in the head h[0..n); its value or NULL. */
static const char *header(const char *h, size_t n, const char *name)
{
    size_t k = strlen(name);
    for (const char *p = h; p != NULL && p < h + n;) {
        const char *eol = memchr(p, '\n', (size_t)(h + n - p));
        if ((size_t)(h + n - p) > k && strncasecmp(p, name, k) == 0 && p[k] == ':') {
            p += k + 1;
            while (*p == ' ' || *p == '\t')
                p++;
            return p;
        }
        p = eol ? eol + 1 : NULL;
    }
    return NULL;
}

/* Decodes a chunked body in place; -1 when malformed or cut short. */
static ssize_t dechunk(char *b, size_t n)
{
    size_t in = 0, out = 0;
    for (;;) {
        char *end;
        unsigned long long sz = strtoull(b + in, &end, 16);
        char *eol = memchr(b + in, '\n', n - in);
        if (end == b + in || eol == NULL)
            return -1;
        in = (size_t)(eol - b) + 1;
        if (sz == 0)
            return (ssize_t)out;
        if (sz > n - in || n - in - sz < 2)
            return -1;
        memmove(b + out, b + in, sz);
        out += sz;
        in += sz + 2; /* the chunk's CRLF */
    }
}

/*
 * GETs path into body (NUL-terminated, the head removed). 0 on a 200 with the whole body;
 * -1 with the reason in err otherwise.
 */
static int http_get(const args_t *a, const char *path, buf_t *body, char *err, size_t errlen)
{
    char req[1024], chunk[16384];
    size_t head_len = 0, want = SIZE_MAX;
    int fd, n, chunked = 0, status = 0;
    ssize_t got;

    body->len = 0;
    n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: kvrelay-top\r\n%s%s%s"
                                   "Connection: close\r\n\r\n",
                 path, a->host, a->port, a->token[0] ? "Authorization: Bearer " : "", a->token,
                 a->token[0] ? "\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof(req)) {
        snprintf(err, errlen, "request too long");
        return -1;
    }
    fd = dial(a, err, errlen);
    if (fd < 0)
        return -1;
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        snprintf(err, errlen, "send %s: %s", path, strerror(errno));
        goto fail;
    }
    /* Until the whole body is in: by Content-Length, else (chunked, or none) until EOF. */
    while (head_len == 0 || body->len - head_len < want) {
        got = recv(fd, chunk, sizeof(chunk), 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            snprintf(err, errlen, "recv %s: %s", path, errno == EAGAIN ? "timed out" : strerror(errno));
            goto fail;
        }
        if (got == 0)
            break;
        if (buf_add(body, chunk, (size_t)got) < 0) {
            snprintf(err, errlen, "%s: response over %u bytes", path, TOP_BODY_MAX);
            goto fail;
        }
        if (head_len == 0) {
            char *e = strstr(body->p, "\r\n\r\n");
            if (e == NULL)
                continue;
            head_len = (size_t)(e - body->p) + 4;
            if (sscanf(body->p, "HTTP/1.%*d %d", &status) != 1) {
                snprintf(err, errlen, "%s: not an HTTP/1.x response", path);
                goto fail;
            }
            const char *te = header(body->p, head_len, "Transfer-Encoding");
            const char *cl = header(body->p, head_len, "Content-Length");
            chunked = te != NULL && strncasecmp(te, "chunked", 7) == 0;
            if (cl != NULL && !chunked)
                want = strtoull(cl, NULL, 10);
        }
    }
    close(fd);
    if (head_len == 0 || (want != SIZE_MAX && body->len - head_len < want)) {
        snprintf(err, errlen, "%s: connection closed before the whole response", path);
        return -1;
    }
    if (status != 200) {
        snprintf(err, errlen, "GET %s: HTTP %d%s", path, status,
                 status == 401   ? " (--token / --token-file?)"
                 : status == 403 ? " (a tenant's token? with --tenants it wants the admin token)"
                                 : "");
        return -1;
    }
    memmove(body->p, body->p + head_len, body->len - head_len);
    body->len -= head_len;
    body->p[body->len] = '\0'; /* dechunk's strtoull stops at the end */
    if (chunked) {
        ssize_t m = dechunk(body->p, body->len);
        if (m < 0) {
            snprintf(err, errlen, "%s: malformed chunked body", path);
            return -1;
        }
        body->len = (size_t)m;
    }
    if (want != SIZE_MAX && body->len > want)
        body->len = want;
    body->p[body->len] = '\0';
    return 0;
fail:
    close(fd);
    return -1;
}

/* ------------------------------------------------------------------ parsing */

/* The unsigned integer member `key` of the top level of the JSON object b[0..n) (/kv/stats):
 * 1 and *v when found, 0 when absent or not an unsigned integer. Strings are skipped with
 * their escapes; nested values are passed over. */
static int json_u64(const char *b, size_t n, const char *key, uint64_t *v)
{
    size_t i = 0, klen = strlen(key);
    int depth = 0, want_key = 0;

    while (i < n) {
        char c = b[i];
        if (c == '"') {
            size_t s = ++i, e;
            while (i < n && b[i] != '"')
                i += b[i] == '\\' ? 2 : 1;
            if (i >= n)
                return 0;
            e = i++;
            if (depth != 1 || !want_key)
                continue;
            want_key = 0;
            while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n'))
                i++;
            if (i >= n || b[i] != ':')
                return 0;
            i++;
            while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n'))
                i++;
            if (e - s == klen && memcmp(b + s, key, klen) == 0) {
                uint64_t x = 0;
                size_t d = i;
                while (i < n && b[i] >= '0' && b[i] <= '9') {
                    if (x > (UINT64_MAX - 9) / 10)
                        return 0;
                    x = x * 10 + (uint64_t)(b[i++] - '0');
                }
                if (i == d)
                    return 0;
                *v = x;
                return 1;
            }
            continue;
        }
        if (c == '{' || c == '[') {
            depth++;
            want_key = c == '{' && depth == 1;
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',' && depth == 1) {
            want_key = 1;
        }
        i++;
    }
    return 0;
}

/* Copies the value of label `name` in the label set l[0..n) ("a=\"x\",b=\"y\"") into out. */
static int label(const char *l, size_t n, const char *name, char *out, size_t cap)
{
    size_t k = strlen(name);
    for (size_t i = 0; i + k + 2 <= n; i++) {
        if ((i == 0 || l[i - 1] == ',' || l[i - 1] == ' ') && memcmp(l + i, name, k) == 0 && l[i + k] == '=' &&
            l[i + k + 1] == '"') {
            size_t s = i + k + 2, e = s;
            while (e < n && l[e] != '"')
                e++;
            if (e >= n || e - s >= cap)
                return 0;
            memcpy(out, l + s, e - s);
            out[e - s] = '\0';
            return 1;
        }
    }
    return 0;
}

static void add_status(sample_t *s, const char *name, uint64_t v)
{
    for (size_t i = 0; i < s->nst; i++)
        if (strcmp(s->st[i].name, name) == 0) {
            s->st[i].n += v;
            return;
        }
    if (s->nst < TOP_STATUSES) {
        snprintf(s->st[s->nst].name, sizeof(s->st[s->nst].name), "%s", name);
        s->st[s->nst++].n = v;
    }
}

/* One sample line of the Prometheus text format (comments are skipped by the caller). */
static void metric_line(sample_t *s, const char *ln, size_t n)
{
    static const struct {
        const char *name;
        size_t off;
    } scalars[] = {
        {"kvrelay_http_received_bytes_total", offsetof(sample_t, bytes_in)},
        {"kvrelay_http_sent_bytes_total", offsetof(sample_t, bytes_out)},
        {"kvrelay_free_bytes", offsetof(sample_t, free_bytes)},
        {"kvrelay_capacity_bytes", offsetof(sample_t, capacity)},
        {"kvrelay_pinned_blocks", offsetof(sample_t, pins)},
        {"kvrelay_workers", offsetof(sample_t, workers)},
        {"kvrelay_worker_restarts_total", offsetof(sample_t, restarts)},
    };
    const char *sp = memchr(ln, ' ', n), *br = memchr(ln, '{', n), *lend = NULL;
    size_t nlen;
    double d;
    uint64_t v;
    char val[64], m[16], st[8];

    if (sp == NULL)
        return;
    if (br != NULL && br < sp) {
        lend = memchr(br, '}', n - (size_t)(br - ln));
        if (lend == NULL)
            return;
        sp = memchr(lend, ' ', n - (size_t)(lend - ln));
        if (sp == NULL)
            return;
        nlen = (size_t)(br - ln);
    } else {
        br = NULL;
        nlen = (size_t)(sp - ln);
    }
    if ((size_t)(ln + n - sp) >= sizeof(val))
        return;
    memcpy(val, sp + 1, (size_t)(ln + n - sp - 1));
    val[ln + n - sp - 1] = '\0';
    d = strtod(val, NULL);
    v = d > 0 && isfinite(d) ? (uint64_t)d : 0;

#define IS(lit) (nlen == sizeof(lit) - 1 && memcmp(ln, lit, nlen) == 0)
    if (IS("kvrelay_http_requests_total") && br != NULL) {
        size_t ll = (size_t)(lend - br - 1);
        if (!label(br + 1, ll, "method", m, sizeof(m)) || !label(br + 1, ll, "status", st, sizeof(st)))
            return;
        s->requests += v;
        for (size_t i = 0; i < TOP_METHODS; i++)
            if (strcmp(m, methods[i]) == 0)
                s->req[i] += v;
        add_status(s, st, v);
        return;
    }
    if (IS("kv_dc_relay_subscribers")) {
        s->subscribers += v;
        return;
    }
#undef IS
    if (br != NULL)
        return;
    for (size_t i = 0; i < KVR_ARRAY_SIZE(scalars); i++)
        if (strlen(scalars[i].name) == nlen && memcmp(ln, scalars[i].name, nlen) == 0)
            *(uint64_t *)((char *)s + scalars[i].off) = v;
}

static void parse_metrics(sample_t *s, const char *b, size_t n)
{
    for (const char *p = b; p < b + n;) {
        const char *eol = memchr(p, '\n', (size_t)(b + n - p));
        size_t len = eol ? (size_t)(eol - p) : (size_t)(b + n - p);
        if (len > 0 && p[0] != '#')
            metric_line(s, p, len);
        p += len + 1;
    }
}

/* Reads both pages into s. 0, or -1 with the reason in err. */
static int take_sample(const args_t *a, sample_t *s, buf_t *buf, char *err, size_t errlen)
{
    static const struct {
        const char *key;
        size_t off;
    } fields[] = {
        {"get_hits", offsetof(sample_t, hits)},
        {"get_misses", offsetof(sample_t, misses)},
        {"evictions", offsetof(sample_t, evictions)},
        {"unique_blocks", offsetof(sample_t, blocks)},
        {"resident_bytes", offsetof(sample_t, resident)},
        {"logical_bytes", offsetof(sample_t, logical)},
        {"dedup_hits", offsetof(sample_t, dedup_hits)},
    };

    memset(s, 0, sizeof(*s));
    s->mono = (double)kvr_clock_ns() / 1e9;
    s->wall = (double)kvr_clock_wall_us() / 1e6;
    if (http_get(a, "/kv/stats", buf, err, errlen) < 0)
        return -1;
    for (size_t i = 0; i < KVR_ARRAY_SIZE(fields); i++)
        if (!json_u64(buf->p, buf->len, fields[i].key, (uint64_t *)((char *)s + fields[i].off))) {
            snprintf(err, errlen, "/kv/stats has no %s", fields[i].key);
            return -1;
        }
    if (http_get(a, "/metrics", buf, err, errlen) < 0)
        return -1;
    parse_metrics(s, buf->p, buf->len);
    if (s->capacity == 0) {
        snprintf(err, errlen, "/metrics has no kvrelay_capacity_bytes: not a kvrelay server?");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ output */

/* now - before, 0 if the counter went back (a server restarted without its segment). */
static uint64_t delta(uint64_t now, uint64_t before)
{
    return now >= before ? now - before : 0;
}

static double per_s(uint64_t now, uint64_t before, double dt)
{
    return dt > 0 ? (double)delta(now, before) / dt : 0.0;
}

static uint64_t status_count(const sample_t *s, const char *name)
{
    for (size_t i = 0; i < s->nst; i++)
        if (strcmp(s->st[i].name, name) == 0)
            return s->st[i].n;
    return 0;
}

static int is_error(const char *name)
{
    return strcmp(name, "other") == 0 || atoi(name) >= 400;
}

/* The error statuses of s, commonest first (ties: lower code first), at most TOP_ERRORS. */
static size_t top_errors(const sample_t *s, const status_t **out)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nst; i++)
        if (is_error(s->st[i].name) && s->st[i].n > 0)
            out[n++] = &s->st[i];
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && (out[j]->n > out[j - 1]->n ||
                                     (out[j]->n == out[j - 1]->n && strcmp(out[j]->name, out[j - 1]->name) < 0));
             j--) {
            const status_t *t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n < TOP_ERRORS ? n : TOP_ERRORS;
}

/* hits / (hits + misses) into out as a fraction (or, pct, a percentage); "-" without GETs. */
static void ratio(char *out, size_t cap, uint64_t hits, uint64_t misses, int pct)
{
    if (hits + misses == 0)
        snprintf(out, cap, "-");
    else if (pct)
        snprintf(out, cap, "%.1f %%", 100.0 * (double)hits / (double)(hits + misses));
    else
        snprintf(out, cap, "%.4f", (double)hits / (double)(hits + misses));
}

static void print_plain(const sample_t *s, const sample_t *p)
{
    double dt = s->mono - p->mono;
    char hr[16], hrn[16];
    const status_t *errs[TOP_STATUSES];
    size_t ne = top_errors(s, errs);

    ratio(hr, sizeof(hr), s->hits, s->misses, 0);
    ratio(hrn, sizeof(hrn), delta(s->hits, p->hits), delta(s->misses, p->misses), 0);
    printf("ts=%.3f req_s=%.1f", s->wall, per_s(s->requests, p->requests, dt));
    for (size_t i = 0; i < TOP_METHODS; i++) {
        char k[16];
        size_t j;
        for (j = 0; methods[i][j] && j < sizeof(k) - 1; j++)
            k[j] = (char)(methods[i][j] | 0x20); /* lower case */
        k[j] = '\0';
        printf(" %s_s=%.1f", k, per_s(s->req[i], p->req[i], dt));
    }
    printf(" in_gbps=%.6f out_gbps=%.6f requests=%llu hits=%llu misses=%llu hit_ratio=%s hit_ratio_now=%s",
           per_s(s->bytes_in, p->bytes_in, dt) / 1e9, per_s(s->bytes_out, p->bytes_out, dt) / 1e9,
           (unsigned long long)s->requests, (unsigned long long)s->hits, (unsigned long long)s->misses, hr, hrn);
    printf(" fill=%.4f blocks=%llu resident_bytes=%llu logical_bytes=%llu capacity_bytes=%llu dedup_hits=%llu",
           1.0 - (double)s->free_bytes / (double)s->capacity, (unsigned long long)s->blocks,
           (unsigned long long)s->resident, (unsigned long long)s->logical, (unsigned long long)s->capacity,
           (unsigned long long)s->dedup_hits);
    printf(" evict_s=%.1f evictions=%llu pins=%llu workers=%llu restarts=%llu subscribers=%llu errors=",
           per_s(s->evictions, p->evictions, dt), (unsigned long long)s->evictions, (unsigned long long)s->pins,
           (unsigned long long)s->workers, (unsigned long long)s->restarts, (unsigned long long)s->subscribers);
    if (ne == 0)
        fputs("-", stdout);
    for (size_t i = 0; i < ne; i++)
        printf("%s%s:%llu", i ? "," : "", errs[i]->name, (unsigned long long)errs[i]->n);
    putchar('\n');
}

/* Bytes with a binary unit, into out. */
static const char *human(char *out, size_t cap, double b)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    size_t i = 0;
    while (b >= 1024 && i + 1 < KVR_ARRAY_SIZE(u)) {
        b /= 1024;
        i++;
    }
    snprintf(out, cap, i ? "%.1f %s" : "%.0f %s", b, u[i]);
    return out;
}

static void print_screen(const args_t *a, const sample_t *s, const sample_t *p)
{
    double dt = s->mono - p->mono;
    char hr[16], hrn[16], t[32], h1[32], h2[32], h3[32];
    const status_t *errs[TOP_STATUSES];
    size_t ne = top_errors(s, errs);
    time_t now = (time_t)s->wall;
    struct tm tm;

    gmtime_r(&now, &tm);
    strftime(t, sizeof(t), "%Y-%m-%d %H:%M:%S UTC", &tm);
    ratio(hr, sizeof(hr), s->hits, s->misses, 1);
    ratio(hrn, sizeof(hrn), delta(s->hits, p->hits), delta(s->misses, p->misses), 1);
    printf("\033[H\033[2J"); /* home, clear */
    printf("kvrelay-top %s    every %.1f s    %s\n\n", a->addr, a->interval, t);
    printf("requests   %10.1f/s ", per_s(s->requests, p->requests, dt));
    for (size_t i = 0; i < TOP_METHODS; i++)
        printf("  %s %.1f", methods[i], per_s(s->req[i], p->req[i], dt));
    printf("\nbytes      in %.3f GB/s   out %.3f GB/s\n", per_s(s->bytes_in, p->bytes_in, dt) / 1e9,
           per_s(s->bytes_out, p->bytes_out, dt) / 1e9);
    printf("GET hits   %s (last interval %s)   hits %llu   misses %llu\n", hr, hrn,
           (unsigned long long)s->hits, (unsigned long long)s->misses);
    printf("arena      %.1f %% full   %llu blocks   resident %s   logical %s   capacity %s\n",
           100.0 * (1.0 - (double)s->free_bytes / (double)s->capacity), (unsigned long long)s->blocks,
           human(h1, sizeof(h1), (double)s->resident), human(h2, sizeof(h2), (double)s->logical),
           human(h3, sizeof(h3), (double)s->capacity));
    printf("evictions  %.1f/s   %llu so far   pinned %llu   dedup hits %llu\n", per_s(s->evictions, p->evictions, dt),
           (unsigned long long)s->evictions, (unsigned long long)s->pins, (unsigned long long)s->dedup_hits);
    printf("processes  %llu workers   %llu restarts   %llu relay subscribers\n", (unsigned long long)s->workers,
           (unsigned long long)s->restarts, (unsigned long long)s->subscribers);
    printf("errors    ");
    if (ne == 0)
        printf(" none");
    for (size_t i = 0; i < ne; i++)
        printf("  %s %.1f/s (%llu)", errs[i]->name, per_s(errs[i]->n, status_count(p, errs[i]->name), dt),
               (unsigned long long)errs[i]->n);
    printf("\n");
}

/* ------------------------------------------------------------------ command line */

static void usage(const char *p)
{
    fprintf(stderr,
            "usage: %s [-a HOST:PORT] [-i SECONDS] [-n COUNT] [--plain] [--token T | --token-file FILE]\n"
            "  -a, --addr HOST:PORT     the server's HTTP address (default 127.0.0.1:9130)\n"
            "  -i, --interval SECONDS   time between samples (default 1; at least 0.1)\n"
            "  -n, --count N            exit after N samples (default 0: run until interrupted)\n"
            "  -p, --plain              one key=value line per sample (the default when stdout is not a terminal)\n"
            "      --token T            bearer token (or --token-file FILE: its first line)\n",
            p);
}

/* HOST:PORT, [V6]:PORT, HOST (port 9130), with an optional http:// in front. */
static int parse_addr(args_t *a, const char *s)
{
    const char *colon;
    size_t hl;

    if (strncmp(s, "http://", 7) == 0)
        s += 7;
    if (s[0] == '[') {
        const char *e = strchr(s, ']');
        if (e == NULL)
            return -1;
        hl = (size_t)(e - s - 1);
        if (hl == 0 || hl >= sizeof(a->host))
            return -1;
        memcpy(a->host, s + 1, hl);
        a->host[hl] = '\0';
        colon = e[1] == ':' ? e + 1 : NULL;
        if (e[1] != '\0' && colon == NULL)
            return -1;
    } else {
        colon = strrchr(s, ':');
        hl = colon ? (size_t)(colon - s) : strlen(s);
        if (hl == 0 || hl >= sizeof(a->host))
            return -1;
        memcpy(a->host, s, hl);
        a->host[hl] = '\0';
    }
    snprintf(a->port, sizeof(a->port), "%s", colon ? colon + 1 : "9130");
    a->port[strcspn(a->port, "/")] = '\0';
    char *end;
    long port = strtol(a->port, &end, 10);
    return *end == '\0' && port > 0 && port <= 65535 ? 0 : -1;
}

static int read_token(args_t *a, const char *file)
{
    FILE *f = fopen(file, "r");
    if (f == NULL) {
        fprintf(stderr, "kvrelay-top: %s: %s\n", file, strerror(errno));
        return -1;
    }
    if (fgets(a->token, sizeof(a->token), f) == NULL)
        a->token[0] = '\0';
    fclose(f);
    a->token[strcspn(a->token, "\r\n")] = '\0';
    return 0;
}

/* Fills a from the command line. -1 to go on, else the exit status (0 after --help, 2). */
static int parse_args(args_t *a, int argc, char **argv)
{
    /* clang-format off */ /* a table aligned by hand */
    static const struct option lo[] = {{"addr", 1, 0, 'a'},  {"interval", 1, 0, 'i'}, {"count", 1, 0, 'n'},
                                       {"plain", 0, 0, 'p'}, {"token", 1, 0, 't'},    {"token-file", 1, 0, 'T'},
                                       {"help", 0, 0, 'h'},  {0, 0, 0, 0}};
    /* clang-format on */
    int opt;
    char *end;

    a->addr = "127.0.0.1:9130";
    a->interval = 1.0;
    a->plain = !isatty(STDOUT_FILENO);
    while ((opt = getopt_long(argc, argv, "a:i:n:ph", lo, NULL)) != -1) {
        switch (opt) {
        case 'a': a->addr = optarg; break;
        case 'i':
            a->interval = strtod(optarg, &end);
            if (*end != '\0' || !(a->interval >= 0.1 && a->interval <= 86400)) {
                fprintf(stderr, "kvrelay-top: --interval %s: seconds from 0.1 to 86400\n", optarg);
                return 2;
            }
            break;
        case 'n':
            a->count = strtol(optarg, &end, 10);
            if (*end != '\0' || a->count < 0) {
                fprintf(stderr, "kvrelay-top: --count %s: a number of samples, 0 or more\n", optarg);
                return 2;
            }
            break;
        case 'p': a->plain = 1; break;
        case 't': snprintf(a->token, sizeof(a->token), "%s", optarg); break;
        case 'T':
            if (read_token(a, optarg) < 0)
                return 2;
            break;
        default: usage(argv[0]); return opt == 'h' ? 0 : 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvrelay-top: unexpected argument %s\n", argv[optind]);
        usage(argv[0]);
        return 2;
    }
    if (parse_addr(a, a->addr) < 0) {
        fprintf(stderr, "kvrelay-top: --addr %s: expected HOST:PORT\n", a->addr);
        return 2;
    }
    return -1;
}

/* Sleeps until monotonic time t (absolute, so that the samples do not drift). */
static void sleep_until(double t)
{
    struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - floor(t)) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

int main(int argc, char **argv)
{
    args_t a = {0};
    sample_t s[2];
    buf_t buf = {0};
    char err[512];
    int rc = parse_args(&a, argc, argv), cur = 0;
    double next;

    if (rc >= 0)
        return rc;
    if (take_sample(&a, &s[cur], &buf, err, sizeof(err)) < 0)
        goto fail;
    next = s[cur].mono;
    for (long i = 0; a.count == 0 || i < a.count; i++) {
        next += a.interval;
        sleep_until(next);
        cur ^= 1;
        if (take_sample(&a, &s[cur], &buf, err, sizeof(err)) < 0)
            goto fail;
        if (a.plain)
            print_plain(&s[cur], &s[cur ^ 1]);
        else
            print_screen(&a, &s[cur], &s[cur ^ 1]);
        fflush(stdout);
    }
    free(buf.p);
    return 0;
fail:
    fprintf(stderr, "kvrelay-top: %s: %s\n", a.addr, err);
    free(buf.p);
    return 1;
}
