/* http.c — see http.h for the design. */
#define H2O_USE_LIBUV 0
#include "io/http.h"

#include "core/log.h"
#include "io/metrics.h"
#include "shm/stats.h"
#include "wire/json.h"
#include "wire/keys.h"

#include <errno.h>
#include <h2o.h>
#include <h2o/http2.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#define IOV_BATCH    64  /* arena spans handed to h2o per send */
#define JSON_MAX     4096
#define ACCEPT_BATCH 64
#define MAX_HEADER_BYTES (16u << 10)
#define KVR_HTTP_INITIAL_INPUT (4u << 20) /* names + values of one request (h2o's own cap is ~400 KB) */

const char *const kvr_http_method_names[KVR_HTTP_METHODS] = {"GET", "PUT", "HEAD", "DELETE", "other"};
const int kvr_http_status_codes[KVR_HTTP_STATUSES] = {200, 201, 400, 401, 404, 405, 409, 413, 431, 500, 503, 507, 0, -1};
const double kvr_http_bucket_bounds[KVR_HTTP_BUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                          0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};

/* One tracked connection (a socket accepted by this worker). */
typedef struct conn_s {
    struct conn_s *prev, *next;
    h2o_socket_t *sock; /* NULL once closed while requests were still undisposed */
    kvr_http_t *http;
    uint32_t inflight;     /* requests of this connection not yet disposed */
    size_t last_written;   /* sock->bytes_written at the last sweep */
    size_t last_read;
    uint64_t last_progress_ms;
} conn_t;

