/* metrics.c — see metrics.h. */
#include "io/metrics.h"

#include "core/relay.h"
#include "shm/relay_sh.h"
#include "shm/stats.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The dimensions of the HTTP families; api.c counts into them by index. */
const char *const kvr_http_method_names[KVR_HTTP_METHODS] = {"GET", "PUT", "HEAD", "DELETE", "other"};
const int kvr_http_status_codes[KVR_HTTP_STATUSES] = {200, 201, 400, 401, 404, 405, 409, 411,
                                                      413, 431, 500, 501, 503, 507, 0, -1};
const double kvr_http_bucket_bounds[KVR_HTTP_BUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                         0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0};

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} out_t;

static void emit(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(out_t *o, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (o->oom)
        return;
    for (;;) {
        va_start(ap, fmt);
        n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->oom = 1;
            return;
        }
        if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        char *nb = realloc(o->buf, o->cap * 2);
        if (nb == NULL) {
            o->oom = 1;
            return;
        }
        o->buf = nb;
        o->cap *= 2;
    }
}

static uint64_t sum(kvr_store_t *st, unsigned i)
{
    return kvr_store_counter(st, i);
}

static void family(out_t *o, const char *name, const char *type, const char *help)
{
    emit(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void scalar(out_t *o, const char *name, const char *type, const char *help, uint64_t v)
{
    family(o, name, type, help);
    emit(o, "%s %llu\n", name, (unsigned long long)v);
}

/* The counters of shm/stats.h's tables that have a metric name, each as one counter family. */
typedef struct {
    unsigned slot;
    const char *name, *labels, *help;
} counter_row_t;

#define ST_ROW_(id, slots, metric, help) {KVR_ST_##id, metric, "", help},
static const counter_row_t stats_rows[] = {KVR_STATS_TABLE(ST_ROW_)};
#undef ST_ROW_
#define RC_ROW_(id, metric, labels, help) {KVR_ST_RELAY + KVR_RC_##id, metric, labels, help},
static const counter_row_t relay_rows[] = {KVR_RELAY_STATS_TABLE(RC_ROW_)};
#undef RC_ROW_
#define KC_ROW_(id, metric, labels, help) {KVR_ST_KVEV + KVR_KC_##id, metric, labels, help},
static const counter_row_t kvev_rows[] = {KVR_KVEV_STATS_TABLE(KC_ROW_)};
#undef KC_ROW_

/* A row without help continues the family of the row before it (another label set). */
static void counters(out_t *o, kvr_store_t *st, const counter_row_t *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (rows[i].name == NULL)
            continue;
        if (rows[i].help != NULL)
            family(o, rows[i].name, "counter", rows[i].help);
        emit(o, "%s%s %llu\n", rows[i].name, rows[i].labels, (unsigned long long)sum(st, rows[i].slot));
    }
}

/* A histogram kept as KVR_PUB_BUCKETS buckets, the sum in us and the count from slot base. */
static void histogram(out_t *o, kvr_store_t *st, const char *name, const char *help, unsigned base)
{
    uint64_t cum = 0, count = sum(st, base + KVR_PUB_BUCKETS + 1);

    family(o, name, "histogram", help);
    for (unsigned b = 0; b < KVR_PUB_BUCKETS; b++) {
        cum += sum(st, base + b);
        emit(o, "%s_bucket{le=\"%g\"} %llu\n", name, (double)kvr_pub_bucket_us[b] / 1e6, (unsigned long long)cum);
    }
    emit(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)count);
    emit(o, "%s_sum %.6f\n", name, (double)sum(st, base + KVR_PUB_BUCKETS) / 1e6);
    emit(o, "%s_count %llu\n", name, (unsigned long long)count);
}

static const char *const stream_names[KVR_STREAM_TYPES] = {"catalog", "pool", "readiness", "load", "serving_load"};

/*
 * The relay's families, under the Dynamo relay's own names (docs/relay-contract.md), plus ours. The
 * reference's gauges whose names end in _count are declared untyped: promtool refuses a
 * typed gauge with that suffix, and untyped samples are scraped and queried alike, so
 * existing dashboards and alerts keep working.
 */
