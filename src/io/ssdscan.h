/*
 * ssdscan.h — the disk tier's start-up scan (ssdscan.c): every page header, and every record
 * of every page, many pages at once through one io_uring (docs/ssd-tier.md, "Restart").
 */
#ifndef KVR_IO_SSDSCAN_H
#define KVR_IO_SSDSCAN_H

#include "io/ssdfile.h"

/* What a scan found: pages by state, records kept and refused. */
typedef struct {
    uint64_t pages_empty, pages_open, pages_sealed, pages_bad;
    uint64_t records, record_bytes;
    uint64_t records_torn;  /* a header or body that did not check: the page's walk ends there */
    uint64_t summaries;     /* sealed pages read from their summary */
    uint64_t summaries_bad; /* summaries that did not check: their pages were walked instead */
    uint64_t max_version;   /* the newest page incarnation seen (0: none) */
    uint64_t max_seq;       /* the newest record's write sequence (0: none) */
} kvr_ssdf_scan_t;

/* Called per record kept: a page's records in offset order, pages interleaved (the scan walks
 * many at once). */
typedef int (*kvr_ssdf_rec_cb)(void *ctx, uint64_t page, uint64_t off, const kvr_ssd_page_t *pg,
                               const kvr_ssd_rec_t *rec);

/*
 * Reads every page header and each page's records (ssdscan.c): a sealed page's from its summary
 * in one read (when the summary is missing or does not check, by walking its record headers up
 * to its `used`), an open one's (the page being written when the server stopped) by walking
 * its headers until one that is empty, stale or does not check, and in an open page each
 * record's body is read and its checksum verified too (a sealed page was synced before it was
 * sealed). A page whose
 * header does not check counts as bad and is reused as if empty. cb returning non-zero stops
 * the scan with that value. KVR_OK, cb's value, or KVR_ERR (an I/O error, logged).
 */
int kvr_ssdf_scan(kvr_ssdf_t *f, kvr_ssdf_rec_cb cb, void *ctx, kvr_ssdf_scan_t *st);
/* The same with at most `depth` reads in flight (io_uring); depth 1, or a kernel that refuses
 * io_uring, reads one block at a time. kvr_ssdf_scan uses KVR_SSDF_SCAN_DEPTH. */
#define KVR_SSDF_SCAN_DEPTH 32
int kvr_ssdf_scan_depth(kvr_ssdf_t *f, unsigned depth, kvr_ssdf_rec_cb cb, void *ctx, kvr_ssdf_scan_t *st);

#endif
