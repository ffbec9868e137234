/*
 * wait_until.h — waiting for a condition in the C tests (tests/unit, tests/mp), bounded.
 *
 *     if (!WAIT_UNTIL(atomic_load(&x->ready), 10000))
 *         cr_assert_fail("never ready");
 *
 * WAIT_UNTIL(cond, timeout_ms) evaluates `cond` until it is true or `timeout_ms` have passed on
 * the monotonic clock, pausing 1 ms between tries, and is 1 if `cond` became true, else 0.
 * WAIT_UNTIL_EVERY(cond, timeout_ms, poll_ms) pauses `poll_ms` instead (a condition that
 * compares two samples, or one with side effects such as a wake-up, wants a longer period).
 * `cond` is evaluated at least once, and once more after the deadline has passed, so a
 * condition that comes true during the last pause is not missed.
 *
 * A test waits with these instead of sleeping a fixed time and hoping the other process or
 * thread got there: on a loaded machine a fixed sleep is too short, on an idle one too long.
 * A sleep that is the test's own doing (pacing traffic, a random pause between kills, a
 * holder keeping a lock) is no synchronisation and stays a sleep, with a comment saying so.
 *
 * A GNU C statement expression (the tests build with -std=gnu11; clang accepts it too).
 */
#ifndef KVR_TEST_WAIT_UNTIL_H
#define KVR_TEST_WAIT_UNTIL_H

#include <errno.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t wait_until_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline void wait_until_pause_ms(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

#define WAIT_UNTIL_EVERY(cond, timeout_ms, poll_ms) \
    ({ \
        const uint64_t wait_until_end_ = wait_until_now_ms() + (uint64_t)(timeout_ms); \
        int wait_until_ok_; \
        for (;;) { \
            const int wait_until_late_ = wait_until_now_ms() >= wait_until_end_; \
            if ((cond)) { \
                wait_until_ok_ = 1; \
                break; \
            } \
            if (wait_until_late_) { \
                wait_until_ok_ = 0; \
                break; \
            } \
            wait_until_pause_ms(poll_ms); \
        } \
        wait_until_ok_; \
    })

#define WAIT_UNTIL(cond, timeout_ms) WAIT_UNTIL_EVERY(cond, timeout_ms, 1)

#endif
