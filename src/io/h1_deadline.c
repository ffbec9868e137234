/*
 * h1_deadline.c — the tick: every connection state's deadline and --min-body-rate
 * (docs/dataplane.md, "Connection states and their deadlines"). See h1_int.h for the parts of
 * the server.
 */
#include "io/h1_int.h"

#include "base/log.h"

#include <linux/tcp.h> /* struct tcp_info with the byte counters */
#include <netinet/in.h>
#include <sys/ioctl.h>

/* The kernel's byte counters of the connection: received, and sent and acknowledged. */
static int tcp_bytes(const h1c_t *c, uint64_t *in, uint64_t *out)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);

    if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0 || len < sizeof(ti))
        return -1;
    *in = ti.tcpi_bytes_received;
    *out = ti.tcpi_bytes_acked;
    return 0;
}

/* Bytes of a next request already in the kernel's receive queue: the client sent it before
 * it could see us drain, so a drain serves it rather than closing under it. */
static int input_waiting(const h1c_t *c)
{
    int n = 0;

    return ioctl(c->fd, FIONREAD, &n) == 0 && n > 0;
}

/* An operation that waits for a whole body or response (MSG_WAITALL) completes only at its
 * end, so the timeout looks at the kernel's own counters: bytes received or acknowledged since
 * the last look are progress. Every other read completes with what arrived and moves last_ms
 * itself. */
static int moved(h1c_t *c)
{
    uint64_t in, out;

    if (c->state != ST_BODY && c->state != ST_COLLECT && c->state != ST_SEND)
        return 0;
    if (tcp_bytes(c, &in, &out) < 0 || (in == c->tcp_in && out == c->tcp_out))
        return 0;
    c->tcp_in = in;
    c->tcp_out = out;
    return 1;
}

/* A transfer that holds something others need (a reservation, a body buffer, a pinned block)
 * while an operation of it is in flight: --min-body-rate applies. */
static int rated(const h1c_t *c)
{
    switch (c->state) {
    case ST_BODY:
    case ST_DISCARD:
    case ST_CHUNKED:
    case ST_COLLECT:
        return c->rbusy;
    case ST_SEND:
        return c->wbusy && c->res.body == KVR_API_BODY_BLOCK;
    default:
        return 0;
    }
}

/* Bytes the transfer still has to move (an upper bound: a MSG_WAITALL operation reports
 * only at its end). */
static uint64_t transfer_left(const h1c_t *c)
{
    if (c->state == ST_SEND)
        return c->resp_total - c->resp_sent;
    if (c->state == ST_CHUNKED)
        return UINT64_MAX;
    return c->body_len - c->body_got;
}

/* Ends the request in progress at a deadline: a read in flight is cancelled and answered 408
 * from its completion (on_read), when the kernel no longer writes into what it holds; in the
 * middle of a response, or of a body after its answer, the connection just ends. */
static void cut(h1c_t *c, const char *why)
{
    if (c->state == ST_SEND || c->post_drain || !c->rbusy) {
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "h1: connection cut: %s", why);
        kvr_h1_conn_close(c);
        return;
    }
    c->cut = 1;
    c->cut_why = why;
    if (kvr_uring_cancel(&c->s->ring, &c->rop) != KVR_OK)
        kvr_h1_conn_close(c);
}

/* --min-body-rate: every --body-rate-window, a rated transfer must have moved the rate times
 * the window, or all it had left. The window's first mark is taken at the first tick that
 * finds the transfer still going, so a request that ends within 50 ms costs no syscall. */
static void check_rate(kvr_h1_t *s, h1c_t *c, uint64_t t)
{
    uint64_t in, out, need;

    if (c->rate_on && t - c->rate_ms < s->cfg->body_rate_window_ms)
        return; /* inside the window: no syscall */
    if (tcp_bytes(c, &in, &out) < 0)
        return;
    if (c->rate_on) {
        need = s->cfg->min_body_rate * (t - c->rate_ms) / 1000;
        if (need > transfer_left(c))
            need = transfer_left(c);
        if (in + out - c->rate_mark < need) {
            cut(c, "the body moved slower than --min-body-rate");
            return;
        }
    }
    c->rate_on = 1;
    c->rate_ms = t;
    c->rate_mark = in + out;
}

