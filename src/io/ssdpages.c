/*
 * ssdpages.c — the disk tier's pages and write head (see ssdpages.h; docs/ssd-tier.md, "Pages
 * and the write head").
 *
 * The open page's summary grows with every append, in memory, and is written after the last
 * record when the page is sealed; an append that would leave no room for the summary it grows
 * seals the page first, so a seal never fails for room. Recycling picks the sealed page of the
 * oldest version: versions are handed out in order, so that is the page written longest ago.
 *
 * Syncs run on a small ring of the writer's own (IORING_OP_FSYNC, datasync), one at a time,
 * started by the writer when it runs out of work and at least once a sync interval while it
 * writes, and here when half the seal slots wait: on this project's test machine a flush
 * stalled the writes behind it for about 0.5 ms per MiB written since the last one, and one
 * per sealed page had cost the writer 40 % of its time. A sync covers every write that
 * completed before it started; a page is sealed only with none of its writes in flight
 * (below), so the first sync to start after its summary covers the page, and its completion
 * lets the header say sealed. The user data of a sync is its
 * generation. An SQE once taken counts as submitted: liburing hands it to the kernel with the
 * next io_uring_enter even when this one failed, and every wait here enters with
 * io_uring_submit_and_wait, so nothing queued is left behind.
 *
 * Record writes go on the same ring (kvr_ssdp_reserve): a record's place, summary entry and
 * counts are taken when it is submitted, as if written, and the writer settles each in the
 * order it reserved them. A failed write cuts its page back to where that record started:
 * every record reserved after it in the page is given up too, so the page's records stay
 * contiguous (what its summary and a scan's walk need), and the page is sealed there once no
 * write is in flight. A page is sealed, and another opened, only with no write in flight. The
 * user data of a write is WR_TAG, its part and its slot.
 */
#define WR_TAG (1ull << 63)
#include "io/ssdpages.h"

#include "io/ssdfault.h"

#include "base/clock.h"
#include "base/log.h"

