/*
 * stats.h — per-process counter blocks in shared memory, summed on read.
 *
 * Each process owns one block (its proc slot) and is the only writer of it, so increments
 * are plain relaxed load+store pairs, no atomic read-modify-write and no shared cache line:
 * blocks are 4 KiB, cache-line aligned. Readers sum every block with relaxed loads.
 * When the supervisor reaps a dead process it folds that block into the retired block
 * (KVR_MAX_PROCS), so totals never go backwards; the levels (gauges: what a process holds now,
 * KVR_ST_LEVELS on) are zeroed instead, so a dead worker's level does not linger.
 */
#ifndef KVR_SHM_STATS_H
#define KVR_SHM_STATS_H

#include "base/barrier.h"
#include "common.h"

/*
 * Every counter, in one table, in slot order (memcached's thread stats are declared the same
 * way): X(id, slots, metric, help). KVR_ST_<id> is the counter's first slot and it spans
 * `slots` of them; io/metrics.c exports each row with a metric name as a Prometheus counter
 * of that name and help, and renders the others (arrays, histograms) itself. SPARE rows keep
 * room for a group to grow without moving the next group: the layout is the segment's (the
 * slots of a running server's processes), so the static_asserts below pin it.
 */
#define KVR_STATS_TABLE(X) \
    /* the store (core/store.c) */ \
    X(PUT_NEW, 1, "kvrelay_put_new_total", "PUTs that stored a new block.") \
    X(PUT_DEDUP, 1, "kvrelay_dedup_hits_total", "PUTs that found the block resident.") \
    X(PUT_CONFLICT, 1, "kvrelay_put_conflicts_total", "PUTs refused: another length under the key.") \
    X(PUT_NOSPACE, 1, "kvrelay_put_nospace_total", "PUTs refused: no room even after eviction.") \
    X(GET_HIT, 1, "kvrelay_get_hits_total", "GETs that found the block (in RAM, or on the disk tier: kvrelay_disk_reads_total).") \
    X(GET_MISS, 1, "kvrelay_get_misses_total", "GETs that did not, in either tier.") \
    X(DELETES, 1, "kvrelay_deletes_total", "DELETEs of resident blocks.") \
    X(EVICTIONS, 1, "kvrelay_evictions_total", "Blocks evicted to make room.") \
    X(EVICTED_BYTES, 1, "kvrelay_evicted_bytes_total", "Payload bytes evicted.") \
    X(REPAIRS, 1, NULL, NULL) /* kvrelay_store_repairs_total comes from the store's own count */ \
    X(STORE_SPARE, 6, NULL, NULL) \
    /* HTTP (io/api.c) */ \
    X(HTTP_BYTES_IN, 1, "kvrelay_http_received_bytes_total", "Request body bytes received.") \
    X(HTTP_BYTES_OUT, 1, "kvrelay_http_sent_bytes_total", "Response bytes sent.") \
    X(HTTP_SPARE, 2, NULL, NULL) \
    X(HTTP_REQ, 80, NULL, NULL)  /* KVR_HTTP_METHODS x KVR_HTTP_STATUSES (io/api.h) */ \
    X(HTTP_HIST, 90, NULL, NULL) /* KVR_HTTP_METHODS x (KVR_HTTP_BUCKETS + 2: sum in us, count) */ \
    /* the HTTP/1.1 server (io/h1_wait.c, io/h1_accept.c) */ \
    X(PUT_BUDGET_WAITS, 1, "kvrelay_put_budget_waits_total", \
      "PUTs that waited for their worker's in-flight budget (--max-inflight-bytes).") \
    X(ACCEPT_PAUSES, 1, "kvrelay_accept_pauses_total", \
      "Times a worker stopped accepting: at --max-connections with none idle, or out of descriptors.") \
    X(IDLE_RECLAIMED, 1, "kvrelay_idle_connections_reclaimed_total", \
      "Idle connections closed to make room (--max-connections, out of descriptors).") \
    X(HTTP_SPARE2, 7, NULL, NULL) \
    /* the relay: KVR_ST_RELAY + KVR_RC_<id> (KVR_RELAY_STATS_TABLE) */ \
    X(RELAY, KVR_RC_COUNT, NULL, NULL) \
    X(RELAY_SPARE, 20 - KVR_RC_COUNT, NULL, NULL) \
    /* publication latency histogram (proc/publisher.c): KVR_PUB_BUCKETS + sum (us) + count */ \
    X(PUB_HIST, KVR_PUB_BUCKETS + 2, NULL, NULL) \
    /* relay streams admitted, by type: + KVR_STREAM_* (io/grpc_relay.c; metrics.c renders it) */ \
    X(RELAY_OPENED, 5, NULL, NULL) \
    /* the KV events (proc/publisher_events.c): KVR_ST_KVEV + KVR_KC_<id> (KVR_KVEV_STATS_TABLE), \
     * then their latency histogram: KVR_PUB_BUCKETS + sum (us) + count */ \
    X(KVEV, KVR_KC_COUNT, NULL, NULL) \
    X(KVEV_SPARE, 12 - KVR_KC_COUNT, NULL, NULL) \
    X(KVEV_HIST, KVR_PUB_BUCKETS + 2, NULL, NULL) \
    /* the disk tier (docs/ssd-tier.md, "Metrics"): a worker's reads (io/api_disk.c), evictions \
     * as any process makes them (core/store_evict.c), the disk writer's writes as the publisher \
     * copies them from it (proc/publisher_ssd.c) */ \
    X(DISK_READS, 1, "kvrelay_disk_reads_total", "GETs served by a read from the disk tier (promotions to RAM).") \
    X(DISK_READ_BYTES, 1, "kvrelay_disk_read_bytes_total", "Payload bytes of those reads.") \
    X(DISK_READ_ERRORS, 1, "kvrelay_disk_read_errors_total", \
      "Reads from the disk tier that failed (I/O error, end of file): answered 404.") \
    X(DISK_READ_BAD, 1, "kvrelay_disk_read_bad_total", \
      "Records read whose header, key or checksum did not match (torn, stale, corrupt): answered 404.") \
    X(DISK_READ_BUSY, 1, "kvrelay_disk_read_busy_total", \
      "GETs refused with 503: the worker had its most reads from the disk tier in flight.") \
    X(DISK_ADMIT_REJECTS, 1, "kvrelay_disk_admission_rejects_total", \
      "Blocks evicted from RAM that the disk tier did not admit (never read since stored).") \
    X(DISK_DROPS, 1, "kvrelay_disk_demotion_drops_total", \
      "Admitted blocks evicted from RAM before the disk writer copied them.") \
    X(DISK_WRITES, 1, "kvrelay_disk_writes_total", "Blocks the disk writer copied to the disk tier.") \
    X(DISK_WRITE_BYTES, 1, "kvrelay_disk_write_bytes_total", "Payload bytes of those copies.") \
    X(DISK_WRITE_ERRORS, 1, "kvrelay_disk_write_errors_total", \
      "Copies to the disk tier that failed (I/O error, short write); the block stays in RAM only.") \
    X(DISK_EVICTIONS, 1, "kvrelay_disk_evictions_total", \
      "Blocks dropped from the disk tier with the oldest page, recycled for new writes.") \
    /* their latency histograms: KVR_PUB_BUCKETS + sum (us) + count; a worker's read from \
     * submission to completion, the writer's record write likewise (copied as its counts) */ \
    X(DISK_READ_HIST, KVR_PUB_BUCKETS + 2, NULL, NULL) \
    X(DISK_WRITE_HIST, KVR_PUB_BUCKETS + 2, NULL, NULL) \
    X(DISK_QUOTA_EVICTIONS, 1, "kvrelay_disk_quota_evictions_total", \
      "Blocks dropped from the disk tier to keep a namespace within its ssd= quota.") \
    X(DISK_QUOTA_REJECTS, 1, "kvrelay_disk_quota_rejects_total", \
      "Blocks not copied to the disk tier: larger than their namespace's ssd= quota.") \
    X(DISK_COMPACTED_PAGES, 1, "kvrelay_disk_compacted_pages_total", \
      "Pages whose live blocks were copied to the write head before the page was recycled.") \
    X(DISK_COMPACTED, 1, "kvrelay_disk_compacted_blocks_total", "Blocks those compactions copied.") \
    X(DISK_SYNCS, 1, "kvrelay_disk_syncs_total", \
      "fdatasyncs of the disk tier's file: when the writer runs out of work, at least every --ssd-sync-interval while it writes.") \
    /* Levels (gauges), from here to the end: each is its process's own value now, so a reap \
     * zeroes them instead of folding them into the retired block (kvr_stats_retire). */ \
    X(PUT_RESERVATIONS, 1, NULL, NULL)   /* io/api.c: PUT reservations held */ \
    X(PUT_RESERVED_BYTES, 1, NULL, NULL) /* io/api.c: their bytes */ \
    X(PUT_BUDGET_WAITING, 1, NULL, NULL) /* io/h1: PUTs on the budget's wait queue */ \
    X(RELAY_SUB_LAG, 1, NULL, NULL)      /* publisher: frames the slowest live subscriber is behind */ \
    X(KVEV_BUF_BATCHES, 1, NULL, NULL)   /* publisher: event batches kept for replay */ \
    X(KVEV_BUF_BYTES, 1, NULL, NULL)     /* publisher: their bytes */ \
    X(RELAY_COALESCE, 1, NULL, NULL)     /* publisher: its publication boundary's stretch (1: none) */ \
    X(LEVEL_SPARE, 1, NULL, NULL)

