/*
 * grpc_conn.c — the gRPC server's connection plumbing (grpc_int.h lists the parts): accept
 * on the worker's ring, one nghttp2 server session per connection with recv/send through
 * io/uring.h, keepalive pings, request reassembly and the framing checks, a stream's queued
 * output (sent without a copy from the stream's buffer) and its end, and the glue to the
 * h2o loop: the ring's eventfd, the publisher's wake-ups, the tick.
 */
#include "io/grpc_int.h"

#include "base/clock.h"
#include "base/log.h"
#include "wire/relay_validate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define RBUF_SIZE          (256u << 10)
#define WBUF_TARGET        (1u << 20) /* nghttp2 output gathered per send */
#define KICK_COALESCE_MS   1          /* deltas reach streams at most this often: fewer, fuller sends */
#define PING_INTERVAL_MS   20000
#define PING_TIMEOUT_MS    10000
#define GRPC_UNIMPLEMENTED 12

/* gstream_t.auth: what the call's authorization metadata said. With --tenants a relay call
 * needs a token: a namespace's token sees that namespace's pools (gstream_t.scope), the admin
 * token every pool (docs/tenancy.md, "Pools"). */
enum { GAUTH_NONE = 0,
       GAUTH_UNKNOWN,
       GAUTH_TENANT,
       GAUTH_ADMIN };

static void conn_pump(gconn_t *c);
static void conn_close(gconn_t *c);

/* Only what can go out now: the rest stays where it is (for a pool stream, the ring). */
static void stream_refill(gstream_t *s, size_t budget)
{
    if (s->method != NULL && s->method->refill != NULL)
        s->method->refill(s, budget);
}

/* ------------------------------------------------------------------ output buffers */

/* Grows a realloc'd buffer to hold at least `need` bytes (doubling from `first`). */
static int buf_grow(uint8_t **buf, size_t *cap, size_t need, size_t first)
{
    size_t c = *cap ? *cap : first;
    uint8_t *n;

    if (need <= *cap)
        return KVR_OK;
    while (c < need)
        c *= 2;
    n = realloc(*buf, c);
    if (n == NULL)
        return KVR_ERR;
    *buf = n;
    *cap = c;
    return KVR_OK;
}

int kvr_grpc_out_reserve(gstream_t *s, size_t add)
{
    if (s->out_off > 0 && s->out_off == s->out_len) {
        s->out_off = s->out_len = 0;
    }
    return buf_grow(&s->out, &s->out_cap, s->out_len + add, 4096);
}

int kvr_grpc_out_message(gstream_t *s, const ProtobufCMessage *m)
{
    if (kvr_grpc_out_reserve(s, kvr_grpc_packed_size(m)) != KVR_OK)
        return KVR_ERR;
    s->out_len += kvr_grpc_pack(m, s->out + s->out_len);
    return KVR_OK;
}

/* ------------------------------------------------------------------ responses */

