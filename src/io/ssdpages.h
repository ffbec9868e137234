/*
 * ssdpages.h — the disk tier's pages as its one writer sees them: which page is free, which one
 * is open for appends, which are sealed and how much of each is still indexed; the write head;
 * sealing a page with its summary; recycling the oldest page when none is free
 * (docs/ssd-tier.md, "Pages and the write head").
 *
 * This table is the writer's private memory, rebuilt at every start from the scan. Readers never
 * consult it: a read checks the record's version and checksum against what its pointer says, so
 * a page recycled under a reader is a miss, never a wrong block.
 */
#ifndef KVR_IO_SSDPAGES_H
#define KVR_IO_SSDPAGES_H

#include "io/ssdfile.h"
#include "io/ssdscan.h"
#include "shm/stats.h"

#include <sys/uio.h>

struct io_uring;

#define KVR_SSDP_NONE UINT64_MAX
/* Sealed pages whose header waits for a sync; one more makes the writer wait for one. Half of
 * them waiting starts a sync without waiting for it (seal_open), so that under a long burst of
 * writes the slots free up before they run out. */
#define KVR_SSDP_SEALS_MAX 32

enum { KVR_SSDP_FREE = 0,
       KVR_SSDP_OPEN = 1,
       KVR_SSDP_SEALED = 2 };

typedef struct {
    uint64_t version;    /* the incarnation (0 while free) */
    uint64_t used;       /* the end of its records, from the page's start */
    uint64_t live_bytes; /* spans of the records still indexed */
    uint32_t nrecords, live_records;
    uint8_t state; /* KVR_SSDP_* */
} kvr_ssdp_page_t;

/* Where a record went. */
typedef struct {
    uint64_t page, version, off, span;
    uint32_t nth;   /* records of its page before it */
    size_t sum_off; /* where its summary entry starts */
} kvr_ssdp_loc_t;

/* Record writes in flight at once, at most (kvr_ssdp_reserve's slots). */
#define KVR_SSDP_WRITES_MAX 64

/* Counters since the table was made (the writer puts them on /metrics). */
typedef struct {
    uint64_t appended, appended_bytes; /* records and their payload bytes */
    uint64_t sealed, opened;           /* page transitions */
    uint64_t recycled;                 /* opened over a sealed page: its records dropped */
    uint64_t recycled_live;            /* records still indexed when their page was recycled */
    uint64_t syncs;
    uint64_t sync_waits; /* times the writer waited for a sync (a seal slot, a recycle, a stop) */
    /* record writes (kvr_ssdp_reserve), submission to completion: KVR_PUB_BUCKETS buckets
     * (shm/stats.h's bounds), the sum in us, the count */
    uint64_t write_hist[KVR_PUB_BUCKETS + 2];
} kvr_ssdp_stats_t;

/* Called when page `page` of incarnation `version` is about to be recycled: whoever indexes
 * records of it must stop pointing at them (or find them stale at read: either is safe). */
typedef void (*kvr_ssdp_drop_cb)(void *ctx, uint64_t page, uint64_t version);

typedef struct {
    kvr_ssdf_t *f;
    kvr_ssdp_page_t *pg;     /* f->npages of them */
    uint64_t open;           /* the page being appended to, or KVR_SSDP_NONE */
    kvr_ssd_page_t open_hdr; /* its header as written */
    uint64_t version, seq;   /* the last page version and record sequence given out */
    uint8_t *sum;            /* the open page's summary entries so far */
    size_t sum_len, sum_cap; /* bytes, and the allocation (grows; bounded by the page) */
    uint64_t unsynced;       /* bytes appended since the last sync started */
    /* The syncs, on a ring of the writer's own so that it never waits for one while appending
     * (NULL: no ring, every sync synchronous). A page being sealed has its summary written and
     * its header waiting in seal[] for the next sync to start; the header is written (sealed
     * 1) when that sync completes. At most one sync is in flight. */
    struct io_uring *ring;
    kvr_ssd_page_t seal[KVR_SSDP_SEALS_MAX];
    uint64_t seal_gen[KVR_SSDP_SEALS_MAX]; /* the sync seal[i] waits for (0: slot free) */
    uint64_t sync_gen;                     /* syncs started on the ring */
    int sync_busy;                         /* sync sync_gen is in flight */
    /* Record writes on the same ring (kvr_ssdp_reserve): each slot's pieces, its parts still in
     * flight (a record of more than IOV_MAX pieces takes several), and its first error. */
    struct {
        kvr_ssdf_wr_t io;
        unsigned parts;
        int err;
        uint64_t t0_us; /* submitted */
    } wr[KVR_SSDP_WRITES_MAX];
    unsigned inflight;                 /* slots reserved and not yet settled */
    uint64_t inflight_bytes;           /* their spans */
    unsigned parts_inflight;           /* writes on the ring */
    uint8_t done[KVR_SSDP_WRITES_MAX]; /* slots completed, not yet taken by kvr_ssdp_next */
    unsigned done_head, done_n;
    int cut; /* a write of the open page failed: sealed once none is in flight */
    kvr_ssdp_drop_cb drop;
    void *drop_ctx;
    kvr_ssdp_stats_t st;
} kvr_ssdp_t;

/* A table over an open file with every page free (a new file, or before feeding a scan).
 * KVR_OK or KVR_ERR (no memory). */
int kvr_ssdp_init(kvr_ssdp_t *p, kvr_ssdf_t *f, kvr_ssdp_drop_cb drop, void *ctx);
void kvr_ssdp_free(kvr_ssdp_t *p);

