/*
 * ssdtier.c — the disk tier's engine (see ssdtier.h; docs/ssd-tier.md).
 *
 * The restore runs the scan once. Pages come interleaved, so records of one key may arrive in
 * any order: the index keeps the highest write sequence per slot (in `seq_of`, private to the
 * restore) and tombstones are set aside and applied when the scan is done. Every record the
 * index does not keep is "forgotten" in the page table, so the pages' live counts are exact.
 */
#include "io/ssdtier.h"

#include "base/log.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct {
    uint64_t h1, h2, seq;
    uint16_t ns, key_len;
} tomb_t;

typedef struct {
    kvr_ssdt_t *t;
    uint64_t *seq_of; /* per slot: the write sequence of the record it holds */
    tomb_t *tomb;
    size_t ntomb, tomb_cap;
} restore_t;

static uint64_t slot_span(const kvr_dslot_t *s)
{
    return kvr_ssd_rec_span(s->key_len, s->length);
}

/* The page table's drop callback: page p of version v is being recycled. */
static void on_recycle(void *ctx, uint64_t page, uint64_t version)
{
    kvr_ssdt_t *t = ctx;

    t->st.recycled_slots += kvr_dindex_drop_page(t->dx, (uint32_t)page, version, t->on_slot, t->on_slot_ctx);
}

static int keep_tomb(restore_t *r, uint64_t h1, uint64_t h2, uint16_t ns, const kvr_ssd_rec_t *rec)
{
    if (r->ntomb == r->tomb_cap) {
        size_t cap = r->tomb_cap ? r->tomb_cap * 2 : 256;
        tomb_t *n = realloc(r->tomb, cap * sizeof(*n));
        if (n == NULL)
            return KVR_ERR;
        r->tomb = n;
        r->tomb_cap = cap;
    }
    r->tomb[r->ntomb++] = (tomb_t){h1, h2, rec->seq, ns, rec->key_len};
    return KVR_OK;
}

/* The scan's callback: one record kept by the scan. */
static int restore_rec(void *ctx, uint64_t page, uint64_t off, const kvr_ssd_page_t *pg, const kvr_ssd_rec_t *rec)
{
    restore_t *r = ctx;
    kvr_ssdt_t *t = r->t;
    uint64_t span = kvr_ssd_rec_span(rec->key_len, rec->length), seed;
    kvr_dslot_t v, old, cur;
    uint32_t id;
    uint16_t ns;
    uint8_t pool;

    kvr_ssdp_scan_rec(&t->p, page, off, pg, rec); /* counted live until forgotten below */
    if (t->resolve(t->resolve_ctx, rec, &ns, &seed, &pool) != KVR_OK) {
        kvr_ssdp_forget(&t->p, page, pg->version, span);
        t->st.restore_unknown_ns++;
        return 0;
    }
    memset(&v, 0, sizeof(v));
    kvr_dindex_hash(seed, rec->key, rec->key_len, &v.h1, &v.h2);
    if (rec->flags & KVR_SSD_REC_TOMBSTONE) {
        kvr_ssdp_forget(&t->p, page, pg->version, span); /* a tombstone holds nothing live */
        return keep_tomb(r, v.h1, v.h2, ns, rec) == KVR_OK ? 0 : KVR_ERR;
    }
    if (kvr_dindex_lookup(t->dx, ns, v.h1, v.h2, rec->key_len, &cur, &id) == 1 && r->seq_of[id] > rec->seq) {
        kvr_ssdp_forget(&t->p, page, pg->version, span); /* a later write of the key is indexed */
        t->st.restore_superseded++;
        return 0;
    }
    v.ns = ns;
    v.key_len = rec->key_len;
    v.length = rec->length;
    v.canon = rec->canon;
    v.pool = pool;
    v.page = (uint32_t)page;
    v.off4k = (uint32_t)(off / KVR_SSD_ALIGN);
    v.version = pg->version;
    if (kvr_dindex_put(t->dx, &v, &id, &old) != KVR_OK) {
        kvr_ssdp_forget(&t->p, page, pg->version, span);
        t->st.restore_index_full++;
        return 0;
    }
    if (old.page != KVR_NIL) {
        kvr_ssdp_forget(&t->p, old.page, old.version, slot_span(&old));
        t->st.restore_superseded++;
    }
    r->seq_of[id] = rec->seq;
    return 0;
}