#define NV(n, v) \
    { \
        (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NO_COPY_NAME \
    }

static ssize_t data_read_cb(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                            uint32_t *data_flags, nghttp2_data_source *source, void *user_data);

void kvr_grpc_send_headers(gstream_t *s)
{
    nghttp2_nv hdrs[] = {NV(":status", "200"), NV("content-type", "application/grpc")};
    nghttp2_data_provider prd;

    if (s->responded)
        return;
    prd.source.ptr = s;
    prd.read_callback = data_read_cb;
    s->responded = 1;
    nghttp2_submit_response(s->conn->session, s->id, hdrs, 2, &prd);
}

/* nghttp2 copies the values (no NO_COPY_VALUE flag): md may live on the stack. */
static size_t status_nv(nghttp2_nv *nv, const kvr_grpc_status_md_t *md)
{
    for (size_t i = 0; i < md->n; i++)
        nv[i] = (nghttp2_nv){(uint8_t *)md->name[i], (uint8_t *)md->value[i], strlen(md->name[i]),
                             strlen(md->value[i]), NGHTTP2_NV_FLAG_NO_COPY_NAME};
    return md->n;
}

void kvr_grpc_stream_end(gstream_t *s, int status, int reason, const char *msg)
{
    if (s->end_status >= 0)
        return;
    s->end_status = status;
    s->end_reason = reason;
    s->end_msg = msg;
    s->phase = PH_ENDING;
    if (!s->responded) { /* Trailers-Only */
        kvr_grpc_status_md_t md;
        nghttp2_nv hdrs[2 + KVR_ARRAY_SIZE(md.name)] = {NV(":status", "200"), NV("content-type", "application/grpc")};
        size_t n = 2;
        kvr_grpc_status_md(&md, status, msg, reason);
        n += status_nv(hdrs + n, &md);
        s->responded = 1;
        nghttp2_submit_response(s->conn->session, s->id, hdrs, n, NULL);
        return;
    }
    if (s->deferred) {
        s->deferred = 0;
        nghttp2_session_resume_data(s->conn->session, s->id);
    }
}

static void submit_trailers(gstream_t *s)
{
    kvr_grpc_status_md_t md;
    nghttp2_nv t[KVR_ARRAY_SIZE(md.name)];

    kvr_grpc_status_md(&md, s->end_status, s->end_msg, s->end_reason);
    nghttp2_submit_trailer(s->conn->session, s->id, t, status_nv(t, &md));
}

/*
 * nghttp2 asks what the stream has to send. The bytes are not copied here: with
 * NGHTTP2_DATA_FLAG_NO_COPY, send_data_cb writes the DATA frame straight from the
 * stream's buffer into the connection's output, one copy instead of two.
 */
static ssize_t data_read_cb(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                            uint32_t *data_flags, nghttp2_data_source *source, void *user_data)
{
    gstream_t *s = source->ptr;
    size_t n;

    if (s->out_off >= s->out_len && s->end_status < 0)
        stream_refill(s, length);
    if (s->out_off < s->out_len) {
        n = s->out_len - s->out_off;
        if (n > length)
            n = length;
        *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
        if (s->end_status >= 0 && s->out_off + n == s->out_len) {
            *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
            submit_trailers(s);
        }
        s->progress_ms = kvr_clock_ms();
        return (ssize_t)n;
    }
    if (s->end_status >= 0) {
        *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        submit_trailers(s);
        return 0;
    }
    s->deferred = 1;
    return NGHTTP2_ERR_DEFERRED;
}

static int pbuf_reserve(gconn_t *c, size_t add);

static int send_data_cb(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                        nghttp2_data_source *source, void *user_data)
{
    gconn_t *c = user_data;
    gstream_t *s = source->ptr;
    size_t pad = frame->data.padlen;

    if (pbuf_reserve(c, 9 + pad + length) != KVR_OK)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    memcpy(c->pbuf + c->plen, framehd, 9);
    c->plen += 9;
    if (pad > 0)
        c->pbuf[c->plen++] = (uint8_t)(pad - 1);
    memcpy(c->pbuf + c->plen, s->out + s->out_off, length);
    c->plen += length;
    s->out_off += length;
    if (pad > 1) {
        memset(c->pbuf + c->plen, 0, pad - 1);
        c->plen += pad - 1;
    }
    return 0;
}

/* Lets DATA frames be as large as the peer allows (up to 256 KiB): fewer frames per chunk. */
static ssize_t read_length_cb(nghttp2_session *session, uint8_t frame_type, int32_t stream_id,
                              int32_t session_window, int32_t stream_window, uint32_t max_frame, void *user_data)
{
    ssize_t n = session_window < stream_window ? session_window : stream_window;
    if ((ssize_t)max_frame < n)
        n = (ssize_t)max_frame;
    if (n > 256 * 1024)
        n = 256 * 1024;
    return n > 0 ? n : 1;
}

void kvr_grpc_stream_kick(gstream_t *s)
{
    if (!s->responded)
        kvr_grpc_send_headers(s);
    else if (s->deferred) {
        s->deferred = 0;
        nghttp2_session_resume_data(s->conn->session, s->id);
    }
}

/* ------------------------------------------------------------------ dispatch */

static const kvr_grpc_method_t *method_find(const char *path)
{
    for (size_t i = 0; i < kvr_grpc_relay_nmethods; i++)
        if (!strcmp(path, kvr_grpc_relay_methods[i].path))
            return &kvr_grpc_relay_methods[i];
    for (size_t i = 0; i < kvr_grpc_health_nmethods; i++)
        if (!strcmp(path, kvr_grpc_health_methods[i].path))
            return &kvr_grpc_health_methods[i];
    return NULL;
}

/* The request is complete: the framing checks, then the method's call. */
static void dispatch(gstream_t *s)
{
    const uint8_t *msg;
    size_t mlen;

    if (!s->grpc_ct) {
        kvr_grpc_stream_end(s, KVR_GRPC_INTERNAL, 0, "content-type must be application/grpc");
        return;
    }
    if (s->too_big) {
        kvr_grpc_stream_end(s, KVR_GRPC_RESOURCE_EXHAUSTED, 0, "request message larger than the maximum");
        return;
    }
    switch (kvr_grpc_one_message(s->req, s->req_len, &msg, &mlen)) {
    case KVR_GRPC_ONE_MALFORMED:
        kvr_grpc_stream_end(s, KVR_GRPC_INTERNAL, 0, "expected exactly one request message");
        return;
    case KVR_GRPC_ONE_COMPRESSED:
        kvr_grpc_stream_end(s, GRPC_UNIMPLEMENTED, 0, "compressed requests are not supported");
        return;
    case KVR_GRPC_ONE_OK:
        break;
    }
    if (s->method == NULL) {
        kvr_grpc_stream_end(s, GRPC_UNIMPLEMENTED, 0, "unknown method");
        return;
    }
    if (s->method->rpc >= 0 && s->conn->g->tenants != NULL && s->auth != GAUTH_ADMIN && s->auth != GAUTH_TENANT) {
        kvr_grpc_stream_end(s, KVR_GRPC_UNAUTHENTICATED, 0,
                            "missing or invalid bearer token in the authorization metadata");
        return;
    }
    s->method->call(s, msg, mlen);
}

/* ------------------------------------------------------------------ nghttp2 callbacks */

static gstream_t *stream_new(gconn_t *c, int32_t id)
{
    gstream_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->conn = c;
    s->id = id;
    s->admitted = -1;
    s->sub = -1;
    s->scope = -1;
    s->end_status = -1;
    s->next = c->streams.next;
    s->prev = &c->streams;
    c->streams.next->prev = s;
    c->streams.next = s;
    return s;
}

static void stream_free(gstream_t *s)
{
    if (s->method != NULL && s->method->done != NULL)
        s->method->done(s);
    s->prev->next = s->next;
    s->next->prev = s->prev;
    free(s->req);
    free(s->out);
    free(s->token);
    free(s);
}

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    gconn_t *c = user_data;
    gstream_t *s;

    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    s = stream_new(c, frame->hd.stream_id);
    if (s == NULL)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    nghttp2_session_set_stream_user_data(session, frame->hd.stream_id, s);
    return 0;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data)
{
    gstream_t *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);

    if (s == NULL || frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (namelen == 5 && memcmp(name, ":path", 5) == 0 && valuelen < sizeof(s->path)) {
        memcpy(s->path, value, valuelen);
        s->path[valuelen] = '\0';
        s->path_len = (int)valuelen;
    } else if (namelen == 12 && memcmp(name, "content-type", 12) == 0) {
        s->grpc_ct = valuelen >= 16 && memcmp(value, "application/grpc", 16) == 0;
    } else if (namelen == 13 && memcmp(name, "authorization", 13) == 0 && s->conn->g->tenants != NULL) {
        uint16_t ns;
        int admin = 0;
        s->auth = GAUTH_UNKNOWN;
        if (valuelen > 7 && strncasecmp((const char *)value, "Bearer ", 7) == 0 &&
            kvr_tenants_auth(s->conn->g->tenants, (const char *)value + 7, valuelen - 7, &ns, &admin)) {
            free(s->token);
            s->token = malloc(valuelen - 7);
            if (s->token == NULL)
                return NGHTTP2_ERR_CALLBACK_FAILURE;
            memcpy(s->token, value + 7, valuelen - 7);
            s->token_len = valuelen - 7;
            s->auth_gen = kvr_tenants_view_generation(s->conn->g->tenants); /* auth refreshed the view */
            s->auth = admin ? GAUTH_ADMIN : GAUTH_TENANT;
            s->scope = admin ? -1 : (int)ns;
        }
    }
    return 0;
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                         void *user_data)
{
    gstream_t *s = nghttp2_session_get_stream_user_data(session, stream_id);

    if (s == NULL || s->too_big)
        return 0;
    if (s->req_len + len > KVR_GRPC_MAX_MESSAGE + KVR_GRPC_PREFIX) {
        s->too_big = 1;
        return 0;
    }
    if (buf_grow(&s->req, &s->req_cap, s->req_len + len, 256) != KVR_OK)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    memcpy(s->req + s->req_len, data, len);
    s->req_len += len;
    return 0;
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    gconn_t *c = user_data;
    gstream_t *s;

    if (frame->hd.type == NGHTTP2_PING && (frame->hd.flags & NGHTTP2_FLAG_ACK)) {
        c->ping_outstanding = 0;
        return 0;
    }
    if ((frame->hd.type != NGHTTP2_DATA && frame->hd.type != NGHTTP2_HEADERS) ||
        !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (s == NULL || s->end_status >= 0 || s->phase != PH_NONE)
        return 0;
    if (c->g->draining) {
        kvr_grpc_stream_end(s, KVR_GRPC_UNAVAILABLE, KVR_RELAY_REASON_PUBLICATION_UNAVAILABLE, "server shutting down");
        return 0;
    }
    s->method = method_find(s->path);
    dispatch(s);
    return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data)
{
    gstream_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
    if (s != NULL) {
        nghttp2_session_set_stream_user_data(session, stream_id, NULL);
        stream_free(s);
    }
    return 0;
}

/* ------------------------------------------------------------------ connections */

static void on_recv(kvr_uring_op_t *op, int res);
static void on_send(kvr_uring_op_t *op, int res);

static void conn_maybe_free(gconn_t *c)
{
    if (!c->dead || c->reading || c->writing)
        return;
    while (c->streams.next != &c->streams)
        stream_free(c->streams.next); /* nghttp2_session_del does not call on_stream_close */
    nghttp2_session_del(c->session);
    close(c->fd);
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->g->nconns--;
    free(c->rbuf);
    free(c->wbuf);
    free(c->pbuf);
    free(c);
}

/* Marks the connection dead; it is freed (conn_maybe_free) only at points where nothing
 * refers to it any more: the end of an I/O completion, or the tick. */
static void conn_close(gconn_t *c)
{
    if (c->dead)
        return;
    c->dead = 1;
    /* Outstanding recv/send complete (with 0 or an error) once the socket is shut down. */
    shutdown(c->fd, SHUT_RDWR);
}

static void conn_read(gconn_t *c)
{
    if (c->reading || c->dead)
        return;
    if (kvr_uring_recv(&c->g->uring, c->fd, c->rbuf, RBUF_SIZE, &c->rop) == KVR_OK)
        c->reading = 1;
    else
        conn_close(c);
}

static int pbuf_reserve(gconn_t *c, size_t add)
{
    return buf_grow(&c->pbuf, &c->pcap, c->plen + add, 65536);
}

/* Gathers nghttp2's output and sends it, one send in flight per connection. DATA frames
 * arrive through send_data_cb during nghttp2_session_mem_send, in order. */
static void conn_pump(gconn_t *c)
{
    if (c->dead || c->writing)
        return;
    while (c->plen < WBUF_TARGET) {
        const uint8_t *data;
        size_t before = c->plen;
        ssize_t n = nghttp2_session_mem_send(c->session, &data);
        if (n < 0) {
            conn_close(c);
            return;
        }
        if (n == 0) {
            if (c->plen == before)
                break;
            continue;
        }
        if (pbuf_reserve(c, (size_t)n) != KVR_OK) {
            conn_close(c);
            return;
        }
        memcpy(c->pbuf + c->plen, data, (size_t)n); /* the pointer dies at the next call */
        c->plen += (size_t)n;
    }
    if (c->plen == 0) {
        if (!nghttp2_session_want_read(c->session) && !nghttp2_session_want_write(c->session))
            conn_close(c);
        return;
    }
    { /* swap buffers: the gathered one goes out, the sent one gathers next */
        uint8_t *tb = c->wbuf;
        size_t tc = c->wcap;
        c->wbuf = c->pbuf;
        c->wcap = c->pcap;
        c->wlen = c->plen;
        c->woff = 0;
        c->pbuf = tb;
        c->pcap = tc;
        c->plen = 0;
    }
    if (kvr_uring_send(&c->g->uring, c->fd, c->wbuf, c->wlen, &c->wop) == KVR_OK)
        c->writing = 1;
    else
        conn_close(c);
}

static void on_send(kvr_uring_op_t *op, int res)
{
    gconn_t *c = op->data;

    c->writing = 0;
    if (res <= 0 || c->dead) {
        conn_close(c);
    } else {
        c->woff += (size_t)res;
        if (c->woff < c->wlen) {
            if (kvr_uring_send(&c->g->uring, c->fd, c->wbuf + c->woff, c->wlen - c->woff, &c->wop) == KVR_OK)
                c->writing = 1;
            else
                conn_close(c);
        } else {
            conn_pump(c);
        }
    }
    conn_maybe_free(c);
}

static void on_recv(kvr_uring_op_t *op, int res)
{
    gconn_t *c = op->data;
    ssize_t rv;

    c->reading = 0;
    if (res <= 0 || c->dead) {
        conn_close(c);
    } else if ((rv = nghttp2_session_mem_recv(c->session, c->rbuf, (size_t)res)) < 0) {
        kvr_debug("grpc: protocol error: %s", nghttp2_strerror((int)rv));
        conn_close(c);
    } else {
        conn_read(c);
        conn_pump(c);
    }
    conn_maybe_free(c);
}

static gconn_t *conn_new(kvr_grpc_t *g, int fd)
{
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 256},
                                   {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20}};
    gconn_t *c = calloc(1, sizeof(*c));

    if (c == NULL || (c->rbuf = malloc(RBUF_SIZE)) == NULL) {
        free(c);
        return NULL;
    }
    c->g = g;
    c->fd = fd;
    c->streams.next = c->streams.prev = &c->streams;
    c->rop.cb = on_recv;
    c->rop.data = c;
    c->wop.cb = on_send;
    c->wop.data = c;
    c->last_ping_ms = kvr_clock_ms();
    nghttp2_session_server_new(&c->session, g->cbs, c);
    nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, 2);
    c->next = g->conns.next;
    c->prev = &g->conns;
    g->conns.next->prev = c;
    g->conns.next = c;
    g->nconns++;
    return c;
}

