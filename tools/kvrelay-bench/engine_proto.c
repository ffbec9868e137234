/*
 * engine_proto.c — responses (engine_int.h): what an HTTP status means for a request, the last
 * checks once a response is in (length, the verification checksum, /exists), and the stream
 * protocols — HTTP/1.1, RESP2 and the memcached text protocol — from the request's bytes to
 * the parsed head and the body's sink. HTTP/2 responses arrive through engine_h2.c and end in
 * the same kvb_http_classify and kvb_req_complete.
 */
#include "engine_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <unistd.h>

/* What an HTTP status means for the request (HTTP/1.1 and HTTP/2 alike); sets the sink. */
void kvb_http_classify(kvb_req_t *r)
{
    int st = r->status;
    r->sink = SINK_DROP;
    switch (r->op) {
    case OP_PUT:
        /* 201 new, 200 a dedup hit (kvrelay); 204 an overwrite (WebDAV servers such as nginx) */
        if (st != 201 && st != 200 && st != 204)
            r->ek = EK_STATUS;
        break;
    case OP_GET:
        if (st == 200) {
            if (r->clen >= 0 && (uint64_t)r->clen != r->size)
                r->ek = EK_LENGTH;
            else if (G.verify)
                r->sink = SINK_HASH;
        } else if (st == 404) {
            r->miss = 1;
        } else {
            r->ek = EK_STATUS;
        }
        break;
    case OP_HEAD:
        if (st == 200) {
            if (r->clen < 0 || (uint64_t)r->clen != r->size)
                r->ek = EK_LENGTH;
        } else if (st == 404) {
            r->miss = 1;
        } else {
            r->ek = EK_STATUS;
        }
        break;
    case OP_EXISTS:
        if (st == 200)
            r->sink = SINK_KEEP;
        else
            r->ek = EK_STATUS;
        break;
    case OP_DELETE:
        if (st == 404)
            r->miss = 1;
        else if (st != 200)
            r->ek = EK_STATUS;
        break;
    }
}

/* The whole response is in: the last checks, then the outcome. */
void kvb_req_complete(kvb_conn_t *c, kvb_req_t *r)
{
    kvb_worker_t *w = c->w;
    if (r->ek < 0 && !r->miss && G.proto == PROTO_HTTP && r->op == OP_EXISTS) {
        r->keep[r->keeplen] = '\0';
        if (strstr(r->keep, "\"exists\":true") != NULL) {
        } else if (strstr(r->keep, "\"exists\":false") != NULL) {
            r->miss = 1;
        } else {
            r->ek = EK_PROTOCOL;
            kvb_note_req(w, EK_PROTOCOL, r, "body %.100s", r->keep);
        }
    }
    if (r->ek < 0 && !r->miss && r->op == OP_GET) {
        if (r->got != r->size) {
            r->ek = r->got < r->size ? EK_SHORT : EK_LENGTH;
            kvb_note_req(w, r->ek, r, "%llu body bytes, %llu PUT", (unsigned long long)r->got, (unsigned long long)r->size);
        } else if (r->sink == SINK_HASH) {
            uint64_t got = XXH3_64bits_digest(r->xs), want = kvb_block_checksum(r->key);
            if (got != want) {
                r->ek = EK_CORRUPT;
                kvb_note_req(w, EK_CORRUPT, r, "%llu bytes with XXH3 %016llx, the block PUT has %016llx",
                             (unsigned long long)r->got, (unsigned long long)got, (unsigned long long)want);
            }
        }
    }
    if (r->ek == EK_STATUS) {
        r->keep[r->keeplen < sizeof(r->keep) ? r->keeplen : sizeof(r->keep) - 1] = '\0';
        if (G.proto == PROTO_HTTP)
            kvb_note_req(w, EK_STATUS, r, "HTTP %d %.100s", r->status, r->keep);
        else
            kvb_note_req(w, EK_STATUS, r, "reply %.100s", r->keep);
    } else if (r->ek == EK_LENGTH) {
        kvb_note_req(w, EK_LENGTH, r, "length %lld, %llu PUT", (long long)r->clen, (unsigned long long)r->size);
    }
    kvb_req_finish(c, r, r->ek, r->miss);
}

/* ---------------------------------------------------------------- stream protocols */

const char *const kvb_http_method[OP_N] = {"PUT", "GET", "HEAD", "GET", "DELETE"};

