/*
 * null_server.c — an HTTP/1.1 server for kvrelay's /kv/ API that stores nothing: the ceiling
 * of kvrelay-bench (the client) on this machine, beside which kvrelay and its peers are
 * measured (scripts/bench-dataplane.sh).
 *
 *   build/bench/null_server [--bind HOST:PORT] [--workers N] [--get-size SIZE] [--put-memory SIZE]
 *                           [--port-file F]
 *
 * What it does per request, on keep-alive connections (pipelined requests are answered in
 * order; HTTP/1.0 closes unless it asks for keep-alive):
 *   GET  /kv/<key>         200 and --get-size bytes: exactly the block kvrelay-bench expects
 *                          for <key> at that size (tools/kvrelay-bench/block.h), so its XXH3
 *                          verification passes. Nothing is stored: the body is 16 stamp bytes
 *                          computed from the key, then a slice of one pool made at start-up,
 *                          sent with writev straight from the pool (no per-request copy).
 *   HEAD /kv/<key>         200, Content-Length: --get-size
 *   GET  /kv/<key>/exists  200 {"exists":true}
 *   PUT  /kv/<key>         the Content-Length body is received into one 256 KiB scratch buffer
 *                          per worker (recv repeatedly, bytes overwritten), then 201 and a small
 *                          JSON body; Expect: 100-continue is honoured. With --put-memory SIZE,
 *                          each worker receives bodies into its share of SIZE instead, one after
 *                          the other, wrapping at the end (the same 256 KiB reads): the memory
 *                          traffic of a store, whose every block lands in memory that was
 *                          written long ago and is no longer in the CPU cache, and still no
 *                          index, no eviction, nothing kept. Touched once at start-up.
 *   DELETE /kv/<key>       200 {"deleted":true}
 *   GET /healthz, /readyz  200
 * Anything else is a JSON error (400, 404, 405, 411, 431, 501); Transfer-Encoding is refused
 * (501, connection closed): kvrelay-bench always sends Content-Length.
 *
 * Processes: N worker processes (default 2, kvrelay's default on this 2-core machine: one per
 * core), each with its own SO_REUSEPORT listener — all created by the parent before the fork,
 * the first fixing an ephemeral port for the rest, as kvrelay's supervisor does — and one
 * level-triggered epoll loop. The parent only waits: SIGTERM/SIGINT are forwarded to the
 * workers; if a worker dies the others are stopped. The CPU of the whole server is the parent's
 * process tree (what the benchmark reads from /proc).
 *
 * Bounds: per worker at most --max-conns connections (default 4096; beyond it a new connection
 * is closed at once), each holding a 16 KiB head buffer (431 beyond) and a few hundred bytes of
 * state; one 256 KiB scratch buffer per worker (and its share of --put-memory); one read-only pool of --get-size + 64 KiB, made
 * before the fork and shared by the workers. A connection that is sending does not read (so
 * pipelined input is bounded by the head buffer). Nothing grows with a body.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tools/kvrelay-bench/block.h"
#include "core/config.h"

#define HEAD_CAP    (16u << 10)
#define SCRATCH_CAP (256u << 10)
#define MAX_WORKERS 64
#define MAX_EVENTS  256
#define RECV_ROUNDS 64 /* reads per readiness event, so one connection cannot starve the rest */

enum { ST_HEAD,
       ST_BODY,
       ST_SEND };

typedef struct conn {
    int fd, state, keep_alive;
    uint32_t evmask;
    uint64_t body_left; /* PUT body bytes still to receive */
    int status_after;   /* the answer queued once the body is in */
    struct iovec iov[3];
    int iov_i, iov_n;
    char rhead[320];
    uint8_t stamp[16];
    size_t hlen;
    char head[HEAD_CAP];
} conn_t;

static struct {
    char bind[256];
    int workers, max_conns;
    uint64_t get_size;
    uint64_t put_memory;
    const char *port_file;
} O = {"127.0.0.1:9140", 2, 4096, 16384, 0, NULL};

static uint8_t *pool;
static uint8_t *scratch;
static uint8_t *put_mem; /* --put-memory: this worker's share, and where the next body byte goes */
static size_t put_cap, put_off;
static int ep, nconns;
static volatile sig_atomic_t stopping;

