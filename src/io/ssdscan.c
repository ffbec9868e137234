/*
 * ssdscan.c — the disk tier's scan at start (see ssdfile.h for what it promises, and
 * docs/ssd-tier.md, "Restart: the scan", for its cost).
 *
 * A sealed page is walked by reading one record header after another: each read depends on the
 * one before (its span says where the next header is), so one page is one chain of 4 KiB reads.
 * To keep the device busy the scan walks up to `depth` pages at once, each walker with one read
 * in flight on a private io_uring; a walker that finishes its page takes the next page number.
 * The pages that were open at the stop (one or two) are walked after, one read at a time, with
 * every body read and checked. Where io_uring is refused, or depth is 1, every page is walked
 * one read at a time.
 */
#include "io/ssdscan.h"

#include "base/log.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK (4u << 20) /* an open page's body reads, at most this many bytes at a time */

typedef struct {
    kvr_ssdf_t *f;
    kvr_ssdf_rec_cb cb;
    void *ctx;
    kvr_ssdf_scan_t *st;
    kvr_ssd_rec_t rec;
    kvr_ssd_sum_t *sum;
    uint8_t *chunk;
    uint64_t *open;       /* the open pages, walked last */
    uint64_t nopen, next; /* next: the next page number to hand out */
} scan_t;

/* An open page's record: its body read in chunks and checked. KVR_OK, KVR_EINVAL, KVR_ERR. */
static int body_check(scan_t *s, uint64_t p, uint64_t off)
{
    const kvr_ssd_rec_t *rec = &s->rec;
    uint64_t len = (uint64_t)rec->key_len + rec->length, at = kvr_ssdf_page_off(s->f, p) + off + KVR_SSD_ALIGN, done = 0;

    kvr_ssd_sum_reset(s->sum);
    while (done < len) {
        uint64_t want = len - done < CHUNK ? len - done : CHUNK;
        uint64_t io = (want + KVR_SSD_ALIGN - 1) & ~(uint64_t)(KVR_SSD_ALIGN - 1);
        if (kvr_ssdf_read(s->f, s->chunk, io, at + done) != KVR_OK)
            return KVR_ERR;
        kvr_ssd_sum_update(s->sum, s->chunk, want);
        done += want;
    }
    return kvr_ssd_sum_digest(s->sum) == rec->body_sum ? KVR_OK : KVR_EINVAL;
}

/* The header at `off` of page pg, decoded into s->rec (rc: KVR_SSD_*), judged: *next gets the
 * offset of the next header, or 0 when the page's walk ends here. KVR_OK, the callback's
 * non-zero value, or KVR_ERR. */
static int record(scan_t *s, const kvr_ssd_page_t *pg, uint64_t off, int rc, uint64_t *next)
{
    uint64_t end = pg->sealed ? pg->used : s->f->page_size, span = 0;
    int cbrc;

    *next = 0;
    if (rc == KVR_SSD_EMPTY || rc == KVR_SSD_STALE)
        return KVR_OK; /* the end of what this incarnation wrote */
    if (rc == KVR_SSD_OK) {
        span = kvr_ssd_rec_span(s->rec.key_len, s->rec.length);
        if (off + span > end)
            rc = KVR_SSD_BAD_FIELD; /* past what the seal covers */
    }
    if (rc == KVR_SSD_OK && !pg->sealed) {
        int b = body_check(s, pg->page, off);
        if (b == KVR_ERR)
            return KVR_ERR;
        rc = b == KVR_OK ? KVR_SSD_OK : KVR_SSD_BAD_SUM;
    }
    if (rc != KVR_SSD_OK) {
        s->st->records_torn++;
        kvr_warn("ssd: page %llu offset %llu: record %s; the page's later records are not used",
                 (unsigned long long)pg->page, (unsigned long long)off, kvr_ssd_strerror(rc));
        return KVR_OK;
    }
    s->st->records++;
    s->st->record_bytes += s->rec.length;
    if (s->rec.seq > s->st->max_seq)
        s->st->max_seq = s->rec.seq;
    if ((cbrc = s->cb(s->ctx, pg->page, off, pg, &s->rec)) != 0)
        return cbrc;
    if (off + span + 2 * KVR_SSD_ALIGN <= end)
        *next = off + span;
    return KVR_OK;
}