/* Tombstones, once every record is in: each drops what was written of its key before it. */
static void apply_tombs(restore_t *r)
{
    kvr_ssdt_t *t = r->t;

    for (size_t i = 0; i < r->ntomb; i++) {
        const tomb_t *b = &r->tomb[i];
        kvr_dslot_t cur;
        uint32_t id;
        if (kvr_dindex_lookup(t->dx, b->ns, b->h1, b->h2, b->key_len, &cur, &id) == 1 && r->seq_of[id] < b->seq) {
            kvr_ssdp_forget(&t->p, cur.page, cur.version, slot_span(&cur));
            kvr_dindex_remove(t->dx, id);
            t->st.restore_tombstoned++;
        }
    }
}

int kvr_ssdt_open(kvr_ssdt_t *t, const char *path, uint64_t size, uint64_t page_size, kvr_dindex_t *dx,
                  kvr_ssdt_resolve_fn resolve, void *ctx)
{
    restore_t r = {.t = t};
    int rc;

    memset(t, 0, sizeof(*t));
    t->dx = dx;
    t->resolve = resolve;
    t->resolve_ctx = ctx;
    if ((rc = kvr_ssdf_open(&t->f, path, size, page_size, NULL)) != KVR_OK)
        return rc;
    if (kvr_ssdp_init(&t->p, &t->f, on_recycle, t) != KVR_OK || (r.seq_of = calloc(dx->nslots, sizeof(uint64_t))) == NULL) {
        kvr_ssdp_free(&t->p);
        kvr_ssdf_close(&t->f);
        return KVR_ERR;
    }
    kvr_dindex_format(dx);
    rc = kvr_ssdf_scan(&t->f, restore_rec, &r, &t->scan);
    if (rc == KVR_OK) {
        apply_tombs(&r);
        rc = kvr_ssdp_scan_done(&t->p, &t->scan);
    }
    free(r.seq_of);
    free(r.tomb);
    if (rc != KVR_OK) {
        kvr_ssdp_free(&t->p);
        kvr_ssdf_close(&t->f);
        return KVR_ERR;
    }
    t->st.restored = kvr_dindex_live(dx);
    kvr_info("ssd: %s: %llu blocks restored (%llu superseded, %llu deleted, %llu of namespaces gone, %llu without "
             "an index slot); %llu pages free of %llu",
             path, (unsigned long long)t->st.restored, (unsigned long long)t->st.restore_superseded,
             (unsigned long long)t->st.restore_tombstoned, (unsigned long long)t->st.restore_unknown_ns,
             (unsigned long long)t->st.restore_index_full, (unsigned long long)kvr_ssdp_free_pages(&t->p),
             (unsigned long long)t->f.npages);
    return KVR_OK;
}

void kvr_ssdt_close(kvr_ssdt_t *t)
{
    kvr_ssdp_seal(&t->p);
    kvr_ssdp_free(&t->p);
    kvr_ssdf_close(&t->f);
}

/* The record header of block b (version, seq and body_sum are the page table's to set). */
static int fill_rec(kvr_ssd_rec_t *rec, const kvr_ssdt_blk_t *b)
{
    size_t nl = strlen(b->ns_name), ml = strlen(b->model);

    if (b->key_len == 0 || b->key_len > KVR_KEY_MAX || nl == 0 || nl > KVR_SSD_NS_NAME_MAX || ml == 0 ||
        ml > KVR_SSD_MODEL_MAX)
        return KVR_EINVAL;
    memset(rec, 0, sizeof(*rec));
    rec->key_len = b->key_len;
    memcpy(rec->key, b->key, b->key_len);
    rec->khash = XXH3_64bits(b->key, b->key_len);
    rec->canon = b->canon;
    rec->length = b->length;
    rec->ns_len = (uint8_t)nl;
    memcpy(rec->ns, b->ns_name, nl);
    rec->model_len = (uint8_t)ml;
    memcpy(rec->model, b->model, ml);
    return KVR_OK;
}