static void on_stop(int sig)
{
    (void)sig;
    stopping = 1;
}

/* ---------------------------------------------------------------- options */

/* The server's own size parser (core/config.h), capped at 16 GiB for this tool. */
static int parse_size(const char *s, uint64_t *out)
{
    uint64_t v;
    if (kvr_config_parse_size(s, &v) != KVR_OK || v > (16ull << 30))
        return -1;
    *out = v;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: null_server [--bind HOST:PORT] [--workers N] [--get-size SIZE] [--put-memory SIZE] "
               "[--max-conns N] [--port-file FILE]\n"
               "  --bind       listen address (default 127.0.0.1:9140; port 0: ephemeral)\n"
               "  --workers    worker processes, one SO_REUSEPORT listener each (default 2)\n"
               "  --get-size   size of every GET body, e.g. 2M (default 16K, at most 1G)\n"
               "  --put-memory receive PUT bodies into this much memory (split over the workers),\n"
               "               one after the other, instead of one 256 KiB buffer (default 0: the buffer)\n"
               "  --max-conns  connections per worker (default 4096)\n"
               "  --port-file  write \"http=PORT\" here once listening\n");
}

static void parse_args(int argc, char **argv)
{
    static const struct option lo[] = {{"bind", required_argument, NULL, 'b'},
                                       {"workers", required_argument, NULL, 'w'},
                                       {"get-size", required_argument, NULL, 's'},
                                       {"put-memory", required_argument, NULL, 'm'},
                                       {"max-conns", required_argument, NULL, 'c'},
                                       {"port-file", required_argument, NULL, 'p'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'b':
            snprintf(O.bind, sizeof(O.bind), "%s", optarg);
            break;
        case 'w':
            O.workers = atoi(optarg);
            if (O.workers < 1 || O.workers > MAX_WORKERS) {
                fprintf(stderr, "null_server: --workers 1..%d\n", MAX_WORKERS);
                exit(2);
            }
            break;
        case 's':
            if (parse_size(optarg, &O.get_size) != 0 || O.get_size > (1u << 30)) {
                fprintf(stderr, "null_server: --get-size: a size up to 1G, e.g. 2M, not %s\n", optarg);
                exit(2);
            }
            break;
        case 'm':
            if (parse_size(optarg, &O.put_memory) != 0) {
                fprintf(stderr, "null_server: --put-memory: a size up to 16G, e.g. 2G, not %s\n", optarg);
                exit(2);
            }
            break;
        case 'c':
            O.max_conns = atoi(optarg);
            if (O.max_conns < 1) {
                fprintf(stderr, "null_server: --max-conns must be positive\n");
                exit(2);
            }
            break;
        case 'p':
            O.port_file = optarg;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(2);
        }
    }
    if (optind < argc) {
        usage(stderr);
        exit(2);
    }
}

/* ---------------------------------------------------------------- listeners */

static int open_listener(const char *host, const char *port)
{
    struct addrinfo hints, *ai;
    int fd, on = 1;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    if (getaddrinfo(host, port, &hints, &ai) != 0)
        return -1;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof(on)) < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
        listen(fd, 1024) < 0) {
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    return fd;
}