void kvb_build_stream_request(kvb_conn_t *c, kvb_req_t *r)
{
    char h[2600], k[1100];
    int n = 0;
    size_t kl;

    if (G.proto == PROTO_HTTP) {
        kvb_key_path(r->key, k, sizeof(k));
        n = snprintf(h, sizeof(h), "%s /kv/%s%s HTTP/1.1\r\nHost: %s\r\n%s", kvb_http_method[r->op], k,
                     r->op == OP_EXISTS ? "/exists" : "", G.target, kvb_auth_line);
        if (r->op == OP_PUT) {
            n += snprintf(h + n, sizeof(h) - (size_t)n, "Content-Length: %llu\r\n", (unsigned long long)r->size);
            if (r->seqhash)
                n += snprintf(h + n, sizeof(h) - (size_t)n, "X-KV-Sequence-Hash: %llu\r\n",
                              (unsigned long long)r->seqhash);
        }
        n += snprintf(h + n, sizeof(h) - (size_t)n, "\r\n");
        kvb_oq_own(&c->oq, h, (size_t)n);
        if (r->op == OP_PUT)
            kvb_oq_block(&c->oq, &r->blk, 0, r->size);
        return;
    }
    kl = kvb_key_name(r->key, k, sizeof(k));
    if (G.proto == PROTO_RESP) {
        static const char *const cmd[OP_N] = {"SET", "GET", "STRLEN", "EXISTS", "DEL"};
        const char *m = cmd[r->op];
        n = snprintf(h, sizeof(h), "*%d\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n", r->op == OP_PUT ? 3 : 2, strlen(m), m, kl, k);
        if (r->op == OP_PUT)
            n += snprintf(h + n, sizeof(h) - (size_t)n, "$%llu\r\n", (unsigned long long)r->size);
        kvb_oq_own(&c->oq, h, (size_t)n);
        if (r->op == OP_PUT) {
            kvb_oq_block(&c->oq, &r->blk, 0, r->size);
            kvb_oq_own(&c->oq, "\r\n", 2);
        }
        return;
    }
    switch (r->op) { /* memcached text protocol; meta get (mg) for HEAD (with its size) and exists */
    case OP_PUT:
        n = snprintf(h, sizeof(h), "set %s 0 0 %llu\r\n", k, (unsigned long long)r->size);
        break;
    case OP_GET:
        n = snprintf(h, sizeof(h), "get %s\r\n", k);
        break;
    case OP_HEAD:
        n = snprintf(h, sizeof(h), "mg %s s\r\n", k);
        break;
    case OP_EXISTS:
        n = snprintf(h, sizeof(h), "mg %s\r\n", k);
        break;
    default:
        n = snprintf(h, sizeof(h), "delete %s\r\n", k);
        break;
    }
    kvb_oq_own(&c->oq, h, (size_t)n);
    if (r->op == OP_PUT) {
        kvb_oq_block(&c->oq, &r->blk, 0, r->size);
        kvb_oq_own(&c->oq, "\r\n", 2);
    }
}

static int ci_prefix(const uint8_t *p, size_t n, const char *s)
{
    size_t l = strlen(s);
    return n >= l && strncasecmp((const char *)p, s, l) == 0;
}

/* HTTP/1.1 head. 1: parsed (*used bytes), 0: incomplete, -1: malformed. */
static int http_head(kvb_conn_t *c, kvb_req_t *r, const uint8_t *p, size_t n, size_t *used)
{
    const uint8_t *end = memmem(p, n, "\r\n\r\n", 4), *line;
    if (end == NULL)
        return n > 2 && memcmp(p, "HTTP/", n < 5 ? n : 5) != 0 ? -1 : 0;
    if (end - p < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ' || p[9] < '1' || p[9] > '5' || p[10] < '0' ||
        p[10] > '9' || p[11] < '0' || p[11] > '9')
        return -1;
    r->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    line = (const uint8_t *)memchr(p, '\n', (size_t)(end + 2 - p)) + 1;
    while (line < end + 2) {
        const uint8_t *eol = memmem(line, (size_t)(end + 2 - line), "\r\n", 2);
        size_t ll = (size_t)(eol - line);
        if (ci_prefix(line, ll, "content-length:")) {
            const uint8_t *v = line + 15;
            int64_t x = 0;
            while (v < eol && (*v == ' ' || *v == '\t'))
                v++;
            if (v == eol)
                return -1;
            for (; v < eol && *v >= '0' && *v <= '9'; v++)
                x = x * 10 + (*v - '0');
            r->clen = x;
        } else if (ci_prefix(line, ll, "transfer-encoding:")) {
            if (memmem(line, ll, "chunked", 7) != NULL)
                return -1; /* kvrelay always sends Content-Length; not supported */
        } else if (ci_prefix(line, ll, "connection:")) {
            if (memmem(line, ll, "close", 5) != NULL)
                c->close_after = 1;
        }
        line = eol + 2;
    }
    *used = (size_t)(end + 4 - p);
    if (r->status < 200)
        return -1; /* interim responses: never asked for (no Expect) */
    kvb_http_classify(r);
    if (r->op == OP_HEAD || r->status == 204 || r->status == 304)
        c->body_left = 0;
    else if (r->clen < 0)
        return -1;
    else
        c->body_left = (uint64_t)r->clen;
    c->trailer = "";
    c->tlen = c->tpos = 0;
    return 1;
}