static void on_accept(kvr_uring_op_t *op, int res)
{
    kvr_grpc_t *g = op->data;
    gconn_t *c;

    g->accepting = 0;
    if (res >= 0) {
        c = conn_new(g, res);
        if (c == NULL) {
            close(res);
        } else {
            conn_read(c);
            conn_pump(c);
        }
    } else if (res != -EAGAIN && res != -EINTR && res != -ECANCELED) {
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "grpc: accept: %s", strerror(-res));
    }
    if (!g->draining && kvr_uring_accept(&g->uring, g->listen_fd, &g->accept_op) == KVR_OK)
        g->accepting = 1;
}

/* ------------------------------------------------------------------ loop glue */

/* The publisher published (or admitted a subscriber): every stream that waits for it. */
static void kick_streams(kvr_grpc_t *g)
{
    for (gconn_t *c = g->conns.next; c != &g->conns; c = c->next) {
        for (gstream_t *s = c->streams.next; s != &c->streams; s = s->next)
            if (s->end_status < 0 && s->method != NULL && s->method->wake != NULL)
                s->method->wake(s);
        conn_pump(c);
    }
}

static void on_uring_event(h2o_socket_t *sock, const char *err)
{
    kvr_grpc_t *g = sock->data;
    kvr_uring_process(&g->uring);
    kvr_uring_flush(&g->uring);
}

