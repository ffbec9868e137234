/*
 * ssdwriter.h — the disk writer: a thread of the publisher process, the one writer of the disk
 * tier's file and of the disk index (docs/ssd-tier.md, "Demotion and admission").
 *
 * It restores the disk index from the file when it starts, then, every round, turns workers'
 * deletes into tombstones, pins admitted blocks near the end of each namespace's LRU list,
 * copies them to the file and indexes the copies, and syncs the file when it runs out of work
 * and at least every sync_ms while it writes. It never makes a PUT wait: it only ever holds the
 * store lock for a pick or a commit, and the blocks it pins are at most `batch` at a time.
 *
 * Its store handle shares the publisher's process slot (pins, lock holder): a death of either
 * thread is the process's death, which the supervisor repairs as any. It writes no stats block
 * slot yet; its counters are its own (kvr_ssdw_stats).
 */
#ifndef KVR_PROC_SSDWRITER_H
#define KVR_PROC_SSDWRITER_H

#include "core/store.h"
#include "io/ssdtier.h"

typedef struct {
    const char *path;     /* the file (kept by the caller while the writer runs) */
    uint64_t size;        /* --ssd-size */
    uint64_t page_size;   /* --ssd-page-size */
    uint64_t window;      /* bytes from each namespace's LRU tail that it keeps copied */
    unsigned batch;       /* blocks pinned and written per round */
    unsigned interval_ms; /* the pause when a round found nothing to do */
    unsigned sync_ms;     /* fdatasync at least this often while writing (--ssd-sync-interval) */
    int wake_fd;          /* an eventfd written when slots changed (the publisher's), or -1 */
} kvr_ssdw_config_t;

typedef struct kvr_ssdw_s kvr_ssdw_t;

/* Starts the thread on seg (whose disk index it restores and keeps). NULL when it cannot start
 * (logged). The restore runs in the thread: kvr_ssdw_state says when it is done. */
kvr_ssdw_t *kvr_ssdw_start(const kvr_ssdw_config_t *cfg, kvr_seg_t *seg);
/* 0 restoring, 1 serving, -1 failed (the file was refused or an I/O error: logged). */
int kvr_ssdw_state(const kvr_ssdw_t *w);
/* Stops the thread, seals the open page (a clean stop) and frees w. */
void kvr_ssdw_stop(kvr_ssdw_t *w);
/* The engine's counters and the writer's own, as of the thread's last round. */
typedef struct {
    kvr_ssdt_stats_t tier;
    uint64_t rounds, picked, already_on_disk, stale, write_errors;
    uint64_t quota_rejects;                   /* blocks larger than their namespace's ssd=: not copied */
    uint64_t syncs;                           /* fdatasyncs of the file started (io/ssdpages.h) */
    uint64_t write_hist[KVR_PUB_BUCKETS + 2]; /* the record writes' latency (io/ssdpages.h) */
} kvr_ssdw_stats_t;
void kvr_ssdw_stats(kvr_ssdw_t *w, kvr_ssdw_stats_t *out);

/* The disk index's slots that changed since the last call (filled, moved or freed; after the
 * restore, every slot once), at most max of them, each once however often it changed: the
 * publisher reads each with kvr_dindex_peek and counts disk blocks as owners of their canonical
 * hashes. Bounded: one bit and one list entry per slot. Any thread. */
size_t kvr_ssdw_take_dirty(kvr_ssdw_t *w, uint32_t *out, size_t max);

#endif
