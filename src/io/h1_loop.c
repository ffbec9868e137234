/*
 * h1_loop.c — the worker's loop waits in the HTTP/1.1 server's ring when it can: one
 * io_uring_enter per loop turn submits and waits, where waiting in h2o cost an epoll_wait, the
 * ring eventfd's read and a submit. h2o's epoll descriptor is polled through the ring
 * (docs/dataplane.md "One wait per turn").
 */
#include "io/h1_int.h"

#include "base/dassert.h"
#include "base/log.h"
#include "io/http.h"

static void on_h2o_ready(kvr_uring_op_t *op, int res)
{
    kvr_h1_t *s = op->data;

    s->h2o_polled = 0;
    s->h2o_ready = 1; /* on an error too: h2o's own run reports it */
    if (res < 0) {
        /* Not armed again for a tick (kvr_h1_turn), so a poll that keeps failing does not
         * spin the loop; h2o still runs every tick meanwhile. */
        s->h2o_poll_err = kvr_clock_ms();
        KVR_LOG_RATELIMITED(KVR_LOG_ERROR, "h1: poll of h2o's loop: %s", strerror(-res));
    }
}

int kvr_h1_own_wait(kvr_h1_t *s)
{
    int fd;

    if (s->ring.engine != KVR_IO_URING || (fd = kvr_http_epoll_fd(s->http)) < 0 || kvr_uring_own_wait(&s->ring) != KVR_OK)
        return 0;
    s->own_wait = 1;
    s->h2o_fd = fd;
    s->h2o_op.cb = on_h2o_ready;
    s->h2o_op.data = s;
    return 1;
}

/* h2o runs, without waiting, when its epoll descriptor is readable, when it has work queued or
 * a timer due (before the wait, or after it: the wait may have ended on h2o's timer, or a
 * callback queued h2o work such as a connection handed over), and at least every tick. */
void kvr_h1_turn(kvr_h1_t *s, int32_t max_ms)
{
    int32_t idle = kvr_http_idle_ms(s->http, max_ms);
    uint64_t t;
    int ready;

    KVR_DASSERT(s->own_wait);
    if (!s->h2o_polled && (s->h2o_poll_err == 0 || kvr_clock_ms() - s->h2o_poll_err >= KVR_TICK_MS) &&
        kvr_uring_poll_in(&s->ring, s->h2o_fd, &s->h2o_op) == KVR_OK)
        s->h2o_polled = 1;
    (void)kvr_uring_wait(&s->ring, idle);
    ready = s->h2o_ready;
    s->h2o_ready = 0;
    t = kvr_clock_ms();
    if (ready || idle == 0 || t - s->h2o_ran >= KVR_TICK_MS || kvr_http_idle_ms(s->http, 1) == 0) {
        s->h2o_ran = t;
        kvr_http_run_once(s->http, 0);
    }
}

int kvr_h1_waits(const kvr_h1_t *s)
{
    return s->own_wait;
}

void kvr_h1_submit(kvr_h1_t *s)
{
    kvr_uring_flush(&s->ring);
}
