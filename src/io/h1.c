/*
 * h1.c — the connection machine of the io_uring HTTP/1.1 server: a connection's life,
 * responses, bodies and reads. h1.h has the design, h1_int.h the other parts.
 */
#include "io/h1_int.h"

#include "base/log.h"

#include <netinet/in.h>
#include <linux/tcp.h> /* TCP_NODELAY */
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#define H1_HEAD_READ 512 /* bytes per read of a head (docs/dataplane.md) */
#define H1_LINGER_MS 2000

static void conn_write(h1c_t *c);
static void conn_next(h1c_t *c);
static void on_read(kvr_uring_op_t *op, int res);
static void on_write(kvr_uring_op_t *op, int res);
static void conn_unlink(h1c_t *c);

/* ------------------------------------------------------------------ connections */

static void conn_free(h1c_t *c)
{
    kvr_h1_t *s = c->s;

    h1_wait_leave(c);
    h1_idle_leave(c);
    h1_peer_give(c);
    kvr_h1_peer_detach(c);
    if (c->reclaimed)
        s->nreclaim--;
    if (c->in_req) {
        kvr_api_done(s->api, &c->res, c->method, c->start_us, c->bytes_in, c->bytes_out);
        c->in_req = 0;
    }
    if (c->cbuf != NULL) {
        free(c->cbuf);
        s->chunked_conns--;
    }
    conn_unlink(c);
    close(c->fd);
    free(c);
    if (s->fd_exhausted && !s->accepting) { /* a descriptor is free now: take the next client */
        s->accept_paused_until = 0;
        kvr_h1_arm_accept(s);
    } else if (s->pressure && !s->accepting) {
        kvr_h1_accept_turn(s, 0);
    }
}

/* Ends the connection: in-flight operations complete with errors once the socket is shut;
 * the record goes with the last of them. */
void kvr_h1_conn_close(h1c_t *c)
{
    if (!c->closing) {
        c->closing = 1;
        h1_wait_leave(c);
        h1_idle_leave(c);
        shutdown(c->fd, SHUT_RDWR);
        /* An abandoned PUT gives its reservation back now, unless a receive into it is still
         * in flight: the kernel may yet copy bytes queued on the socket into those pages, so
         * they go back when it completes (conn_free), which the shutdown hastens. */
        if (c->in_req && c->res.put != KVR_API_PUT_NONE && !c->rbusy) {
            h1_peer_give(c);
            kvr_api_put_end(c->s->api, &c->res, 0);
        }
    }
    if (!c->rbusy && !c->wbusy)
        conn_free(c);
}

static void conn_unlink(h1c_t *c)
{
    kvr_h1_t *s = c->s;

    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    s->nconns--;
}

void kvr_h1_conn_new(kvr_h1_t *s, int fd)
{
    h1c_t *c = malloc(sizeof(*c));
    int one = 1;

    if (c == NULL) {
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "h1: out of memory for a connection");
        close(fd);
        return;
    }
    memset(c, 0, offsetof(h1c_t, out));
    kvr_api_res_reset(&c->res);
    c->s = s;
    c->fd = fd;
    c->rop.cb = on_read;
    c->rop.data = c;
    c->wop.cb = on_write;
    c->wop.data = c;
    c->last_ms = kvr_clock_coarse_ms();
    c->state = ST_SNIFF;
    c->next = s->conns;
    if (s->conns != NULL)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    kvr_h1_peer_attach(c);
    h1_idle_enter(c); /* silent so far: the first to go when room is needed */
    kvr_h1_conn_read(c);
}

void kvr_h1_conn_release(h1c_t *c)
{
    h1_idle_leave(c);
    kvr_h1_peer_detach(c);
    conn_unlink(c);
    free(c);
}

/* ------------------------------------------------------------------ responses */

