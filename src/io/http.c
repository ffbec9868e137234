/* http.c — see http.h for the design. */
#define H2O_USE_LIBUV 0
#include "io/http.h"

#include "base/clock.h"
#include "base/log.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <unistd.h>
#include <h2o.h>
#include <h2o/http2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>

#define IOV_BATCH        64     /* arena spans handed to h2o per send */
#define KVR_HTTP_TURN_US 200000 /* the budget's reading connection keeps its turn while it moves */

/* One tracked connection (a socket handed to h2o by this worker). */
typedef struct conn_s {
    struct conn_s *prev, *next;
    h2o_socket_t *sock; /* NULL once closed while requests were still undisposed */
    kvr_http_t *http;
    uint32_t inflight;   /* requests of this connection not yet disposed */
    size_t last_written; /* sock->bytes_written at the last sweep */
    size_t last_read;
    uint64_t last_progress_ms;
    int paused;              /* the body budget stopped its reading */
    h2o_socket_cb paused_cb; /* h2o's read callback, to start again with */
} conn_t;

typedef struct {
    void (*cb)(void *data);
    void *data;
    h2o_socket_t *sock;
} kvr_http_watch_t;

struct kvr_http_s {
    const kvr_config_t *cfg;
    kvr_http_watch_t watch[4]; /* eventfds joined to the loop (the io_uring rings) */
    unsigned nwatch;
    kvr_api_t *api;
    h2o_globalconf_t gconf;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    h2o_evloop_t *loop;
    SSL_CTX *ssl;
    conn_t conns; /* list head */
    uint64_t nconns;
    int draining;
    uint64_t last_sweep_ms;
    uint64_t last_budget_us;
    uint64_t last_trim_us; /* the budget's last malloc_trim */
    int over_budget;       /* every connection but `kept` has stopped reading */
    int statm_fd;          /* /proc/self/statm, read by the budget */
    conn_t *kept;
    size_t kept_read; /* kept->sock->bytes_read at the last check */
    uint64_t kept_moved_us;
};

/* ------------------------------------------------------------------ per-request record */

/* The request layer's response, in the request's pool: disposed (pin released, request
 * counted) when h2o disposes of the request, never earlier. */
typedef struct {
    h2o_generator_t super;
    kvr_http_t *http;
    conn_t *conn;
    h2o_req_t *req;
    uint64_t start_us;
    uint64_t off; /* block payload bytes handed to h2o so far */
    unsigned method;
    kvr_api_res_t res;
} reqrec_t;

static void reqrec_dispose(void *p)
{
    reqrec_t *r = p;

    kvr_api_done(r->http->api, &r->res, r->method, r->start_us, r->req->entity.len, r->req->bytes_sent);
    if (r->conn != NULL && r->conn->inflight > 0 && --r->conn->inflight == 0 && r->conn->sock == NULL)
        free(r->conn); /* the socket closed first; the last request frees the record */
}

