/*
 * h1_accept.c — accepting clients: the workers' accept turns (docs/concurrency.md, "Accept
 * turns"), accepts the kernel left queued, and making room when out of descriptors or at
 * --max-connections. See h1_int.h for the parts of the server.
 */
#include "io/h1_int.h"

#include "base/log.h"

#include <errno.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define H1_ACCEPT_PAUSE_MS 100
#define H1_ACCEPT_SLACK    1   /* connections held beyond the least loaded worker's, still accepting */
#define H1_ACCEPT_STALL_MS 200 /* a worker given the turn whose loop has not moved for this long is passed over */
#define H1_RECLAIM_MAX     16  /* idle connections closed at once when out of descriptors */

/* The client connections we hold: ours and those handed to h2o. */
uint32_t kvr_h1_held(const kvr_h1_t *s)
{
    return (uint32_t)(s->nconns + kvr_http_connections(s->http));
}

/* ------------------------------------------------------------------ making room */

/*
 * Closes up to n of the longest-idle connections; returns how many. A connection whose socket
 * holds bytes we have not read yet is passed over: it has spoken (a newcomer's first request,
 * accepted a moment ago, whose read is not done yet, or a kept-alive client's next request) and
 * is not idle. That costs one ioctl per connection looked at, only when room is needed.
 */
static unsigned reclaim(kvr_h1_t *s, unsigned n, const char *why)
{
    h1_link_t *l, *next;
    unsigned k = 0;

    for (l = s->idle.next; k < n && l != &s->idle; l = next) {
        h1c_t *c = H1_CONN_OF(l, ilink);
        int unread = 0;

        next = l->next;
        if (ioctl(c->fd, FIONREAD, &unread) == 0 && unread > 0)
            continue;
        h1_idle_leave(c);
        c->reclaimed = 1;
        s->nreclaim++;
        kvr_h1_conn_close(c);
        k++;
    }
    if (k > 0) {
        if (!s->pressure)
            kvr_warn("h1: %s with %llu connections open: closing the longest-idle ones to make room", why,
                     (unsigned long long)s->nconns);
        s->pressure = 1;
        s->pressure_ms = kvr_clock_ms();
        s->reclaimed += k;
        kvr_stat_add(s->api->store->my_stats, KVR_ST_IDLE_RECLAIMED, k);
    }
    return k;
}

/* 1 when an idle connection could make room for a newcomer: one that has not spoken. A
 * connection accepted a moment ago whose request is in its socket, unread, is on the idle
 * list but about to be busy: arming an accept on its account would let the next newcomer in
 * past the bound. Scans from the longest idle, which is usually silent: one ioctl. */