static void refresh_date(kvr_h1_t *s)
{
    time_t t = time(NULL);
    struct tm tm;

    if (t == s->date_sec)
        return;
    s->date_sec = t;
    gmtime_r(&t, &tm);
    strftime(s->date, sizeof(s->date), "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
}

/* A response head is assembled by hand rather than with snprintf, which cost about 2 % of a
 * worker's CPU at 16 KiB GETs. Every append is bounded by the head buffer; the strings are the
 * server's own (status reasons, content types, one extra header), so nothing is ever cut. */
typedef struct {
    char *p;
    char *end;
} h1_head_t;

static void head_str(h1_head_t *h, const char *str)
{
    size_t n = strlen(str);

    if (n > (size_t)(h->end - h->p))
        n = (size_t)(h->end - h->p);
    memcpy(h->p, str, n);
    h->p += n;
}

static void head_u64(h1_head_t *h, uint64_t v)
{
    char tmp[20];
    size_t n = 0;

    do {
        tmp[sizeof(tmp) - ++n] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    if (n > (size_t)(h->end - h->p))
        n = (size_t)(h->end - h->p);
    memcpy(h->p, tmp + sizeof(tmp) - n, n);
    h->p += n;
}

/* Builds the response head and starts sending head + body. */
void kvr_h1_respond(h1c_t *c)
{
    kvr_api_res_t *res = &c->res;
    kvr_h1_t *s = c->s;
    h1_head_t h = {c->out, c->out + sizeof(c->out)};

    if (res->close || s->draining)
        c->keep = 0;
    refresh_date(s);
    head_str(&h, "HTTP/1.1 ");
    head_u64(&h, (uint64_t)res->status);
    head_str(&h, " ");
    head_str(&h, res->reason);
    head_str(&h, "\r\nServer: kvrelay\r\n");
    head_str(&h, s->date);
    head_str(&h, "Content-Length: ");
    head_u64(&h, res->length);
    head_str(&h, "\r\n");
    if (res->ctype != NULL) {
        head_str(&h, "Content-Type: ");
        head_str(&h, res->ctype);
        head_str(&h, "\r\n");
    }
    if (res->hdr_name != NULL) {
        head_str(&h, res->hdr_name);
        head_str(&h, ": ");
        head_str(&h, res->hdr_value);
        head_str(&h, "\r\n");
    }
    head_str(&h, c->keep ? "\r\n" : "Connection: close\r\n\r\n");
    c->out_len = (size_t)(h.p - c->out);
    c->resp_total = c->out_len + (res->head_only ? 0 : res->length);
    c->resp_sent = 0;
    c->state = ST_SEND;
    c->rate_on = 0;
    c->last_ms = kvr_clock_coarse_ms();
    conn_write(c);
}

/* An error found by the transport itself (framing, limits): JSON, then the connection ends. */
void kvr_h1_respond_error_hdr(h1c_t *c, int status, const char *code, const char *msg, const char *hname,
                              const char *hval)
{
    if (!c->in_req) {
        kvr_api_res_reset(&c->res);
        c->in_req = 1;
        c->start_us = kvr_clock_us();
    }
    if (c->res.put != KVR_API_PUT_NONE) {
        h1_peer_give(c);
        kvr_api_put_end(c->s->api, &c->res, 0);
    }
    if (c->res.pinned) {
        kvr_store_unpin(c->s->api->store, &c->res.ref);
        c->res.pinned = 0;
    }
    free(c->res.heap);
    c->res.heap = NULL;
    kvr_api_error(&c->res, status, code, msg);
    c->res.hdr_name = hname;
    c->res.hdr_value = hval;
    c->keep = 0;
    kvr_h1_respond(c);
}

void kvr_h1_respond_error(h1c_t *c, int status, const char *code, const char *msg)
{
    kvr_h1_respond_error_hdr(c, status, code, msg, NULL, NULL);
}

/* Fills the iovecs for what is left to send. */
static size_t send_iov(h1c_t *c)
{
    kvr_api_res_t *res = &c->res;
    uint64_t off = c->resp_sent;
    size_t n = 0;

    if (off < c->out_len) {
        c->iov[n].iov_base = c->out + off;
        c->iov[n].iov_len = c->out_len - off;
        n++;
        off = 0;
    } else {
        off -= c->out_len;
    }
    if (res->head_only || off >= res->length)
        return n;
    if (res->body == KVR_API_BODY_BLOCK) {
        n += kvr_api_block_iov(c->s->api, res, off, c->iov + n, H1_IOV);
    } else {
        c->iov[n].iov_base = (char *)kvr_api_body_bytes(res) + off;
        c->iov[n].iov_len = res->length - off;
        n++;
    }
    return n;
}

static int zc_wanted(const h1c_t *c)
{
    uint64_t min = c->s->cfg->send_zc_min;

    return min > 0 && c->state == ST_SEND && c->res.body == KVR_API_BODY_BLOCK && !c->res.head_only &&
           c->res.length >= min;
}

static void conn_write(h1c_t *c)
{
    memset(&c->msg, 0, sizeof(c->msg));
    c->msg.msg_iov = c->iov;
    c->msg.msg_iovlen = send_iov(c);
    /* One completion for the whole response (or the 64 spans of this batch). With
     * --send-zc-min, a large block goes out zero-copy: the completion comes once the kernel
     * lets go of its pages, and the pin is held until then (kvr_api_done after it). */
    if ((zc_wanted(c) ? kvr_uring_sendmsg_zc : kvr_uring_sendmsg)(&c->s->ring, c->fd, &c->msg, MSG_WAITALL,
                                                                  &c->wop) != KVR_OK) {
        kvr_h1_conn_close(c);
        return;
    }
    c->wbusy = 1;
}

/* The response is out: account for it, then the next request or the end. */
static void response_done(h1c_t *c)
{
    if (c->keep && c->res.drain && !c->expect100) {
        /* Answered from the head: the body follows and is consumed before the next request
         * (body_complete comes back here with drain cleared). */
        c->res.drain = 0;
        c->post_drain = 1;
        c->state = ST_DISCARD;
        c->last_ms = kvr_clock_coarse_ms();
        kvr_h1_begin_body(c);
        return;
    }
    kvr_api_done(c->s->api, &c->res, c->method, c->start_us, c->bytes_in, c->bytes_out);
    c->in_req = 0;
    if (!c->keep || c->res.drain) {
        /* Lingering close: our side ends now; whatever the peer still sends is discarded for
         * a moment so that it reads our answer instead of a reset. */
        shutdown(c->fd, SHUT_WR);
        c->state = ST_LINGER;
        c->last_ms = kvr_clock_coarse_ms();
        c->linger_until = c->last_ms + H1_LINGER_MS;
        kvr_h1_conn_read(c);
        return;
    }
    conn_next(c);
}

static void on_write(kvr_uring_op_t *op, int res)
{
    h1c_t *c = op->data;

    c->wbusy = 0;
    if (c->closing || res <= 0) {
        kvr_h1_conn_close(c);
        return;
    }
    c->last_ms = kvr_clock_coarse_ms();
    if (c->state == ST_SEND)
        c->resp_sent += (uint64_t)res;
    if (c->resp_sent > c->out_len)
        c->bytes_out = c->resp_sent - c->out_len;
    if (c->state == ST_SEND && c->resp_sent < c->resp_total) {
        conn_write(c);
        return;
    }
    if (c->state == ST_SEND) {
        response_done(c);
        return;
    }
    /* "100 Continue" went out: the body may come now. */
    kvr_h1_conn_read(c);
}

/* ------------------------------------------------------------------ requests */

/* Asks the request layer; carries out what it decides. */
void kvr_h1_start_request(h1c_t *c)
{
    kvr_api_res_t *res = &c->res;

    if (c->method != KVR_M_PUT && c->method != KVR_M_POST && (c->body_len > 0 || c->chunked)) {
        if (c->chunked || c->body_len > c->s->cfg->max_block_size) {
            kvr_h1_respond_error(c, c->chunked ? 400 : 413, c->chunked ? "InvalidRequest" : "EntityTooLarge",
                                 "this request's body is not accepted");
            return;
        }
        kvr_api_handle(c->s->api, &c->rq, res);
        if (res->dk != NULL) /* rare (a GET with a body): read at once, blocking this worker */
            kvr_api_disk_sync(c->s->api, res);
        c->state = ST_DISCARD; /* answered once the unused body has been consumed */
        kvr_h1_begin_body(c);
        return;
    }
    c->rq.peer_held = h1_peer_held(c);
    kvr_api_handle(c->s->api, &c->rq, res);
    h1_peer_take(c);
    if (res->dk != NULL) {
        kvr_h1_disk_start(c);
        return;
    }
    switch (res->put) {
    case KVR_API_BODY_WANTED:
        if (c->s->chunked_conns >= KVR_H1_CHUNKED_CONNS || (c->cbuf = malloc(c->body_len + 1)) == NULL) {
            res->put = KVR_API_PUT_NONE;
            kvr_h1_respond_error_hdr(c, 503, "Busy", "too many request bodies in memory in this worker; retry",
                                     "retry-after", H1_RETRY_AFTER);
            return;
        }
        c->s->chunked_conns++;
        c->state = ST_COLLECT;
        kvr_h1_begin_body(c);
        return;
    case KVR_API_PUT_WAIT:
        h1_wait_enter(c);
        c->last_ms = kvr_clock_coarse_ms();
        return;
    case KVR_API_PUT_RESERVED:
        c->state = ST_BODY;
        kvr_h1_begin_body(c);
        return;
    case KVR_API_PUT_DEDUP:
        c->state = ST_DISCARD;
        kvr_h1_begin_body(c);
        return;
    case KVR_API_PUT_DEFERRED:
        kvr_h1_chunked_start(c);
        return;
    default:
        kvr_h1_respond(c);
    }
}

/* ------------------------------------------------------------------ bodies */

void kvr_h1_body_complete(h1c_t *c)
{
    kvr_api_res_t *res = &c->res;

    c->hused += c->body_len < h1_preread(c) ? c->body_len : h1_preread(c);
    if (c->post_drain) {
        c->post_drain = 0;
        response_done(c);
        return;
    }
    if (c->state == ST_COLLECT) {
        kvr_api_batch(c->s->api, &c->rq, c->cbuf, c->body_len, res);
        free(c->cbuf);
        c->cbuf = NULL;
        c->s->chunked_conns--;
    } else if (res->put != KVR_API_PUT_NONE) {
        h1_peer_give(c);
        kvr_api_put_end(c->s->api, res, 1);
    }
    kvr_h1_respond(c);
}

/* "100 Continue": the body may come now; on_write starts its read. */
static void send_continue(h1c_t *c)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";

    c->sent100 = 1;
    if (kvr_uring_send(&c->s->ring, c->fd, cont, sizeof(cont) - 1, &c->wop) != KVR_OK) {
        kvr_h1_conn_close(c);
        return;
    }
    c->wbusy = 1;
}

/* Consumes what arrived with the head, then reads the rest (after "100 Continue"). */
void kvr_h1_begin_body(h1c_t *c)
{
    size_t pre = h1_preread(c);

    c->last_ms = kvr_clock_coarse_ms();
    c->rate_on = 0;
    if (c->state == ST_CHUNKED) {
        /* the preread bytes are taken by kvr_h1_chunked_read; with none, a client that
         * asked for "100 Continue" waits for it before the first chunk */
        if (pre == 0 && c->expect100 && !c->sent100)
            send_continue(c);
        else
            kvr_h1_conn_read(c);
        return;
    }
    if (pre > c->body_len)
        pre = (size_t)c->body_len;
    if (c->state == ST_BODY && pre > 0)
        kvr_api_put_write(c->s->api, &c->res, 0, c->hbuf + c->hused, pre);
    if (c->state == ST_COLLECT && pre > 0)
        memcpy(c->cbuf, c->hbuf + c->hused, pre);
    c->body_got = pre;
    c->bytes_in = pre;
    if (c->body_got == c->body_len) {
        kvr_h1_body_complete(c);
        return;
    }
    if (c->expect100 && !c->sent100) {
        send_continue(c);
        return;
    }
    kvr_h1_conn_read(c);
}

/* ------------------------------------------------------------------ reads */

/* --recv-lowat L: while a PUT body is received, the socket wakes the ring (and so the
 * receive's retry, and the window update it sends) once L bytes are queued instead of once per
 * arriving segment. A receive must never wait for bytes that will not come, so the raised mark
 * covers the body but its last L bytes: those, and every other read, run at the default mark
 * of 1. Returns the bytes the next body receive may ask for. */
static uint64_t body_lowat(h1c_t *c, uint64_t want)
{
    uint64_t l = c->s->cfg->recv_lowat;
    int v;

    if (l > 0 && want >= 2 * l) {
        if (!c->lowat) {
            v = (int)l;
            if (setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) == 0)
                c->lowat = 1;
        }
        return c->lowat ? want - l : want;
    }
    if (c->lowat) {
        v = 1;
        setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v));
        c->lowat = 0;
    }
    return want;
}