int kvr_ssdt_write(kvr_ssdt_t *t, const kvr_ssdt_blk_t *b, const struct iovec *body, int nbody, kvr_ssdp_loc_t *loc)
{
    kvr_ssd_rec_t rec;
    int rc;

    if ((rc = fill_rec(&rec, b)) != KVR_OK)
        return rc;
    return kvr_ssdp_append(&t->p, &rec, body, nbody, loc);
}

int kvr_ssdt_reserve(kvr_ssdt_t *t, const kvr_ssdt_blk_t *b, const struct iovec *body, int nbody, kvr_ssdp_loc_t *loc,
                     unsigned slot)
{
    kvr_ssd_rec_t rec;
    int rc;

    if ((rc = fill_rec(&rec, b)) != KVR_OK)
        return rc;
    return kvr_ssdp_reserve(&t->p, &rec, body, nbody, loc, slot);
}

int kvr_ssdt_turn_due(const kvr_ssdt_t *t, const kvr_ssdt_blk_t *b)
{
    kvr_ssd_rec_t rec;

    return fill_rec(&rec, b) == KVR_OK && kvr_ssdp_full_for(&t->p, &rec);
}

int kvr_ssdt_turn(kvr_ssdt_t *t)
{
    int rc = kvr_ssdp_turn(&t->p);

    return rc != KVR_OK ? rc : (kvr_ssdt_compact(t) == KVR_ERR ? KVR_ERR : KVR_OK);
}

int kvr_ssdt_index(kvr_ssdt_t *t, const kvr_ssdt_blk_t *b, const kvr_ssdp_loc_t *loc)
{
    kvr_dslot_t v, old;
    uint32_t id;

    memset(&v, 0, sizeof(v));
    kvr_dindex_hash(b->seed, b->key, b->key_len, &v.h1, &v.h2);
    v.ns = b->ns;
    v.key_len = b->key_len;
    v.length = b->length;
    v.canon = b->canon;
    v.pool = b->pool;
    v.page = (uint32_t)loc->page;
    v.off4k = (uint32_t)(loc->off / KVR_SSD_ALIGN);
    v.version = loc->version;
    if (kvr_dindex_put(t->dx, &v, &id, &old) != KVR_OK) {
        kvr_ssdp_forget(&t->p, loc->page, loc->version, loc->span);
        t->st.demote_index_full++;
        return KVR_ENOSPACE;
    }
    if (old.page != KVR_NIL)
        kvr_ssdp_forget(&t->p, old.page, old.version, slot_span(&old));
    if (t->on_slot != NULL)
        t->on_slot(t->on_slot_ctx, id);
    t->st.demoted++;
    t->st.demoted_bytes += b->length;
    return KVR_OK;
}

void kvr_ssdt_unwrite(kvr_ssdt_t *t, const kvr_ssdp_loc_t *loc)
{
    kvr_ssdp_forget(&t->p, loc->page, loc->version, loc->span);
}

int kvr_ssdt_demote(kvr_ssdt_t *t, const kvr_ssdt_blk_t *b, const struct iovec *body, int nbody)
{
    kvr_ssdp_loc_t loc;
    int rc = kvr_ssdt_write(t, b, body, nbody, &loc);

    return rc == KVR_OK ? kvr_ssdt_index(t, b, &loc) : rc;
}