/*
 * The relay's counters, KVR_ST_RELAY + KVR_RC_<id>: X(id, metric, labels, help), who counts in
 * the comment. Rows with a metric are exported by io/metrics.c as `metric{labels}`.
 */
#define KVR_RELAY_STATS_TABLE(X) \
    X(DELTAS, "kvrelay_relay_deltas_published_total", "", "Deltas published.") /* publisher */ \
    X(DELTA_BYTES, "kvrelay_relay_delta_bytes_published_total", "", \
      "Bytes of the published delta messages.")                                                  /* publisher */ \
    X(FRAMES, "kvrelay_relay_frames_sent_total", "", "FilterUpdate frames sent to subscribers.") /* workers */ \
    X(BYTES, "kvrelay_relay_bytes_sent_total", "", "FilterUpdate bytes sent to subscribers.")    /* workers */ \
    X(HEARTBEATS, "kv_dc_relay_pool_heartbeats_total", "", "Pool-stream heartbeats sent.")       /* workers */ \
    X(LAGGED, "kv_dc_relay_subscriber_lagged_total", "", "Streams closed for queue lag.")        /* workers */ \
    X(REJECTED, "kv_dc_relay_subscriber_limit_rejected_total", "{stream=\"all\",scope=\"total\"}", \
      "Admission rejections.")                                                                  /* workers */ \
    X(LOAD_WINDOWS, "kv_dc_relay_load_updates_total", "", "Load windows emitted.")              /* workers */ \
    X(STREAMS_OPENED, NULL, "", NULL)                                                           /* workers: streams admitted */ \
    X(GENERATIONS, "kvrelay_relay_generations_total", "", "Generations started by publishers.") /* publisher */ \
    X(COALESCED, "kvrelay_relay_coalesced_deltas_total", "", \
      "Deltas published past --publication-threshold or --publication-delay because subscribers fell behind.") /* publisher */

