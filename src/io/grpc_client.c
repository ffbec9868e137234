/* grpc_client.c — see grpc_client.h. */
#include "io/grpc_client.h"

#include "base/clock.h"
#include "core/config.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_RESPONSE (16u << 20)

struct kvr_gclient_s {
    int fd;
    nghttp2_session *session;
    kvr_gcall_t *calls;
    char authority[300];
    char auth[600]; /* "Bearer <token>", "" for none: sent as authorization on every call */
    int dead;
};

typedef struct {
    const uint8_t *data;
    size_t len, off;
} reqsrc_t;

static kvr_gcall_t *find_call(kvr_gclient_t *c, int32_t id)
{
    for (kvr_gcall_t *k = c->calls; k != NULL; k = k->next)
        if (k->stream_id == id)
            return k;
    return NULL;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user)
{
    kvr_gcall_t *k = find_call(user, frame->hd.stream_id);
    if (k == NULL)
        return 0;
    if (namelen == 11 && !memcmp(name, "grpc-status", 11)) {
        char v[16];
        size_t n = valuelen < sizeof(v) - 1 ? valuelen : sizeof(v) - 1;
        memcpy(v, value, n);
        v[n] = '\0';
        k->grpc_status = atoi(v);
    } else if (namelen == 12 && !memcmp(name, "grpc-message", 12)) {
        size_t n = valuelen < sizeof(k->grpc_message) - 1 ? valuelen : sizeof(k->grpc_message) - 1;
        memcpy(k->grpc_message, value, n);
        k->grpc_message[n] = '\0';
    } else if (namelen == 21 && !memcmp(name, "kv-relay-error-reason", 21)) {
        size_t n = valuelen < sizeof(k->reason) - 1 ? valuelen : sizeof(k->reason) - 1;
        memcpy(k->reason, value, n);
        k->reason[n] = '\0';
    }
    return 0;
}

/* Reassembles length-prefixed messages and hands each to the callback. */
static int on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *user)
{
    kvr_gclient_t *c = user;
    kvr_gcall_t *k = find_call(c, id);

    if (k == NULL || k->done)
        return 0;
    if (k->len + len > k->cap) {
        size_t cap = k->cap ? k->cap : 65536;
        uint8_t *nb;
        while (cap < k->len + len)
            cap *= 2;
        if (cap > MAX_RESPONSE + 5 + 65536) {
            nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
            return 0;
        }
        nb = realloc(k->buf, cap);
        if (nb == NULL)
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        k->buf = nb;
        k->cap = cap;
    }
    memcpy(k->buf + k->len, data, len);
    k->len += len;
    for (;;) {
        uint32_t mlen;
        if (k->len < 5)
            break;
        mlen = kvr_be32(k->buf + 1);
        if (mlen > MAX_RESPONSE) {
            nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
            k->len = 0;
            return 0;
        }
        if (k->len < 5 + (size_t)mlen)
            break;
        if (k->cb != NULL && k->cb(k->ctx, k, k->buf + 5, mlen) != 0) {
            nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
            k->len = 0;
            return 0;
        }
        memmove(k->buf, k->buf + 5 + mlen, k->len - 5 - mlen);
        k->len -= 5 + mlen;
    }
    return 0;
}

static int on_close(nghttp2_session *s, int32_t id, uint32_t err, void *user)
{
    kvr_gcall_t *k = find_call(user, id);
    if (k != NULL)
        k->done = 1;
    return 0;
}

static ssize_t req_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t length, uint32_t *flags,
                        nghttp2_data_source *src, void *user)
{
    reqsrc_t *r = src->ptr;
    size_t n = r->len - r->off;

    if (n > length)
        n = length;
    memcpy(buf, r->data + r->off, n);
    r->off += n;
    if (r->off == r->len) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        free((void *)r->data);
        free(r);
    }
    return (ssize_t)n;
}

kvr_gclient_t *kvr_gclient_connect(const char *hostport, int timeout_ms, char *err, size_t errlen)
{
    char host[256], port[8];
    uint16_t p;
    struct addrinfo hints = {0}, *res = NULL;
    kvr_gclient_t *c;
    nghttp2_session_callbacks *cbs;
    int fd = -1, on = 1;
    struct pollfd pfd;
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 4 << 20},
                                   {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, 1 << 20}};

    if (kvr_config_split_hostport(hostport, host, sizeof(host), &p) != KVR_OK) {
        snprintf(err, errlen, "bad address %s", hostport);
        return NULL;
    }
    snprintf(port, sizeof(port), "%u", p);
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0) {
        snprintf(err, errlen, "cannot resolve %s", host);
        return NULL;
    }
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || (connect(fd, res->ai_addr, res->ai_addrlen) < 0 && errno != EINPROGRESS)) {
        snprintf(err, errlen, "connect %s: %s", hostport, strerror(errno));
        goto fail;
    }
    pfd.fd = fd;
    pfd.events = POLLOUT;
    if (poll(&pfd, 1, timeout_ms) != 1) {
        snprintf(err, errlen, "connect %s: timed out", hostport);
        goto fail;
    }
    {
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr != 0) {
            snprintf(err, errlen, "connect %s: %s", hostport, strerror(soerr));
            goto fail;
        }
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    freeaddrinfo(res);
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        return NULL;
    }
    c->fd = fd;
    snprintf(c->authority, sizeof(c->authority), "%s", hostport);
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_close);
    nghttp2_session_client_new(&c->session, cbs, c);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, 2);
    nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0, 64 << 20);
    return c;