/* RESP2 / memcached: one line, maybe a body and a fixed trailer. */
static int line_head(kvb_conn_t *c, kvb_req_t *r, const uint8_t *p, size_t n, size_t *used)
{
    const uint8_t *eol = memmem(p, n, "\r\n", 2);
    char line[512];
    size_t ll;

    if (eol == NULL)
        return 0;
    ll = (size_t)(eol - p);
    *used = ll + 2;
    if (ll >= sizeof(line))
        ll = sizeof(line) - 1;
    memcpy(line, p, ll);
    line[ll] = '\0';
    c->body_left = 0;
    c->trailer = "";
    c->tlen = c->tpos = 0;
    r->sink = SINK_DROP;
    if (G.proto == PROTO_RESP) {
        long long v = strtoll(line + 1, NULL, 10);
        switch (line[0]) {
        case '+':
            if (r->op != OP_PUT || strcmp(line, "+OK") != 0)
                return -1;
            return 1;
        case '-':
            r->ek = EK_STATUS;
            snprintf(r->keep, sizeof(r->keep), "%.200s", line);
            r->keeplen = strlen(r->keep);
            return 1;
        case ':':
            if (r->op == OP_HEAD) {
                if (v == 0)
                    r->miss = 1;
                else if ((uint64_t)v != r->size)
                    r->clen = v, r->ek = EK_LENGTH;
            } else if (r->op == OP_EXISTS || r->op == OP_DELETE) {
                if (v == 0)
                    r->miss = 1;
            } else {
                return -1;
            }
            return 1;
        case '$':
            if (r->op != OP_GET)
                return -1;
            if (v < 0) {
                r->miss = 1;
                return 1;
            }
            r->clen = v;
            c->body_left = (uint64_t)v;
            c->trailer = "\r\n";
            c->tlen = 2;
            if ((uint64_t)v != r->size)
                r->ek = EK_LENGTH;
            else if (G.verify)
                r->sink = SINK_HASH;
            return 1;
        default:
            return -1;
        }
    }
    /* memcached */
    if (!strncmp(line, "VALUE ", 6)) {
        const char *sp = strrchr(line, ' ');
        long long v = strtoll(sp + 1, NULL, 10);
        if (r->op != OP_GET || v < 0)
            return -1;
        r->clen = v;
        c->body_left = (uint64_t)v;
        c->trailer = "\r\nEND\r\n";
        c->tlen = 7;
        if ((uint64_t)v != r->size)
            r->ek = EK_LENGTH;
        else if (G.verify)
            r->sink = SINK_HASH;
        return 1;
    }
    if (!strcmp(line, "STORED") && r->op == OP_PUT)
        return 1;
    if ((!strcmp(line, "END") && r->op == OP_GET) || (!strcmp(line, "EN") && (r->op == OP_HEAD || r->op == OP_EXISTS)) ||
        (!strcmp(line, "NOT_FOUND") && r->op == OP_DELETE)) {
        r->miss = 1;
        return 1;
    }
    if (!strcmp(line, "DELETED") && r->op == OP_DELETE)
        return 1;
    if (!strncmp(line, "HD", 2) && (line[2] == '\0' || line[2] == ' ') && (r->op == OP_HEAD || r->op == OP_EXISTS)) {
        if (r->op == OP_HEAD) {
            const char *s = strstr(line, " s");
            long long v = s ? strtoll(s + 2, NULL, 10) : -1;
            if (v < 0 || (uint64_t)v != r->size)
                r->clen = v, r->ek = EK_LENGTH;
        }
        return 1;
    }
    if (!strncmp(line, "SERVER_ERROR", 12) || !strncmp(line, "CLIENT_ERROR", 12) || !strcmp(line, "ERROR") ||
        !strcmp(line, "NOT_STORED") || !strcmp(line, "EXISTS")) {
        r->ek = EK_STATUS;
        snprintf(r->keep, sizeof(r->keep), "%.200s", line);
        r->keeplen = strlen(r->keep);
        return 1;
    }
    return -1;
}