/*
 * Restart. kvr_ssdp_scan_rec takes each record the scan kept (call it from the scan's callback:
 * the record counts as indexed until kvr_ssdp_forget says otherwise); kvr_ssdp_scan_done then
 * continues versions and sequences after the newest seen, and seals every page that was open at
 * the stop at the end of its good records (synced first; no summary, so the next scan walks its
 * headers), so appends always start a fresh page. KVR_OK or KVR_ERR (an I/O error, logged).
 */
void kvr_ssdp_scan_rec(kvr_ssdp_t *p, uint64_t page, uint64_t off, const kvr_ssd_page_t *pg, const kvr_ssd_rec_t *rec);
int kvr_ssdp_scan_done(kvr_ssdp_t *p, const kvr_ssdf_scan_t *st);

/*
 * Appends a record (rec's lengths, names, key, hashes set; version, seq and body_sum are set
 * here) with its body in the arena's pieces (kvr_ssdf_rec_write's rules). When the open page
 * has no room for it and for its summary entry, the page is sealed and another opened: the
 * lowest free page, else the sealed page of the oldest version, recycled (the drop callback
 * first). The record counts as indexed. KVR_OK with *loc; KVR_EINVAL when the record is larger
 * than half a page (never admitted; nothing written); KVR_ERR on an I/O error (logged; the
 * record is not stored, and the page it was meant for is sealed at its last good record).
 */
int kvr_ssdp_append(kvr_ssdp_t *p, kvr_ssd_rec_t *rec, const struct iovec *body, int nbody, kvr_ssdp_loc_t *loc);

/*
 * The same on the ring, for the disk writer: the record's place is taken and its write
 * submitted (user slot `slot` < KVR_SSDP_WRITES_MAX, not in use), its summary entry added; the
 * write completes later (kvr_ssdp_next) and the caller settles every record in the order it
 * reserved them (kvr_ssdp_settle). KVR_OK with *loc; KVR_AGAIN when the page must be sealed
 * first (it is full, or a write of it failed) and writes are in flight: take and settle them,
 * then try again; KVR_EINVAL and KVR_ERR as kvr_ssdp_append (nothing reserved).
 * kvr_ssdp_append itself refuses with KVR_AGAIN while writes are in flight.
 */
int kvr_ssdp_reserve(kvr_ssdp_t *p, kvr_ssd_rec_t *rec, const struct iovec *body, int nbody, kvr_ssdp_loc_t *loc,
                     unsigned slot);
/* A reserved write completed: 1 with its slot and *ok (every byte written), 0 when none has
 * (without wait) or none is in flight. wait: blocks until one completes. */
int kvr_ssdp_next(kvr_ssdp_t *p, int wait, unsigned *slot, int *ok);
/* Settles a reserved record, in reservation order: ok, it is on disk (indexed by the caller, or
 * forgotten); not ok (its write failed, or one reserved before it in its page did), the page
 * is cut back to where it started, and sealed there once no write is in flight. */
void kvr_ssdp_settle(kvr_ssdp_t *p, unsigned slot, const kvr_ssdp_loc_t *loc, int ok);

/* A record is no longer indexed (deleted, replaced, or dropped from RAM and disk): its page's
 * live counts fall, unless the page has been recycled since (version differs). */
void kvr_ssdp_forget(kvr_ssdp_t *p, uint64_t page, uint64_t version, uint64_t span);

/* Seals the open page, if any, with its summary, and waits until every sealed page's header
 * is down, then syncs the headers (a clean stop). KVR_OK or KVR_ERR (logged). A full page is sealed without waiting:
 * its summary is written now, and its header says sealed once the next sync has completed
 * (kvr_ssdp_sync, kvr_ssdp_reap). */
int kvr_ssdp_seal(kvr_ssdp_t *p);

/* Whether rec's record would not go in the open page (its span and summary entry do not fit,
 * the page was cut, or none is open): its reserve or append seals the page and opens another.
 * 0 for a record larger than half a page, which no page takes. */
int kvr_ssdp_full_for(const kvr_ssdp_t *p, const kvr_ssd_rec_t *rec);

/* Seals the open page, if any, and opens the next (a free one, else the oldest sealed one,
 * recycled), as an append that does not fit does. KVR_OK, KVR_AGAIN (writes in flight),
 * KVR_ERR (no page could be opened). */
int kvr_ssdp_turn(kvr_ssdp_t *p);

/* Starts an fdatasync when anything was appended, or a page sealed, since the last one
 * started, and none is in flight (the power-loss bound: the writer calls it when it runs out
 * of work and at least every --ssd-sync-interval); without a ring, syncs here. KVR_OK or
 * KVR_ERR (logged). */
int kvr_ssdp_sync(kvr_ssdp_t *p);

/* Finishes what completed on the ring: sealed pages' headers are written once a sync that
 * started after their summaries is done. wait: until no sync is in flight and no header waits
 * (syncing as needed). Never fails (errors are logged: a page whose sync or header write
 * failed stays open on disk, and the next start walks its records). */
void kvr_ssdp_reap(kvr_ssdp_t *p, int wait);

/* The page the next opening would recycle (all pages in use): the sealed page of the oldest
 * version, or KVR_SSDP_NONE while a page is free. */
uint64_t kvr_ssdp_victim(const kvr_ssdp_t *p);

/* Pages free, and bytes of records still indexed over all pages. */
uint64_t kvr_ssdp_free_pages(const kvr_ssdp_t *p);
uint64_t kvr_ssdp_live_bytes(const kvr_ssdp_t *p);

#endif
