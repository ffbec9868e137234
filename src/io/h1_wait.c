/*
 * h1_wait.c — PUTs waiting for the worker's in-flight budget. See h1_int.h for the parts of
 * the server.
 */
#include "io/h1_int.h"

/* A PUT that waited for the in-flight budget asks again. 1 when it is on its way (or
 * answered), 0 when it still waits. */
static int retry_wait(h1c_t *c)
{
    kvr_api_res_reset(&c->res);
    c->rq.peer_held = h1_peer_held(c);
    kvr_api_handle(c->s->api, &c->rq, &c->res);
    if (c->res.put == KVR_API_PUT_WAIT)
        return 0;
    h1_peer_take(c);
    h1_wait_leave(c);
    c->state = c->res.put == KVR_API_PUT_RESERVED ? ST_BODY : ST_DISCARD;
    if (c->res.put == KVR_API_PUT_RESERVED || c->res.put == KVR_API_PUT_DEDUP)
        kvr_h1_begin_body(c);
    else
        kvr_h1_respond(c);
    return 1;
}

/* Once per loop iteration: the budget that PUTs ended since gives the oldest waiters their
 * turn at once (not at the next tick), in arrival order. */
void kvr_h1_wake_waiters(kvr_h1_t *s)
{
    h1_link_t *l, *next;
    h1c_t *c;

    for (l = s->wait.next; l != &s->wait; l = next) {
        c = H1_CONN_OF(l, wlink);
        next = l->next;
        if (!kvr_api_put_fits(s->api, c->rq.body_len))
            break;
        if (!kvr_api_peer_fits(s->api, h1_peer_held(c), c->rq.body_len))
            continue; /* its address holds its share: the ones behind it go first */
        if (!retry_wait(c))
            break;
    }
}