/* One listener per worker; the first fixes the port (ephemeral or not) for the rest. */
static int open_listeners(int *fds, int n, unsigned *port_out)
{
    char host[256], port[16];
    char *colon = strrchr(O.bind, ':');
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (colon == NULL || colon == O.bind)
        return -1;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - O.bind), O.bind);
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    snprintf(port, sizeof(port), "%s", colon + 1);
    for (int i = 0; i < n; i++) {
        if ((fds[i] = open_listener(host, port)) < 0)
            return -1;
        if (i == 0) {
            if (getsockname(fds[0], (struct sockaddr *)&ss, &sl) < 0)
                return -1;
            *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                       : ((struct sockaddr_in *)&ss)->sin_port);
            snprintf(port, sizeof(port), "%u", *port_out);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- connections */

static void set_events(conn_t *c, uint32_t want)
{
    struct epoll_event ev;
    if (want == c->evmask)
        return;
    ev.events = want;
    ev.data.ptr = c;
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->evmask = want;
}

static void conn_close(conn_t *c)
{
    close(c->fd); /* also leaves the epoll set */
    free(c);
    nconns--;
}

/* Queues a complete small response (head and JSON body) on c. */
static void respond_json(conn_t *c, int status, const char *reason, const char *body)
{
    size_t bl = strlen(body);
    int n = snprintf(c->rhead, sizeof(c->rhead),
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n%s\r\n%s", status,
                     reason, bl, c->keep_alive ? "" : "Connection: close\r\n", body);
    c->iov[0].iov_base = c->rhead;
    c->iov[0].iov_len = (size_t)n < sizeof(c->rhead) ? (size_t)n : sizeof(c->rhead) - 1;
    c->iov_i = 0;
    c->iov_n = 1;
    c->state = ST_SEND;
}

static void respond_error(conn_t *c, int status, const char *reason, const char *msg, int close_after)
{
    char body[200];
    if (close_after)
        c->keep_alive = 0;
    snprintf(body, sizeof(body), "{\"error\":\"%s\",\"status\":%d}", msg, status);
    respond_json(c, status, reason, body);
}

/* GET/HEAD of a block: the head, then (GET) the stamp and the pool slice kvrelay-bench expects. */
static void respond_block(conn_t *c, const char *key, size_t klen, int head_only)
{
    uint64_t size = O.get_size;
    size_t off = kvb_block_stamp(key, klen, size, c->stamp);
    int n = snprintf(c->rhead, sizeof(c->rhead),
                     "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %" PRIu64
                     "\r\n%s\r\n",
                     size, c->keep_alive ? "" : "Connection: close\r\n");
    c->iov[0].iov_base = c->rhead;
    c->iov[0].iov_len = (size_t)n;
    c->iov_n = 1;
    if (!head_only) {
        c->iov[1].iov_base = c->stamp;
        c->iov[1].iov_len = size < 16 ? (size_t)size : 16;
        c->iov_n = 2;
        if (size > 16) {
            c->iov[2].iov_base = pool + off;
            c->iov[2].iov_len = (size_t)(size - 16);
            c->iov_n = 3;
        }
    }
    c->iov_i = 0;
    c->state = ST_SEND;
}

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* Percent-decodes [p, p+n) into out (cap bytes); -1 if malformed or too long. */
static ssize_t decode_key(const char *p, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)p[i];
        if (ch == '%') {
            int hi, lo;
            if (i + 2 >= n || (hi = hexval(p[i + 1])) < 0 || (lo = hexval(p[i + 2])) < 0)
                return -1;
            ch = hi * 16 + lo;
            i += 2;
        }
        if (o == cap)
            return -1;
        out[o++] = (char)ch;
    }
    return (ssize_t)o;
}

static int header_is(const char *line, size_t ll, const char *name)
{
    size_t n = strlen(name);
    return ll > n && line[n] == ':' && strncasecmp(line, name, n) == 0;
}

static const char *header_value(const char *line, size_t ll, size_t nlen, size_t *vl)
{
    const char *v = line + nlen + 1, *e = line + ll;
    while (v < e && (*v == ' ' || *v == '\t'))
        v++;
    while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    *vl = (size_t)(e - v);
    return v;
}

/*
 * Handles the request whose head is c->head[0..hl) (hl includes the blank line). Leaves c in
 * ST_SEND with the answer queued, or in ST_BODY (PUT) with the answer to queue once the body
 * is in.
 */