static void on_kick_timeout(h2o_timeout_entry_t *entry)
{
    kvr_grpc_t *g = (kvr_grpc_t *)((char *)entry - offsetof(kvr_grpc_t, kick_entry));
    g->last_kick_ms = kvr_clock_ms();
    kick_streams(g);
    kvr_uring_flush(&g->uring);
}

/*
 * The publisher published (or admitted a subscriber). Streams are kicked at most once per
 * KICK_COALESCE_MS: under a heavy PUT load deltas come every few hundred microseconds, and
 * sending each one to every subscriber separately costs a send per delta per stream.
 */
static void on_wake(h2o_socket_t *sock, const char *err)
{
    kvr_grpc_t *g = sock->data;
    uint64_t v, t = kvr_clock_ms();

    (void)!read(g->wake_fd, &v, sizeof(v));
    if (h2o_timeout_is_linked(&g->kick_entry))
        return;
    if (t - g->last_kick_ms >= KICK_COALESCE_MS) {
        g->last_kick_ms = t;
        kick_streams(g);
        kvr_uring_flush(&g->uring);
    } else {
        h2o_timeout_link(g->loop, &g->kick_timeout, &g->kick_entry);
    }
}

void kvr_grpc_flush(kvr_grpc_t *g)
{
    kvr_uring_flush(&g->uring);
}