/*
 * A sealed page's summary (len bytes at buf), checked whole before any record of it is handed
 * over: its checksum, then every entry in offset order from the page header to `used`, as many
 * as nrecords. KVR_OK (*ok 1: the records were handed over; 0: the summary does not check,
 * walk the headers instead), the callback's non-zero value.
 */
static int summary(scan_t *s, const kvr_ssd_page_t *pg, const uint8_t *buf, int *ok)
{
    *ok = 0;
    if (kvr_ssd_sum(buf, pg->summary_len) != pg->summary_sum) {
        s->st->summaries_bad++;
        kvr_warn("ssd: page %llu: summary checksum mismatch; walking its records", (unsigned long long)pg->page);
        return KVR_OK;
    }
    for (int pass = 0; pass < 2; pass++) { /* check all, then hand over */
        uint64_t want = KVR_SSD_ALIGN, n = 0, off;
        size_t at = 0, len;
        while (at < pg->summary_len) {
            int rc = kvr_ssd_sument_decode(buf + at, pg->summary_len - at, pg->version, s->f->page_size, &s->rec,
                                           &off, &len);
            if (rc != KVR_SSD_OK || off != want || n >= pg->nrecords)
                break;
            want += kvr_ssd_rec_span(s->rec.key_len, s->rec.length);
            at += len;
            n++;
            if (pass == 1) {
                s->st->records++;
                s->st->record_bytes += s->rec.length;
                if (s->rec.seq > s->st->max_seq)
                    s->st->max_seq = s->rec.seq;
                if ((rc = s->cb(s->ctx, pg->page, off, pg, &s->rec)) != 0)
                    return rc;
            }
        }
        if (pass == 0 && (at != pg->summary_len || n != pg->nrecords || want != pg->used)) {
            s->st->summaries_bad++;
            kvr_warn("ssd: page %llu: summary does not match the page; walking its records", (unsigned long long)pg->page);
            return KVR_OK;
        }
    }
    s->st->summaries++;
    *ok = 1;
    return KVR_OK;
}

/* Page p's header, decoded and counted: 1 when its records are to be walked now (sealed),
 * 0 when not (empty, bad, or open: queued for the end). */
static int page_header(scan_t *s, uint64_t p, const uint8_t *blk, kvr_ssd_page_t *pg)
{
    int d = kvr_ssd_page_decode(blk, p, s->f->file_id, s->f->page_size, pg);

    if (d == KVR_SSD_EMPTY) {
        s->st->pages_empty++;
        return 0;
    }
    if (d != KVR_SSD_OK) {
        s->st->pages_bad++;
        kvr_warn("ssd: page %llu: header %s; the page is reused", (unsigned long long)p, kvr_ssd_strerror(d));
        return 0;
    }
    if (pg->version > s->st->max_version)
        s->st->max_version = pg->version;
    if (!pg->sealed) {
        s->st->pages_open++;
        s->open[s->nopen++] = p;
        return 0;
    }
    s->st->pages_sealed++;
    return pg->used >= 3 * KVR_SSD_ALIGN; /* the header and at least one record */
}