static void handle_request(conn_t *c, size_t hl)
{
    char *p = c->head, *end = c->head + hl - 2, *line, *sp1, *sp2, *eol;
    char key[1100];
    int64_t clen = -1;
    int expect = 0, http10;
    size_t tlen;
    ssize_t klen;

    eol = memmem(p, (size_t)(end - p), "\r\n", 2);
    sp1 = memchr(p, ' ', (size_t)(eol - p));
    sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
    c->keep_alive = 1;
    if (sp1 == NULL || sp2 == NULL || eol - sp2 != 9 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0 ||
        (sp2[8] != '0' && sp2[8] != '1')) {
        respond_error(c, 400, "Bad Request", "malformed request line", 1);
        return;
    }
    http10 = sp2[8] == '0';
    c->keep_alive = !http10;
    for (line = eol + 2; line < end; line = eol + 2) {
        size_t ll, vl;
        const char *v;
        eol = memmem(line, (size_t)(end + 2 - line), "\r\n", 2);
        ll = (size_t)(eol - line);
        if (header_is(line, ll, "content-length")) {
            int64_t x = 0;
            v = header_value(line, ll, 14, &vl);
            if (vl == 0 || vl > 12) {
                respond_error(c, 400, "Bad Request", "bad Content-Length", 1);
                return;
            }
            for (size_t i = 0; i < vl; i++) {
                if (v[i] < '0' || v[i] > '9') {
                    respond_error(c, 400, "Bad Request", "bad Content-Length", 1);
                    return;
                }
                x = x * 10 + (v[i] - '0');
            }
            if (clen >= 0 && clen != x) {
                respond_error(c, 400, "Bad Request", "conflicting Content-Length", 1);
                return;
            }
            clen = x;
        } else if (header_is(line, ll, "transfer-encoding")) {
            respond_error(c, 501, "Not Implemented", "Transfer-Encoding is not supported", 1);
            return;
        } else if (header_is(line, ll, "connection")) {
            v = header_value(line, ll, 10, &vl);
            if (vl == 5 && strncasecmp(v, "close", 5) == 0)
                c->keep_alive = 0;
            else if (vl == 10 && strncasecmp(v, "keep-alive", 10) == 0)
                c->keep_alive = 1;
        } else if (header_is(line, ll, "expect")) {
            v = header_value(line, ll, 6, &vl);
            expect = vl == 12 && strncasecmp(v, "100-continue", 12) == 0;
        }
    }
    tlen = (size_t)(sp2 - sp1 - 1);
#define METHOD_IS(m) ((size_t)(sp1 - p) == sizeof(m) - 1 && memcmp(p, m, sizeof(m) - 1) == 0)
    if ((METHOD_IS("GET") || METHOD_IS("HEAD")) &&
        ((tlen == 8 && memcmp(sp1 + 1, "/healthz", 8) == 0) || (tlen == 7 && memcmp(sp1 + 1, "/readyz", 7) == 0))) {
        respond_json(c, 200, "OK", "{\"status\":\"ok\"}");
        return;
    }
    if (tlen <= 4 || memcmp(sp1 + 1, "/kv/", 4) != 0) {
        respond_error(c, 404, "Not Found", "no such endpoint", clen > 0);
        return;
    }
    if (METHOD_IS("PUT")) {
        if (clen < 0) {
            respond_error(c, 411, "Length Required", "Content-Length required", 1);
            return;
        }
        if (expect && clen > 0) {
            static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
            if (send(c->fd, cont, sizeof(cont) - 1, MSG_NOSIGNAL) != (ssize_t)sizeof(cont) - 1) {
                c->keep_alive = 0; /* an empty socket buffer takes 25 bytes; else give up on it */
                respond_error(c, 500, "Internal Server Error", "could not send 100 Continue", 1);
                return;
            }
        }
        c->body_left = (uint64_t)clen;
        c->state = ST_BODY;
        return;
    }
    if (clen > 0) { /* a body on anything but PUT: not worth framing, close after answering */
        respond_error(c, 400, "Bad Request", "unexpected request body", 1);
        return;
    }
    if (METHOD_IS("DELETE")) {
        respond_json(c, 200, "OK", "{\"deleted\":true}");
        return;
    }
    if (!METHOD_IS("GET") && !METHOD_IS("HEAD")) {
        respond_error(c, 405, "Method Not Allowed", "method not allowed", 0);
        return;
    }
    if (tlen > 11 && memcmp(sp2 - 7, "/exists", 7) == 0) {
        respond_json(c, 200, "OK", "{\"exists\":true}");
        return;
    }
    klen = decode_key(sp1 + 5, tlen - 4, key, sizeof(key));
    if (klen <= 0) {
        respond_error(c, 400, "Bad Request", "malformed key", 0);
        return;
    }
    respond_block(c, key, (size_t)klen, METHOD_IS("HEAD"));
#undef METHOD_IS
}

/* Drops the first n buffered bytes (a request head, body bytes that came with it). */
static void consume(conn_t *c, size_t n)
{
    memmove(c->head, c->head + n, c->hlen - n);
    c->hlen -= n;
}

/* The PUT body is in: queue 201. */
static void body_done(conn_t *c)
{
    respond_json(c, 201, "Created", "{\"stored\":true}");
}