/* A reload of the tenants table may have removed the token a relay stream was opened with, or
 * moved it to another namespace: the stream ends then, as that token's HTTP requests get 401
 * (docs/tenancy.md). Checked on the tick, once per change of the table. */
static void recheck_token(gstream_t *s)
{
    kvr_tenants_view_t *v = s->conn->g->tenants;
    uint16_t ns;
    int admin = 0;

    if (v == NULL || s->token == NULL || s->end_status >= 0 || s->method == NULL || s->method->rpc < 0)
        return; /* no tenants, no token given, or not the relay's (health needs none) */
    kvr_tenants_view_refresh(v);
    if (kvr_tenants_view_generation(v) == s->auth_gen)
        return;
    if (kvr_tenants_auth(v, s->token, s->token_len, &ns, &admin) && (admin ? -1 : (int)ns) == s->scope) {
        s->auth_gen = kvr_tenants_view_generation(v);
        return;
    }
    kvr_grpc_stream_end(s, KVR_GRPC_UNAUTHENTICATED, 0, "the bearer token is no longer valid (tenants file reloaded)");
    kvr_grpc_stream_kick(s);
}

void kvr_grpc_tick(kvr_grpc_t *g)
{
    uint64_t t = kvr_clock_ms();

    for (gconn_t *c = g->conns.next, *cn; c != &g->conns; c = cn) {
        cn = c->next;
        if (c->dead) {
            conn_maybe_free(c);
            continue;
        }
        for (gstream_t *s = c->streams.next; s != &c->streams; s = s->next) {
            recheck_token(s);
            if (s->end_status < 0 && s->method != NULL && s->method->tick != NULL)
                s->method->tick(s, t);
        }
        if (c->ping_outstanding && t - c->ping_sent_ms > PING_TIMEOUT_MS) {
            kvr_info("grpc: keepalive ping unanswered; closing the connection");
            conn_close(c);
            continue;
        }
        if (!c->ping_outstanding && t - c->last_ping_ms >= PING_INTERVAL_MS) {
            nghttp2_submit_ping(c->session, NGHTTP2_FLAG_NONE, NULL);
            c->ping_outstanding = 1;
            c->ping_sent_ms = t;
            c->last_ping_ms = t;
        }
        conn_pump(c);
    }
    kvr_uring_flush(&g->uring);
}

