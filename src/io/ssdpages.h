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

#include "io/ssdscan.h"

#include <sys/uio.h>

#define KVR_SSDP_NONE UINT64_MAX

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
} kvr_ssdp_loc_t;

/* Counters since the table was made (the writer puts them on /metrics). */
typedef struct {
    uint64_t appended, appended_bytes; /* records and their payload bytes */
    uint64_t sealed, opened;           /* page transitions */
    uint64_t recycled;                 /* opened over a sealed page: its records dropped */
    uint64_t recycled_live;            /* records still indexed when their page was recycled */
    uint64_t syncs;
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
    uint64_t unsynced;       /* bytes appended since the last sync */
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

/* A record is no longer indexed (deleted, replaced, or dropped from RAM and disk): its page's
 * live counts fall, unless the page has been recycled since (version differs). */
void kvr_ssdp_forget(kvr_ssdp_t *p, uint64_t page, uint64_t version, uint64_t span);

/* Seals the open page, if any, with its summary (a full page, or a clean stop). KVR_OK or
 * KVR_ERR (logged). */
int kvr_ssdp_seal(kvr_ssdp_t *p);

/* fdatasync when anything was appended since the last one (the power-loss bound: the writer
 * calls it at least every second). KVR_OK or KVR_ERR (logged). */
int kvr_ssdp_sync(kvr_ssdp_t *p);

/* The page the next opening would recycle (all pages in use): the sealed page of the oldest
 * version, or KVR_SSDP_NONE while a page is free. */
uint64_t kvr_ssdp_victim(const kvr_ssdp_t *p);

/* Pages free, and bytes of records still indexed over all pages. */
uint64_t kvr_ssdp_free_pages(const kvr_ssdp_t *p);
uint64_t kvr_ssdp_live_bytes(const kvr_ssdp_t *p);

#endif
