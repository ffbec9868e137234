/*
 * metrics.h — the Prometheus text exposition of /metrics (format 0.0.4, kvrelay_ prefix).
 *
 * Counters are summed over every process's stats block (and the retired block of dead
 * ones), so they never go backwards across worker restarts.
 */
#ifndef KVR_IO_METRICS_H
#define KVR_IO_METRICS_H

#include "core/store.h"

/* Renders the page into a malloc'd buffer (caller frees); NULL on allocation failure. */
char *kvr_metrics_render(kvr_seg_t *seg, kvr_store_t *store, size_t *len);

#endif