static int room_to_make(kvr_h1_t *s)
{
    for (h1_link_t *l = s->idle.next; l != &s->idle; l = l->next) {
        int unread = 0;
        if (ioctl(H1_CONN_OF(l, ilink)->fd, FIONREAD, &unread) != 0 || unread == 0)
            return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ turns */

void kvr_h1_arm_accept(kvr_h1_t *s)
{
    if (s->accepting || s->draining || s->listen_fd < 0)
        return;
    if (kvr_h1_held(s) - s->nreclaim >= s->max_conns && !room_to_make(s)) {
        /* at --max-connections and nothing idle to close: newcomers wait in the listener's
         * queue (or are taken by another worker) until a connection here ends */
        if (!s->full_warned) /* once an episode, also one that began by closing idle ones */
            kvr_warn("h1: %llu connections open, none idle (--max-connections %llu): not accepting until one ends",
                     (unsigned long long)kvr_h1_held(s), (unsigned long long)s->max_conns);
        s->full_warned = 1;
        if (!s->full) /* one pause, however many ticks find us full */
            kvr_stat_add(s->api->store->my_stats, KVR_ST_ACCEPT_PAUSES, 1);
        s->full = 1;
        s->pressure = 1;
        s->pressure_ms = kvr_clock_ms();
        return;
    }
    s->full = 0;
    if (kvr_uring_accept(&s->ring, s->listen_fd, &s->accept_op) == KVR_OK)
        s->accepting = 1;
}

/* 1 when the worker in slot `to`, given the turn, has not looped for H1_ACCEPT_STALL_MS (or no
 * longer serves): we accept in its place. */
static int turn_stalled(kvr_h1_t *s, int to, uint64_t t)
{
    uint32_t conns;
    uint64_t hb;

    if (!kvr_seg_worker_load(s->api->seg, to, &conns, &hb))
        return 1;
    if (to != s->yield_to || hb != s->yield_hb) {
        s->yield_to = to;
        s->yield_hb = hb;
        s->yield_ms = t;
        return 0;
    }
    return t - s->yield_ms >= H1_ACCEPT_STALL_MS;
}

/*
 * Accept turns (docs/concurrency.md): publishes our connection count, then accepts while we
 * hold at most H1_ACCEPT_SLACK more than the least loaded worker; past that, once our accept
 * in flight has completed, we stop and wake that worker, which then takes the turn. Called
 * after each accept, when our count changes, when woken (`woken`: a turn given to us is passed
 * on, never dropped, if by our counts it is another's), and every tick.
 */
void kvr_h1_accept_turn(kvr_h1_t *s, int woken)
{
    uint32_t n = kvr_h1_held(s);
    int to;

    if (n != s->published) {
        kvr_seg_set_conns(s->api->seg, n);
        s->published = n;
    }
    if (s->draining || s->fd_exhausted)
        return;
    to = kvr_seg_accept_yield(s->api->seg, n, H1_ACCEPT_SLACK);
    if (to < 0 || turn_stalled(s, to, kvr_clock_ms())) {
        s->parked = 0;
        kvr_h1_arm_accept(s);
    } else if ((!s->parked || woken) && !s->accepting) {
        s->parked = 1;
        kvr_relay_wake(s->accept_fds[to]);
    }
}

static void on_turn(void *data)
{
    kvr_h1_t *s = data;
    uint64_t v;

    (void)!read(s->accept_fds[s->api->seg->slot], &v, sizeof(v));
    kvr_h1_accept_turn(s, 1);
}

static void on_accept(kvr_uring_op_t *op, int res)
{
    kvr_h1_t *s = op->data;

    s->accepting = 0;
    if (res >= 0) {
        if (s->fd_exhausted && s->fd_warned)
            kvr_info("h1: accepting again (%llu connections open)", (unsigned long long)s->nconns);
        s->fd_exhausted = s->fd_warned = 0;
        if (s->draining) {
            close(res);
        } else {
            uint64_t before = s->nconns;
            kvr_h1_conn_new(s, res);
            /* past --max-connections the longest silent idle goes (the newcomer is the newest).
             * When the idle connection the accept was armed for has spoken since, none but the
             * newcomer is left to go: then the newcomer goes, so that the bound holds. */
            if (s->nconns > before && kvr_h1_held(s) - s->nreclaim > s->max_conns &&
                reclaim(s, 1, "at --max-connections") == 0) {
                h1c_t *c = s->conns; /* kvr_h1_conn_new put the newcomer first */
                KVR_LOG_RATELIMITED(KVR_LOG_WARN, "h1: at --max-connections %llu with none idle: closing a newcomer",
                                    (unsigned long long)s->max_conns);
                c->reclaimed = 1; /* not held any more, though its read is still to complete */
                s->nreclaim++;
                kvr_h1_conn_close(c);
            }
        }
        kvr_h1_accept_turn(s, 0);
        return;
    }
    if (res == -EMFILE || res == -ENFILE || res == -ENOBUFS || res == -ENOMEM) {
        /* Out of descriptors: close the longest-idle connections and accept again as soon as
         * one is freed (h1.c, conn_free); with none idle, stop accepting for a moment as nginx does
         * and keep serving what is open. */
        if (reclaim(s, H1_RECLAIM_MAX, strerror(-res)) == 0 && !s->fd_warned) {
            kvr_warn("h1: cannot accept (%s) with %llu connections open, none idle; pausing accept",
                     strerror(-res), (unsigned long long)s->nconns);
            s->fd_warned = 1;
        }
        if (!s->fd_exhausted) /* one pause per episode, until an accept succeeds */
            kvr_stat_add(s->api->store->my_stats, KVR_ST_ACCEPT_PAUSES, 1);
        s->fd_exhausted = 1;
        s->accept_paused_until = kvr_clock_ms() + H1_ACCEPT_PAUSE_MS;
        return;
    }
    if (res != -ECANCELED)
        kvr_h1_arm_accept(s);
}

int kvr_h1_accept_init(kvr_h1_t *s)
{
    s->accept_op.cb = on_accept;
    s->accept_op.data = s;
    return kvr_http_watch_fd(s->http, s->accept_fds[s->api->seg->slot], on_turn, s);
}

/* Every tick while our accept is in flight: a connection that waits in the listener's queue
 * means the wake-up went to a worker that does not run (stopped, or stuck in a long
 * operation: the kernel wakes one waiter of a shared listener, and that one's accept runs only
 * when its process does). We take it here, within a tick, instead of leaving it there. */
void kvr_h1_accept_queued(kvr_h1_t *s)
{
    struct pollfd p = {.fd = s->listen_fd, .events = POLLIN};
    int fd;

    if (!s->accepting || s->draining || s->listen_fd < 0 || poll(&p, 1, 0) != 1)
        return;
    fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    kvr_uring_fd_new(&s->ring, fd); /* not through the engine's accept: it must hear of it */
    kvr_h1_conn_new(s, fd);
}