/*
 * The KV events' counters, KVR_ST_KVEV + KVR_KC_<id>, all the publisher's: X(id, metric, labels,
 * help), exported by io/metrics.c as `metric{labels}`.
 */
#define KVR_KVEV_STATS_TABLE(X) \
    X(BATCHES, "kvrelay_kv_events_batches_total", "", "KV event batches published.") \
    X(STORED, "kvrelay_kv_events_total", "{type=\"stored\"}", "KV events published, by type.") \
    X(REMOVED, "kvrelay_kv_events_total", "{type=\"removed\"}", NULL) \
    X(CLEARED, "kvrelay_kv_events_total", "{type=\"cleared\"}", NULL) \
    X(BYTES, "kvrelay_kv_events_bytes_total", "", "Payload bytes of the published KV event batches.") \
    X(REPLAYS, "kvrelay_kv_events_replays_total", "", "Replay requests answered from the buffer.") \
    X(RESYNCS, "kvrelay_kv_events_resyncs_total", "", \
      "Replay requests for batches the buffer no longer held, answered with the pool's whole state.") \
    X(BAD_REQUESTS, "kvrelay_kv_events_bad_requests_total", "", "Malformed replay requests (ignored).") \
    X(SEND_ERRORS, "kvrelay_kv_events_send_errors_total", "", \
      "Batches or replay answers ZMQ refused (a replay answer cut short: the subscriber asks again).")

#define KVR_PUB_BUCKETS 12
/* Upper bounds (microseconds) of the publication latency histogram's buckets (shm/stats.c):
 * the publisher counts into them, /metrics exports them. */
extern const uint64_t kvr_pub_bucket_us[KVR_PUB_BUCKETS];

enum {
#define KVR_KC_ENUM_(id, metric, labels, help) KVR_KC_##id,
    KVR_KVEV_STATS_TABLE(KVR_KC_ENUM_)
#undef KVR_KC_ENUM_
        KVR_KC_COUNT
};