/* Caps iov[0..n) at max bytes in all; returns the new count. */
static int iov_cap(struct iovec *iov, int n, uint64_t max)
{
    uint64_t sum = 0;

    for (int i = 0; i < n; i++) {
        if (sum + iov[i].iov_len >= max) {
            iov[i].iov_len = max - sum;
            return iov[i].iov_len > 0 ? i + 1 : i;
        }
        sum += iov[i].iov_len;
    }
    return n;
}

void kvr_h1_conn_read(h1c_t *c)
{
    kvr_h1_t *s = c->s;
    uint64_t want;
    int rc;

    if (c->closing) {
        kvr_h1_conn_close(c);
        return;
    }
    if (c->lowat && c->state != ST_BODY)
        body_lowat(c, 0);
    switch (c->state) {
    case ST_SNIFF:
        rc = kvr_uring_recv_flags(&s->ring, c->fd, c->hbuf, H1_H2_PREFACE_LEN, MSG_PEEK, &c->rop);
        break;
    case ST_HEAD: {
        /* At most H1_HEAD_READ per read: a head is a few hundred bytes, and what the read takes
         * beyond it is body that must then be copied from here into the arena (a user-space copy
         * the kernel would otherwise do straight into the reservation). */
        size_t room = sizeof(c->hbuf) - c->hlen;
        rc = kvr_uring_recv(&s->ring, c->fd, c->hbuf + c->hlen, room < H1_HEAD_READ ? room : H1_HEAD_READ, &c->rop);
        break;
    }
    case ST_BODY:
        memset(&c->msg, 0, sizeof(c->msg));
        c->msg.msg_iov = c->iov;
        c->msg.msg_iovlen = kvr_api_txn_iov(s->api, &c->res, c->body_got, c->iov, H1_IOV);
        if (s->cfg->recv_lowat > 0 || c->lowat)
            c->msg.msg_iovlen = iov_cap(c->iov, (int)c->msg.msg_iovlen, body_lowat(c, c->body_len - c->body_got));
        /* One completion for the body (or the 64 spans of this batch): the kernel waits for all
         * of it; progress in between is seen through TCP_INFO (moved()). */
        rc = kvr_uring_recvmsg(&s->ring, c->fd, &c->msg, MSG_WAITALL, &c->rop);
        break;
    case ST_COLLECT:
        c->iov[0].iov_base = c->cbuf + c->body_got;
        c->iov[0].iov_len = c->body_len - c->body_got;
        memset(&c->msg, 0, sizeof(c->msg));
        c->msg.msg_iov = c->iov;
        c->msg.msg_iovlen = 1;
        rc = kvr_uring_recvmsg(&s->ring, c->fd, &c->msg, MSG_WAITALL, &c->rop);
        break;
    case ST_DISCARD:
    case ST_LINGER:
        want = c->state == ST_LINGER ? (1u << 30) : c->body_len - c->body_got;
        rc = kvr_uring_recv_flags(&s->ring, c->fd, s->scratch, want > (1u << 30) ? (1u << 30) : want, MSG_TRUNC,
                                  &c->rop);
        break;
    case ST_CHUNKED:
        kvr_h1_chunked_read(c);
        return;
    default:
        return;
    }
    if (rc != KVR_OK) {
        kvr_h1_conn_close(c);
        return;
    }
    c->rbusy = 1;
}