static void render_relay(out_t *o, kvr_seg_t *seg, kvr_store_t *st, const kvr_seg_status_t *ss)
{
    kvr_relay_status_t rs;
    uint64_t gen;
    int pub_up = ss->publisher_running != 0;

    kvr_relay_status(seg, &rs);
    gen = rs.generation;
    family(o, "kv_dc_relay_subscribers", "gauge", "Current subscribers, by stream.");
    for (int t = 0; t < KVR_STREAM_TYPES; t++)
        emit(o, "kv_dc_relay_subscribers{stream=\"%s\"} %u\n", stream_names[t], rs.active[t]);
    counters(o, st, relay_rows, KVR_ARRAY_SIZE(relay_rows));
    scalar(o, "kv_dc_relay_catalog_pool_count", "untyped", "Pools in the catalog (the admin's view: every pool).",
           gen != 0 && pub_up ? rs.pools : 0);
    scalar(o, "kv_dc_relay_requested_publication_hub_count", "untyped", "Hubs requested by at least one subscriber.",
           rs.active[KVR_STREAM_POOL] > 0);
    scalar(o, "kv_dc_relay_initialized_publication_hub_count", "untyped", "Hubs holding a filter mirror.", gen != 0 && pub_up);
    scalar(o, "kv_dc_relay_ready_publication_hub_count", "untyped", "Hubs with a contiguous ready mirror.", gen != 0 && pub_up);
    scalar(o, "kv_dc_relay_idle_publication_hub_count", "untyped", "Ready hubs with no subscribers.",
           gen != 0 && pub_up && rs.active[KVR_STREAM_POOL] == 0);
    scalar(o, "kv_dc_relay_terminal_publication_failures_total", "counter",
           "Generations fenced after a terminal publication failure.", 0);
    family(o, "kv_dc_relay_serving_topology_count", "untyped", "Topology entries by state.");
    emit(o, "kv_dc_relay_serving_topology_count{state=\"ready\"} 0\n"
            "kv_dc_relay_serving_topology_count{state=\"unavailable\"} 0\n"
            "kv_dc_relay_serving_topology_count{state=\"unknown\"} 0\n");
    scalar(o, "kv_dc_relay_degraded_load_coverage_pool_count", "untyped", "Pools with observed < expected ranks.", 0);
    family(o, "kv_dc_relay_tls_expiry_timestamp_seconds", "gauge", "Obsolete (TLS-era); 0 without TLS.");
    emit(o, "kv_dc_relay_tls_expiry_timestamp_seconds{material=\"server_cert\"} 0\n"
            "kv_dc_relay_tls_expiry_timestamp_seconds{material=\"client_ca\"} 0\n");

    family(o, "kvrelay_relay_streams_opened_total", "counter", "Relay streams admitted, by stream.");
    for (int t = 0; t < KVR_STREAM_TYPES; t++)
        emit(o, "kvrelay_relay_streams_opened_total{stream=\"%s\"} %llu\n", stream_names[t],
             (unsigned long long)sum(st, KVR_ST_RELAY_OPENED + (unsigned)t));
    scalar(o, "kvrelay_relay_subscriber_lag_frames", "gauge",
           "Frames the slowest live pool subscriber is behind the published sequence (the publisher samples it at each publication and scan).",
           sum(st, KVR_ST_RELAY_SUB_LAG));
    scalar(o, "kvrelay_relay_publication_coalesce", "gauge",
           "How many times --publication-delay a delta waits, the threshold lifted, because subscribers fell behind (1: the configured boundary).",
           sum(st, KVR_ST_RELAY_COALESCE));
    scalar(o, "kvrelay_relay_generation", "gauge", "layout_generation being published.", gen);
    scalar(o, "kvrelay_relay_published_sequence", "gauge", "Last published delta sequence, summed over the pools.",
           rs.published_seq);
    scalar(o, "kvrelay_publisher_restarts_total", "counter", "Publishers replaced after they died.",
           ss->publisher_restarts);
    histogram(o, st, "kvrelay_relay_publication_latency_seconds",
              "From the first pending change-log event (dated when the publisher saw it, or, if it came during a timed sleep, from that sleep's start) to the publication of its delta.",
              KVR_ST_PUB_HIST);
}