/*
 * Runs the state machine over what is buffered: parses heads, eats body bytes that came with
 * them. 0: wants more input or is sending; -1: close the connection.
 */
static int process_buffered(conn_t *c)
{
    while (c->state != ST_SEND) {
        if (c->state == ST_BODY) {
            size_t take = c->hlen < c->body_left ? c->hlen : (size_t)c->body_left;
            consume(c, take);
            c->body_left -= take;
            if (c->body_left > 0)
                return 0;
            body_done(c);
            break;
        }
        {
            char *e = c->hlen >= 4 ? memmem(c->head, c->hlen, "\r\n\r\n", 4) : NULL;
            size_t hl;
            if (e == NULL) {
                if (c->hlen == HEAD_CAP) {
                    respond_error(c, 431, "Request Header Fields Too Large", "request head over 16 KiB", 1);
                    c->hlen = 0;
                    break;
                }
                return 0;
            }
            hl = (size_t)(e + 4 - c->head);
            handle_request(c, hl);
            consume(c, hl);
        }
    }
    return 0;
}

/* Writes the queued answer. 1: all written, 0: the socket is full, -1: error. */
static int send_pending(conn_t *c)
{
    while (c->iov_i < c->iov_n) {
        ssize_t n = writev(c->fd, c->iov + c->iov_i, c->iov_n - c->iov_i);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        while (n > 0 && c->iov_i < c->iov_n) {
            struct iovec *v = &c->iov[c->iov_i];
            if ((size_t)n >= v->iov_len) {
                n -= (ssize_t)v->iov_len;
                c->iov_i++;
            } else {
                v->iov_base = (char *)v->iov_base + n;
                v->iov_len -= (size_t)n;
                n = 0;
            }
        }
    }
    return 1;
}

/* Reads once into the head buffer or (body) the scratch buffer. 1: progress, 0: EAGAIN, -1: close. */
static int read_some(conn_t *c)
{
    ssize_t n;
    if (c->state == ST_BODY && c->hlen == 0) {
        size_t want = c->body_left < SCRATCH_CAP ? (size_t)c->body_left : SCRATCH_CAP;
        uint8_t *to = scratch;
        if (put_mem != NULL) {
            if (want > put_cap - put_off)
                want = put_cap - put_off;
            to = put_mem + put_off;
        }
        n = recv(c->fd, to, want, 0);
        if (n > 0) {
            if (put_mem != NULL && (put_off += (size_t)n) == put_cap)
                put_off = 0;
            c->body_left -= (uint64_t)n;
            if (c->body_left == 0)
                body_done(c);
            return 1;
        }
    } else {
        n = recv(c->fd, c->head + c->hlen, HEAD_CAP - c->hlen, 0);
        if (n > 0) {
            c->hlen += (size_t)n;
            return process_buffered(c) < 0 ? -1 : 1;
        }
    }
    if (n == 0)
        return -1;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
}

/* One readiness event of a connection. */
static void conn_event(conn_t *c)
{
    for (int round = 0; round < RECV_ROUNDS; round++) {
        if (c->state == ST_SEND) {
            int rc = send_pending(c);
            if (rc < 0) {
                conn_close(c);
                return;
            }
            if (rc == 0) {
                set_events(c, EPOLLOUT);
                return;
            }
            if (!c->keep_alive) {
                conn_close(c);
                return;
            }
            c->state = ST_HEAD;
            if (process_buffered(c) < 0) { /* a pipelined request already in */
                conn_close(c);
                return;
            }
            continue;
        }
        {
            int rc = read_some(c);
            if (rc < 0) {
                conn_close(c);
                return;
            }
            if (rc == 0) {
                set_events(c, EPOLLIN);
                return;
            }
        }
    }
    set_events(c, c->state == ST_SEND ? EPOLLOUT : EPOLLIN); /* level-triggered: comes back */
}

static void accept_all(int lfd)
{
    for (int i = 0; i < 64; i++) {
        int on = 1, fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        conn_t *c;
        struct epoll_event ev;
        if (fd < 0)
            return; /* EAGAIN, or out of descriptors: the backlog waits for the next event */
        if (nconns >= O.max_conns || (c = malloc(sizeof(*c))) == NULL) {
            close(fd);
            continue;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
        c->fd = fd;
        c->state = ST_HEAD;
        c->keep_alive = 1;
        c->hlen = 0;
        c->body_left = 0;
        c->iov_i = c->iov_n = 0;
        c->evmask = EPOLLIN;
        ev.events = EPOLLIN;
        ev.data.ptr = c;
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            close(fd);
            free(c);
            continue;
        }
        nconns++;
    }
}

