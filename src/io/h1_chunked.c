/*
 * h1_chunked.c — chunked request bodies: the one body the worker collects in a heap buffer
 * (at most KVR_H1_CHUNKED_MAX, KVR_H1_CHUNKED_CONNS at a time), decoded in place and then
 * handed to the request layer with its length known. See h1_int.h for the parts of the server.
 */
#include "io/h1_int.h"

#include <stdlib.h>

void kvr_h1_chunked_start(h1c_t *c)
{
    if (c->s->chunked_conns >= KVR_H1_CHUNKED_CONNS) {
        kvr_h1_respond_error_hdr(c, 503, "Busy", "too many chunked uploads in this worker; retry", "retry-after",
                                 H1_RETRY_AFTER);
        return;
    }
    c->s->chunked_conns++;
    c->cbuf = NULL;
    c->clen = c->cdec = c->ccap = 0;
    memset(&c->dec, 0, sizeof(c->dec));
    c->dec.consume_trailer = 1;
    c->state = ST_CHUNKED;
    kvr_h1_begin_body(c);
}

static int chunked_grow(h1c_t *c, size_t need)
{
    size_t cap = c->ccap ? c->ccap : 64u << 10;
    char *p;

    while (cap < need)
        cap *= 2;
    if (cap > KVR_H1_CHUNKED_MAX + (64u << 10))
        cap = KVR_H1_CHUNKED_MAX + (64u << 10);
    if (cap < need)
        return -1;
    if (cap == c->ccap)
        return 0;
    p = realloc(c->cbuf, cap);
    if (p == NULL)
        return -1;
    c->cbuf = p;
    c->ccap = cap;
    return 0;
}

void kvr_h1_chunked_read(h1c_t *c)
{
    size_t pre = h1_preread(c), want;

    if (pre > 0) { /* bytes that came with the head first */
        if (chunked_grow(c, c->clen + pre) < 0) {
            kvr_h1_respond_error(c, 413, "EntityTooLarge", "chunked body larger than 8 MiB");
            return;
        }
        memcpy(c->cbuf + c->clen, c->hbuf + c->hused, pre);
        c->clen += pre;
        c->hused = c->hlen;
        kvr_h1_chunked_input(c);
        return;
    }
    if (chunked_grow(c, c->clen + (16u << 10)) < 0) {
        kvr_h1_respond_error(c, 413, "EntityTooLarge", "chunked body larger than 8 MiB");
        return;
    }
    /* At most a head buffer per read: what a read takes beyond the body's end is the next
     * requests, and kvr_h1_chunked_input must be able to hand all of it back to the head
     * buffer. */
    want = c->ccap - c->clen;
    if (want > sizeof(c->hbuf))
        want = sizeof(c->hbuf);
    if (kvr_uring_recv(&c->s->ring, c->fd, c->cbuf + c->clen, want, &c->rop) != KVR_OK) {
        kvr_h1_conn_close(c);
        return;
    }
    c->rbusy = 1;
}

/* Chunked: new raw bytes are at cbuf[cdec, clen); decode them in place. */
void kvr_h1_chunked_input(h1c_t *c)
{
    size_t n = c->clen - c->cdec;
    ssize_t left = phr_decode_chunked(&c->dec, c->cbuf + c->cdec, &n);

    c->clen = c->cdec + n; /* decoded prefix; the decoder dropped the framing */
    c->cdec = c->clen;
    if (left == -1) {
        kvr_h1_respond_error(c, 400, "InvalidRequest", "malformed chunked body");
        return;
    }
    if (c->cdec > KVR_H1_CHUNKED_MAX) {
        kvr_h1_respond_error(c, 413, "EntityTooLarge", "chunked body larger than 8 MiB");
        return;
    }
    if (left == -2) {
        kvr_h1_conn_read(c);
        return;
    }
    /* The body is whole. The request is decided now, while c->rq (path, Authorization,
     * X-KV-Sequence-Hash, X-KV-Model) still points into the head in hbuf. */
    c->rq.length_unknown = 0;
    c->rq.body_len = c->body_len = c->cdec;
    c->bytes_in = c->cdec;
    kvr_api_res_reset(&c->res);
    c->rq.peer_held = h1_peer_held(c);
    kvr_api_handle(c->s->api, &c->rq, &c->res);
    if (c->res.put == KVR_API_PUT_WAIT) { /* the body is here already: no budget to wait for */
        c->rq.buffered = 1;
        kvr_api_res_reset(&c->res);
        kvr_api_handle(c->s->api, &c->rq, &c->res);
    }
    h1_peer_take(c);
    if (c->res.put == KVR_API_PUT_RESERVED)
        kvr_api_put_write(c->s->api, &c->res, 0, c->cbuf, c->cdec);
    /* Only then may the bytes after the body's end, the next requests, replace the head:
     * copied earlier they overwrote the path the request layer was about to read (a pipelined
     * "GET /healthz" turned the PUT before it into a 404). They are at most one read, which
     * kvr_h1_chunked_read bounds by the head buffer, so they always fit. */
    if (left > 0 && (size_t)left <= sizeof(c->hbuf)) {
        memcpy(c->hbuf, c->cbuf + c->cdec, (size_t)left);
        c->hlen = (size_t)left;
    } else {
        c->hlen = 0;
        if (left > 0)
            c->keep = 0; /* cannot happen (see kvr_h1_chunked_read); never parse a torn request */
    }
    free(c->cbuf);
    c->cbuf = NULL;
    c->s->chunked_conns--;
    c->hused = 0;    /* every preread byte went into cbuf; hbuf holds only what follows */
    c->body_len = 0; /* body_complete must not count preread again */
    kvr_h1_body_complete(c);
}