/* One page, one read at a time. KVR_OK, the callback's value, or KVR_ERR. */
static int walk_sync(scan_t *s, uint64_t p, uint8_t *blk, int open_pass)
{
    kvr_ssd_page_t pg;
    uint64_t off = KVR_SSD_ALIGN;
    int rc;

    if (kvr_ssdf_read(s->f, blk, KVR_SSD_ALIGN, kvr_ssdf_page_off(s->f, p)) != KVR_OK) {
        kvr_error("ssd: reading the header of page %llu: %s", (unsigned long long)p, strerror(errno));
        return KVR_ERR;
    }
    if (open_pass) {
        if (kvr_ssd_page_decode(blk, p, s->f->file_id, s->f->page_size, &pg) != KVR_SSD_OK)
            return KVR_OK; /* counted in the first pass */
    } else if (!page_header(s, p, blk, &pg)) {
        return KVR_OK;
    }
    if (pg.sealed && pg.summary_len > 0) {
        size_t io = (pg.summary_len + KVR_SSD_ALIGN - 1) & ~(size_t)(KVR_SSD_ALIGN - 1);
        uint8_t *buf = kvr_ssdf_buf(io);
        int ok = 0;
        if (buf == NULL)
            return KVR_ERR;
        rc = kvr_ssdf_read(s->f, buf, io, kvr_ssdf_page_off(s->f, p) + pg.used);
        if (rc != KVR_OK)
            kvr_error("ssd: reading the summary of page %llu: %s", (unsigned long long)p, strerror(errno));
        else
            rc = summary(s, &pg, buf, &ok);
        free(buf);
        if (rc != KVR_OK || ok)
            return rc;
    }
    while (off != 0) {
        int d = kvr_ssdf_rec_read(s->f, p, pg.version, off, &s->rec);
        if (d == KVR_ERR)
            return KVR_ERR;
        if ((rc = record(s, &pg, off, d, &off)) != KVR_OK)
            return rc;
    }
    return KVR_OK;
}

typedef struct {
    kvr_ssd_page_t pg;
    uint64_t page, off; /* off 0: reading the page header */
    uint8_t *blk;
    uint8_t *sum; /* the summary being read (summing 1), sum_cap bytes */
    size_t sum_cap;
    int summing;
} walker_t;

/* The bytes of the walker's summary read. */
static size_t summary_io(const walker_t *w)
{
    return (w->pg.summary_len + KVR_SSD_ALIGN - 1) & ~(size_t)(KVR_SSD_ALIGN - 1);
}

/* Queues the walker's next read: its page's summary, its next record header, or the next
 * page's header when its page is done. 0 when there is nothing left for it. */
static int walker_next(scan_t *s, struct io_uring *ring, walker_t *w)
{
    struct io_uring_sqe *sqe;
    void *buf = w->blk;
    size_t len = KVR_SSD_ALIGN;
    uint64_t at;

    if (w->summing) {
        buf = w->sum;
        len = summary_io(w);
        at = kvr_ssdf_page_off(s->f, w->page) + w->pg.used;
    } else if (w->off == 0) {
        if (s->next >= s->f->npages)
            return 0;
        w->page = s->next++;
        at = kvr_ssdf_page_off(s->f, w->page);
    } else {
        at = kvr_ssdf_page_off(s->f, w->page) + w->off;
    }
    sqe = io_uring_get_sqe(ring); /* depth entries, one read in flight per walker: never full */
    io_uring_prep_read(sqe, s->f->fd, buf, (unsigned)len, at);
    io_uring_sqe_set_data(sqe, w);
    return 1;
}

/* A walker's read completed with res. KVR_OK, the callback's value, or KVR_ERR. */
static int walker_done(scan_t *s, walker_t *w, int res)
{
    size_t want = w->summing ? summary_io(w) : KVR_SSD_ALIGN;
    int rc, ok;

    if (res < 0 || (size_t)res != want) {
        errno = res < 0 ? -res : EIO;
        kvr_error("ssd: reading page %llu at offset %llu: %s", (unsigned long long)w->page,
                  (unsigned long long)(w->summing ? w->pg.used : w->off), strerror(errno));
        return KVR_ERR;
    }
    if (w->summing) {
        w->summing = 0;
        rc = summary(s, &w->pg, w->sum, &ok);
        w->off = ok ? 0 : KVR_SSD_ALIGN; /* done, or walk the headers after all */
        return rc;
    }
    if (w->off == 0) {
        if (!page_header(s, w->page, w->blk, &w->pg))
            return KVR_OK;
        if (w->pg.summary_len == 0) {
            w->off = KVR_SSD_ALIGN;
            return KVR_OK;
        }
        if (summary_io(w) > w->sum_cap) {
            free(w->sum);
            w->sum_cap = 0;
            if ((w->sum = kvr_ssdf_buf(summary_io(w))) == NULL)
                return KVR_ERR;
            w->sum_cap = summary_io(w);
        }
        w->summing = 1;
        return KVR_OK;
    }
    return record(s, &w->pg, w->off,
                  kvr_ssd_rec_decode(w->blk, w->pg.version, w->off, s->f->page_size, &s->rec), &w->off);
}

