/*
 * metrics.h — the Prometheus text exposition of /metrics (format 0.0.4, kvrelay_ prefix).
 *
 * Counters are summed over every process's stats block (and the retired block of dead
 * ones), so they never go backwards across worker restarts.
 */
#ifndef KVR_IO_METRICS_H
#define KVR_IO_METRICS_H

#include "core/store.h"
#include "shm/stats.h"

/* Metric dimensions: method index order and status list (metrics.c renders them). */
#define KVR_HTTP_METHODS  5 /* GET PUT HEAD DELETE other */
#define KVR_HTTP_STATUSES 16
#define KVR_HTTP_BUCKETS  16
static_assert(KVR_ST_HTTP_REQ + KVR_HTTP_METHODS * KVR_HTTP_STATUSES <= KVR_ST_HTTP_HIST, "HTTP counters");
static_assert(KVR_ST_HTTP_HIST + KVR_HTTP_METHODS * (KVR_HTTP_BUCKETS + 2) <= KVR_ST_RELAY, "HTTP histograms");
extern const char *const kvr_http_method_names[KVR_HTTP_METHODS];
extern const int kvr_http_status_codes[KVR_HTTP_STATUSES];
extern const double kvr_http_bucket_bounds[KVR_HTTP_BUCKETS];

/* Renders the page into a malloc'd buffer (caller frees); NULL on allocation failure.
 * ns_names[id] names each namespace the tenants table lists (NULL for the others): their
 * kvrelay_namespace_* series, one per listed namespace. */
char *kvr_metrics_render(kvr_seg_t *seg, kvr_store_t *store, const char *const ns_names[KVR_NS_MAX],
                         const uint64_t ns_quota[KVR_NS_MAX], size_t *len);

#endif