static void blockgen_send_next(reqrec_t *r)
{
    struct iovec iov[IOV_BATCH];
    h2o_iovec_t bufs[IOV_BATCH];
    size_t n = kvr_api_block_iov(r->http->api, &r->res, r->off, iov, IOV_BATCH);

    for (size_t i = 0; i < n; i++) {
        bufs[i] = h2o_iovec_init(iov[i].iov_base, iov[i].iov_len);
        r->off += iov[i].iov_len;
    }
    h2o_send(r->req, bufs, n, r->off >= r->res.length ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
}

static void blockgen_proceed(h2o_generator_t *self, h2o_req_t *req)
{
    blockgen_send_next((reqrec_t *)self);
}

static void blockgen_stop(h2o_generator_t *self, h2o_req_t *req)
{
    /* The pin goes with the request's pool (reqrec_dispose); nothing to do here. */
}

/* Carries out the request layer's answer with h2o. */
static void send_res(reqrec_t *r)
{
    static h2o_generator_t nogen = {NULL, NULL};
    h2o_req_t *req = r->req;
    kvr_api_res_t *res = &r->res;
    h2o_iovec_t body;

    req->res.status = res->status;
    req->res.reason = res->reason;
    req->res.content_length = res->length;
    if (res->ctype != NULL)
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, res->ctype, strlen(res->ctype));
    if (res->hdr_name != NULL)
        h2o_add_header_by_str(&req->pool, &req->res.headers, res->hdr_name, strlen(res->hdr_name), 0, NULL,
                              res->hdr_value, strlen(res->hdr_value));
    if (res->close)
        req->http1_is_persistent = 0;
    if (res->body == KVR_API_BODY_BLOCK && !res->head_only && res->length > 0) {
        r->super.proceed = blockgen_proceed;
        r->super.stop = blockgen_stop;
        h2o_start_response(req, &r->super);
        blockgen_send_next(r);
        return;
    }
    h2o_start_response(req, &nogen);
    if (res->head_only || res->length == 0) {
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
        return;
    }
    body = h2o_iovec_init(kvr_api_body_bytes(res), res->length);
    h2o_send(req, &body, 1, H2O_SEND_STATE_FINAL);
}