static int worker_main(int lfd)
{
    struct epoll_event evs[MAX_EVENTS], lev;
    static int listener_tag; /* its address marks the listener in epoll data */
    ep = epoll_create1(EPOLL_CLOEXEC);
    scratch = aligned_alloc(4096, SCRATCH_CAP);
    if (ep < 0 || scratch == NULL)
        return 1;
    lev.events = EPOLLIN;
    lev.data.ptr = &listener_tag;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev) < 0)
        return 1;
    while (!stopping) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, 500);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == &listener_tag)
                accept_all(lfd);
            else
                conn_event(evs[i].data.ptr);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- main: the parent */

int main(int argc, char **argv)
{
    int lfds[MAX_WORKERS];
    pid_t pids[MAX_WORKERS];
    unsigned port = 0;
    size_t plen;
    struct sigaction sa;
    int alive, rc = 0;

    parse_args(argc, argv);
    plen = kvb_pool_len(O.get_size);
    /* shared and read-only after the fill: the workers' pages are the parent's */
    pool = mmap(NULL, plen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (pool == MAP_FAILED) {
        fprintf(stderr, "null_server: cannot map a %zu-byte pool: %s\n", plen, strerror(errno));
        return 1;
    }
    kvb_pool_fill(pool, plen);
    mprotect(pool, plen, PROT_READ);
    if (O.put_memory > 0) {
        /* shared memory (as a store's segment is), touched here once, before the port opens,
         * so that no measured PUT pays a first touch; worker i receives into slice i */
        put_cap = (size_t)(O.put_memory / (uint64_t)O.workers) & ~(size_t)4095;
        if (put_cap < SCRATCH_CAP)
            put_cap = SCRATCH_CAP;
        put_mem = mmap(NULL, put_cap * (size_t)O.workers, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (put_mem == MAP_FAILED) {
            fprintf(stderr, "null_server: cannot map --put-memory: %s\n", strerror(errno));
            return 1;
        }
        memset(put_mem, 0x5a, put_cap * (size_t)O.workers);
    }
    if (open_listeners(lfds, O.workers, &port) != 0) {
        fprintf(stderr, "null_server: cannot listen on %s: %s\n", O.bind, strerror(errno));
        return 1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    for (int i = 0; i < O.workers; i++) {
        pids[i] = fork();
        if (pids[i] < 0) {
            fprintf(stderr, "null_server: fork: %s\n", strerror(errno));
            for (int j = 0; j < i; j++)
                kill(pids[j], SIGTERM);
            return 1;
        }
        if (pids[i] == 0) {
            for (int j = 0; j < O.workers; j++)
                if (j != i)
                    close(lfds[j]);
            if (put_mem != NULL)
                put_mem += put_cap * (size_t)i;
            _exit(worker_main(lfds[i]));
        }
    }
    for (int i = 0; i < O.workers; i++)
        close(lfds[i]);
    if (O.port_file != NULL) {
        FILE *f = fopen(O.port_file, "w");
        if (f != NULL) {
            fprintf(f, "http=%u\n", port);
            fclose(f);
        }
    }
    fprintf(stderr, "null_server: %d workers on port %u, GET bodies of %" PRIu64 " bytes\n", O.workers, port,
            O.get_size);
    alive = O.workers;
    while (alive > 0) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0) {
            if (errno != EINTR)
                break;
            if (stopping)
                for (int i = 0; i < O.workers; i++)
                    if (pids[i] > 0)
                        kill(pids[i], SIGTERM);
            continue;
        }
        for (int i = 0; i < O.workers; i++)
            if (pids[i] == p)
                pids[i] = 0;
        alive--;
        if (!stopping && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            fprintf(stderr, "null_server: worker %d died (status %d); stopping\n", (int)p, st);
            rc = 1;
        }
        stopping = 1;
        for (int i = 0; i < O.workers; i++)
            if (pids[i] > 0)
                kill(pids[i], SIGTERM);
    }
    return rc;
}