/* The tombstone of slot s's key: its record's header says the key, names and canon. */
static int write_tomb(kvr_ssdt_t *t, const kvr_dslot_t *s)
{
    kvr_ssd_rec_t rec, tomb;
    kvr_ssdp_loc_t loc;
    uint8_t *key;
    int rc = kvr_ssdf_rec_read(&t->f, s->page, s->version, (uint64_t)s->off4k * KVR_SSD_ALIGN, &rec);

    if (rc == KVR_ERR)
        return KVR_ERR;
    if (rc != KVR_SSD_OK)
        return KVR_OK; /* recycled or unreadable: nothing on disk says the key any more */
    tomb = rec;
    tomb.flags = KVR_SSD_REC_TOMBSTONE;
    tomb.length = 0;
    tomb.written_ns = 0;
    if ((key = kvr_ssdf_buf(KVR_SSD_ALIGN)) == NULL)
        return KVR_ERR;
    memcpy(key, rec.key, rec.key_len);
    rc = kvr_ssdp_append(&t->p, &tomb, &(struct iovec){key, rec.key_len}, 1, &loc);
    free(key);
    if (rc != KVR_OK)
        return KVR_ERR;
    kvr_ssdp_forget(&t->p, loc.page, loc.version, loc.span); /* it keeps no page alive */
    t->st.tombstones++;
    return KVR_OK;
}

/*
 * Deletes are found by scanning the slots for DEAD ones, but only when the workers' kill count
 * moved since the last scan that went all the way round, and at most REAP_SCAN slots a call (a
 * 1 TiB tier has 16 Mi slots: a whole scan every round would be a gigabyte read every 10 ms).
 * A kill counted before a scan starts is found by it; one counted later starts another. A
 * tombstone that cannot be written leaves its slot DEAD (a miss all the same) until the next
 * scan: the next kill's, or the clean stop's.
 */
#define REAP_SCAN (1u << 16)

int kvr_ssdt_reap(kvr_ssdt_t *t, unsigned max)
{
    uint64_t budget = max == UINT32_MAX ? UINT64_MAX : REAP_SCAN, kills = kvr_dindex_kills(t->dx), scanned;
    unsigned n = 0;
    uint32_t id;

    if (max == UINT32_MAX || t->cycle_left == 0) { /* a clean stop looks all the way round */
        if (kills == t->kills_seen && max != UINT32_MAX)
            return 0;
        t->cycle_kills = kills;
        t->cycle_left = t->dx->nslots;
    }
    while (n < max && t->cycle_left > 0 && budget > 0) {
        uint64_t step = t->cycle_left < budget ? t->cycle_left : budget;
        kvr_dslot_t s, now;
        id = kvr_dindex_scan_dead(t->dx, &t->reap_cursor, step, &scanned);
        t->cycle_left -= scanned;
        budget = budget == UINT64_MAX ? budget : budget - scanned;
        if (t->cycle_left == 0)
            t->kills_seen = t->cycle_kills;
        if (id == KVR_NIL)
            continue;
        kvr_dindex_get(t->dx, id, &s);
        if (write_tomb(t, &s) != KVR_OK)
            return KVR_ERR;
        /* The tombstone's append may have recycled the slot's own page (and freed the slot). */
        kvr_dindex_get(t->dx, id, &now);
        if (KVR_DSLOT_STATE(now.sw) == KVR_DSLOT_DEAD && now.page == s.page && now.version == s.version) {
            kvr_ssdp_forget(&t->p, s.page, s.version, slot_span(&s));
            kvr_dindex_remove(t->dx, id);
            if (t->on_slot != NULL)
                t->on_slot(t->on_slot_ctx, id);
        }
        n++;
    }
    return (int)n;
}

typedef struct {
    uint64_t version;
    uint32_t page;
} page_age_t;

typedef struct {
    uint32_t off4k, id;
    uint32_t sw;
    uint64_t length;
} rec_at_t;

static int by_version(const void *a, const void *b)
{
    uint64_t x = ((const page_age_t *)a)->version, y = ((const page_age_t *)b)->version;
    return x < y ? -1 : x > y;
}