/* The KV events (docs/kv-events.md): zeros while they are off. */
static void render_kv_events(out_t *o, kvr_store_t *st)
{
    counters(o, st, kvev_rows, KVR_ARRAY_SIZE(kvev_rows));
    scalar(o, "kvrelay_kv_events_buffer_batches", "gauge", "KV event batches kept for replay.",
           sum(st, KVR_ST_KVEV_BUF_BATCHES));
    scalar(o, "kvrelay_kv_events_buffer_bytes", "gauge", "Bytes of the KV event batches kept for replay.",
           sum(st, KVR_ST_KVEV_BUF_BYTES));
    histogram(o, st, "kvrelay_kv_events_latency_seconds",
              "From the first change-log event of a KV event batch (dated as for the relay's publication latency) to the batch sent.",
              KVR_ST_KVEV_HIST);
}

/* The store's families split by namespace, for the namespaces the tenants table lists. */
static void render_namespaces(out_t *o, kvr_store_t *st, const char *const names[KVR_NS_MAX],
                              const uint64_t quota[KVR_NS_MAX])
{
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } rows[] = {
#define NS_ROW(n, t, h, f) {"kvrelay_namespace_" n, t, h, offsetof(kvr_store_ns_stats_t, f)}
        NS_ROW("blocks", "gauge", "Resident blocks of the namespace.", blocks),
        NS_ROW("resident_bytes", "gauge", "Payload bytes of the namespace's resident blocks.", resident_bytes),
        NS_ROW("logical_bytes", "gauge", "The namespace's payload bytes times references.", logical_bytes),
        NS_ROW("get_hits_total", "counter", "GETs of the namespace that found their block.", get_hits),
        NS_ROW("get_misses_total", "counter", "GETs of the namespace that found nothing.", get_misses),
        NS_ROW("puts_new_total", "counter", "PUTs of the namespace that stored a new block.", put_new),
        NS_ROW("dedup_hits_total", "counter", "PUTs of the namespace answered by a block it held.", put_dedup),
        NS_ROW("evictions_total", "counter", "The namespace's blocks evicted to make room.", evictions),
        NS_ROW("evicted_bytes_total", "counter", "Payload bytes of the namespace's evicted blocks.", evicted_bytes),
        NS_ROW("deletes_total", "counter", "DELETEs of the namespace that dropped a reference.", deletes),
#undef NS_ROW
    };
    kvr_store_ns_stats_t s[KVR_NS_MAX];
    uint64_t v;

    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++)
        if (names[ns] != NULL)
            kvr_store_ns_stats(st, (uint16_t)ns, &s[ns]);
    for (size_t r = 0; r < KVR_ARRAY_SIZE(rows); r++) {
        family(o, rows[r].name, rows[r].type, rows[r].help);
        for (unsigned ns = 0; ns < KVR_NS_MAX; ns++) {
            if (names[ns] == NULL)
                continue;
            memcpy(&v, (const char *)&s[ns] + rows[r].off, sizeof(v));
            emit(o, "%s{namespace=\"%s\"} %llu\n", rows[r].name, names[ns], (unsigned long long)v);
        }
    }
    family(o, "kvrelay_namespace_quota_bytes", "gauge", "The namespace's memory= quota in bytes (0: none).");
    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++)
        if (names[ns] != NULL)
            emit(o, "kvrelay_namespace_quota_bytes{namespace=\"%s\"} %llu\n", names[ns],
                 (unsigned long long)quota[ns]);
    if (st->dx.sh == NULL)
        return;
    family(o, "kvrelay_namespace_disk_blocks", "gauge", "Blocks of the namespace on the disk tier.");
    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++)
        if (names[ns] != NULL)
            emit(o, "kvrelay_namespace_disk_blocks{namespace=\"%s\"} %llu\n", names[ns],
                 (unsigned long long)kvr_dindex_ns_live(&st->dx, (uint16_t)ns));
    family(o, "kvrelay_namespace_disk_bytes", "gauge", "Payload bytes of the namespace's blocks on the disk tier.");
    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++)
        if (names[ns] != NULL)
            emit(o, "kvrelay_namespace_disk_bytes{namespace=\"%s\"} %llu\n", names[ns],
                 (unsigned long long)kvr_dindex_ns_bytes(&st->dx, (uint16_t)ns));
    family(o, "kvrelay_namespace_ssd_quota_bytes", "gauge", "The namespace's ssd= quota in bytes (0: none).");
    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++)
        if (names[ns] != NULL)
            emit(o, "kvrelay_namespace_ssd_quota_bytes{namespace=\"%s\"} %llu\n", names[ns],
                 (unsigned long long)kvr_store_ssd_quota(st, (uint16_t)ns));
}