static void on_read(kvr_uring_op_t *op, int res)
{
    h1c_t *c = op->data;

    c->rbusy = 0;
    h1_idle_leave(c);
    if (c->closing) {
        kvr_h1_conn_close(c);
        return;
    }
    if (c->state == ST_DISK) { /* the op read a block from the disk tier, not the socket */
        kvr_h1_disk_done(c, res);
        return;
    }
    if (c->cut) { /* cancelled by the tick: a deadline passed (kvr_h1_tick) */
        c->cut = 0;
        if (c->state == ST_HEAD)
            c->method = KVR_M_OTHER; /* counted as no method: the head never said one */
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "h1: 408 after %s", c->cut_why);
        kvr_h1_respond_error(c, 408, "RequestTimeout", c->cut_why);
        return;
    }
    if (res <= 0) {
        if (c->state == ST_BODY || c->state == ST_DISCARD || c->state == ST_CHUNKED || c->state == ST_COLLECT)
            KVR_LOG_RATELIMITED(KVR_LOG_DEBUG, "h1: connection ended inside a body (%d)", res);
        kvr_h1_conn_close(c);
        return;
    }
    if (c->state == ST_SNIFF) { /* a peek moves nothing: it does not count as progress */
        kvr_h1_sniffed(c, res);
        return;
    }
    c->last_ms = kvr_clock_coarse_ms();
    switch (c->state) {
    case ST_HEAD:
        if (c->head_ms == 0)
            c->head_ms = c->last_ms;
        c->hlen += (size_t)res;
        kvr_h1_parse_head(c);
        return;
    case ST_BODY:
    case ST_DISCARD:
    case ST_COLLECT:
        c->body_got += (uint64_t)res;
        c->bytes_in += (uint64_t)res;
        if (c->body_got >= c->body_len)
            kvr_h1_body_complete(c);
        else
            kvr_h1_conn_read(c);
        return;
    case ST_CHUNKED:
        c->clen += (size_t)res;
        kvr_h1_chunked_input(c);
        return;
    case ST_LINGER:
        kvr_h1_conn_read(c);
        return;
    default:
        return;
    }
}