struct kvr_http_s {
    const kvr_config_t *cfg;
    kvr_seg_t *seg;
    kvr_store_t *store;
    kvr_relay_t *relay;
    h2o_globalconf_t gconf;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    h2o_evloop_t *loop;
    h2o_socket_t *listener;
    int listen_fd;
    SSL_CTX *ssl;
    conn_t conns; /* list head */
    uint64_t nconns;
    int draining;
    uint64_t last_sweep_ms;
    size_t token_len;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* ------------------------------------------------------------------ per-request record */

typedef struct {
    kvr_http_t *http;
    conn_t *conn;
    uint64_t start_us;
    unsigned method;
    h2o_req_t *req;
} reqrec_t;

static unsigned method_index(const h2o_iovec_t *m)
{
    if (h2o_memis(m->base, m->len, H2O_STRLIT("GET")))
        return 0;
    if (h2o_memis(m->base, m->len, H2O_STRLIT("PUT")))
        return 1;
    if (h2o_memis(m->base, m->len, H2O_STRLIT("HEAD")))
        return 2;
    if (h2o_memis(m->base, m->len, H2O_STRLIT("DELETE")))
        return 3;
    return 4;
}

static unsigned status_index(int status)
{
    for (unsigned i = 0; i < KVR_HTTP_STATUSES - 2; i++)
        if (kvr_http_status_codes[i] == status)
            return i;
    return KVR_HTTP_STATUSES - 2; /* other */
}

/* Runs when h2o disposes of the request: count it, time it, and release the connection. */
static void reqrec_dispose(void *p)
{
    reqrec_t *r = p;
    kvr_stats_block_t *b = r->http->store->my_stats;
    uint64_t us = now_us() - r->start_us;
    double secs = (double)us / 1e6;
    unsigned base = KVR_ST_HTTP_HIST + r->method * (KVR_HTTP_BUCKETS + 2), k;

    kvr_stat_add(b, KVR_ST_HTTP_REQ + r->method * KVR_HTTP_STATUSES + status_index(r->req->res.status), 1);
    for (k = 0; k < KVR_HTTP_BUCKETS && secs > kvr_http_bucket_bounds[k]; k++)
        ;
    if (k < KVR_HTTP_BUCKETS)
        kvr_stat_add(b, base + k, 1);
    kvr_stat_add(b, base + KVR_HTTP_BUCKETS, us);
    kvr_stat_add(b, base + KVR_HTTP_BUCKETS + 1, 1);
    kvr_stat_add(b, KVR_ST_HTTP_BYTES_OUT, r->req->bytes_sent);
    kvr_stat_add(b, KVR_ST_HTTP_BYTES_IN, r->req->entity.len);
    if (r->conn != NULL && r->conn->inflight > 0 && --r->conn->inflight == 0 && r->conn->sock == NULL)
        free(r->conn); /* the socket closed first; the last request frees the record */
}

/* ------------------------------------------------------------------ responses */

static void add_header(h2o_req_t *req, const h2o_token_t *tok, const char *v, size_t n)
{
    h2o_add_header(&req->pool, &req->res.headers, tok, NULL, v, n);
}

static void send_json(h2o_req_t *req, int status, const char *reason, kvr_json_t *j)
{
    req->res.status = status;
    req->res.reason = reason;
    add_header(req, H2O_TOKEN_CONTENT_TYPE, H2O_STRLIT("application/json"));
    if (j->overflow) {
        req->res.status = 500;
        req->res.reason = "Internal Server Error";
        h2o_send_inline(req, H2O_STRLIT("{\"error\":\"Internal\",\"message\":\"response too large\"}"));
        return;
    }
    req->res.content_length = j->len;
    h2o_send_inline(req, j->buf, j->len);
}

static void send_error(h2o_req_t *req, int status, const char *reason, const char *code, const char *msg)
{
    char buf[512];
    kvr_json_t j;

    kvr_json_init(&j, buf, sizeof(buf));
    kvr_json_raw(&j, "{");
    kvr_json_key(&j, "error", 1);
    kvr_json_str(&j, code, strlen(code));
    kvr_json_key(&j, "message", 0);
    kvr_json_str(&j, msg, strlen(msg));
    kvr_json_raw(&j, "}");
    send_json(req, status, reason, &j);
}

static void send_405(h2o_req_t *req, const char *allow)
{
    add_header(req, H2O_TOKEN_ALLOW, allow, strlen(allow));
    send_error(req, 405, "Method Not Allowed", "MethodNotAllowed", "method not allowed for this resource");
}

static int is_method(h2o_req_t *req, const char *m)
{
    return h2o_memis(req->method.base, req->method.len, m, strlen(m));
}

/* ------------------------------------------------------------------ GET of a block */

typedef struct {
    h2o_generator_t super;
    kvr_http_t *http;
    kvr_block_ref_t ref;
    uint64_t off;  /* payload bytes handed to h2o so far */
    int pinned;
} blockgen_t;

static void blockgen_dispose(void *p)
{
    blockgen_t *g = p;
    if (g->pinned) {
        kvr_store_unpin(g->http->store, &g->ref);
        g->pinned = 0;
    }
}

static void blockgen_send_next(blockgen_t *g, h2o_req_t *req)
{
    struct iovec iov[IOV_BATCH];
    h2o_iovec_t bufs[IOV_BATCH];
    size_t n = kvr_store_ref_iov(g->http->store, &g->ref, g->off, iov, IOV_BATCH);
    uint64_t sent = 0;

    for (size_t i = 0; i < n; i++) {
        bufs[i] = h2o_iovec_init(iov[i].iov_base, iov[i].iov_len);
        sent += iov[i].iov_len;
    }
    g->off += sent;
    h2o_send(req, bufs, n, g->off >= g->ref.length ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
}

static void blockgen_proceed(h2o_generator_t *self, h2o_req_t *req)
{
    blockgen_send_next((blockgen_t *)self, req);
}

static void blockgen_stop(h2o_generator_t *self, h2o_req_t *req)
{
    /* The pin goes with the request's pool (blockgen_dispose); nothing to do here. */
}

static void handle_get_block(kvr_http_t *h, h2o_req_t *req, const uint8_t *key, size_t klen)
{
    blockgen_t *g = h2o_mem_alloc_shared(&req->pool, sizeof(*g), blockgen_dispose);
    int rc;

    memset(g, 0, sizeof(*g));
    g->http = h;
    rc = kvr_store_get(h->store, key, klen, &g->ref);
    if (rc == KVR_ENOTFOUND) {
        send_error(req, 404, "Not Found", "NoSuchBlock", "no such block");
        return;
    }
    if (rc == KVR_EBUSY) {
        send_error(req, 503, "Service Unavailable", "Busy", "too many blocks in flight in this worker");
        return;
    }
    if (rc != KVR_OK) {
        send_error(req, 500, "Internal Server Error", "Internal", "store error");
        return;
    }
    g->pinned = 1;
    g->super.proceed = blockgen_proceed;
    g->super.stop = blockgen_stop;
    req->res.status = 200;
    req->res.reason = "OK";
    req->res.content_length = g->ref.length;
    add_header(req, H2O_TOKEN_CONTENT_TYPE, H2O_STRLIT("application/octet-stream"));
    h2o_start_response(req, &g->super);
    if (g->ref.length == 0) {
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
        return;
    }
    blockgen_send_next(g, req);
}

/* ------------------------------------------------------------------ other /kv handlers */

static void handle_head_block(kvr_http_t *h, h2o_req_t *req, const uint8_t *key, size_t klen)
{
    static h2o_generator_t nogen = {NULL, NULL};
    uint64_t len = 0;

    if (!kvr_store_exists(h->store, key, klen, &len)) {
        req->res.status = 404;
        req->res.reason = "Not Found";
        req->res.content_length = 0;
    } else {
        req->res.status = 200;
        req->res.reason = "OK";
        req->res.content_length = len;
        add_header(req, H2O_TOKEN_CONTENT_TYPE, H2O_STRLIT("application/octet-stream"));
    }
    h2o_start_response(req, &nogen);
    h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
}

static int parse_seq_hash(h2o_req_t *req, uint64_t *canon)
{
    ssize_t i = h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-kv-sequence-hash"), -1);
    if (i < 0)
        return 0;
    return kvr_parse_u64(req->headers.entries[i].value.base, req->headers.entries[i].value.len, canon) == KVR_OK ? 1 : -1;
}

static void handle_put_block(kvr_http_t *h, h2o_req_t *req, const uint8_t *key, size_t klen)
{
    char buf[JSON_MAX];
    kvr_json_t j;
    uint64_t canon;
    int rc, hs = parse_seq_hash(req, &canon);

    if (hs < 0) {
        send_error(req, 400, "Bad Request", "InvalidRequest", "X-KV-Sequence-Hash must be a u64 in decimal or 0x hex");
        return;
    }
    if (hs == 0)
        canon = kvr_store_default_canon(key, klen);
    if (req->entity.len > h->cfg->max_block_size) {
        send_error(req, 413, "Payload Too Large", "EntityTooLarge", "block larger than --max-block-size");
        return;
    }
    rc = kvr_store_put(h->store, key, klen, req->entity.base != NULL ? req->entity.base : "", req->entity.len, canon);
    switch (rc) {
    case KVR_PUT_CREATED:
    case KVR_PUT_DEDUP:
        kvr_json_init(&j, buf, sizeof(buf));
        kvr_json_raw(&j, "{");
        kvr_json_key(&j, "hash", 1);
        kvr_json_str(&j, key, klen);
        kvr_json_key(&j, "bytes", 0);
        kvr_json_u64(&j, req->entity.len);
        kvr_json_key(&j, "created", 0);
        kvr_json_raw(&j, rc == KVR_PUT_CREATED ? "true}" : "false}");
        if (rc == KVR_PUT_CREATED)
            send_json(req, 201, "Created", &j);
        else
            send_json(req, 200, "OK", &j);
        return;
    case KVR_ECONFLICT:
        send_error(req, 409, "Conflict", "Conflict", "a block of another length is stored under this key");
        return;
    case KVR_ENOSPACE:
        send_error(req, 507, "Insufficient Storage", "InsufficientStorage", "no room for the block even after eviction");
        return;
    case KVR_EINVAL:
        send_error(req, 400, "Bad Request", "InvalidRequest", "invalid key");
        return;
    default:
        send_error(req, 500, "Internal Server Error", "Internal", "store error");
    }
}

static void handle_delete_block(kvr_http_t *h, h2o_req_t *req, const uint8_t *key, size_t klen)
{
    char buf[JSON_MAX];
    kvr_json_t j;
    uint32_t left = 0;
    int rc = kvr_store_release(h->store, key, klen, &left);

    if (rc == KVR_ENOTFOUND) {
        send_error(req, 404, "Not Found", "NoSuchBlock", "no such block");
        return;
    }
    if (rc != KVR_OK) {
        send_error(req, 500, "Internal Server Error", "Internal", "store error");
        return;
    }
    kvr_json_init(&j, buf, sizeof(buf));
    kvr_json_raw(&j, "{");
    kvr_json_key(&j, "hash", 1);
    kvr_json_str(&j, key, klen);
    kvr_json_key(&j, "refs", 0);
    kvr_json_u64(&j, left);
    kvr_json_raw(&j, "}");
    send_json(req, 200, "OK", &j);
}

static void handle_exists(kvr_http_t *h, h2o_req_t *req, const uint8_t *key, size_t klen)
{
    char buf[JSON_MAX];
    kvr_json_t j;
    int e = kvr_store_exists(h->store, key, klen, NULL);

    kvr_json_init(&j, buf, sizeof(buf));
    kvr_json_raw(&j, "{");
    kvr_json_key(&j, "hash", 1);
    kvr_json_str(&j, key, klen);
    kvr_json_key(&j, "exists", 0);
    kvr_json_raw(&j, e ? "true}" : "false}");
    send_json(req, 200, "OK", &j);
}

static void json_field(kvr_json_t *j, const char *name, uint64_t v, int first)
{
    kvr_json_key(j, name, first);
    kvr_json_u64(j, v);
}

static void handle_stats(kvr_http_t *h, h2o_req_t *req)
{
    char buf[JSON_MAX];
    kvr_json_t j;
    kvr_store_stats_t s;

    kvr_store_stats(h->store, &s);
    kvr_json_init(&j, buf, sizeof(buf));
    kvr_json_raw(&j, "{");
    json_field(&j, "unique_blocks", s.unique_blocks, 1);
    json_field(&j, "total_refs", s.total_refs, 0);
    json_field(&j, "resident_bytes", s.resident_bytes, 0);
    json_field(&j, "logical_bytes", s.logical_bytes, 0);
    json_field(&j, "dedup_savings_bytes", s.dedup_savings_bytes, 0);
    json_field(&j, "dedup_hits", s.dedup_hits, 0);
    json_field(&j, "get_hits", s.get_hits, 0);
    json_field(&j, "get_misses", s.get_misses, 0);
    json_field(&j, "capacity_bytes", s.capacity_bytes, 0);
    json_field(&j, "evictions", s.evictions, 0);
    json_field(&j, "evicted_bytes", s.evicted_bytes, 0);
    json_field(&j, "put_new", s.put_new, 0);
    json_field(&j, "put_conflicts", s.put_conflicts, 0);
    json_field(&j, "deletes", s.deletes, 0);
    kvr_json_raw(&j, "}");
    send_json(req, 200, "OK", &j);
}

static void handle_debug_store(kvr_http_t *h, h2o_req_t *req)
{
    char buf[JSON_MAX];
    kvr_json_t j;
    kvr_store_stats_t scan;
    int ok = kvr_store_check(h->store, &scan) == KVR_OK;

    kvr_json_init(&j, buf, sizeof(buf));
    kvr_json_raw(&j, "{");
    kvr_json_key(&j, "ok", 1);
    kvr_json_raw(&j, ok ? "true" : "false");
    json_field(&j, "unique_blocks", scan.unique_blocks, 0);
    json_field(&j, "total_refs", scan.total_refs, 0);
    json_field(&j, "resident_bytes", scan.resident_bytes, 0);
    json_field(&j, "logical_bytes", scan.logical_bytes, 0);
    json_field(&j, "pinned_blocks", scan.pinned_blocks, 0);
    json_field(&j, "zombie_blocks", scan.zombie_blocks, 0);
    kvr_json_raw(&j, "}");
    send_json(req, ok ? 200 : 500, ok ? "OK" : "Internal Server Error", &j);
}

static void handle_debug_relay(kvr_http_t *h, h2o_req_t *req)
{
    char buf[JSON_MAX];
    kvr_json_t j;
    const kvr_relay_sh_t *sh = h->relay->sh;
    uint64_t subs = 0;

    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++)
        subs += atomic_load(&sh->sub[i].state) == KVR_SUB_LIVE;
    kvr_json_init(&j, buf, sizeof(buf));
    kvr_json_raw(&j, "{");
    json_field(&j, "generation", atomic_load(&sh->generation), 1);
    json_field(&j, "published_seq", atomic_load(&sh->published_seq), 0);
    json_field(&j, "catalog_revision", atomic_load(&sh->catalog_revision), 0);
    json_field(&j, "bucket_count", sh->bucket_count, 0);
    json_field(&j, "seed", sh->seed, 0);
    json_field(&j, "dc_id", sh->dc_id, 0);
    json_field(&j, "incarnation", sh->incarnation, 0);
    json_field(&j, "publisher_pid", atomic_load(&sh->publisher_pid), 0);
    json_field(&j, "live_pool_subscribers", subs, 0);
    json_field(&j, "log_head", atomic_load(&h->store->log->head), 0);
    json_field(&j, "log_tail", atomic_load(&h->store->log->tail), 0);
    kvr_json_raw(&j, "}");
    send_json(req, 200, "OK", &j);
}

/* The publisher's working filter as bucket_count little-endian u64 words (x86: as stored). */
static void handle_debug_filter(kvr_http_t *h, h2o_req_t *req)
{
    static h2o_generator_t nogen = {NULL, NULL};
    size_t len = h->relay->sh->bucket_count * 8;
    uint8_t *copy = h2o_mem_alloc_pool(&req->pool, len);
    h2o_iovec_t body;

    for (uint64_t i = 0; i < h->relay->sh->bucket_count; i++)
        kvr_put_le64(copy + i * 8, __atomic_load_n(&h->relay->filter[i], __ATOMIC_RELAXED));
    body = h2o_iovec_init(copy, len);
    req->res.status = 200;
    req->res.reason = "OK";
    req->res.content_length = len;
    add_header(req, H2O_TOKEN_CONTENT_TYPE, H2O_STRLIT("application/octet-stream"));
    h2o_start_response(req, &nogen);
    h2o_send(req, &body, 1, H2O_SEND_STATE_FINAL);
}

static void handle_metrics(kvr_http_t *h, h2o_req_t *req)
{
    size_t len = 0;
    char *text = kvr_metrics_render(h->seg, h->store, &len);

    if (text == NULL) {
        send_error(req, 500, "Internal Server Error", "Internal", "out of memory");
        return;
    }
    req->res.status = 200;
    req->res.reason = "OK";
    add_header(req, H2O_TOKEN_CONTENT_TYPE, H2O_STRLIT("text/plain; version=0.0.4; charset=utf-8"));
    req->res.content_length = len;
    h2o_send_inline(req, text, len);
    free(text);
}

static int ready(kvr_http_t *h)
{
    const kvr_ctl_sh_t *c = &h->seg->hdr->ctl;
    return !atomic_load_explicit(&c->draining, memory_order_relaxed) && !h->draining &&
           atomic_load_explicit(&c->workers_running, memory_order_relaxed) >=
               atomic_load_explicit(&c->workers_expected, memory_order_relaxed) &&
           atomic_load_explicit(&c->publisher_running, memory_order_relaxed) >=
               atomic_load_explicit(&c->publisher_expected, memory_order_relaxed);
}

static void send_text(h2o_req_t *req, int status, const char *reason, const char *body)
{
    req->res.status = status;
    req->res.reason = reason;
    add_header(req, H2O_TOKEN_CONTENT_TYPE, H2O_STRLIT("text/plain"));
    req->res.content_length = strlen(body);
    h2o_send_inline(req, body, strlen(body));
}

/* Constant-time bearer check. */
static int authorized(kvr_http_t *h, h2o_req_t *req)
{
    const char *tok = h->cfg->token;
    ssize_t i;
    const h2o_iovec_t *v;
    size_t n;
    char pad[KVR_CFG_STR_MAX];

    if (h->token_len == 0)
        return 1;
    i = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1);
    if (i < 0)
        return 0;
    v = &req->headers.entries[i].value;
    if (v->len < 7 || strncasecmp(v->base, "Bearer ", 7) != 0)
        return 0;
    n = v->len - 7;
    /* compare a fixed number of bytes whatever the presented length */
    memset(pad, 0, sizeof(pad));
    memcpy(pad, v->base + 7, n < sizeof(pad) ? n : sizeof(pad));
    return (CRYPTO_memcmp(pad, tok, h->token_len) == 0) & (n == h->token_len);
}

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    kvr_http_t *h = *(kvr_http_t **)(self + 1);
    reqrec_t *rec = h2o_mem_alloc_shared(&req->pool, sizeof(*rec), reqrec_dispose);
    h2o_socket_t *sock = req->conn->callbacks->get_socket != NULL ? req->conn->callbacks->get_socket(req->conn) : NULL;
    size_t plen = req->query_at != SIZE_MAX ? req->query_at : req->path.len;
    const char *path = req->path.base;
    uint8_t key[KVR_KEY_MAX];
    size_t klen = 0;
    int rc;

    rec->http = h;
    rec->req = req;
    rec->start_us = now_us();
    rec->method = method_index(&req->method);
    rec->conn = sock != NULL && sock->on_close.data != NULL ? sock->on_close.data : NULL;
    if (rec->conn != NULL)
        rec->conn->inflight++;

    {
        size_t hb = req->path.len;
        for (size_t i = 0; i < req->headers.size; i++)
            hb += req->headers.entries[i].name->len + req->headers.entries[i].value.len;
        if (hb > MAX_HEADER_BYTES) {
            req->http1_is_persistent = 0;
            send_error(req, 431, "Request Header Fields Too Large", "InvalidRequest",
                       "request headers larger than 16 KiB");
            return 0;
        }
    }
    if (h2o_memis(path, plen, H2O_STRLIT("/healthz"))) {
        send_text(req, 200, "OK", "ok\n");
        return 0;
    }
    if (h2o_memis(path, plen, H2O_STRLIT("/readyz"))) {
        if (ready(h))
            send_text(req, 200, "OK", "ready\n");
        else
            send_text(req, 503, "Service Unavailable", "not ready\n");
        return 0;
    }
    if (!authorized(h, req)) {
        add_header(req, H2O_TOKEN_WWW_AUTHENTICATE, H2O_STRLIT("Bearer"));
        send_error(req, 401, "Unauthorized", "Unauthorized", "missing or invalid bearer token");
        return 0;
    }
    if (h2o_memis(path, plen, H2O_STRLIT("/metrics"))) {
        if (!is_method(req, "GET") && !is_method(req, "HEAD"))
            send_405(req, "GET, HEAD");
        else
            handle_metrics(h, req);
        return 0;
    }
    if (h2o_memis(path, plen, H2O_STRLIT("/debug/store"))) {
        if (!is_method(req, "GET"))
            send_405(req, "GET");
        else
            handle_debug_store(h, req);
        return 0;
    }
    if (h2o_memis(path, plen, H2O_STRLIT("/debug/relay")) || h2o_memis(path, plen, H2O_STRLIT("/debug/filter"))) {
        if (!is_method(req, "GET"))
            send_405(req, "GET");
        else if (h->relay == NULL || h->relay->sh == NULL)
            send_error(req, 404, "Not Found", "NotFound", "the relay is not configured");
        else if (path[7] == 'r')
            handle_debug_relay(h, req);
        else
            handle_debug_filter(h, req);
        return 0;
    }
    if (plen < 4 || memcmp(path, "/kv/", 4) != 0) {
        send_error(req, 404, "Not Found", "NotFound", "no such resource");
        return 0;
    }
    path += 4;
    plen -= 4;
    if (h2o_memis(path, plen, H2O_STRLIT("stats"))) {
        if (!is_method(req, "GET") && !is_method(req, "HEAD"))
            send_405(req, "GET, HEAD");
        else
            handle_stats(h, req);
        return 0;
    }
    if (plen >= 7 && memcmp(path + plen - 7, "/exists", 7) == 0) { /* §3: the rest is the key */
        if (!is_method(req, "GET") && !is_method(req, "HEAD")) {
            send_405(req, "GET, HEAD");
            return 0;
        }
        rc = kvr_key_decode(path, plen - 7, key, sizeof(key), &klen);
        if (rc != KVR_KEY_OK) {
            send_error(req, 400, "Bad Request", "InvalidRequest", kvr_key_error(rc));
            return 0;
        }
        handle_exists(h, req, key, klen);
        return 0;
    }
    if (!is_method(req, "GET") && !is_method(req, "HEAD") && !is_method(req, "PUT") && !is_method(req, "DELETE")) {
        send_405(req, "GET, HEAD, PUT, DELETE");
        return 0;
    }
    rc = kvr_key_decode(path, plen, key, sizeof(key), &klen);
    if (rc != KVR_KEY_OK) {
        send_error(req, 400, "Bad Request", "InvalidRequest", kvr_key_error(rc));
        return 0;
    }
    if (is_method(req, "GET"))
        handle_get_block(h, req, key, klen);
    else if (is_method(req, "HEAD"))
        handle_head_block(h, req, key, klen);
    else if (is_method(req, "PUT"))
        handle_put_block(h, req, key, klen);
    else
        handle_delete_block(h, req, key, klen);
    return 0;
}