/* Every page, `depth` walkers at once. KVR_OK, the callback's value, KVR_ERR, or 1 when
 * io_uring is refused (nothing was read: walk one read at a time instead). */
static int walk_ring(scan_t *s, unsigned depth)
{
    struct io_uring ring;
    walker_t *w = calloc(depth, sizeof(*w));
    unsigned busy = 0;
    int rc = KVR_OK;

    if (w == NULL)
        return KVR_ERR;
    if (io_uring_queue_init(depth, &ring, 0) < 0) {
        free(w);
        return 1;
    }
    for (unsigned i = 0; i < depth; i++) {
        if ((w[i].blk = kvr_ssdf_buf(KVR_SSD_ALIGN)) == NULL) {
            rc = KVR_ERR;
            break;
        }
        busy += (unsigned)walker_next(s, &ring, &w[i]);
    }
    while (rc == KVR_OK && busy > 0) {
        struct io_uring_cqe *cqe;
        int r = io_uring_submit_and_wait(&ring, 1);
        if (r < 0 && r != -EINTR) {
            kvr_error("ssd: io_uring_submit_and_wait: %s", strerror(-r));
            rc = KVR_ERR;
            break;
        }
        while (rc == KVR_OK && io_uring_peek_cqe(&ring, &cqe) == 0) {
            walker_t *x = io_uring_cqe_get_data(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&ring, cqe);
            busy--;
            rc = walker_done(s, x, res);
            if (rc == KVR_OK)
                busy += (unsigned)walker_next(s, &ring, x);
        }
    }
    if (busy > 0) { /* stopped early: let the reads in flight land before their buffers go */
        io_uring_submit(&ring);
        while (busy > 0) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&ring, &cqe) != 0)
                break;
            io_uring_cqe_seen(&ring, cqe);
            busy--;
        }
    }
    io_uring_queue_exit(&ring);
    for (unsigned i = 0; i < depth; i++) {
        free(w[i].blk);
        free(w[i].sum);
    }
    free(w);
    return rc;
}

int kvr_ssdf_scan_depth(kvr_ssdf_t *f, unsigned depth, kvr_ssdf_rec_cb cb, void *ctx, kvr_ssdf_scan_t *st)
{
    scan_t s = {.f = f, .cb = cb, .ctx = ctx, .st = st};
    uint8_t *blk = kvr_ssdf_buf(KVR_SSD_ALIGN);
    int rc = KVR_ERR;

    memset(st, 0, sizeof(*st));
    s.sum = kvr_ssd_sum_new();
    s.chunk = kvr_ssdf_buf(CHUNK);
    s.open = malloc(sizeof(*s.open) * f->npages);
    if (blk != NULL && s.sum != NULL && s.chunk != NULL && s.open != NULL) {
        rc = depth > 1 ? walk_ring(&s, depth < f->npages ? depth : (unsigned)f->npages) : 1;
        if (rc == 1) { /* one read at a time */
            rc = KVR_OK;
            for (uint64_t p = 0; rc == KVR_OK && p < f->npages; p++)
                rc = walk_sync(&s, p, blk, 0);
        }
        for (uint64_t i = 0; rc == KVR_OK && i < s.nopen; i++)
            rc = walk_sync(&s, s.open[i], blk, 1);
    }
    free(blk);
    free(s.chunk);
    free(s.open);
    kvr_ssd_sum_free(s.sum);
    return rc;
}

int kvr_ssdf_scan(kvr_ssdf_t *f, kvr_ssdf_rec_cb cb, void *ctx, kvr_ssdf_scan_t *st)
{
    return kvr_ssdf_scan_depth(f, KVR_SSDF_SCAN_DEPTH, cb, ctx, st);
}