/* Keep-alive: the next request, which may already be (partly) in the head buffer. */
static void conn_next(h1c_t *c)
{
    size_t left = c->hlen - c->hused;

    if (left > 0)
        memmove(c->hbuf, c->hbuf + c->hused, left);
    c->hlen = left;
    c->hused = 0;
    c->last_len = 0;
    c->state = ST_HEAD;
    c->last_ms = kvr_clock_coarse_ms();
    c->head_ms = left > 0 ? c->last_ms : 0;
    if (c->s->draining) {
        kvr_h1_conn_close(c);
        return;
    }
    if (left > 0) {
        kvr_h1_parse_head(c);
    } else {
        h1_idle_enter(c);
        kvr_h1_conn_read(c);
    }
}

/* ------------------------------------------------------------------ the server */

static void on_ring(void *data)
{
    kvr_h1_t *s = data;
    kvr_uring_process(&s->ring);
    kvr_uring_flush(&s->ring);
}

kvr_h1_t *kvr_h1_create(const kvr_config_t *cfg, kvr_api_t *api, kvr_http_t *http, int listen_fd,
                        const int *accept_fds)
{
    kvr_h1_t *s = calloc(1, sizeof(*s));

    if (s == NULL)
        return NULL;
    *s = (kvr_h1_t){
        .cfg = cfg,
        .api = api,
        .http = http,
        .listen_fd = listen_fd,
        .accept_fds = accept_fds,
        .yield_to = -1,
        .max_conns = cfg->max_connections,
    };
    if (s->max_conns == 0) {
        /* what the descriptor limit leaves after a reserve for the listeners, rings, eventfds,
         * the segment, the log and h2o's own */
        struct rlimit rl;
        uint64_t lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 1u << 20;
        s->max_conns = lim - (lim / 4 < 64 ? lim / 4 : 64);
    }
    kvr_info("h1: at most %llu client connections (%s)", (unsigned long long)s->max_conns,
             cfg->max_connections ? "--max-connections" : "RLIMIT_NOFILE less a reserve");
    if (kvr_uring_init(&s->ring, 1024) != KVR_OK) {
        free(s);
        return NULL;
    }
    h1_list_init(&s->wait);
    h1_list_init(&s->idle);
    if ((!kvr_h1_own_wait(s) && kvr_http_watch_fd(http, s->ring.efd, on_ring, s) != KVR_OK) || kvr_h1_accept_init(s) != KVR_OK) {
        kvr_uring_exit(&s->ring);
        free(s);
        return NULL;
    }
    s->last_tick_ms = kvr_clock_ms();
    kvr_h1_arm_accept(s);
    kvr_uring_flush(&s->ring);
    return s;
}

void kvr_h1_flush(kvr_h1_t *s)
{
    if (!h1_list_empty(&s->wait))
        kvr_h1_wake_waiters(s);
    if (kvr_h1_held(s) != s->published)
        kvr_h1_accept_turn(s, 0);
    if (!s->own_wait) /* else the wait submits */
        kvr_uring_flush(&s->ring);
}

void kvr_h1_start_drain(kvr_h1_t *s)
{
    if (s->draining)
        return;
    s->draining = 1;
    if (s->accepting)
        kvr_uring_cancel(&s->ring, &s->accept_op);
    /* Idle connections close at the next tick, not here: a request that reached us before the
     * drain may be a completion this turn has not reaped yet (and the tick keeps those whose
     * next request still waits in the kernel). */
    kvr_uring_flush(&s->ring);
}

uint64_t kvr_h1_connections(const kvr_h1_t *s)
{
    return s->nconns;
}