static int by_offset(const void *a, const void *b)
{
    uint32_t x = ((const rec_at_t *)a)->off4k, y = ((const rec_at_t *)b)->off4k;
    return x < y ? -1 : x > y;
}

/* ------------------------------------------------------------------ compaction */

/* Copies the record of slot id (LIVE, on page `page` of its current version, *s) to the write
 * head and points the slot at the copy. 1 moved, 0 not (unreadable: it goes with its page),
 * KVR_ERR (a write failed: the page was sealed where it was, as for any failed write). */
static int compact_one(kvr_ssdt_t *t, uint32_t id, const kvr_dslot_t *s, uint8_t *buf)
{
    uint64_t off = (uint64_t)s->off4k * KVR_SSD_ALIGN;
    kvr_ssd_rec_t rec;
    kvr_ssdp_loc_t loc;
    kvr_dslot_t v = *s;

    if (kvr_ssdf_rec_read(&t->f, s->page, s->version, off, &rec) != KVR_SSD_OK || (rec.flags & KVR_SSD_REC_TOMBSTONE) ||
        rec.length != s->length || rec.key_len != s->key_len ||
        kvr_ssdf_body_read(&t->f, s->page, off, &rec, buf) != KVR_OK)
        return 0;
    if (kvr_ssdp_append(&t->p, &rec, &(struct iovec){buf, (size_t)rec.key_len + rec.length}, 1, &loc) != KVR_OK)
        return KVR_ERR;
    v.page = (uint32_t)loc.page;
    v.off4k = (uint32_t)(loc.off / KVR_SSD_ALIGN);
    v.version = loc.version;
    /* a DELETE that killed the slot meanwhile wins: the copy is left unindexed, and a
     * tombstone written after it keeps it dead at the next restart (the reaper's would find
     * nothing to say once this page is recycled) */
    if (!kvr_dindex_move_live(t->dx, id, s->sw, &v)) {
        kvr_dslot_t now;
        kvr_ssdp_forget(&t->p, loc.page, loc.version, loc.span);
        kvr_dindex_get(t->dx, id, &now);
        if (KVR_DSLOT_STATE(now.sw) != KVR_DSLOT_DEAD || KVR_DSLOT_GEN(now.sw) != KVR_DSLOT_GEN(s->sw))
            return 0; /* not a kill (the room check keeps its page from being recycled under it) */
        rec.flags = KVR_SSD_REC_TOMBSTONE;
        rec.length = 0;
        rec.written_ns = 0;
        if (kvr_ssdp_append(&t->p, &rec, &(struct iovec){buf, rec.key_len}, 1, &loc) != KVR_OK)
            return KVR_ERR;
        kvr_ssdp_forget(&t->p, loc.page, loc.version, loc.span);
        t->st.tombstones++;
        return 0;
    }
    kvr_ssdp_forget(&t->p, s->page, s->version, slot_span(s));
    if (t->on_slot != NULL)
        t->on_slot(t->on_slot_ctx, id);
    t->st.compacted++;
    t->st.compacted_bytes += s->length;
    return 1;
}