static void protocol_error(kvb_conn_t *c, const char *what, const uint8_t *p, size_t n)
{
    char shown[81];
    size_t k = 0;
    for (size_t i = 0; i < n && k < 80; i++)
        shown[k++] = (p[i] >= 32 && p[i] < 127) ? (char)p[i] : '.';
    shown[k] = '\0';
    {
        char why[200];
        snprintf(why, sizeof(why), "%s: \"%s\"", what, shown);
        kvb_conn_fail(c, EK_PROTOCOL, why);
    }
}

/* Bytes of the response being read. 1: the connection moved on (response done, or failed). */
static int stream_input(kvb_conn_t *c, const uint8_t *p, size_t n)
{
    kvb_req_t *r = &c->reqs[0];

    if (!r->active) {
        char why[100];
        snprintf(why, sizeof(why), "%zu bytes nobody asked for", n);
        kvb_note_error(c->w, EK_PROTOCOL, "%s", why);
        kvb_conn_fail(c, EK_PROTOCOL, why);
        return 1;
    }
    if (c->rphase == RP_HEAD) {
        const uint8_t *hp = p;
        size_t hn = n, used = 0, old = c->hlen;
        int rc;
        if (old) {
            size_t take = HBUF_CAP - old < n ? HBUF_CAP - old : n;
            memcpy(c->hbuf + old, p, take);
            c->hlen += take;
            hp = c->hbuf;
            hn = c->hlen;
        }
        rc = G.proto == PROTO_HTTP ? http_head(c, r, hp, hn, &used) : line_head(c, r, hp, hn, &used);
        if (rc < 0) {
            protocol_error(c, "malformed response", hp, hn);
            return 1;
        }
        if (rc == 0) {
            if (old == 0) {
                if (n >= HBUF_CAP) {
                    protocol_error(c, "response head too long", p, n);
                    return 1;
                }
                if (c->hbuf == NULL && (c->hbuf = malloc(HBUF_CAP)) == NULL) { /* a head split across reads */
                    protocol_error(c, "out of memory", p, n);
                    return 1;
                }
                memcpy(c->hbuf, p, n);
                c->hlen = n;
            } else if (c->hlen == HBUF_CAP) {
                protocol_error(c, "response head too long", c->hbuf, c->hlen);
                return 1;
            }
            return 0;
        }
        p += used - old;
        n -= used - old;
        c->hlen = 0;
        r->head_done = 1;
        c->rphase = RP_BODY;
    }
    if (c->body_left) {
        size_t take = c->body_left < n ? (size_t)c->body_left : n;
        kvb_sink_bytes(r, p, take);
        p += take;
        n -= take;
        c->body_left -= take;
    }
    if (c->body_left == 0) {
        while (n > 0 && c->tpos < c->tlen) {
            if (*p != (uint8_t)c->trailer[c->tpos]) {
                protocol_error(c, "bad bytes after the body", p, n);
                return 1;
            }
            p++;
            n--;
            c->tpos++;
        }
        if (c->tpos == c->tlen) {
            int drop = c->close_after || c->oq.bytes > 0; /* answered before the body was sent */
            if (n > 0) {
                protocol_error(c, "bytes after the response", p, n);
                return 1;
            }
            c->rphase = RP_HEAD;
            kvb_req_complete(c, r);
            if (drop) {
                kvb_conn_close_fd(c);
                kvb_schedule_reopen(c, kvb_now());
            } else {
                kvb_conn_fill(c);
            }
            return 1;
        }
    }
    return 0;
}

void kvb_stream_flush(kvb_conn_t *c)
{
    int rc = kvb_oq_flush(c->fd, &c->oq);
    if (rc < 0) {
        char why[128];
        snprintf(why, sizeof(why), "write: %s", strerror(errno));
        kvb_conn_fail(c, EK_AUTO, why);
    } else {
        kvb_conn_events(c, rc ? EPOLLIN : EPOLLIN | EPOLLOUT);
    }
}

void kvb_stream_readable(kvb_conn_t *c)
{
    kvb_worker_t *w = c->w;
    ssize_t n;

    while ((n = kvb_conn_read(c)) > 0)
        if (stream_input(c, w->tbuf, (size_t)n))
            return;
}
