/*
 * h1_sniff.c — who serves a connection, from its first bytes looked at without being consumed
 * (MSG_PEEK): TLS and the HTTP/2 preface go to h2o, the rest stays here (docs/dataplane.md,
 * "Who serves a connection"). See h1_int.h for the parts of the server.
 */
#include "io/h1_int.h"

#include "base/log.h"

/* Called from the peek's completion: nothing of ours is in flight and nothing was consumed. */
static void adopt_to_h2o(h1c_t *c)
{
    kvr_h1_t *s = c->s;

    if (kvr_http_adopt(s->http, c->fd) != KVR_OK) {
        /* h2o is at --h2o-max-connections: the client waits here and we look again later */
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "h1: TLS/h2c connection waits: %llu open in h2o",
                            (unsigned long long)kvr_http_connections(s->http));
        c->sniff_wait = 1;
        return;
    }
    kvr_h1_conn_release(c); /* the descriptor lives on in h2o */
}

/* The first bytes decide who serves the connection. */
void kvr_h1_sniffed(h1c_t *c, int n)
{
    size_t cmp = (size_t)n < H1_H2_PREFACE_LEN ? (size_t)n : H1_H2_PREFACE_LEN;

    if (c->head_ms == 0) { /* the first bytes: --header-timeout and --io-timeout run from here */
        c->head_ms = kvr_clock_ms();
        /* A connection silent since its accept still has the accept's stamp: left so, a tick
         * that came before the head's read completed cut it at once when the silence had
         * lasted --io-timeout (CI: 0.35 s after its first byte, under load). */
        c->last_ms = kvr_clock_coarse_ms();
    }
    if (kvr_http_tls(c->s->http)) { /* a TLS port serves TLS only: h2o refuses the rest */
        adopt_to_h2o(c);
        return;
    }
    if (memcmp(c->hbuf, H1_H2_PREFACE, cmp) == 0) {
        if (cmp >= 4) { /* "PRI " is the HTTP/2 preface and nothing else */
            adopt_to_h2o(c);
            return;
        }
        c->sniff_wait = 1; /* too few bytes to tell: look again at the next tick */
        return;
    }
    c->state = ST_HEAD;
    c->hlen = 0;
    kvr_h1_conn_read(c);
}
