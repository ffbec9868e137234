/*
 * ssdpages.c — the disk tier's pages and write head (see ssdpages.h; docs/ssd-tier.md, "Pages
 * and the write head").
 *
 * The open page's summary grows with every append, in memory, and is written after the last
 * record when the page is sealed; an append that would leave no room for the summary it grows
 * seals the page first, so a seal never fails for room. Recycling picks the sealed page of the
 * oldest version: versions are handed out in order, so that is the page written longest ago.
 */
#include "io/ssdpages.h"

#include "base/log.h"

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
    if (p->pg == NULL || p->sum == NULL) {
        kvr_ssdp_free(p);
        return KVR_ERR;
    }
    return KVR_OK;
}

void kvr_ssdp_free(kvr_ssdp_t *p)
{
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

/* Seals the open page at g->used with the summary so far. */
int kvr_ssdp_seal(kvr_ssdp_t *p)
{
    kvr_ssdp_page_t *g;
    int rc;

    if (p->open == KVR_SSDP_NONE)
        return KVR_OK;
    g = &p->pg[p->open];
    p->open_hdr.nrecords = g->nrecords;
    p->open_hdr.used = g->used;
    rc = kvr_ssdf_page_seal(p->f, &p->open_hdr, p->sum, p->sum_len);
    if (rc != KVR_OK) /* left open on disk: the next scan walks it with every body checked */
        kvr_error("ssd: sealing page %llu failed; it is no longer written", (unsigned long long)p->open);
    g->state = KVR_SSDP_SEALED;
    p->open = KVR_SSDP_NONE;
    p->sum_len = 0;
    p->unsynced = 0; /* the seal synced (or failed: nothing more to sync of that page) */
    p->st.sealed++;
    p->st.syncs++;
    return rc == KVR_OK ? KVR_OK : KVR_ERR;
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

int kvr_ssdp_append(kvr_ssdp_t *p, kvr_ssd_rec_t *rec, const struct iovec *body, int nbody, kvr_ssdp_loc_t *loc)
{
    uint64_t span = kvr_ssd_rec_span(rec->key_len, rec->length);
    size_t ent = KVR_SSD_SUMENT_FIXED + rec->ns_len + rec->model_len + rec->key_len;
    kvr_ssdp_page_t *g;
    int rc;

    if (span > p->f->page_size / 2)
        return KVR_EINVAL;
    if (p->open != KVR_SSDP_NONE) {
        g = &p->pg[p->open];
        if (g->used + span + align_up(p->sum_len + ent) > p->f->page_size)
            kvr_ssdp_seal(p);
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
    rec->seq = ++p->seq;
    if (rec->written_ns == 0)
        rec->written_ns = now_ns();
    if ((rc = kvr_ssdf_rec_write(p->f, p->open, g->used, rec, body, nbody)) != KVR_OK) {
        KVR_LOG_RATELIMITED(KVR_LOG_ERROR, "ssd: a record of page %llu could not be written; the page is sealed where it was",
                            (unsigned long long)p->open);
        kvr_ssdp_seal(p);
        return rc == KVR_EINVAL ? KVR_EINVAL : KVR_ERR;
    }
    *loc = (kvr_ssdp_loc_t){.page = p->open, .version = g->version, .off = g->used, .span = span};
    p->sum_len += kvr_ssd_sument_encode(rec, g->used, p->sum + p->sum_len);
    g->used += span;
    g->nrecords++;
    g->live_records++;
    g->live_bytes += span;
    p->unsynced += span;
    p->st.appended++;
    p->st.appended_bytes += rec->length;
    return KVR_OK;
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
    if (p->unsynced == 0)
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