fail:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return NULL;
}

int kvr_gclient_fd(const kvr_gclient_t *c)
{
    return c->fd;
}

void kvr_gclient_close(kvr_gclient_t *c)
{
    if (c == NULL)
        return;
    nghttp2_session_del(c->session);
    close(c->fd);
    while (c->calls != NULL) {
        kvr_gcall_t *k = c->calls;
        c->calls = k->next;
        free(k->buf);
        free(k);
    }
    free(c);
}

#define HDR(n, v) \
    { \
        (uint8_t *)(n), (uint8_t *)(v), strlen(n), strlen(v), NGHTTP2_NV_FLAG_NONE \
    }

int kvr_gclient_set_token(kvr_gclient_t *c, const char *token)
{
    if (token == NULL || token[0] == '\0') {
        c->auth[0] = '\0';
        return KVR_OK;
    }
    for (const char *p = token; *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e)
            return KVR_ERR; /* not a header value: no spaces, controls or bytes above ASCII */
    if ((size_t)snprintf(c->auth, sizeof(c->auth), "Bearer %s", token) >= sizeof(c->auth)) {
        c->auth[0] = '\0';
        return KVR_ERR;
    }
    return KVR_OK;
}

kvr_gcall_t *kvr_gclient_call(kvr_gclient_t *c, const char *path, const uint8_t *req, size_t req_len,
                              kvr_gcall_msg_cb cb, void *ctx)
{
    nghttp2_nv hdrs[] = {HDR(":method", "POST"), HDR(":scheme", "http"),
                         HDR(":path", path), HDR(":authority", c->authority),
                         HDR("content-type", "application/grpc"), HDR("te", "trailers"),
                         HDR("authorization", c->auth)};
    size_t nhdrs = KVR_ARRAY_SIZE(hdrs) - (c->auth[0] == '\0'); /* authorization only with a token */
    nghttp2_data_provider prd;
    reqsrc_t *src = malloc(sizeof(*src));
    uint8_t *body = malloc(req_len + 5);
    kvr_gcall_t *k = calloc(1, sizeof(*k));
    int32_t id;

    hdrs[KVR_ARRAY_SIZE(hdrs) - 1].flags = NGHTTP2_NV_FLAG_NO_INDEX; /* a credential: kept out of HPACK tables */
    if (src == NULL || body == NULL || k == NULL || c->dead) {
        free(src);
        free(body);
        free(k);
        return NULL;
    }
    body[0] = 0;
    kvr_put_be32(body + 1, (uint32_t)req_len);
    if (req_len)
        memcpy(body + 5, req, req_len);
    src->data = body;
    src->len = req_len + 5;
    src->off = 0;
    prd.source.ptr = src;
    prd.read_callback = req_read;
    id = nghttp2_submit_request(c->session, NULL, hdrs, nhdrs, &prd, NULL);
    if (id < 0) {
        free(src);
        free(body);
        free(k);
        return NULL;
    }
    k->stream_id = id;
    k->cb = cb;
    k->ctx = ctx;
    k->grpc_status = -1;
    k->next = c->calls;
    c->calls = k;
    kvr_gclient_step(c);
    return k;
}

void kvr_gclient_cancel(kvr_gclient_t *c, kvr_gcall_t *call)
{
    if (!call->done)
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
    kvr_gclient_step(c);
}

static void mark_dead(kvr_gclient_t *c)
{
    c->dead = 1;
    for (kvr_gcall_t *k = c->calls; k != NULL; k = k->next)
        k->done = 1;
}

int kvr_gclient_step(kvr_gclient_t *c)
{
    uint8_t buf[65536];

    if (c->dead)
        return KVR_ERR;
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
        if (n > 0) {
            if (nghttp2_session_mem_recv(c->session, buf, (size_t)n) < 0) {
                mark_dead(c);
                return KVR_ERR;
            }
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            mark_dead(c);
            return KVR_ERR;
        }
        break;
    }
    for (;;) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(c->session, &data), off = 0;
        if (n < 0) {
            mark_dead(c);
            return KVR_ERR;
        }
        if (n == 0)
            break;
        while (off < n) {
            ssize_t w = send(c->fd, data + off, (size_t)(n - off), MSG_NOSIGNAL);
            if (w < 0) {
                if (errno == EAGAIN || errno == EINTR) {
                    struct pollfd pfd = {c->fd, POLLOUT, 0};
                    poll(&pfd, 1, 100);
                    continue;
                }
                mark_dead(c);
                return KVR_ERR;
            }
            off += w;
        }
    }
    return KVR_OK;
}

int kvr_gclient_wait(kvr_gclient_t *c, kvr_gcall_t *call, int timeout_ms)
{
    uint64_t t0 = kvr_clock_ms();

    for (;;) {
        struct pollfd pfd = {c->fd, POLLIN, 0};
        long el;
        if (call != NULL && call->done)
            return KVR_OK;
        if (kvr_gclient_step(c) != KVR_OK)
            return call != NULL && call->done && call->grpc_status >= 0 ? KVR_OK : KVR_ERR;
        if (call != NULL && call->done)
            return KVR_OK;
        el = (long)(kvr_clock_ms() - t0);
        if (el >= timeout_ms)
            return KVR_AGAIN;
        poll(&pfd, 1, (int)(timeout_ms - el < 50 ? timeout_ms - el : 50));
    }
}