static size_t head_bytes(h2o_req_t *req)
{
    size_t hb = req->path.len;
    for (size_t i = 0; i < req->headers.size; i++)
        hb += req->headers.entries[i].name->len + req->headers.entries[i].value.len;
    return hb;
}

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    kvr_http_t *h = *(kvr_http_t **)(self + 1);
    reqrec_t *r = h2o_mem_alloc_shared(&req->pool, sizeof(*r), reqrec_dispose);
    h2o_socket_t *sock = req->conn->callbacks->get_socket != NULL ? req->conn->callbacks->get_socket(req->conn) : NULL;
    kvr_api_req_t rq;
    ssize_t i;

    memset(r, 0, offsetof(reqrec_t, res));
    kvr_api_res_reset(&r->res);
    r->http = h;
    r->req = req;
    r->start_us = kvr_clock_us();
    r->method = kvr_api_method(req->method.base, req->method.len);
    r->conn = sock != NULL && sock->on_close.data != NULL ? sock->on_close.data : NULL;
    if (r->conn != NULL)
        r->conn->inflight++;

    memset(&rq, 0, sizeof(rq));
    rq.method = r->method;
    rq.path = req->path.base;
    rq.path_len = req->query_at != SIZE_MAX ? req->query_at : req->path.len;
    if ((i = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1)) >= 0) {
        rq.auth = req->headers.entries[i].value.base;
        rq.auth_len = req->headers.entries[i].value.len;
    }
    if ((i = h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-kv-sequence-hash"), -1)) >= 0) {
        rq.seq_hash = req->headers.entries[i].value.base;
        rq.seq_hash_len = req->headers.entries[i].value.len;
    }
    if ((i = h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-kv-model"), -1)) >= 0) {
        rq.model = req->headers.entries[i].value.base;
        rq.model_len = req->headers.entries[i].value.len;
    }
    rq.body_len = req->entity.len;
    rq.head_bytes = head_bytes(req);
    rq.buffered = 1;
    kvr_api_handle(h->api, &rq, &r->res);
    if (r->res.dk != NULL) /* from the disk tier: read at once (this worker's h2o loop waits for it) */
        kvr_api_disk_sync(h->api, &r->res);
    if (r->res.put == KVR_API_BODY_WANTED) {
        kvr_api_batch(h->api, &rq, req->entity.base != NULL ? req->entity.base : "", req->entity.len, &r->res);
    } else if (r->res.put != KVR_API_PUT_NONE) {
        /* h2o 2.2 has buffered the whole body already: one copy into the reservation. */
        if (r->res.put == KVR_API_PUT_RESERVED)
            kvr_api_put_write(h->api, &r->res, 0, req->entity.base, req->entity.len);
        kvr_api_put_end(h->api, &r->res, 1);
    }
    send_res(r);
    return 0;
}

/* ------------------------------------------------------------------ connections */

/* The socket is gone. Requests of it that h2o has not disposed yet still point here. */
static void conn_on_close(void *p)
{
    conn_t *c = p;
    if (c->http->kept == c)
        c->http->kept = NULL;
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->http->nconns--;
    c->sock = NULL;
    if (c->inflight == 0)
        free(c);
}

int kvr_http_adopt(kvr_http_t *h, int fd)
{
    h2o_socket_t *sock;
    conn_t *c;

    if (h->draining || h->nconns >= h->cfg->h2o_max_connections)
        return KVR_AGAIN;
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVR_AGAIN;
    sock = h2o_evloop_socket_create(h->loop, fd, 0);
    if (sock == NULL) {
        free(c);
        return KVR_AGAIN;
    }
    c->sock = sock;
    c->http = h;
    c->last_progress_ms = kvr_clock_ms();
    c->next = h->conns.next;
    c->prev = &h->conns;
    h->conns.next->prev = c;
    h->conns.next = c;
    h->nconns++;
    sock->on_close.cb = conn_on_close;
    sock->on_close.data = c;
    h2o_accept(&h->accept_ctx, sock);
    return KVR_OK;
}

/* Kernel-level cut: h2o sees the error on its next I/O and closes and disposes normally. */
static void conn_cut(conn_t *c)
{
    int fd = h2o_socket_get_fd(c->sock);
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
}

/*
 * Every 250 ms: cut connections with a request in flight whose bytes have not moved in either
 * direction for --io-timeout (a client that stopped reading keeps its GET's pin otherwise);
 * while draining, cut connections with nothing in flight and no unread input.
 */
static void sweep(kvr_http_t *h)
{
    uint64_t t = kvr_clock_ms();

    for (conn_t *c = h->conns.next, *next; c != &h->conns; c = next) {
        next = c->next;
        if (c->sock->bytes_written != c->last_written || c->sock->bytes_read != c->last_read) {
            c->last_written = c->sock->bytes_written;
            c->last_read = c->sock->bytes_read;
            c->last_progress_ms = t;
        }
        if (c->inflight > 0 && t - c->last_progress_ms > h->cfg->io_timeout_ms) {
            KVR_LOG_RATELIMITED(KVR_LOG_WARN, "http: cutting a connection stalled for %llu ms",
                                (unsigned long long)(t - c->last_progress_ms));
            conn_cut(c);
            c->last_progress_ms = t; /* once */
        } else if (h->draining && c->inflight == 0 && c->sock->input->size == 0) {
            conn_cut(c);
        }
    }
}

/* ------------------------------------------------------------------ the body budget */

/*
 * h2o 2.2 reads request bodies whole into the worker's memory, over HTTP/2 for up to 100 streams
 * per connection at once. Bound: when the worker's private resident memory passes --h2o-buffer,
 * every h2o connection
 * but one stops reading; the one left reading finishes its body (at most --h2o-max-body more),
 * and once the memory is back under three quarters of the budget every paused connection reads
 * again. When the one left reading has not moved for 200 ms the turn passes to another.
 */
/* The worker's private resident memory (resident minus shared pages, /proc/self/statm): what
 * h2o's buffered bodies make grow. -1 when it cannot be read (the budget then does nothing). */
static long private_resident(kvr_http_t *h)
{
    char buf[160];
    unsigned long size, res, shared;
    ssize_t n;

    if (h->statm_fd < 0)
        return -1;
    n = pread(h->statm_fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    if (sscanf(buf, "%lu %lu %lu", &size, &res, &shared) != 3 || shared > res)
        return -1;
    return (long)((res - shared) * (unsigned long)sysconf(_SC_PAGESIZE));
}

static void conn_on_close(void *p);

/* The library's own h2o_socket_read_start, which the definition below stands in front of. */
static void real_read_start(h2o_socket_t *sock, h2o_socket_cb cb)
{
    static void (*fn)(h2o_socket_t *, h2o_socket_cb);
    if (fn == NULL)
        fn = (void (*)(h2o_socket_t *, h2o_socket_cb))dlsym(RTLD_NEXT, "h2o_socket_read_start");
    fn(sock, cb);
}

/*
 * libh2o-evloop calls h2o_socket_read_start through its PLT, so this definition in the
 * executable is the one it reaches (mk/build.mk exports it): a connection paused by the body
 * budget stays paused even when h2o wants to read again (after a response, on a new HTTP/2
 * window); its callback is kept and installed when the budget lets it go.
 */
void h2o_socket_read_start(h2o_socket_t *sock, h2o_socket_cb cb)
{
    if (sock->on_close.cb == conn_on_close && sock->on_close.data != NULL) {
        conn_t *c = sock->on_close.data;
        if (c->paused) {
            c->paused_cb = cb;
            return;
        }
    }
    real_read_start(sock, cb);
}

static void pause_conn(conn_t *c)
{
    if (c->sock == NULL || c->paused)
        return;
    c->paused = 1;
    c->paused_cb = NULL;
    if (h2o_socket_is_reading(c->sock)) {
        c->paused_cb = c->sock->_cb.read;
        h2o_socket_read_stop(c->sock);
    }
}

static void resume_conn(conn_t *c)
{
    if (c->sock == NULL || !c->paused)
        return;
    c->paused = 0;
    if (c->paused_cb != NULL && !h2o_socket_is_reading(c->sock))
        real_read_start(c->sock, c->paused_cb);
    c->paused_cb = NULL;
}

static void pass_turn(kvr_http_t *h)
{
    conn_t *from = h->kept != NULL ? h->kept : &h->conns, *c;

    for (c = from->next; c != from; c = c->next)
        if (c != &h->conns && c->paused)
            break;
    if (c == from || c == &h->conns)
        return; /* nobody else waits */
    if (h->kept != NULL)
        pause_conn(h->kept);
    resume_conn(c);
    h->kept = c;
    h->kept_read = c->sock->bytes_read;
    h->kept_moved_us = h->last_budget_us;
}

static void budget(kvr_http_t *h)
{
    long r = private_resident(h);
    size_t used;

    /* Bodies freed under M_MMAP_THRESHOLD stay in malloc's heap (the worker trims it only past
     * M_TRIM_THRESHOLD), where they count as private memory though nothing holds them: hand
     * them back before judging, at most every 100 ms. A worker's peak over 16 TLS uploads of
     * 80 MiB ranged 388-535 MiB over three runs without it, 347-471 over four with it. */
    if (r > 0 && (size_t)r > h->cfg->h2o_buffer && h->last_budget_us - h->last_trim_us >= 100000) {
        h->last_trim_us = h->last_budget_us;
        malloc_trim(0);
        r = private_resident(h);
    }
    used = r < 0 ? 0 : (size_t)r;

    if (!h->over_budget && used > h->cfg->h2o_buffer) {
        h->over_budget = 1;
        h->kept = NULL;
        for (conn_t *c = h->conns.next; c != &h->conns; c = c->next) {
            if (h->kept == NULL && c->sock != NULL) {
                h->kept = c;
                h->kept_read = c->sock->bytes_read;
                h->kept_moved_us = h->last_budget_us;
                continue;
            }
            pause_conn(c);
        }
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "http: worker holds %zu MiB past --h2o-buffer: one connection reads at a time",
                            used >> 20);
    } else if (h->over_budget && used < h->cfg->h2o_buffer / 4 * 3) {
        h->over_budget = 0;
        h->kept = NULL;
        for (conn_t *c = h->conns.next; c != &h->conns; c = c->next)
            resume_conn(c);
    } else if (h->over_budget && h->kept != NULL && h->kept->sock->bytes_read != h->kept_read) {
        h->kept_read = h->kept->sock->bytes_read;
        h->kept_moved_us = h->last_budget_us;
    } else if (h->over_budget && (h->kept == NULL || h->last_budget_us - h->kept_moved_us > KVR_HTTP_TURN_US)) {
        pass_turn(h); /* the one reading has gone quiet (its body is in, or its client stalls) */
    }
}

/* ------------------------------------------------------------------ setup */

static SSL_CTX *make_ssl(const kvr_config_t *cfg)
{
    SSL_CTX *ssl = SSL_CTX_new(TLS_server_method());

    if (ssl == NULL)
        return NULL;
    SSL_CTX_set_min_proto_version(ssl, TLS1_2_VERSION);
    SSL_CTX_set_options(ssl, SSL_OP_NO_COMPRESSION);
    if (SSL_CTX_use_certificate_chain_file(ssl, cfg->tls_cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(ssl, cfg->tls_key, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ssl) != 1) {
        unsigned long e = ERR_get_error();
        kvr_error("tls: cannot load %s / %s: %s", cfg->tls_cert, cfg->tls_key, ERR_error_string(e, NULL));
        SSL_CTX_free(ssl);
        return NULL;
    }
    h2o_ssl_register_alpn_protocols(ssl, h2o_http2_alpn_protocols);
    return ssl;
}

kvr_http_t *kvr_http_create(const kvr_config_t *cfg, kvr_api_t *api)
{
    kvr_http_t *h = calloc(1, sizeof(*h));
    h2o_hostconf_t *host;
    h2o_pathconf_t *pathconf;
    h2o_handler_t *handler;

    if (h == NULL)
        return NULL;
    h->cfg = cfg;
    h->api = api;
    h->conns.next = h->conns.prev = &h->conns;
    h->statm_fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);

    /* h2o 2.2 buffers every request body whole before the handler runs; the bound on that is
     * h2o_max_connections x h2o_max_body (README, "Memory"). Bodies up to the cap stay in
     * memory rather than spilling into files. */
    h2o_socket_buffer_mmap_settings.threshold = (size_t)cfg->h2o_max_body + (64u << 20);
    /* A socket's input buffer starts large enough for a typical block: h2o 2.2 grows it by
     * doubling, copying everything received so far each time (so a body of B bytes may briefly
     * hold about 3B/2 on top of it, counted in the bound). Not larger: a connection's input
     * buffer is reused as a ring, and over time every page of its capacity gets touched. */
    h2o_socket_buffer_prototype._initial_buf.capacity = 4u << 20;

    h2o_config_init(&h->gconf);
    h->gconf.max_request_entity_size = (size_t)cfg->h2o_max_body;
    h->gconf.http1.req_timeout = cfg->idle_timeout_ms;
    h->gconf.http2.idle_timeout = cfg->idle_timeout_ms;
    h->gconf.http2.graceful_shutdown_timeout = cfg->shutdown_grace_ms;
    h->gconf.server_name = h2o_iovec_init(H2O_STRLIT("kvrelay"));
    host = h2o_config_register_host(&h->gconf, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    pathconf = h2o_config_register_path(host, "/", 0);
    handler = h2o_create_handler(pathconf, sizeof(*handler) + sizeof(kvr_http_t *));
    handler->on_req = on_req;
    *(kvr_http_t **)(handler + 1) = h;

    h->loop = h2o_evloop_create();
    h2o_context_init(&h->ctx, h->loop, &h->gconf);
    h->accept_ctx.ctx = &h->ctx;
    h->accept_ctx.hosts = h->gconf.hosts;
    if (cfg->tls_cert[0] != '\0') {
        h->ssl = make_ssl(cfg);
        if (h->ssl == NULL)
            goto fail;
        h->accept_ctx.ssl_ctx = h->ssl;
    }
    h->last_sweep_ms = kvr_clock_ms();
    return h;

fail:
    free(h);
    return NULL;
}

int kvr_http_tls(const kvr_http_t *h)
{
    return h->ssl != NULL;
}

static void on_watch(h2o_socket_t *sock, const char *err)
{
    kvr_http_watch_t *w = sock->data;
    if (err == NULL)
        w->cb(w->data);
}

int kvr_http_watch_fd(kvr_http_t *h, int fd, void (*cb)(void *data), void *data)
{
    kvr_http_watch_t *w;
    h2o_socket_t *sock;

    if (h->nwatch >= KVR_ARRAY_SIZE(h->watch))
        return KVR_ERR;
    sock = h2o_evloop_socket_create(h->loop, fd, H2O_SOCKET_FLAG_DONT_READ);
    if (sock == NULL)
        return KVR_ERR;
    w = &h->watch[h->nwatch++];
    w->cb = cb;
    w->data = data;
    w->sock = sock;
    sock->data = w;
    h2o_socket_read_start(sock, on_watch);
    return KVR_OK;
}

void kvr_http_run_once(kvr_http_t *h, int32_t max_wait_ms)
{
    uint64_t t;

    /* -1 on EINTR (signals, io_uring task work): the caller's loop decides what to do. */
    (void)h2o_evloop_run(h->loop, max_wait_ms);
    if (h->nconns > 0 || h->over_budget) {
        uint64_t us = kvr_clock_us();
        if (us - h->last_budget_us >= 5000) {
            h->last_budget_us = us;
            budget(h);
        }
    }
    t = kvr_clock_ms();
    if (t - h->last_sweep_ms >= 250) {
        h->last_sweep_ms = t;
        sweep(h);
    }
}

int kvr_http_epoll_fd(const kvr_http_t *h)
{
    /* h2o 2.2's epoll loop is struct st_h2o_evloop_epoll_t { h2o_evloop_t super; int ep; },
     * which its headers do not export (lib/common/socket/evloop/epoll.c.h). Read it through the
     * same layout, and believe it only if the descriptor is an epoll instance. */
    struct evloop_epoll_view {
        h2o_evloop_t super;
        int ep;
    };
    int fd = ((const struct evloop_epoll_view *)(const void *)h->loop)->ep;
    char path[48], link[64];
    ssize_t n;

    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, link, sizeof(link) - 1);
    if (n <= 0 || (link[n] = '\0', strcmp(link, "anon_inode:[eventpoll]") != 0)) {
        kvr_warn("h2o's epoll descriptor not found (%s): the loop waits in h2o", n <= 0 ? strerror(errno) : link);
        return -1;
    }
    return fd;
}

int32_t kvr_http_idle_ms(kvr_http_t *h, int32_t max_ms)
{
    h2o_evloop_t *loop = h->loop;
    struct timeval tv;
    uint64_t wake, now;

    if (loop->_statechanged.head != NULL || loop->_pending_as_client != NULL || loop->_pending_as_server != NULL)
        return 0;
    wake = h2o_timeout_get_wake_at(&loop->_timeouts);
    if (wake == UINT64_MAX)
        return max_ms;
    gettimeofday(&tv, NULL); /* h2o's own clock: wake is in its milliseconds */
    now = (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
    if (wake <= now)
        return 0;
    return wake - now < (uint64_t)max_ms ? (int32_t)(wake - now) : max_ms;
}

void kvr_http_start_drain(kvr_http_t *h)
{
    if (h->draining)
        return;
    h->draining = 1;
    h2o_context_request_shutdown(&h->ctx);
    sweep(h);
}

int kvr_http_drained(kvr_http_t *h)
{
    return h->draining && h->nconns == 0;
}

uint64_t kvr_http_connections(const kvr_http_t *h)
{
    return h->nconns;
}

void *kvr_http_loop(kvr_http_t *h)
{
    return h->loop;
}

void kvr_http_destroy(kvr_http_t *h)
{
    if (h == NULL)
        return;
    if (h->ssl != NULL)
        SSL_CTX_free(h->ssl);
    free(h);
}