int kvr_ssdt_compact(kvr_ssdt_t *t)
{
    uint64_t vp = kvr_ssdp_victim(&t->p), used, room, max = 0;
    const kvr_ssdp_page_t *g, *o;
    rec_at_t *at;
    size_t nat = 0, cap, copied = 0;
    uint8_t *buf;
    kvr_dslot_t s;
    int rc = 0;

    if (vp == KVR_SSDP_NONE || t->p.open == KVR_SSDP_NONE || t->p.inflight > 0)
        return 0;
    g = &t->p.pg[vp];
    o = &t->p.pg[t->p.open];
    used = g->used > KVR_SSD_ALIGN ? g->used - KVR_SSD_ALIGN : 0;
    /* live over half of it; room for all of it in the open page, with a tombstone each (a
     * DELETE may win any of them) and their summary entries at their largest beside the
     * summary so far (else an append would open a page: this one, recycled under the copy);
     * one page compacted for each page opened otherwise */
    room = t->p.f->page_size - o->used;
    if (g->live_bytes * 2 <= used || 2 * t->st.compacted_pages + 1 > t->p.st.opened ||
        g->live_bytes + (uint64_t)g->live_records * kvr_ssd_rec_span(KVR_KEY_MAX, 0) +
                KVR_ALIGN_UP(t->p.sum_len + 2 * (uint64_t)g->live_records * KVR_SSD_SUMENT_MAX, KVR_SSD_ALIGN) >
            room)
        return 0;
    cap = g->live_records;
    if (cap == 0 || (at = malloc(cap * sizeof(*at))) == NULL)
        return 0;
    for (uint64_t i = 0; i < t->dx->nslots && nat < cap; i++) {
        kvr_dindex_get(t->dx, (uint32_t)i, &s);
        if (KVR_DSLOT_STATE(s.sw) == KVR_DSLOT_LIVE && s.page == vp && s.version == g->version) {
            at[nat++] = (rec_at_t){s.off4k, (uint32_t)i, s.sw, s.length};
            if (slot_span(&s) > max)
                max = slot_span(&s);
        }
    }
    qsort(at, nat, sizeof(*at), by_offset); /* the page read in its order */
    if ((buf = kvr_ssdf_buf(max)) == NULL) {
        free(at);
        return 0;
    }
    for (size_t k = 0; k < nat && rc != KVR_ERR; k++) {
        int moved;
        kvr_dindex_get(t->dx, at[k].id, &s);
        if (s.sw != at[k].sw)
            continue; /* moved, freed or killed since the pass */
        if ((moved = compact_one(t, at[k].id, &s, buf)) == KVR_ERR)
            rc = KVR_ERR;
        else
            copied += (size_t)moved;
    }
    free(buf);
    free(at);
    t->st.compacted_pages += copied > 0; /* the rate's count: pages something was copied from */
    return rc == KVR_ERR ? KVR_ERR : copied > 0;
}

/* ------------------------------------------------------------------ ssd= quotas */

/* Slot id, LIVE as *s says: dropped as a DELETE drops it (LIVE to DEAD, counted in the kills),
 * so that the reaper writes its tombstone and frees it: a dropped copy never comes back at a
 * restart. 1, or 0 when a worker killed it meanwhile (the reaper has it either way). */
static int quota_drop(kvr_ssdt_t *t, uint32_t id, const kvr_dslot_t *s)
{
    if (!kvr_dindex_kill_seen(t->dx, id, s->sw))
        return 0;
    t->st.quota_evicted++;
    t->st.quota_evicted_bytes += s->length;
    return 1;
}

/* A LIVE slot of ns whose record is in its page's current incarnation (*s: its copy). */
static int ns_slot(kvr_ssdt_t *t, uint32_t id, uint16_t ns, kvr_dslot_t *s)
{
    kvr_dindex_get(t->dx, id, s);
    return KVR_DSLOT_STATE(s->sw) == KVR_DSLOT_LIVE && s->ns == ns && s->page < t->f.npages &&
           t->p.pg[s->page].version == s->version;
}