enum {
#define KVR_RC_ENUM_(id, metric, labels, help) KVR_RC_##id,
    KVR_RELAY_STATS_TABLE(KVR_RC_ENUM_)
#undef KVR_RC_ENUM_
        KVR_RC_COUNT
};

/* Each row's first slot, then the next row's after its span. */
enum {
#define KVR_ST_ENUM_(id, slots, metric, help) KVR_ST_##id, KVR_ST_##id##_END_ = KVR_ST_##id + (slots)-1,
    KVR_STATS_TABLE(KVR_ST_ENUM_)
#undef KVR_ST_ENUM_
        KVR_ST_USED /* slots the table takes */
};
#define KVR_ST_MAX    512                     /* slots in a block: 4 KiB */
#define KVR_ST_LEVELS KVR_ST_PUT_RESERVATIONS /* the first level: levels run to KVR_ST_USED */

/* The segment's layout: the slots every running process agrees on. */
static_assert(KVR_ST_HTTP_BYTES_IN == 16 && KVR_ST_HTTP_REQ == 20 && KVR_ST_HTTP_HIST == 100, "stats layout");
static_assert(KVR_ST_RELAY == 200 && KVR_ST_PUB_HIST == 220 && KVR_ST_USED <= KVR_ST_MAX, "stats layout");
static_assert(KVR_RC_COUNT <= 20, "relay counters fit their group");
static_assert(KVR_ST_PUT_BUDGET_WAITS == 190 && KVR_ST_RELAY_OPENED == 234 && KVR_ST_KVEV == 239 && KVR_ST_DISK_READS == 265 && KVR_ST_DISK_READ_HIST == 276 && KVR_ST_LEVELS == 309,
              "stats layout");
static_assert(KVR_KC_COUNT <= 12, "the KV events' counters fit their group");

typedef struct {
    uint64_t c[KVR_ST_MAX];
} kvr_stats_block_t;
static_assert(sizeof(kvr_stats_block_t) == 4096, "stats block layout");

/* Only the block's owner calls it: a relaxed load of its own last store, then a relaxed store
 * that readers' relaxed loads (kvr_stats_sum) may see late; a counter pairs with nothing. */
static inline void kvr_stat_add(kvr_stats_block_t *b, unsigned i, uint64_t v)
{
    kvr_atomic_store_relaxed(&b->c[i], kvr_atomic_load_relaxed(&b->c[i]) + v);
}

/* Levels (KVR_ST_LEVELS on) go up and down, by their block's owner alone like counters. */
static inline void kvr_stat_sub(kvr_stats_block_t *b, unsigned i, uint64_t v)
{
    kvr_atomic_store_relaxed(&b->c[i], kvr_atomic_load_relaxed(&b->c[i]) - v);
}

static inline void kvr_stat_set(kvr_stats_block_t *b, unsigned i, uint64_t v)
{
    kvr_atomic_store_relaxed(&b->c[i], v);
}

/* The bucket of a latency of us microseconds: the first whose bound holds it, KVR_PUB_BUCKETS
 * past the last (counted in the sum and the count only, as +Inf). */
static inline unsigned kvr_hist_bucket(uint64_t us)
{
    unsigned b = 0;

    while (b < KVR_PUB_BUCKETS && us > kvr_pub_bucket_us[b])
        b++;
    return b;
}

/* Counts a latency into the histogram at slot base: KVR_PUB_BUCKETS buckets, the sum in us,
 * the count (the block's owner only, as kvr_stat_add). */
static inline void kvr_stat_hist(kvr_stats_block_t *b, unsigned base, uint64_t us)
{
    unsigned k = kvr_hist_bucket(us);

    if (k < KVR_PUB_BUCKETS)
        kvr_stat_add(b, base + k, 1);
    kvr_stat_add(b, base + KVR_PUB_BUCKETS, us);
    kvr_stat_add(b, base + KVR_PUB_BUCKETS + 1, 1);
}

/* Sums counter i over n blocks. */
uint64_t kvr_stats_sum(const kvr_stats_block_t *blocks, unsigned n, unsigned i);

/* Folds the counters of block `from` into `into` and zeroes `from` (reap of a dead process):
 * its levels are zeroed, not folded, since the dead process holds nothing any more. */
void kvr_stats_retire(kvr_stats_block_t *into, kvr_stats_block_t *from);

#endif