char *kvr_metrics_render(kvr_seg_t *seg, kvr_store_t *st, const char *const ns_names[KVR_NS_MAX],
                         const uint64_t ns_quota[KVR_NS_MAX], size_t *len)
{
    out_t o = {malloc(16384), 0, 16384, 0};
    kvr_store_stats_t s;
    kvr_seg_status_t ss;

    if (o.buf == NULL)
        return NULL;
    kvr_store_stats(st, &s);
    kvr_seg_status(seg, &ss);

    family(&o, "kvrelay_http_requests_total", "counter", "HTTP requests served, by method and status.");
    for (unsigned m = 0; m < KVR_HTTP_METHODS; m++)
        for (unsigned k = 0; k < KVR_HTTP_STATUSES - 1; k++) {
            uint64_t v = sum(st, KVR_ST_HTTP_REQ + m * KVR_HTTP_STATUSES + k);
            if (v == 0 && !(m == 0 && k == 0))
                continue;
            if (kvr_http_status_codes[k] > 0)
                emit(&o, "kvrelay_http_requests_total{method=\"%s\",status=\"%d\"} %llu\n", kvr_http_method_names[m],
                     kvr_http_status_codes[k], (unsigned long long)v);
            else
                emit(&o, "kvrelay_http_requests_total{method=\"%s\",status=\"other\"} %llu\n", kvr_http_method_names[m],
                     (unsigned long long)v);
        }

    family(&o, "kvrelay_http_request_duration_seconds", "histogram",
           "Time from the request's arrival at the handler to its disposal, by method.");
    for (unsigned m = 0; m < KVR_HTTP_METHODS; m++) {
        unsigned base = KVR_ST_HTTP_HIST + m * (KVR_HTTP_BUCKETS + 2);
        uint64_t cum = 0, count = sum(st, base + KVR_HTTP_BUCKETS + 1);
        for (unsigned b = 0; b < KVR_HTTP_BUCKETS; b++) {
            cum += sum(st, base + b);
            emit(&o, "kvrelay_http_request_duration_seconds_bucket{method=\"%s\",le=\"%g\"} %llu\n",
                 kvr_http_method_names[m], kvr_http_bucket_bounds[b], (unsigned long long)cum);
        }
        emit(&o, "kvrelay_http_request_duration_seconds_bucket{method=\"%s\",le=\"+Inf\"} %llu\n",
             kvr_http_method_names[m], (unsigned long long)count);
        emit(&o, "kvrelay_http_request_duration_seconds_sum{method=\"%s\"} %.6f\n", kvr_http_method_names[m],
             (double)sum(st, base + KVR_HTTP_BUCKETS) / 1e6);
        emit(&o, "kvrelay_http_request_duration_seconds_count{method=\"%s\"} %llu\n", kvr_http_method_names[m],
             (unsigned long long)count);
    }

    counters(&o, st, stats_rows, KVR_ARRAY_SIZE(stats_rows));
    scalar(&o, "kvrelay_blocks", "gauge", "Resident blocks.", s.unique_blocks);
    scalar(&o, "kvrelay_refs", "gauge", "Sum of the resident blocks' reference counts.", s.total_refs);
    scalar(&o, "kvrelay_resident_bytes", "gauge", "Payload bytes of resident blocks.", s.resident_bytes);
    scalar(&o, "kvrelay_logical_bytes", "gauge", "Payload bytes times references.", s.logical_bytes);
    scalar(&o, "kvrelay_capacity_bytes", "gauge", "Block arena capacity (--memory).", s.capacity_bytes);
    scalar(&o, "kvrelay_free_bytes", "gauge", "Arena bytes not held by any block.", s.free_pages * (s.capacity_bytes / (s.total_pages ? s.total_pages : 1)));
    scalar(&o, "kvrelay_pinned_blocks", "gauge", "Blocks pinned by GETs in flight.", s.pinned_blocks);
    scalar(&o, "kvrelay_put_reservations", "gauge", "PUT reservations held: bodies being received into the arena.",
           sum(st, KVR_ST_PUT_RESERVATIONS));
    scalar(&o, "kvrelay_put_reserved_bytes", "gauge", "Bytes of the PUT reservations held (the in-flight budget in use).",
           sum(st, KVR_ST_PUT_RESERVED_BYTES));
    scalar(&o, "kvrelay_put_budget_waiting", "gauge", "PUTs waiting now for their worker's in-flight budget.",
           sum(st, KVR_ST_PUT_BUDGET_WAITING));
    scalar(&o, "kvrelay_store_repairs_total", "counter", "Store repairs after a process died.", s.repairs);
    scalar(&o, "kvrelay_change_log_dropped_total", "counter", "Change-log events dropped on overflow (then resynced).",
           s.log_dropped);
    scalar(&o, "kvrelay_workers", "gauge", "Worker processes running.",
           ss.workers_running);
    scalar(&o, "kvrelay_worker_restarts_total", "counter", "Workers replaced after they died.",
           ss.worker_restarts);
    scalar(&o, "kvrelay_hangs_killed_total", "counter",
           "Workers and publishers the watchdog found hung (--hang-timeout) and killed.", ss.hangs_killed);
    family(&o, "kvrelay_start_time_seconds", "gauge", "When the supervisor started, in seconds since the Unix epoch.");
    emit(&o, "kvrelay_start_time_seconds %.3f\n", (double)ss.started_unix_ms / 1e3);
    family(&o, "kvrelay_worker_connections", "gauge",
           "Client connections each serving worker holds, by process slot (workers take turns accepting by it).");
    for (int i = 0; i < KVR_MAX_PROCS; i++) {
        uint32_t conns;
        uint64_t hb;
        if (kvr_seg_worker_load(seg, i, &conns, &hb))
            emit(&o, "kvrelay_worker_connections{slot=\"%d\"} %u\n", i, conns);
    }
    scalar(&o, "kvrelay_hugepages", "gauge", "1 when the segment is backed by hugetlb pages.",
           ss.hugetlb);
    if (st->dx.sh != NULL) { /* the disk tier's gauges; its counters are rows of the table */
        scalar(&o, "kvrelay_disk_blocks", "gauge", "Blocks held by the disk tier.", kvr_dindex_live(&st->dx));
        scalar(&o, "kvrelay_disk_bytes", "gauge", "Payload bytes of the blocks held by the disk tier.",
               kvr_dindex_live_bytes(&st->dx));
        histogram(&o, st, "kvrelay_disk_read_seconds",
                  "Reads from the disk tier that served a GET, from the GET's reservation to the record read and checked.",
                  KVR_ST_DISK_READ_HIST);
        histogram(&o, st, "kvrelay_disk_write_seconds",
                  "The disk writer's record writes that completed, from submission to completion.", KVR_ST_DISK_WRITE_HIST);
    }
    render_namespaces(&o, st, ns_names, ns_quota);
    if (ss.ckf_buckets != 0)
        render_relay(&o, seg, st, &ss);
    render_kv_events(&o, st);
    if (o.oom) {
        free(o.buf);
        return NULL;
    }
    *len = o.len;
    return o.buf;
}