/* ------------------------------------------------------------------ connections */

/* The socket is gone. Requests of it that h2o has not disposed yet still point here. */
static void conn_on_close(void *p)
{
    conn_t *c = p;
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->http->nconns--;
    c->sock = NULL;
    if (c->inflight == 0)
        free(c);
}

static void on_accept(h2o_socket_t *listener, const char *err)
{
    kvr_http_t *h = listener->data;

    if (err != NULL)
        return;
    for (int i = 0; i < ACCEPT_BATCH && !h->draining; i++) {
        h2o_socket_t *sock = h2o_evloop_socket_accept(listener);
        conn_t *c;
        if (sock == NULL)
            break; /* another worker won, or nothing pending */
        c = calloc(1, sizeof(*c));
        if (c == NULL) {
            h2o_socket_close(sock);
            continue;
        }
        c->sock = sock;
        c->http = h;
        c->last_progress_ms = now_ms();
        c->next = h->conns.next;
        c->prev = &h->conns;
        h->conns.next->prev = c;
        h->conns.next = c;
        h->nconns++;
        sock->on_close.cb = conn_on_close;
        sock->on_close.data = c;
        h2o_accept(&h->accept_ctx, sock);
    }
}

/* Kernel-level cut: h2o sees the error on its next I/O and closes and disposes normally. */
static void conn_cut(conn_t *c)
{
    int fd = h2o_socket_get_fd(c->sock);
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
}