#include <errno.h>
#include <limits.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t align_up(uint64_t n)
{
    return (n + KVR_SSD_ALIGN - 1) & ~(uint64_t)(KVR_SSD_ALIGN - 1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int kvr_ssdp_init(kvr_ssdp_t *p, kvr_ssdf_t *f, kvr_ssdp_drop_cb drop, void *ctx)
{
    int rc;

    memset(p, 0, sizeof(*p));
    p->f = f;
    p->open = KVR_SSDP_NONE;
    p->drop = drop;
    p->drop_ctx = ctx;
    /* The summary grows as the page fills; it must fit in the page after the records, so it
     * is bounded by the page, never by the traffic. */
    p->sum_cap = 64u << 10;
    p->pg = calloc(f->npages, sizeof(*p->pg));
    p->sum = malloc(p->sum_cap);
    if (p->pg == NULL || p->sum == NULL || (p->ring = calloc(1, sizeof(*p->ring))) == NULL) {
        kvr_ssdp_free(p);
        return KVR_ERR;
    }
    /* room for every slot's first part, the sync, and more parts (a submit frees the SQ) */
    if ((rc = io_uring_queue_init(2 * KVR_SSDP_WRITES_MAX, p->ring, 0)) < 0) {
        kvr_warn("ssd: no ring for the writer (%s): its writes and syncs are synchronous", strerror(-rc));
        free(p->ring);
        p->ring = NULL;
    }
    return KVR_OK;
}

void kvr_ssdp_free(kvr_ssdp_t *p)
{
    if (p->ring != NULL) {
        unsigned slot;
        int ok;
        while (kvr_ssdp_next(p, 1, &slot, &ok) == 1) /* nothing the kernel still writes is freed */
            ;
        kvr_ssdp_reap(p, 1);
        io_uring_queue_exit(p->ring);
        free(p->ring);
        p->ring = NULL;
    }
    for (unsigned k = 0; k < KVR_SSDP_WRITES_MAX; k++)
        kvr_ssdf_wr_free(&p->wr[k].io);
    free(p->pg);
    free(p->sum);
    p->pg = NULL;
    p->sum = NULL;
}

void kvr_ssdp_scan_rec(kvr_ssdp_t *p, uint64_t page, uint64_t off, const kvr_ssd_page_t *pg, const kvr_ssd_rec_t *rec)
{
    kvr_ssdp_page_t *g = &p->pg[page];
    uint64_t span = kvr_ssd_rec_span(rec->key_len, rec->length);

    if (g->state == KVR_SSDP_FREE) {
        g->state = pg->sealed ? KVR_SSDP_SEALED : KVR_SSDP_OPEN; /* OPEN: sealed by scan_done */
        g->version = pg->version;
        g->used = pg->sealed ? pg->used : KVR_SSD_ALIGN;
    }
    if (!pg->sealed && off + span > g->used)
        g->used = off + span;
    g->nrecords++;
    g->live_records++;
    g->live_bytes += span;
}

int kvr_ssdp_scan_done(kvr_ssdp_t *p, const kvr_ssdf_scan_t *st)
{
    p->version = st->max_version;
    p->seq = st->max_seq;
    for (uint64_t i = 0; i < p->f->npages; i++) {
        kvr_ssdp_page_t *g = &p->pg[i];
        kvr_ssd_page_t hdr;
        if (g->state != KVR_SSDP_OPEN)
            continue;
        memset(&hdr, 0, sizeof(hdr));
        hdr.page = i;
        hdr.version = g->version;
        hdr.file_id = p->f->file_id;
        hdr.opened_ns = now_ns();
        hdr.nrecords = g->nrecords;
        hdr.used = g->used;
        if (kvr_ssdf_page_seal(p->f, &hdr, NULL, 0) != KVR_OK)
            return KVR_ERR;
        g->state = KVR_SSDP_SEALED;
        p->st.sealed++;
        kvr_info("ssd: page %llu was open at the stop: sealed after its %u good records",
                 (unsigned long long)i, g->nrecords);
    }
    return KVR_OK;
}

/* Starts sync sync_gen + 1 on the ring, unless one is in flight. KVR_OK, or KVR_ERR when the
 * ring fails (the caller syncs at once). */
static int sync_start(kvr_ssdp_t *p)
{
    struct io_uring_sqe *sqe;

    if (p->sync_busy)
        return KVR_OK;
    if ((sqe = io_uring_get_sqe(p->ring)) == NULL && io_uring_submit(p->ring) >= 0)
        sqe = io_uring_get_sqe(p->ring);
    if (sqe == NULL)
        return KVR_ERR;
    io_uring_prep_fsync(sqe, p->f->fd, IORING_FSYNC_DATASYNC);
    io_uring_sqe_set_data64(sqe, p->sync_gen + 1);
    io_uring_submit(p->ring); /* or with the next enter (above) */
    p->sync_gen++;
    p->sync_busy = 1;
    p->unsynced = 0;
    p->st.syncs++;
    return KVR_OK;
}

/* Sync gen completed: every sealed page waiting for it (or an earlier one) gets its header. */
static void finish(kvr_ssdp_t *p, uint64_t gen, int res)
{
    p->sync_busy = 0;
    if (res < 0)
        kvr_error("ssd: fdatasync: %s", strerror(-res));
    for (unsigned k = 0; k < KVR_SSDP_SEALS_MAX; k++) {
        if (p->seal_gen[k] == 0 || p->seal_gen[k] > gen)
            continue;
        p->seal_gen[k] = 0;
        if (res < 0 || kvr_ssdf_page_seal_end(p->f, &p->seal[k]) != KVR_OK) /* left open on disk */
            kvr_error("ssd: sealing page %llu failed (%s); the next start walks its records",
                      (unsigned long long)p->seal[k].page, res < 0 ? strerror(-res) : "its header");
        else
            p->unsynced += KVR_SSD_ALIGN; /* the header too: the next sync makes it survive power */
    }
}

/* Slot's write is over (every part completed, or none could go): counted, logged if it failed,
 * queued for kvr_ssdp_next. */
static void write_done(kvr_ssdp_t *p, unsigned slot, int log)
{
    uint64_t us = kvr_clock_us() - p->wr[slot].t0_us;
    unsigned k = kvr_hist_bucket(us);

    if (p->wr[slot].err != 0) {
        if (log)
            kvr_ssdf_wr_failed(&p->wr[slot].io, p->wr[slot].err);
    } else {
        p->st.write_hist[k] += k < KVR_PUB_BUCKETS;
        p->st.write_hist[KVR_PUB_BUCKETS] += us;
        p->st.write_hist[KVR_PUB_BUCKETS + 1]++;
    }
    p->done[(p->done_head + p->done_n++) % KVR_SSDP_WRITES_MAX] = (uint8_t)slot;
}

/* A write's part completed (res: bytes, or -errno): its slot is done with its last part. */
static void wrote(kvr_ssdp_t *p, uint64_t ud, int res)
{
    unsigned slot = (unsigned)(ud & 0xff), first = (unsigned)((ud >> 8) & 0xffffff) * IOV_MAX;
    const kvr_ssdf_wr_t *io = &p->wr[slot].io;
    size_t want = 0;
    ssize_t r = res;

    for (unsigned i = first; i < (unsigned)io->niov && i < first + IOV_MAX; i++)
        want += io->iov[i].iov_len;
    if (r < 0) {
        errno = -res;
        r = -1;
    }
    r = kvr_ssd_fault_write(r, want);
    if (r != (ssize_t)want && p->wr[slot].err == 0)
        p->wr[slot].err = r < 0 ? errno : ENOSPC; /* a short write: the device is full, or was cut */
    p->parts_inflight--;
    if (--p->wr[slot].parts == 0)
        write_done(p, slot, 1);
}

/* Takes one completion: waits for it (wait), or only if there is one. 1 when one was taken. */
static int take(kvr_ssdp_t *p, int wait)
{
    struct io_uring_cqe *cqe;
    int rc;

    do /* submit_and_wait: also hands over what an earlier failed submit left queued */
        rc = wait ? io_uring_submit_and_wait(p->ring, 1) : 0;
    while (rc == -EINTR);
    if (rc < 0 || io_uring_peek_cqe(p->ring, &cqe) < 0)
        return 0; /* -EAGAIN: nothing completed yet */
    if (io_uring_cqe_get_data64(cqe) & WR_TAG)
        wrote(p, io_uring_cqe_get_data64(cqe), cqe->res);
    else
        finish(p, io_uring_cqe_get_data64(cqe), cqe->res);
    io_uring_cqe_seen(p->ring, cqe);
    return 1;
}

/* Whether a sealed page's header waits; page: that page only (KVR_SSDP_NONE: any). */
static int seal_waits(const kvr_ssdp_t *p, uint64_t page)
{
    for (unsigned k = 0; k < KVR_SSDP_SEALS_MAX; k++)
        if (p->seal_gen[k] != 0 && (page == KVR_SSDP_NONE || p->seal[k].page == page))
            return 1;
    return 0;
}

/* Waits until no header of page (KVR_SSDP_NONE: of any page) waits: a sync is started when
 * none in flight covers it. */
static void seal_drain(kvr_ssdp_t *p, uint64_t page)
{
    while (seal_waits(p, page)) {
        if (!p->sync_busy && sync_start(p) != KVR_OK)
            break;
        p->st.sync_waits++;
        if (!take(p, 1))
            break;
    }
    if (seal_waits(p, page)) { /* the ring failed: sync here, then the headers */
        p->st.syncs++;
        finish(p, UINT64_MAX, kvr_ssdf_sync(p->f) == KVR_OK ? 0 : -EIO);
    }
}

void kvr_ssdp_reap(kvr_ssdp_t *p, int wait)
{
    if (p->ring == NULL)
        return;
    while (p->sync_busy && take(p, wait))
        ;
    if (wait)
        seal_drain(p, KVR_SSDP_NONE);
}

/* Sealed pages whose header waits for a sync. */
static unsigned seals_waiting(const kvr_ssdp_t *p)
{
    unsigned n = 0;

    for (unsigned k = 0; k < KVR_SSDP_SEALS_MAX; k++)
        n += p->seal_gen[k] != 0;
    return n;
}

/* A free seal slot, or -1. */
static int seal_free(const kvr_ssdp_t *p)
{
    for (unsigned k = 0; k < KVR_SSDP_SEALS_MAX; k++)
        if (p->seal_gen[k] == 0)
            return (int)k;
    return -1;
}

/* Seals the open page at g->used with the summary so far: at once without a ring, else its
 * header waits in a seal slot for the next sync. */
static int seal_open(kvr_ssdp_t *p)
{
    kvr_ssdp_page_t *g;
    int rc, k = -1;

    if (p->open == KVR_SSDP_NONE)
        return KVR_OK;
    g = &p->pg[p->open];
    p->open_hdr.nrecords = g->nrecords;
    p->open_hdr.used = g->used;
    if (p->ring != NULL) {
        while ((k = seal_free(p)) < 0 && seal_waits(p, KVR_SSDP_NONE))
            seal_drain(p, p->seal[0].page);
    }
    if (k < 0) {
        rc = kvr_ssdf_page_seal(p->f, &p->open_hdr, p->sum, p->sum_len);
        p->unsynced = 0;
        p->st.syncs++;
    } else if ((rc = kvr_ssdf_page_seal_begin(p->f, &p->open_hdr, p->sum, p->sum_len)) == KVR_OK) {
        p->seal[k] = p->open_hdr;
        p->seal_gen[k] = p->sync_gen + 1; /* the next sync to start */
        p->unsynced += KVR_SSD_ALIGN;     /* ... which the next kvr_ssdp_sync starts */
        if (!p->sync_busy && seals_waiting(p) >= KVR_SSDP_SEALS_MAX / 2)
            (void)sync_start(p); /* a ring that fails: seal_drain syncs at the slots' end */
    }
    if (rc != KVR_OK) /* left open on disk: the next scan walks it with every body checked */
        kvr_error("ssd: sealing page %llu failed; it is no longer written", (unsigned long long)p->open);
    g->state = KVR_SSDP_SEALED;
    p->open = KVR_SSDP_NONE;
    p->sum_len = 0;
    p->st.sealed++;
    return rc == KVR_OK ? KVR_OK : KVR_ERR;
}

int kvr_ssdp_seal(kvr_ssdp_t *p)
{
    int rc = seal_open(p);

    kvr_ssdp_reap(p, 1);
    if (p->unsynced > 0) { /* the headers just written, and any append since the last sync */
        p->unsynced = 0;
        p->st.syncs++;
        if (kvr_ssdf_sync(p->f) != KVR_OK)
            rc = KVR_ERR;
    }
    return rc;
}

uint64_t kvr_ssdp_victim(const kvr_ssdp_t *p)
{
    uint64_t best = KVR_SSDP_NONE;

    for (uint64_t i = 0; i < p->f->npages; i++) {
        if (p->pg[i].state == KVR_SSDP_FREE)
            return KVR_SSDP_NONE;
        if (p->pg[i].state == KVR_SSDP_SEALED && (best == KVR_SSDP_NONE || p->pg[i].version < p->pg[best].version))
            best = i;
    }
    return best;
}

/* Opens a page for appends: the lowest free one, else the oldest sealed one, recycled. */
static int open_page(kvr_ssdp_t *p)
{
    uint64_t i, v = kvr_ssdp_victim(p);
    kvr_ssdp_page_t *g;

    if (v == KVR_SSDP_NONE) {
        for (i = 0; i < p->f->npages && p->pg[i].state != KVR_SSDP_FREE; i++)
            ;
        if (i == p->f->npages)
            return KVR_ERR; /* every page open: cannot happen with one open page and >= 2 pages */
    } else {
        i = v;
        g = &p->pg[i];
        if (p->ring != NULL) /* its header is rewritten below: its seal's first */
            seal_drain(p, i);
        if (p->drop != NULL)
            p->drop(p->drop_ctx, i, g->version);
        p->st.recycled++;
        p->st.recycled_live += g->live_records;
    }
    g = &p->pg[i];
    memset(g, 0, sizeof(*g));
    memset(&p->open_hdr, 0, sizeof(p->open_hdr));
    p->open_hdr.page = i;
    p->open_hdr.version = ++p->version;
    p->open_hdr.file_id = p->f->file_id;
    p->open_hdr.opened_ns = now_ns();
    if (kvr_ssdf_page_write(p->f, &p->open_hdr) != KVR_OK)
        return KVR_ERR; /* the page stays free (its old records are gone from the index) */
    g->state = KVR_SSDP_OPEN;
    g->version = p->open_hdr.version;
    g->used = KVR_SSD_ALIGN;
    p->open = i;
    p->sum_len = 0;
    p->st.opened++;
    return KVR_OK;
}

/* Cuts the open page back to where the record at loc started: it and every record after it
 * are no longer the page's, and the page is sealed there once no write is in flight. */
static void cut(kvr_ssdp_t *p, const kvr_ssdp_loc_t *loc)
{
    kvr_ssdp_page_t *g;
    uint64_t bytes;
    uint32_t recs;

    if (p->open == KVR_SSDP_NONE || p->pg[p->open].version != loc->version || loc->off >= p->pg[p->open].used)
        return;
    g = &p->pg[p->open];
    bytes = g->used - loc->off;
    recs = g->nrecords - loc->nth;
    g->used = loc->off;
    g->nrecords = loc->nth;
    g->live_records -= recs < g->live_records ? recs : g->live_records;
    g->live_bytes -= bytes < g->live_bytes ? bytes : g->live_bytes;
    p->sum_len = loc->sum_off;
    p->cut = 1;
    KVR_LOG_RATELIMITED(KVR_LOG_ERROR, "ssd: a record of page %llu could not be written; the page is sealed where it was",
                        (unsigned long long)p->open);
}

/* A record's summary entry. */
static size_t sument_len(const kvr_ssd_rec_t *rec)
{
    return KVR_SSD_SUMENT_FIXED + rec->ns_len + rec->model_len + rec->key_len;
}

int kvr_ssdp_full_for(const kvr_ssdp_t *p, const kvr_ssd_rec_t *rec)
{
    uint64_t span = kvr_ssd_rec_span(rec->key_len, rec->length);
    const kvr_ssdp_page_t *g;

    if (span > p->f->page_size / 2)
        return 0; /* never kept on disk (place refuses it): no page is sealed for it */
    if (p->open == KVR_SSDP_NONE)
        return 1;
    g = &p->pg[p->open];
    return p->cut || g->used + span + align_up(p->sum_len + sument_len(rec)) > p->f->page_size;
}

int kvr_ssdp_turn(kvr_ssdp_t *p)
{
    if (p->inflight > 0)
        return KVR_AGAIN;
    kvr_ssdp_reap(p, 0);
    if (p->open != KVR_SSDP_NONE) {
        seal_open(p);
        p->cut = 0;
    }
    return open_page(p);
}

/* Takes a record's place in the open page (sealing it first when it is full or was cut, and
 * opening another), and prepares its write in io: the record counts as the page's from here.
 * KVR_OK, KVR_AGAIN (a seal is due and writes are in flight), KVR_EINVAL, KVR_ERR. */
static int place(kvr_ssdp_t *p, kvr_ssd_rec_t *rec, const struct iovec *body, int nbody, kvr_ssdp_loc_t *loc,
                 kvr_ssdf_wr_t *io)
{
    uint64_t span = kvr_ssd_rec_span(rec->key_len, rec->length);
    size_t ent = sument_len(rec);
    kvr_ssdp_page_t *g;
    int rc;

    if (span > p->f->page_size / 2)
        return KVR_EINVAL;
    kvr_ssdp_reap(p, 0);
    if (p->open != KVR_SSDP_NONE && kvr_ssdp_full_for(p, rec)) {
        if (p->inflight > 0)
            return KVR_AGAIN;
        seal_open(p);
        p->cut = 0;
    }
    if (p->open == KVR_SSDP_NONE && open_page(p) != KVR_OK)
        return KVR_ERR;
    if (p->sum_len + ent > p->sum_cap) { /* the room check above bounds it by the page */
        size_t cap = p->sum_cap * 2;
        uint8_t *n = realloc(p->sum, cap);
        if (n == NULL)
            return KVR_ERR;
        p->sum = n;
        p->sum_cap = cap;
    }
    g = &p->pg[p->open];
    rec->version = g->version;
    rec->seq = p->seq + 1;
    if (rec->written_ns == 0)
        rec->written_ns = now_ns();
    if ((rc = kvr_ssdf_rec_prep(p->f, p->open, g->used, rec, body, nbody, io)) != KVR_OK)
        return rc;
    p->seq++;
    *loc = (kvr_ssdp_loc_t){.page = p->open, .version = g->version, .off = g->used, .span = span, .nth = g->nrecords, .sum_off = p->sum_len};
    p->sum_len += kvr_ssd_sument_encode(rec, g->used, p->sum + p->sum_len);
    g->used += span;
    g->nrecords++;
    g->live_records++;
    g->live_bytes += span;
    p->st.appended++;
    p->st.appended_bytes += rec->length;
    return KVR_OK;
}

int kvr_ssdp_append(kvr_ssdp_t *p, kvr_ssd_rec_t *rec, const struct iovec *body, int nbody, kvr_ssdp_loc_t *loc)
{
    kvr_ssdf_wr_t io;
    int rc;

    if (p->inflight > 0)
        return KVR_AGAIN;
    if ((rc = place(p, rec, body, nbody, loc, &io)) != KVR_OK)
        return rc;
    rc = kvr_ssdf_wr_sync(p->f, &io);
    kvr_ssdf_wr_free(&io);
    if (rc != KVR_OK) {
        cut(p, loc);
        seal_open(p);
        p->cut = 0;
        return KVR_ERR;
    }
    p->unsynced += loc->span;
    return KVR_OK;
}

/* Puts slot's write on the ring, IOV_MAX pieces a part. */
static void submit(kvr_ssdp_t *p, unsigned slot)
{
    kvr_ssdf_wr_t *io = &p->wr[slot].io;
    uint64_t at = io->at;

    for (unsigned first = 0, part = 0; first < (unsigned)io->niov; first += IOV_MAX, part++) {
        unsigned k = (unsigned)io->niov - first < IOV_MAX ? (unsigned)io->niov - first : IOV_MAX;
        struct io_uring_sqe *sqe = io_uring_get_sqe(p->ring);
        size_t len = 0;
        if (sqe == NULL && io_uring_submit(p->ring) >= 0)
            sqe = io_uring_get_sqe(p->ring);
        if (sqe == NULL) { /* the rest is not written: the record fails */
            p->wr[slot].err = p->wr[slot].err != 0 ? p->wr[slot].err : EBUSY;
            break;
        }
        for (unsigned i = first; i < first + k; i++)
            len += io->iov[i].iov_len;
        io_uring_prep_writev(sqe, p->f->fd, io->iov + first, k, at);
        io_uring_sqe_set_data64(sqe, WR_TAG | (uint64_t)part << 8 | slot);
        p->wr[slot].parts++;
        p->parts_inflight++;
        at += len;
    }
    io_uring_submit(p->ring);
    if (p->wr[slot].parts == 0) /* nothing went on the ring */
        write_done(p, slot, 1);
}

int kvr_ssdp_reserve(kvr_ssdp_t *p, kvr_ssd_rec_t *rec, const struct iovec *body, int nbody, kvr_ssdp_loc_t *loc,
                     unsigned slot)
{
    int rc;

    if (slot >= KVR_SSDP_WRITES_MAX || p->wr[slot].io.iov != NULL)
        return KVR_EINVAL;
    if ((rc = place(p, rec, body, nbody, loc, &p->wr[slot].io)) != KVR_OK)
        return rc;
    p->inflight++;
    p->inflight_bytes += loc->span;
    p->wr[slot].err = 0;
    p->wr[slot].parts = 0;
    p->wr[slot].t0_us = kvr_clock_us();
    if (p->ring != NULL) {
        submit(p, slot);
        return KVR_OK;
    }
    if (kvr_ssdf_wr_sync(p->f, &p->wr[slot].io) != KVR_OK) /* logged there */
        p->wr[slot].err = errno != 0 ? errno : EIO;
    write_done(p, slot, 0);
    return KVR_OK;
}

int kvr_ssdp_next(kvr_ssdp_t *p, int wait, unsigned *slot, int *ok)
{
    for (;;) {
        if (p->done_n > 0) {
            *slot = p->done[p->done_head];
            p->done_head = (p->done_head + 1) % KVR_SSDP_WRITES_MAX;
            p->done_n--;
            *ok = p->wr[*slot].err == 0;
            return 1;
        }
        if (p->ring == NULL || p->parts_inflight == 0 || !take(p, wait))
            return 0;
    }
}

void kvr_ssdp_settle(kvr_ssdp_t *p, unsigned slot, const kvr_ssdp_loc_t *loc, int ok)
{
    if (slot >= KVR_SSDP_WRITES_MAX || p->wr[slot].io.iov == NULL)
        return;
    kvr_ssdf_wr_free(&p->wr[slot].io);
    p->inflight--;
    p->inflight_bytes -= loc->span <= p->inflight_bytes ? loc->span : p->inflight_bytes;
    if (ok)
        p->unsynced += loc->span;
    else
        cut(p, loc);
    if (p->cut && p->inflight == 0) { /* sealed where it was cut */
        seal_open(p);
        p->cut = 0;
    }
}

void kvr_ssdp_forget(kvr_ssdp_t *p, uint64_t page, uint64_t version, uint64_t span)
{
    kvr_ssdp_page_t *g;

    if (page >= p->f->npages)
        return;
    g = &p->pg[page];
    if (g->state == KVR_SSDP_FREE || g->version != version || g->live_records == 0)
        return;
    g->live_records--;
    g->live_bytes -= span <= g->live_bytes ? span : g->live_bytes;
}

int kvr_ssdp_sync(kvr_ssdp_t *p)
{
    kvr_ssdp_reap(p, 0);
    if (p->unsynced == 0 || p->sync_busy)
        return KVR_OK;
    if (p->ring != NULL && sync_start(p) == KVR_OK)
        return KVR_OK;
    p->unsynced = 0;
    p->st.syncs++;
    return kvr_ssdf_sync(p->f);
}

uint64_t kvr_ssdp_free_pages(const kvr_ssdp_t *p)
{
    uint64_t n = 0;

    for (uint64_t i = 0; i < p->f->npages; i++)
        n += p->pg[i].state == KVR_SSDP_FREE;
    return n;
}

uint64_t kvr_ssdp_live_bytes(const kvr_ssdp_t *p)
{
    uint64_t n = 0;

    for (uint64_t i = 0; i < p->f->npages; i++)
        n += p->pg[i].live_bytes;
    return n;
}
