/*
 * hist.c — log-bucketed histogram (HDR-like): values below 128 have a bucket each; above,
 * every power of two is split into 128 buckets, so a bucket is at most 1/128 (0.8 %) of its
 * values wide. Fixed size (58 x 128 counters), no allocation, O(1) add.
 */
#include "hist.h"

static inline unsigned hist_index(uint64_t v)
{
    unsigned e;
    if (v < (1u << KVB_HIST_SUB))
        return (unsigned)v;
    e = 63u - (unsigned)__builtin_clzll(v); /* >= KVB_HIST_SUB */
    return ((e - KVB_HIST_SUB + 1) << KVB_HIST_SUB) + (unsigned)((v >> (e - KVB_HIST_SUB)) - (1u << KVB_HIST_SUB));
}

/* The middle of bucket i. */
static uint64_t hist_value(unsigned i)
{
    unsigned g = i >> KVB_HIST_SUB, m = i & ((1u << KVB_HIST_SUB) - 1), e;
    uint64_t lo, width;
    if (g == 0)
        return i;
    e = g + KVB_HIST_SUB - 1;
    lo = ((uint64_t)(1u << KVB_HIST_SUB) + m) << (e - KVB_HIST_SUB);
    width = 1ull << (e - KVB_HIST_SUB);
    return lo + (width - 1) / 2;
}

void kvb_hist_add(kvb_hist_t *h, uint64_t v)
{
    h->b[hist_index(v)]++;
    h->n++;
    h->sum += v;
    if (v > h->max)
        h->max = v;
}

void kvb_hist_merge(kvb_hist_t *d, const kvb_hist_t *s)
{
    if (s->n == 0)
        return;
    for (unsigned i = 0; i < KVB_HIST_N; i++)
        d->b[i] += s->b[i];
    d->n += s->n;
    d->sum += s->sum;
    if (s->max > d->max)
        d->max = s->max;
}

uint64_t kvb_hist_quantile(const kvb_hist_t *h, double q)
{
    uint64_t rank, seen = 0;
    if (h->n == 0)
        return 0;
    if (q >= 1.0)
        return h->max;
    rank = (uint64_t)(q * (double)h->n);
    if ((double)rank < q * (double)h->n)
        rank++;
    if (rank == 0)
        rank = 1;
    for (unsigned i = 0; i < KVB_HIST_N; i++) {
        seen += h->b[i];
        if (seen >= rank) {
            uint64_t v = hist_value(i);
            return v > h->max ? h->max : v;
        }
    }
    return h->max;
}

void kvb_stats_merge(kvb_stats_t *d, const kvb_stats_t *s)
{
    for (int o = 0; o < OP_N; o++) {
        d->ok[o] += s->ok[o];
        d->miss_ok[o] += s->miss_ok[o];
        d->bytes[o] += s->bytes[o];
        for (int k = 0; k < EK_N; k++)
            d->err[o][k] += s->err[o][k];
        for (int c = 0; c < 600; c++)
            d->status[o][c] += s->status[o][c];
        kvb_hist_merge(&d->lat[o], &s->lat[o]);
    }
}