uint64_t kvr_ssdt_quota(kvr_ssdt_t *t, uint16_t ns, uint64_t quota)
{
    uint64_t have = 0, need, acc = 0, vb = UINT64_MAX, rest = 0, freed = 0;
    uint64_t np = t->f.npages, *bytes;
    page_age_t *age = NULL;
    rec_at_t *at = NULL;
    size_t nage = 0, nat = 0, cap = 0;
    uint32_t bpage = KVR_NIL;
    kvr_dslot_t s;

    /* the gauge counts DEAD slots too (deletes and earlier drops not reaped yet): a cheap
     * filter; and the drops of the last call first reaped (their tombstones written) */
    if (quota == 0 || ns >= KVR_NS_MAX || kvr_dindex_ns_bytes(t->dx, ns) <= quota || t->quota_kills[ns] > t->kills_seen)
        return 0;
    if ((bytes = calloc(np, sizeof(*bytes))) == NULL || (age = malloc(np * sizeof(*age))) == NULL) {
        free(bytes);
        return 0; /* tried again next round */
    }
    /* one pass: the namespace's LIVE bytes in each page */
    for (uint64_t i = 0; i < t->dx->nslots; i++)
        if (ns_slot(t, (uint32_t)i, ns, &s)) {
            bytes[s.page] += s.length;
            have += s.length;
        }
    if (have <= quota) {
        free(bytes);
        free(age);
        return 0;
    }
    need = have - (quota - quota / 8);
    for (uint64_t pg = 0; pg < np; pg++)
        if (bytes[pg] > 0)
            age[nage++] = (page_age_t){t->p.pg[pg].version, (uint32_t)pg};
    qsort(age, nage, sizeof(*age), by_version);
    /* the oldest pages go whole; the page where `need` is reached, from its start */
    for (size_t k = 0; k < nage; k++) {
        if (acc + bytes[age[k].page] >= need) {
            vb = age[k].version;
            bpage = age[k].page;
            rest = need - acc;
            cap = t->p.pg[bpage].nrecords;
            break;
        }
        acc += bytes[age[k].page];
    }
    free(bytes);
    free(age);
    if (cap > 0 && (at = malloc(cap * sizeof(*at))) == NULL)
        return 0;
    /* a second pass: drop the older pages' slots, list the boundary page's */
    for (uint64_t i = 0; i < t->dx->nslots; i++) {
        if (!ns_slot(t, (uint32_t)i, ns, &s))
            continue;
        if (s.version < vb)
            freed += quota_drop(t, (uint32_t)i, &s) ? s.length : 0;
        else if (s.page == bpage && s.version == vb && nat < cap)
            at[nat++] = (rec_at_t){s.off4k, (uint32_t)i, s.sw, s.length};
    }
    qsort(at, nat, sizeof(*at), by_offset);
    for (size_t k = 0, got = 0; k < nat && got < rest; k++) {
        kvr_dindex_get(t->dx, at[k].id, &s);
        if (s.sw == at[k].sw && quota_drop(t, at[k].id, &s)) {
            got += s.length;
            freed += s.length;
        }
    }
    free(at);
    t->quota_kills[ns] = kvr_dindex_kills(t->dx); /* the next call waits for their reaping */
    return freed;
}

int kvr_ssdt_read(kvr_ssdt_t *t, const kvr_dslot_t *s, const void *key, size_t klen, void *buf)
{
    kvr_ssd_rec_t rec;
    uint64_t off = (uint64_t)s->off4k * KVR_SSD_ALIGN;
    int rc = kvr_ssdf_rec_read(&t->f, s->page, s->version, off, &rec);

    if (rc == KVR_ERR)
        return KVR_ERR;
    if (rc == KVR_SSD_STALE || (rc == KVR_SSD_OK && (rec.key_len != klen || memcmp(rec.key, key, klen) != 0 ||
                                                     (rec.flags & KVR_SSD_REC_TOMBSTONE) || rec.length != s->length))) {
        t->st.read_bad++;
        return KVR_ENOTFOUND;
    }
    if (rc == KVR_SSD_OK)
        rc = kvr_ssdf_body_read(&t->f, s->page, off, &rec, buf);
    else
        rc = KVR_EINVAL;
    if (rc == KVR_EINVAL) {
        if (t->st.read_bad++ == 0)
            kvr_warn("ssd: page %u offset %llu: the record is torn or corrupted; answered as a miss (logged once, "
                     "counted)",
                     s->page, (unsigned long long)off);
        return KVR_EINVAL;
    }
    if (rc == KVR_OK)
        t->st.read_ok++;
    return rc;
}
