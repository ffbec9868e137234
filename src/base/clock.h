/*
 * clock.h — monotonic time for timeouts, intervals and rates (never wall time, which steps).
 */
#ifndef KVR_BASE_CLOCK_H
#define KVR_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t kvr_clock_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static inline uint64_t kvr_clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#endif
