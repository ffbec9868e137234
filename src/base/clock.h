/*
 * clock.h — the one source of time for kvrelay.
 *
 * kvr_clock_ns/us/ms read CLOCK_MONOTONIC: timeouts, intervals, rates and deadlines (it never
 * steps). kvr_clock_wall_ms/us read CLOCK_REALTIME: only for values that leave the process as
 * timestamps (the start time /metrics reports, a FilterUpdate's send time, lag against a
 * peer's clock); never subtract two of them to time something.
 */
#ifndef KVR_BASE_CLOCK_H
#define KVR_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t kvr_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvr_clock_us(void)
{
    return kvr_clock_ns() / 1000;
}

static inline uint64_t kvr_clock_ms(void)
{
    return kvr_clock_ns() / 1000000;
}

/*
 * CLOCK_MONOTONIC_COARSE, in ms: the clock as of the last timer tick, read without the TSC
 * (a few ns instead of 30-50 in a VM). It is never ahead of kvr_clock_ms and at most a tick
 * (1-4 ms) behind. For activity stamps that deadlines are later measured from with
 * kvr_clock_ms: `now - stamp` never wraps, and a deadline fires at most a tick early. The
 * per-request stamps of the HTTP/1.1 path use it (docs/dataplane.md, "Page faults, the
 * store lock, the clock and the scheduler").
 */
static inline uint64_t kvr_clock_coarse_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

static inline uint64_t kvr_clock_wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static inline uint64_t kvr_clock_wall_ms(void)
{
    return kvr_clock_wall_us() / 1000;
}

#endif
