/*
 * hist.h — log-bucketed latency histograms (1/128 relative precision) and the statistics
 * each load thread keeps, merged by main at the end of the run.
 */
#ifndef KVB_HIST_H
#define KVB_HIST_H

#include "kvb.h"

#define KVB_HIST_SUB 7
#define KVB_HIST_N   ((64 - KVB_HIST_SUB + 1) << KVB_HIST_SUB)

typedef struct kvb_hist {
    uint64_t n, max, sum;
    uint64_t b[KVB_HIST_N];
} kvb_hist_t;

void kvb_hist_add(kvb_hist_t *h, uint64_t v);
void kvb_hist_merge(kvb_hist_t *d, const kvb_hist_t *s);
/* The value at quantile q (0..1): the middle of its bucket, never above the maximum. */
uint64_t kvb_hist_quantile(const kvb_hist_t *h, double q);

typedef struct kvb_stats {
    uint64_t ok[OP_N]; /* successes, misses included when --misses ok */
    uint64_t miss_ok[OP_N];
    uint64_t bytes[OP_N]; /* payload bytes of successes: PUT bodies, verified GET bodies */
    uint64_t err[OP_N][EK_N];
    uint64_t status[OP_N][600]; /* HTTP status codes seen (HTTP only) */
    kvb_hist_t lat[OP_N];       /* latency of successes, ns */
} kvb_stats_t;

void kvb_stats_merge(kvb_stats_t *d, const kvb_stats_t *s);

#endif
