/*
 * h1_peer.c — the table of client addresses: what each address's connections hold of the
 * worker's PUT budget (--peer-inflight-share). See h1_int.h for the parts of the server.
 */
#include "io/h1_int.h"

#include <netinet/in.h>
#include <stdlib.h>

#define H1_PEER_MAX     65536 /* addresses remembered per worker (about 3 MiB); more go unlimited */
#define H1_PEER_KEEP_MS 60000 /* an address without connections is remembered this long */

static unsigned peer_bucket(const uint8_t *a)
{
    uint32_t h = 2166136261u;

    for (int i = 0; i < 16; i++)
        h = (h ^ a[i]) * 16777619u;
    return h % H1_PEER_BUCKETS;
}

/* Finds or adds the connection's peer; without an address (or memory) it has none and is
 * not limited by address. */
void kvr_h1_peer_attach(h1c_t *c)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    uint8_t a[16] = {0};
    h1peer_t **b, *p;

    if (getpeername(c->fd, (struct sockaddr *)&ss, &len) < 0)
        return;
    if (ss.ss_family == AF_INET) {
        a[10] = a[11] = 0xff;
        memcpy(a + 12, &((struct sockaddr_in *)&ss)->sin_addr, 4);
    } else if (ss.ss_family == AF_INET6) {
        memcpy(a, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
    } else {
        return;
    }
    b = &c->s->peers[peer_bucket(a)];
    for (p = *b; p != NULL && memcmp(p->addr, a, 16) != 0; p = p->next)
        ;
    if (p == NULL) {
        if (c->s->npeers >= H1_PEER_MAX || (p = calloc(1, sizeof(*p))) == NULL)
            return;
        memcpy(p->addr, a, 16);
        p->next = *b;
        *b = p;
        c->s->npeers++;
    }
    p->conns++;
    p->last_ms = c->last_ms;
    c->peer = p;
}

/* The record outlives the address's last connection by H1_PEER_KEEP_MS (kvr_h1_peer_sweep): a
 * client that opens a connection per request is still one of the worker's clients between
 * two of them. */
void kvr_h1_peer_detach(h1c_t *c)
{
    h1peer_t *p = c->peer;

    if (p == NULL)
        return;
    c->peer = NULL;
    p->conns--;
    p->last_ms = kvr_clock_ms();
}

void kvr_h1_peer_sweep(kvr_h1_t *s, uint64_t t)
{
    if (t - s->peers_swept_ms < 1000)
        return;
    s->peers_swept_ms = t;
    for (int i = 0; i < H1_PEER_BUCKETS; i++)
        for (h1peer_t **b = &s->peers[i], *p; (p = *b) != NULL;)
            if (p->conns == 0 && p->held == 0 && t - p->last_ms > H1_PEER_KEEP_MS) {
                *b = p->next;
                free(p);
                s->npeers--;
            } else {
                b = &p->next;
            }
}