/*
 * Every 250 ms: cut connections with a request in flight whose bytes have not moved for
 * --io-timeout (a client that stopped reading keeps its GET's pin otherwise); while
 * draining, cut connections with nothing in flight and no unread input.
 */
static void sweep(kvr_http_t *h)
{
    uint64_t t = now_ms();

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

kvr_http_t *kvr_http_create(const kvr_config_t *cfg, kvr_seg_t *seg, kvr_store_t *store, kvr_relay_t *relay,
                            int listen_fd)
{
    kvr_http_t *h = calloc(1, sizeof(*h));
    h2o_hostconf_t *host;
    h2o_pathconf_t *pathconf;
    h2o_handler_t *handler;

    if (h == NULL)
        return NULL;
    h->cfg = cfg;
    h->seg = seg;
    h->store = store;
    h->relay = relay;
    h->listen_fd = listen_fd;
    h->conns.next = h->conns.prev = &h->conns;
    h->token_len = strlen(cfg->token);

    /* Bodies up to the cap stay in memory: KV chunks of 32-80 MiB are normal. */
    h2o_socket_buffer_mmap_settings.threshold = (size_t)cfg->max_block_size + (64u << 20);
    /* A socket's input buffer starts large enough for a typical block: h2o 2.2 grows it by
     * doubling, copying everything received so far each time, which cost as much CPU as the
     * copy into the arena. Only the bytes used are touched; freed buffers stay on the heap
     * (worker.c's mallopt), so a new one costs neither a syscall nor page faults. */
    h2o_socket_buffer_prototype._initial_buf.capacity = KVR_HTTP_INITIAL_INPUT;

    h2o_config_init(&h->gconf);
    h->gconf.max_request_entity_size = (size_t)cfg->max_block_size;
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
    h->listener = h2o_evloop_socket_create(h->loop, listen_fd, H2O_SOCKET_FLAG_DONT_READ);
    h->listener->data = h;
    h2o_socket_read_start(h->listener, on_accept);
    h->last_sweep_ms = now_ms();
    return h;

fail:
    free(h);
    return NULL;
}

void kvr_http_run_once(kvr_http_t *h, int32_t max_wait_ms)
{
    uint64_t t;

    /* -1 on EINTR (signals, io_uring task work): the caller's loop decides what to do. */
    (void)h2o_evloop_run(h->loop, max_wait_ms);
    t = now_ms();
    if (t - h->last_sweep_ms >= 250) {
        h->last_sweep_ms = t;
        sweep(h);
    }
}

void kvr_http_start_drain(kvr_http_t *h)
{
    if (h->draining)
        return;
    h->draining = 1;
    if (h->listener != NULL) {
        h2o_socket_read_stop(h->listener);
        h2o_socket_close(h->listener); /* closes listen_fd */
        h->listener = NULL;
    }
    h2o_context_request_shutdown(&h->ctx);
    sweep(h);
}

int kvr_http_drained(kvr_http_t *h)
{
    return h->draining && h->nconns == 0;
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