void kvr_grpc_start_drain(kvr_grpc_t *g)
{
    if (g->draining)
        return;
    g->draining = 1;
    for (gconn_t *c = g->conns.next; c != &g->conns; c = c->next) {
        for (gstream_t *s = c->streams.next; s != &c->streams; s = s->next) {
            if (s->end_status >= 0)
                continue;
            if (s->method != NULL && s->method->cancel != NULL)
                s->method->cancel(s);
            kvr_grpc_stream_end(s, KVR_GRPC_UNAVAILABLE, KVR_RELAY_REASON_PUBLICATION_UNAVAILABLE, "server shutting down");
        }
        nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(c->session),
                              NGHTTP2_NO_ERROR, NULL, 0);
        conn_pump(c);
    }
    /* The accept in flight completes when the listener is shut down. */
    shutdown(g->listen_fd, SHUT_RDWR);
    kvr_uring_flush(&g->uring);
}

unsigned kvr_grpc_connections(const kvr_grpc_t *g)
{
    return g->nconns;
}

static void set_callbacks(kvr_grpc_t *g)
{
    nghttp2_session_callbacks_new(&g->cbs);
    nghttp2_session_callbacks_set_on_begin_headers_callback(g->cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(g->cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(g->cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(g->cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(g->cbs, on_stream_close);
    nghttp2_session_callbacks_set_send_data_callback(g->cbs, send_data_cb);
    nghttp2_session_callbacks_set_data_source_read_length_callback(g->cbs, read_length_cb);
}

kvr_grpc_t *kvr_grpc_create(const kvr_config_t *cfg, kvr_seg_t *seg, kvr_store_t *store, kvr_relay_t *relay,
                            void *loop, int listen_fd, int wake_fd)
{
    kvr_grpc_t *g = calloc(1, sizeof(*g));

    if (g == NULL)
        return NULL;
    g->cfg = cfg;
    g->seg = seg;
    g->store = store;
    g->relay = relay;
    g->loop = loop;
    g->listen_fd = listen_fd;
    g->wake_fd = wake_fd;
    g->conns.next = g->conns.prev = &g->conns;
    if (cfg->tenants[0] != '\0') { /* with --tenants, relay calls are the admin's */
        g->tenants = malloc(sizeof(*g->tenants));
        if (g->tenants == NULL) {
            free(g);
            return NULL;
        }
        kvr_tenants_view_init(g->tenants, seg);
    }
    if (kvr_uring_init(&g->uring, 256) != KVR_OK) {
        free(g->tenants);
        free(g);
        return NULL;
    }
    set_callbacks(g);

    h2o_timeout_init(g->loop, &g->kick_timeout, KICK_COALESCE_MS);
    g->kick_entry.cb = on_kick_timeout;
    g->uring_sock = h2o_evloop_socket_create(g->loop, g->uring.efd, H2O_SOCKET_FLAG_DONT_READ);
    g->uring_sock->data = g;
    h2o_socket_read_start(g->uring_sock, on_uring_event);
    g->wake_sock = h2o_evloop_socket_create(g->loop, wake_fd, H2O_SOCKET_FLAG_DONT_READ);
    g->wake_sock->data = g;
    h2o_socket_read_start(g->wake_sock, on_wake);

    g->accept_op.cb = on_accept;
    g->accept_op.data = g;
    if (kvr_uring_accept(&g->uring, listen_fd, &g->accept_op) == KVR_OK)
        g->accepting = 1;
    kvr_uring_flush(&g->uring);
    return g;
}
