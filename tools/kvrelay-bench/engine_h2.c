/*
 * engine_h2.c — HTTP/2 with prior knowledge (h2c) through a libnghttp2 client session per
 * connection (engine_int.h). DATA frames are NO_COPY: nghttp2 hands over the 9-byte frame
 * header and the length, and the frame is queued as that header plus a slice of the pool.
 * --streams requests are in flight per connection, one per request slot.
 */
#include "engine_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

static ssize_t h2_send_cb(nghttp2_session *s, const uint8_t *data, size_t len, int flags, void *user)
{
    kvb_conn_t *c = user;
    if (c->oq.bytes >= OQ_HIGH)
        return NGHTTP2_ERR_WOULDBLOCK;
    kvb_oq_own(&c->oq, data, len);
    return (ssize_t)len;
}

static int h2_send_data_cb(nghttp2_session *s, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                           nghttp2_data_source *src, void *user)
{
    kvb_conn_t *c = user;
    kvb_req_t *r = src->ptr;
    if (c->oq.bytes >= OQ_HIGH)
        return NGHTTP2_ERR_WOULDBLOCK;
    kvb_oq_own(&c->oq, framehd, 9);
    kvb_oq_block(&c->oq, &r->blk, r->wr_off, length);
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
    kvb_http_classify(r);
    return 0;
}

static int h2_on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *user)
{
    kvb_req_t *r = nghttp2_session_get_stream_user_data(s, id);
    if (r != NULL && r->active)
        kvb_sink_bytes(r, data, len);
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
        kvb_note_req(c->w, ek, r, "stream reset (%s)", nghttp2_http2_strerror(err));
        kvb_req_finish(c, r, ek, 0);
    } else if (!r->head_done || r->status == 0) {
        kvb_note_req(c->w, EK_PROTOCOL, r, "stream closed without a response");
        kvb_req_finish(c, r, EK_PROTOCOL, 0);
    } else {
        if (r->op == OP_HEAD && r->got > 0 && r->ek < 0) {
            r->ek = EK_PROTOCOL;
            kvb_note_req(c->w, EK_PROTOCOL, r, "a body in the answer to HEAD");
        }
        kvb_req_complete(c, r);
    }
    return 0;
}

int kvb_h2_init(kvb_conn_t *c)
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
void kvb_h2_flush(kvb_conn_t *c)
{
    for (int i = 0; i < 64; i++) {
        int rc;
        if (c->oq.bytes < OQ_HIGH && nghttp2_session_send(c->h2) != 0) {
            kvb_conn_fail(c, EK_AUTO, "HTTP/2 session error");
            return;
        }
        if (c->oq.bytes == 0)
            break;
        rc = kvb_oq_flush(c->fd, &c->oq);
        if (rc < 0) {
            char why[128];
            snprintf(why, sizeof(why), "write: %s", strerror(errno));
            kvb_conn_fail(c, EK_AUTO, why);
            return;
        }
        if (rc == 0) {
            kvb_conn_events(c, EPOLLIN | EPOLLOUT);
            return;
        }
    }
    kvb_conn_events(c, EPOLLIN);
    if (!nghttp2_session_want_read(c->h2) && !nghttp2_session_want_write(c->h2))
        kvb_conn_fail(c, EK_AUTO, "HTTP/2 session ended (GOAWAY)");
}

void kvb_h2_readable(kvb_conn_t *c)
{
    kvb_worker_t *w = c->w;
    ssize_t n, rv;

    while ((n = kvb_conn_read(c)) > 0) {
        rv = nghttp2_session_mem_recv(c->h2, w->tbuf, (size_t)n);
        if (rv < 0) {
            char why[128];
            snprintf(why, sizeof(why), "HTTP/2: %s", nghttp2_strerror((int)rv));
            kvb_conn_fail(c, EK_PROTOCOL, why);
            return;
        }
    }
    if (n < 0)
        return;
    kvb_conn_fill(c);
}

/* Submits a request started by req_start (engine.c) as an HTTP/2 stream: headers, and for a PUT
 * a data provider that reads the block in place (NO_COPY). The caller flushes. */
void kvb_h2_submit(kvb_conn_t *c, kvb_req_t *r)
{
    kvb_worker_t *w = c->w;
    int op = r->op;
    uint64_t key = r->key;
    char path[1200], clen[24], seq[24], k[1100];
    nghttp2_nv nv[8];
    int nn = 0;
    nghttp2_data_provider prd;
    int32_t id;
#define NV(n_, v_) nv[nn++] = (nghttp2_nv){(uint8_t *)(n_), (uint8_t *)(v_), strlen(n_), strlen(v_), NGHTTP2_NV_FLAG_NONE}
    kvb_key_path(key, k, sizeof(k));
    snprintf(path, sizeof(path), "/kv/%s%s", k, op == OP_EXISTS ? "/exists" : "");
    NV(":method", kvb_http_method[op]);
    NV(":scheme", "http");
    NV(":authority", G.target);
    NV(":path", path);
    if (kvb_auth_h2[0])
        NV("authorization", kvb_auth_h2);
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
        kvb_note_req(w, EK_CONNECT, r, "cannot submit (%s)", nghttp2_strerror(id));
        kvb_req_finish(c, r, EK_CONNECT, 0);
    }
}
