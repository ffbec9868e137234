/*
 * h1_head.c — request heads: picohttpparser, then the framing checks before anything else
 * (docs/dataplane.md, "A PUT on the io_uring path"). See h1_int.h for the parts of the server.
 */
#include "io/h1_int.h"

#include <strings.h>

#define H1_MAX_HEADERS 64

static int hdr_is(const struct phr_header *h, const char *name)
{
    size_t n = strlen(name);
    return h->name_len == n && strncasecmp(h->name, name, n) == 0;
}

static int val_is(const struct phr_header *h, const char *v)
{
    size_t n = strlen(v);
    return h->value_len == n && strncasecmp(h->value, v, n) == 0;
}

/* Strict Content-Length: digits only, no overflow. */
static int parse_length(const char *p, size_t n, uint64_t *out)
{
    uint64_t v = 0;

    if (n == 0 || n > 19)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    *out = v;
    return 0;
}

/* One Transfer-Encoding field value, a list of codings (RFC 9110 section 5.6.1: empty
 * elements and the whitespace around commas are ignored): counts the chunked ones and the
 * others. */
static void te_codings(const struct phr_header *h, unsigned *chunked, unsigned *other)
{
    const char *p = h->value, *end = h->value + h->value_len;

    while (p < end) {
        const char *e = memchr(p, ',', (size_t)(end - p)), *b = p, *t;
        if (e == NULL)
            e = end;
        p = e < end ? e + 1 : end;
        while (b < e && (*b == ' ' || *b == '\t'))
            b++;
        for (t = e; t > b && (t[-1] == ' ' || t[-1] == '\t'); t--)
            ;
        if (t == b)
            continue;
        if (t - b == 7 && strncasecmp(b, "chunked", 7) == 0)
            (*chunked)++;
        else
            (*other)++; /* gzip, identity, parameters: nothing but plain chunked is decoded */
    }
}

/* Framing and the headers the request layer needs. 0, or -1 after answering an error. */
static int read_headers(h1c_t *c, const struct phr_header *hd, size_t nh, int minor)
{
    int have_len = 0, te = 0, conn_close_hdr = 0, conn_keep = 0;
    unsigned te_chunked = 0, te_other = 0;
    uint64_t len = 0, l;

    /* RFC 9112 section 5.2: obs-fold is refused before any field is read. picohttpparser
     * reports a continuation line as a field of its own with no name, after the field it
     * continues, so in one pass "Transfer-Encoding:\r\n chunked" was first seen as an empty
     * coding (501). */
    for (size_t i = 0; i < nh; i++)
        if (hd[i].name == NULL) {
            kvr_h1_respond_error(c, 400, "InvalidRequest", "obsolete header line folding");
            return -1;
        }
    for (size_t i = 0; i < nh; i++) {
        const struct phr_header *h = &hd[i];
        if (hdr_is(h, "content-length")) {
            if (parse_length(h->value, h->value_len, &l) < 0 || (have_len && l != len)) {
                kvr_h1_respond_error(c, 400, "InvalidRequest", "invalid or conflicting Content-Length");
                return -1;
            }
            have_len = 1;
            len = l;
        } else if (hdr_is(h, "transfer-encoding")) {
            te = 1; /* every field counts: two fields are one list (RFC 9110 section 5.3) */
            te_codings(h, &te_chunked, &te_other);
        } else if (hdr_is(h, "connection")) {
            conn_close_hdr |= val_is(h, "close");
            conn_keep |= val_is(h, "keep-alive");
        } else if (hdr_is(h, "expect")) {
            if (!val_is(h, "100-continue")) {
                kvr_h1_respond_error(c, 400, "InvalidRequest", "unsupported Expect");
                return -1;
            }
            c->expect100 = 1;
        } else if (hdr_is(h, "authorization")) {
            c->rq.auth = h->value;
            c->rq.auth_len = h->value_len;
        } else if (hdr_is(h, "x-kv-sequence-hash")) {
            c->rq.seq_hash = h->value;
            c->rq.seq_hash_len = h->value_len;
        } else if (hdr_is(h, "x-kv-model")) {
            c->rq.model = h->value;
            c->rq.model_len = h->value_len;
        }
    }
    /* Malformed framing first (400): chunked applied twice (RFC 9112 section 7: never more
     * than once), a Transfer-Encoding that names no coding, or one beside a Content-Length.
     * Then a coding we cannot decode (501, RFC 9112 section 6.1). Every one leaves the body's
     * length unknown: the answer closes the connection. */
    if (te && (te_chunked > 1 || te_chunked + te_other == 0)) {
        kvr_h1_respond_error(c, 400, "InvalidRequest",
                             te_chunked > 1 ? "chunked applied more than once" : "empty Transfer-Encoding");
        return -1;
    }
    if (te && have_len) { /* RFC 9112 section 6.1: a request smuggling vector; refuse and close */
        kvr_h1_respond_error(c, 400, "InvalidRequest", "Content-Length together with Transfer-Encoding");
        return -1;
    }
    if (te_other > 0) {
        kvr_h1_respond_error(c, 501, "NotImplemented", "only Transfer-Encoding: chunked is supported");
        return -1;
    }
    if (!te && !have_len && (c->method == KVR_M_PUT || c->method == KVR_M_POST)) {
        kvr_h1_respond_error(c, 411, "InvalidRequest", "a PUT or POST needs Content-Length or chunked encoding");
        return -1;
    }
    c->keep = minor >= 1 ? !conn_close_hdr : conn_keep;
    c->chunked = (uint8_t)te;
    c->body_len = len;
    c->rq.body_len = len;
    c->rq.length_unknown = te;
    return 0;
}

/* Parses a complete head out of hbuf; asks for more when it is not complete. */
void kvr_h1_parse_head(h1c_t *c)
{
    const char *method, *path;
    size_t mlen, plen, nh = H1_MAX_HEADERS;
    struct phr_header hd[H1_MAX_HEADERS];
    int minor, n;

    n = phr_parse_request(c->hbuf, c->hlen, &method, &mlen, &path, &plen, &minor, hd, &nh, c->last_len);
    if (n == -2) {
        if (c->hlen >= KVR_API_MAX_HEAD) {
            kvr_h1_respond_error(c, 431, "InvalidRequest", "request headers larger than 16 KiB");
            return;
        }
        c->last_len = c->hlen;
        kvr_h1_conn_read(c);
        return;
    }
    c->start_us = kvr_clock_us();
    c->in_req = 1;
    kvr_api_res_reset(&c->res);
    memset(&c->rq, 0, sizeof(c->rq));
    c->expect100 = c->sent100 = c->post_drain = 0;
    c->bytes_in = c->bytes_out = 0;
    c->body_got = 0;
    c->method = n > 0 ? kvr_api_method(method, mlen) : KVR_M_OTHER;
    if (n < 0) {
        kvr_h1_respond_error(c, 400, "InvalidRequest", "malformed request head");
        return;
    }
    if ((size_t)n > KVR_API_MAX_HEAD) {
        kvr_h1_respond_error(c, 431, "InvalidRequest", "request headers larger than 16 KiB");
        return;
    }
    c->hused = (size_t)n;
    c->last_len = 0;
    c->rq.method = c->method;
    c->rq.path = path;
    c->rq.path_len = plen;
    for (size_t i = 0; i < plen; i++)
        if (path[i] == '?') {
            c->rq.path_len = i;
            break;
        }
    c->rq.head_bytes = (size_t)n;
    if (read_headers(c, hd, nh, minor) < 0)
        return;
    kvr_h1_start_request(c);
}