void kvr_h1_tick(kvr_h1_t *s)
{
    uint64_t t;
    h1c_t *c, *next;

    /* first: a connection it opens starts its clock at kvr_clock_ms(), which must not be later
     * than the t the timeouts below compare against (t - last_ms would wrap and cut it at once) */
    kvr_h1_accept_queued(s);
    t = kvr_clock_ms();
    if (s->fd_exhausted && !s->accepting && t >= s->accept_paused_until)
        kvr_h1_arm_accept(s);
    kvr_h1_accept_turn(s, 0);
    if (t - s->last_tick_ms > 1000) /* we did not run: nobody's rate is to blame for the gap */
        for (c = s->conns; c != NULL; c = c->next)
            c->rate_on = 0;
    s->last_tick_ms = t;
    kvr_h1_peer_sweep(s, t);
    if (s->pressure && t - s->pressure_ms > 1000 && s->nreclaim == 0 && !s->fd_exhausted &&
        kvr_h1_held(s) < s->max_conns - s->max_conns / 8) {
        kvr_info("h1: room again: %llu connections open, %llu idle ones closed to make room",
                 (unsigned long long)s->nconns, (unsigned long long)s->reclaimed);
        s->pressure = 0;
        s->full_warned = 0;
        s->reclaimed = 0;
    }
    for (c = s->conns; c != NULL; c = next) {
        next = c->next;
        if (c->closing || c->cut)
            continue;
        if (s->cfg->min_body_rate > 0 && rated(c) && (check_rate(s, c, t), c->closing || c->cut))
            continue;
        if (c->state == ST_WAIT) { /* kvr_h1_wake_waiters admits; here only the time limit */
            if (t - c->last_ms > s->cfg->io_timeout_ms) {
                h1_wait_leave(c);
                kvr_h1_respond_error_hdr(c, 503, "Busy", "too many PUT bodies in flight; retry", "retry-after",
                                         H1_RETRY_AFTER);
            }
        } else if (c->state == ST_SNIFF && c->sniff_wait && !c->rbusy) {
            c->sniff_wait = 0;
            kvr_h1_conn_read(c); /* the peek saw too few bytes to decide, or h2o was full */
            if (t - c->last_ms > s->cfg->io_timeout_ms || t - c->head_ms > s->cfg->header_timeout_ms)
                kvr_h1_conn_close(c);
        } else if (c->state == ST_LINGER) {
            if (t > c->linger_until)
                kvr_h1_conn_close(c);
        } else if (h1_idle(c)) { /* silent since accepted, or between requests */
            if (t - c->last_ms > s->cfg->idle_timeout_ms || (s->draining && !input_waiting(c)))
                kvr_h1_conn_close(c);
        } else if (c->state == ST_HEAD && c->head_ms != 0) { /* a head is coming in */
            if (t - c->head_ms > s->cfg->header_timeout_ms)
                cut(c, "the request head was not complete within --header-timeout");
            else if (t - c->last_ms > s->cfg->io_timeout_ms)
                cut(c, "no byte of the request head for --io-timeout");
        } else if (t - c->last_ms > s->cfg->io_timeout_ms && (c->rbusy || c->wbusy) && moved(c)) {
            c->last_ms = t; /* a long transfer in one operation, still moving */
        } else if (t - c->last_ms > s->cfg->io_timeout_ms) {
            KVR_LOG_RATELIMITED(KVR_LOG_WARN, "h1: cutting a connection with no progress for %llu ms",
                                (unsigned long long)(t - c->last_ms));
            kvr_h1_conn_close(c);
        }
    }
    kvr_uring_flush(&s->ring);
}
