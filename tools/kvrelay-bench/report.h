/*
 * report.h — the run's results (report.c): the table or summary line on stdout and the JSON
 * file, from the statistics merged over every thread.
 */
#ifndef KVB_REPORT_H
#define KVB_REPORT_H

#include "worker.h"

typedef struct kvb_totals {
    uint64_t requests, ok, errors, bytes, miss_ok;
    uint64_t err[EK_N];
    kvb_hist_t lat;
} kvb_totals_t;

/* The totals over every operation of s. */
void kvb_sum_totals(const kvb_stats_t *s, kvb_totals_t *t);

/* What the reports need, filled by main once the threads have been joined. */
typedef struct kvb_run {
    kvb_worker_t **ws; /* the threads, for their first errors and the relay */
    int nw;
    const kvb_stats_t *st, *pre;                    /* merged statistics: the measured phase, the preload */
    const kvb_totals_t *t, *tp;                     /* their totals */
    double elapsed, pre_s;                          /* seconds measured, seconds of preload */
    double cpu_user, cpu_sys;                       /* client CPU over the measured time */
    uint64_t relay_err, ended, unpublished, failed; /* relay: its errors and their kinds */
    uint64_t all_errors;
    int rc; /* the exit status */
} kvb_run_t;

void kvb_report_print(const kvb_run_t *run);
void kvb_report_json(const char *path, const kvb_run_t *run);

#endif
