/*
 * store.c — the store's operations: setup, put, get, exists, release, stats and the
 * publisher's resync. store.h has the semantics and the recovery model; the crash repair and
 * the debug check are in store_repair.c, what both share in store_int.h.
 *
 * Every function that touches shared state either takes the store lock (store_lock) or says
 * why it needs none: a GET's bytes are read under the caller's pin, a PUT's bytes are written
 * into a reservation only its owner writes, and exists() reads under the index's seqlock.
 */
#include "core/store.h"

#include "base/log.h"
#include "core/store_int.h"
#include "wire/keys.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <xxhash.h>

void (*kvr_store_fault_hook)(int point);

/* ------------------------------------------------------------------ setup */

static void bind_handles(kvr_store_t *st, kvr_seg_t *seg)
{
    kvr_seg_hdr_t *h = seg->hdr;

    memset(st, 0, sizeof(*st));
    st->seg = seg;
    st->sh = kvr_seg_at(seg, h->off_store);
    st->arena.sh = &st->sh->arena;
    st->arena.pages = kvr_seg_at(seg, h->off_pages);
    st->arena.data = kvr_seg_at(seg, h->off_arena);
    st->arena.page_shift = h->page_shift;
    st->arena.lock = &st->sh->lock;
    st->ix.sh = &st->sh->index;
    st->ix.lru = st->sh->ns_lru;
    st->ix.ent = kvr_seg_at(seg, h->off_entries);
    st->ix.buckets = kvr_seg_at(seg, h->off_buckets);
    st->ix.cbuckets = kvr_seg_at(seg, h->off_cbuckets);
    st->ix.seed = st->sh->ns_seed;
    st->ix.arena = &st->arena;
    st->ix.lock = &st->sh->lock;
    st->log = kvr_seg_at(seg, h->off_log);
    if (h->ssd_slots != 0)
        kvr_dindex_map(&st->dx, kvr_seg_at(seg, h->off_dindex), h->ssd_slots);
    st->pins_all = kvr_seg_at(seg, h->off_pins);
    st->pin_slots = h->pin_slots;
    st->page_size = h->page_size;
    st->scratch = kvr_seg_at(seg, h->off_scratch);
    st->slot = seg->slot;
    st->notify_fd = -1;
    st->my_stats = seg->slot >= 0 ? &st->sh->stats[seg->slot] : &st->sh->stats[KVR_STATS_RETIRED];
}

int kvr_store_format(kvr_seg_t *seg, int no_evict)
{
    kvr_seg_hdr_t *h = seg->hdr;
    kvr_store_t st;
    kvr_pin_t *pins;

    KVR_DASSERT(seg->slot < 0); /* the creator, before it claims a slot: nobody else maps it */
    bind_handles(&st, seg);
    memset(st.sh, 0, sizeof(*st.sh));
    if (kvr_shlock_init(&st.sh->lock) != KVR_OK)
        return KVR_ERR;
    st.sh->index.max_blocks = h->max_blocks;
    st.sh->index.nbuckets = h->nbuckets;
    st.sh->arena.npages = h->npages;
    st.sh->no_evict = no_evict ? 1 : 0;
    if (getrandom(st.sh->ns_seed, sizeof(st.sh->ns_seed), 0) != (ssize_t)sizeof(st.sh->ns_seed)) {
        kvr_error("store: getrandom for the namespace seeds: %s", strerror(errno));
        return KVR_ERR;
    }
    kvr_index_format(&st.ix);
    kvr_arena_format(&st.arena);
    kvr_chlog_format(st.log, h->log_capacity);
    if (st.dx.sh != NULL)
        kvr_dindex_format(&st.dx);
    pins = st.pins_all;
    for (uint64_t i = 0; i < (uint64_t)KVR_MAX_PROCS * h->pin_slots; i++) {
        pins[i].entry = KVR_NIL;
        pins[i].count = 0;
    }
    st.sh->formatted = 1;
    return KVR_OK;
}

int kvr_store_attach(kvr_seg_t *seg, int no_evict)
{
    kvr_seg_hdr_t *h = seg->hdr;
    kvr_store_t st;

    KVR_DASSERT(seg->slot < 0); /* as kvr_store_format: before the claim, before any fork */
    bind_handles(&st, seg);
    if (!st.sh->formatted) {
        kvr_error("store: re-attached segment was never formatted");
        return KVR_ERR;
    }
    /* The mutex may be held by a process of the previous run: no such process is alive now
     * (the segment file's lock says so), so a fresh mutex is the recovered one. */
    if (kvr_shlock_init(&st.sh->lock) != KVR_OK)
        return KVR_ERR;
    st.sh->no_evict = no_evict ? 1 : 0;
    for (uint64_t i = 0; i < (uint64_t)KVR_MAX_PROCS * h->pin_slots; i++) {
        st.pins_all[i].entry = KVR_NIL;
        st.pins_all[i].count = 0;
    }
    for (int s = 0; s < KVR_MAX_PROCS; s++)
        kvr_store_retire_stats(&st, s);
    if (st.dx.sh != NULL) /* the disk writer restores it from the file (io/ssdtier.c) */
        kvr_dindex_format(&st.dx);
    if (store_lock(&st) != KVR_OK)
        return KVR_ERR;
    kvr_store_pools_attach_locked(&st);
    kvr_store_repair_locked(&st, -1);
    store_unlock(&st);
    return KVR_OK;
}

int kvr_store_open(kvr_store_t *st, kvr_seg_t *seg)
{
    if (seg->hdr->magic != KVR_SEG_MAGIC || seg->hdr->layout_version != KVR_SEG_LAYOUT_VERSION) {
        kvr_error("store: segment magic/version mismatch");
        return KVR_ERR;
    }
    bind_handles(st, seg);
    if (!st->sh->formatted) {
        kvr_error("store: segment not formatted");
        return KVR_ERR;
    }
    if (st->slot < 0) {
        kvr_error("store: open without a process slot");
        return KVR_ERR;
    }
    return KVR_OK;
}

int kvr_store_key_valid(const void *key, size_t klen)
{
    return klen >= 1 && klen <= KVR_KEY_MAX && memchr(key, 0, klen) == NULL;
}

/* The chain hash of (ns, key): XXH3 under the namespace's secret seed (store_sh.h). */
static inline uint64_t key_hash(const kvr_store_t *st, uint16_t ns, const void *key, size_t klen)
{
    return XXH3_64bits_withSeed(key, klen, st->sh->ns_seed[ns]);
}

uint64_t kvr_store_default_canon(const void *key, size_t klen)
{
    return kvr_key_canon(key, klen);
}

uint64_t kvr_store_block_max(const kvr_store_t *st)
{
    uint64_t bytes = st->sh->arena.npages << st->arena.page_shift;

    /* pages_for(KVR_KEY_MAX, bytes - KVR_KEY_MAX) == npages: fits an empty arena exactly */
    return bytes > KVR_KEY_MAX ? bytes - KVR_KEY_MAX : 0;
}

/* ------------------------------------------------------------------ pin tables */

static inline uint32_t pin_hash(uint32_t entry, uint32_t mask)
{
    return (entry * 0x9E3779B1u) & mask;
}

/* Adds one pin of entry to this process's table. KVR_OK or KVR_EBUSY. Locked. */
static int pin_add_locked(kvr_store_t *st, uint32_t entry)
{
    kvr_pin_t *t = pin_table(st, st->slot);
    uint32_t mask = st->pin_slots - 1, i = pin_hash(entry, mask);

    KVR_DASSERT(store_locked(st) && store_mine(st));
    for (uint32_t n = 0; n < st->pin_slots; n++, i = (i + 1) & mask) {
        if (t[i].entry == entry) {
            t[i].count++;
            return KVR_OK;
        }
        if (t[i].entry == KVR_NIL) {
            if (n > st->pin_slots / 2)
                return KVR_EBUSY; /* keep probes short: treat as full */
            t[i].count = 1;
            t[i].entry = entry;
            return KVR_OK;
        }
    }
    return KVR_EBUSY;
}

/* Drops one pin of entry from this process's table (backward-shift delete). Locked. */
static int pin_del_locked(kvr_store_t *st, uint32_t entry)
{
    kvr_pin_t *t = pin_table(st, st->slot);
    uint32_t mask = st->pin_slots - 1, i = pin_hash(entry, mask), j;

    KVR_DASSERT(store_locked(st) && store_mine(st));
    for (uint32_t n = 0;; n++, i = (i + 1) & mask) {
        if (n >= st->pin_slots || t[i].entry == KVR_NIL)
            return KVR_ENOTFOUND;
        if (t[i].entry == entry)
            break;
    }
    if (--t[i].count > 0)
        return KVR_OK;
    /* Backward shift: pull later members of the probe run into the hole. */
    j = i;
    for (;;) {
        uint32_t home;
        j = (j + 1) & mask;
        if (t[j].entry == KVR_NIL)
            break;
        home = pin_hash(t[j].entry, mask);
        /* t[j] may move to i if i lies cyclically in [home, j). */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t[i] = t[j];
            i = j;
        }
    }
    t[i].entry = KVR_NIL;
    t[i].count = 0;
    return KVR_OK;
}

/* How many pins of entry this process's table holds. Its only writer is this process, so
 * it may read the table without the lock (the debug check of a pinned read). */
KVR_DASSERT_FN static uint32_t pin_count_mine(const kvr_store_t *st, uint32_t entry)
{
    const kvr_pin_t *t = pin_table(st, st->slot);
    uint32_t mask = st->pin_slots - 1, i = pin_hash(entry, mask);

    for (uint32_t n = 0; n < st->pin_slots && t[i].entry != KVR_NIL; n++, i = (i + 1) & mask)
        if (t[i].entry == entry)
            return t[i].count;
    return 0;
}

/* ------------------------------------------------------------------ removal and eviction */

static void free_entry_locked(kvr_store_t *st, uint32_t i)
{
    kvr_entry_t *e = &st->ix.ent[i];

    KVR_DASSERT(store_locked(st));
    if (e->first_page != KVR_NIL)
        kvr_arena_free_locked(&st->arena, e->first_page);
    kvr_index_entry_free_locked(&st->ix, i);
}

/*
 * Takes a LIVE block out of the resident set: it becomes invisible at once, its remove
 * event is logged, and its memory is freed now or, if pinned, at the last unpin. Locked.
 */
void kvr_store_remove_block_locked(kvr_store_t *st, uint32_t i)
{
    kvr_store_sh_t *sh = st->sh;
    kvr_entry_t *e = &st->ix.ent[i];

    KVR_DASSERT(store_locked(st));
    /* DYING is the roll-forward point: a repair completes what follows. Relaxed: the seqlock
     * readers of kvr_index_lookup_lockfree load it relaxed and validate by seq (index.c). */
    kvr_atomic_store_relaxed(&e->state, KVR_ENT_DYING);
    kvr_index_unlink_locked(&st->ix, i);
    FAULT_POINT(KVR_FAULT_REMOVE_UNLINKED);
    sh->unique_blocks--;
    sh->total_refs -= e->refs;
    sh->resident_bytes -= e->length;
    sh->ns_agg[e->ns].blocks--;
    sh->ns_agg[e->ns].refs -= e->refs;
    sh->ns_agg[e->ns].resident_bytes -= e->length;
    sh->ns_agg[e->ns].logical_bytes -= e->length * e->refs;
    sh->logical_bytes -= e->length * e->refs;
    if (e->meta & KVR_ENT_ANNOUNCED) {
        chlog_event_locked(st, KVR_EV_REMOVE, i);
        e->meta &= (uint8_t)~KVR_ENT_ANNOUNCED;
    }
    if (e->pins > 0) {
        e->state = KVR_ENT_ZOMBIE;
        sh->zombies++;
    } else {
        free_entry_locked(st, i);
    }
}

/* ------------------------------------------------------------------ a block's bytes */

/*
 * The one walk over a block's bytes in its arena chain: `left` bytes from byte `skip` of the
 * chain (the key comes first, so a payload offset is skipped by key_len + off), handed out
 * one span (part of a run) at a time. Every reader and writer of block bytes goes through it.
 *
 * No lock: the caller owns the chain for the walk's duration, either by a pin (a pinned
 * block's chain is never freed, split or relinked) or as the owner of a reservation (no other
 * process touches a RESERVED entry's chain). kvr_arena_next_span asserts the run it reads is
 * in use; the callers assert the pin or the reservation.
 */
typedef struct {
    uint32_t run;
    uint64_t skip, left;
} span_walk_t;

static inline span_walk_t span_walk(const kvr_store_t *st, const kvr_entry_t *e, uint64_t off, uint64_t n)
{
    return (span_walk_t){e->first_page, e->key_len + off, n};
}

/* The next span: 1 with *p and *k (k >= 1), or 0 when the bytes asked for are done. */
static inline int span_next(const kvr_store_t *st, span_walk_t *w, uint8_t **p, uint64_t *k)
{
    uint64_t len;

    while (w->left > 0 && kvr_arena_next_span(&st->arena, &w->run, &w->skip, p, &len)) {
        if (len == 0)
            continue; /* a run wholly inside the skipped key bytes */
        *k = len < w->left ? len : w->left;
        w->left -= *k;
        return 1;
    }
    return 0;
}

/* Copies n bytes between buf and a block's payload at off (to_block: into the block).
 * Returns the bytes not copied: 0 unless the chain is shorter than its entry says. */
static uint64_t copy_block(kvr_store_t *st, const kvr_entry_t *e, uint64_t off, uint8_t *buf, uint64_t n,
                           int to_block)
{
    span_walk_t w = span_walk(st, e, off, n);
    uint8_t *p;
    uint64_t k;

    while (span_next(st, &w, &p, &k)) {
        if (to_block)
            memcpy(p, buf, k);
        else
            memcpy(buf, p, k);
        buf += k;
    }
    return w.left;
}

/* Fills iov with the spans of n payload bytes at off; returns the count (<= max). */
static size_t block_iov(kvr_store_t *st, const kvr_entry_t *e, uint64_t off, uint64_t n, struct iovec *iov,
                        size_t max)
{
    span_walk_t w = span_walk(st, e, off, n);
    size_t cnt = 0;
    uint8_t *p;
    uint64_t k;

    while (cnt < max && span_next(st, &w, &p, &k)) {
        iov[cnt].iov_base = p;
        iov[cnt].iov_len = k;
        cnt++;
    }
    return cnt;
}

/* A pinned block's whole chain, key then payload, as iovecs (the disk tier's record body). */
size_t kvr_store_ref_chain_iov(kvr_store_t *st, const kvr_block_ref_t *ref, struct iovec *iov, size_t max)
{
    const kvr_entry_t *e = &st->ix.ent[ref->entry];
    span_walk_t w = {e->first_page, 0, e->key_len + ref->length};
    size_t cnt = 0;
    uint8_t *p;
    uint64_t k;

    KVR_DASSERT(store_mine(st) && pin_count_mine(st, ref->entry) > 0);
    while (cnt < max && span_next(st, &w, &p, &k)) {
        iov[cnt].iov_base = p;
        iov[cnt].iov_len = k;
        cnt++;
    }
    return w.left == 0 ? cnt : 0;
}

/* The calling process owns txn's reservation: only it writes the chain (see span_walk). */
KVR_DASSERT_FN static int txn_mine(const kvr_store_t *st, const kvr_put_txn_t *txn)
{
    const kvr_entry_t *e = &st->ix.ent[txn->entry];

    return store_mine(st) && kvr_atomic_load_relaxed(&e->state) == KVR_ENT_RESERVED &&
           (int)KVR_ENT_OWNER(e) == st->slot && kvr_atomic_load_relaxed(&e->gen) == txn->gen;
}

/* ------------------------------------------------------------------ put */

int kvr_store_put_begin(kvr_store_t *st, uint16_t ns, uint32_t pool, const void *key, size_t klen, uint64_t len,
                        uint64_t canon, kvr_put_txn_t *txn)
{
    kvr_store_sh_t *sh = st->sh;
    uint64_t khash, pages;
    uint32_t i, head;
    kvr_entry_t *e;
    int rc;

    KVR_DASSERT(store_mine(st));
    /* acquire: pairs with kvr_store_pool's release store of npools (the slot is whole) */
    if (!kvr_store_key_valid(key, klen) || ns >= KVR_NS_MAX || pool >= kvr_atomic_load_acquire(&sh->npools))
        return KVR_EINVAL;
    KVR_DASSERT(sh->pool[pool].ns == ns); /* the caller resolved the pool from this namespace */
    khash = key_hash(st, ns, key, klen);
    pages = pages_for(st, klen, len);
    if (store_lock(st) != KVR_OK)
        return KVR_ERR;
    i = kvr_index_lookup_locked(&st->ix, ns, key, klen, khash);
    if (i != KVR_NIL) {
        e = &st->ix.ent[i];
        if (e->length != len) {
            store_unlock(st);
            kvr_stat_add(st->my_stats, KVR_ST_PUT_CONFLICT, 1);
            ns_stat_add(st, ns, KVR_NSST_PUT_CONFLICTS, 1);
            return KVR_ECONFLICT;
        }
        e->refs++;
        sh->total_refs++;
        sh->logical_bytes += len;
        sh->ns_agg[ns].refs++;
        sh->ns_agg[ns].logical_bytes += len;
        e->meta |= KVR_ENT_READ; /* asked for again: admitted to the disk tier */
        kvr_index_touch_locked(&st->ix, i);
        store_unlock(st);
        kvr_stat_add(st->my_stats, KVR_ST_PUT_DEDUP, 1);
        ns_stat_add(st, ns, KVR_NSST_PUT_DEDUP, 1);
        return KVR_PUT_DEDUP;
    }
    rc = kvr_store_make_room_locked(st, ns, len, pages);
    if (rc != KVR_OK) {
        store_unlock(st);
        kvr_stat_add(st->my_stats, KVR_ST_PUT_NOSPACE, 1);
        return rc;
    }
    i = kvr_index_entry_alloc_locked(&st->ix);
    head = kvr_arena_alloc_locked(&st->arena, pages);
    e = &st->ix.ent[i];
    e->khash = khash;
    /* Relaxed: a lock-free walker of a stale canon chain may load canon and pool (index.c) */
    kvr_atomic_store_relaxed(&e->canon, canon);
    e->length = len;
    kvr_index_set_key(e, ns, key, klen);
    kvr_atomic_store_relaxed(&e->pool, (uint8_t)pool);
    e->refs = 0;
    e->pins = 0;
    e->first_page = head;
    e->gen++;
    e->meta = (uint8_t)st->slot;
    sh->ns_agg[ns].reserved_bytes += len; /* a repair recounts it from the entries */
    /* State last: a crash before this leaves a FREE entry and unowned pages (reclaimed).
     * Release pairs with nothing lock-free (a RESERVED entry is on no chain, so no seqlock
     * reader reaches it); the next locker sees it through the lock, and the repair orders
     * after the mutex's own release. Kept release so that the state is the last store. */
    kvr_atomic_store_release(&e->state, KVR_ENT_RESERVED);
    store_unlock(st);

    memcpy(kvr_arena_page(&st->arena, head), key, klen);
    txn->entry = i;
    txn->gen = e->gen;
    txn->length = len;
    txn->key_len = (uint16_t)klen;
    txn->promote = 0; /* a PUT, unless the caller says otherwise */
    return KVR_OK;
}

int kvr_store_put_write(kvr_store_t *st, const kvr_put_txn_t *txn, uint64_t off, const void *src, uint64_t n)
{
    KVR_DASSERT(txn_mine(st, txn));
    if (off > txn->length || n > txn->length - off)
        return KVR_EINVAL;
    copy_block(st, &st->ix.ent[txn->entry], off, (uint8_t *)(uintptr_t)src, n, 1);
    return KVR_OK;
}

size_t kvr_store_txn_iov(kvr_store_t *st, const kvr_put_txn_t *txn, uint64_t off, struct iovec *iov, size_t max)
{
    KVR_DASSERT(txn_mine(st, txn));
    return block_iov(st, &st->ix.ent[txn->entry], off, off < txn->length ? txn->length - off : 0, iov, max);
}

size_t kvr_store_txn_chain_iov(kvr_store_t *st, const kvr_put_txn_t *txn, uint64_t from, struct iovec *iov,
                               size_t max)
{
    const kvr_entry_t *e = &st->ix.ent[txn->entry];
    uint64_t all = e->key_len + txn->length;
    span_walk_t w = {e->first_page, from, from < all ? all - from : 0};
    size_t cnt = 0;
    uint8_t *p;
    uint64_t k;

    KVR_DASSERT(txn_mine(st, txn));
    while (cnt < max && span_next(st, &w, &p, &k)) {
        iov[cnt].iov_base = p;
        iov[cnt].iov_len = k;
        cnt++;
    }
    return cnt;
}

int kvr_store_put_commit(kvr_store_t *st, kvr_put_txn_t *txn)
{
    kvr_store_sh_t *sh = st->sh;
    kvr_entry_t *e = &st->ix.ent[txn->entry];
    uint32_t other;
    uint16_t ns;
    int rc;

    KVR_DASSERT(store_mine(st));
    if (store_lock(st) != KVR_OK)
        return KVR_ERR;
    if (e->state != KVR_ENT_RESERVED || e->gen != txn->gen) {
        /* Only a repair that believed us dead can take a reservation away. */
        store_unlock(st);
        kvr_error("store: reservation %u lost before commit", txn->entry);
        return KVR_ERR;
    }
    ns = e->ns;
    sh->ns_agg[ns].reserved_bytes -= e->length; /* resident from here, or given back */
    other = kvr_index_lookup_locked(&st->ix, ns, kvr_index_key(&st->ix, e), e->key_len, e->khash);
    if (other != KVR_NIL) {
        /* A concurrent put of the same key committed first. */
        kvr_entry_t *o = &st->ix.ent[other];
        if (o->length == e->length) {
            o->refs++;
            sh->total_refs++;
            sh->logical_bytes += o->length;
            sh->ns_agg[ns].refs++;
            sh->ns_agg[ns].logical_bytes += o->length;
            kvr_index_touch_locked(&st->ix, other);
            rc = KVR_PUT_DEDUP;
        } else {
            rc = KVR_ECONFLICT;
        }
        free_entry_locked(st, txn->entry);
        store_unlock(st);
        kvr_stat_add(st->my_stats, rc == KVR_PUT_DEDUP ? KVR_ST_PUT_DEDUP : KVR_ST_PUT_CONFLICT, 1);
        ns_stat_add(st, ns, rc == KVR_PUT_DEDUP ? KVR_NSST_PUT_DEDUP : KVR_NSST_PUT_CONFLICTS, 1);
        return rc;
    }
    e->refs = 1;
    kvr_index_link_locked(&st->ix, txn->entry); /* publishes: state LIVE, on the chain */
    FAULT_POINT(KVR_FAULT_COMMIT_LINKED);
    sh->unique_blocks++;
    sh->total_refs++;
    sh->resident_bytes += e->length;
    sh->logical_bytes += e->length;
    sh->ns_agg[e->ns].blocks++;
    sh->ns_agg[e->ns].refs++;
    sh->ns_agg[e->ns].resident_bytes += e->length;
    sh->ns_agg[e->ns].logical_bytes += e->length;
    chlog_event_locked(st, KVR_EV_INSERT, txn->entry);
    e->meta |= KVR_ENT_ANNOUNCED;
    store_unlock(st);
    if (!txn->promote) {
        kvr_stat_add(st->my_stats, KVR_ST_PUT_NEW, 1);
        ns_stat_add(st, ns, KVR_NSST_PUT_NEW, 1);
    }
    return KVR_PUT_CREATED;
}

void kvr_store_put_abort(kvr_store_t *st, kvr_put_txn_t *txn)
{
    kvr_entry_t *e = &st->ix.ent[txn->entry];

    KVR_DASSERT(store_mine(st));
    if (store_lock(st) != KVR_OK)
        return;
    if (e->state == KVR_ENT_RESERVED && e->gen == txn->gen) {
        st->sh->ns_agg[e->ns].reserved_bytes -= e->length;
        free_entry_locked(st, txn->entry);
    }
    store_unlock(st);
}

int kvr_store_put(kvr_store_t *st, uint16_t ns, uint32_t pool, const void *key, size_t klen, const void *data,
                  uint64_t len, uint64_t canon)
{
    kvr_put_txn_t txn;
    int rc = kvr_store_put_begin(st, ns, pool, key, klen, len, canon, &txn);

    if (rc != KVR_OK)
        return rc;
    kvr_store_put_write(st, &txn, 0, data, len);
    return kvr_store_put_commit(st, &txn);
}

/* ------------------------------------------------------------------ get, exists, release */

/* Validates the key, takes the lock and looks it up: KVR_OK with the lock held and *i the
 * LIVE entry; KVR_ENOTFOUND, KVR_EINVAL or KVR_ERR without the lock. */
static int lock_and_find(kvr_store_t *st, uint16_t ns, const void *key, size_t klen, uint32_t *i)
{
    uint64_t khash;

    KVR_DASSERT(store_mine(st));
    if (!kvr_store_key_valid(key, klen) || ns >= KVR_NS_MAX)
        return KVR_EINVAL;
    khash = key_hash(st, ns, key, klen);
    if (store_lock(st) != KVR_OK)
        return KVR_ERR;
    *i = kvr_index_lookup_locked(&st->ix, ns, key, klen, khash);
    if (*i == KVR_NIL) {
        store_unlock(st);
        return KVR_ENOTFOUND;
    }
    return KVR_OK;
}

static_assert(KVR_MAX_PROCS <= 64, "an entry's owner slot is 6 bits of its meta (shm/index.h)");

int kvr_store_pin_locked(kvr_store_t *st, uint32_t i, kvr_block_ref_t *ref)
{
    kvr_entry_t *e = &st->ix.ent[i];

    KVR_DASSERT(store_locked(st) && e->state == KVR_ENT_LIVE);
    if (pin_add_locked(st, i) != KVR_OK)
        return KVR_EBUSY;
    if (e->pins++ == 0)
        st->sh->pinned_entries++;
    ref->entry = i;
    ref->gen = e->gen;
    ref->length = e->length;
    ref->canon = e->canon;
    return KVR_OK;
}

void kvr_store_count_miss(kvr_store_t *st, uint16_t ns)
{
    kvr_stat_add(st->my_stats, KVR_ST_GET_MISS, 1);
    ns_stat_add(st, ns, KVR_NSST_GET_MISSES, 1);
}

int kvr_store_get(kvr_store_t *st, uint16_t ns, const void *key, size_t klen, kvr_block_ref_t *ref)
{
    return kvr_store_get_counted(st, ns, key, klen, ref, KVR_GET_COUNT_HIT | KVR_GET_COUNT_MISS);
}

int kvr_store_get_counted(kvr_store_t *st, uint16_t ns, const void *key, size_t klen, kvr_block_ref_t *ref,
                          unsigned count)
{
    uint32_t i;
    kvr_entry_t *e;
    int rc = lock_and_find(st, ns, key, klen, &i);

    if (rc == KVR_ENOTFOUND && (count & KVR_GET_COUNT_MISS))
        kvr_store_count_miss(st, ns);
    if (rc != KVR_OK)
        return rc;
    if (kvr_store_pin_locked(st, i, ref) != KVR_OK) {
        store_unlock(st);
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "store: pin table full (%u slots)", st->pin_slots);
        return KVR_EBUSY;
    }
    e = &st->ix.ent[i];
    FAULT_POINT(KVR_FAULT_PINNED);
    e->meta |= KVR_ENT_READ; /* the disk tier's admission: read since it was stored */
    kvr_index_touch_locked(&st->ix, i);
    store_unlock(st);
    if (count & KVR_GET_COUNT_HIT) {
        kvr_stat_add(st->my_stats, KVR_ST_GET_HIT, 1);
        ns_stat_add(st, ns, KVR_NSST_GET_HITS, 1);
    }
    return KVR_OK;
}

/* A pinned block's bytes are read without the lock: the pin (asserted) keeps its chain. */
size_t kvr_store_ref_iov(kvr_store_t *st, const kvr_block_ref_t *ref, uint64_t off, struct iovec *iov, size_t max)
{
    KVR_DASSERT(store_mine(st) && pin_count_mine(st, ref->entry) > 0);
    return block_iov(st, &st->ix.ent[ref->entry], off, off < ref->length ? ref->length - off : 0, iov, max);
}

int kvr_store_read(kvr_store_t *st, const kvr_block_ref_t *ref, uint64_t off, void *dst, uint64_t n)
{
    KVR_DASSERT(store_mine(st) && pin_count_mine(st, ref->entry) > 0);
    if (off > ref->length || n > ref->length - off)
        return KVR_EINVAL;
    return copy_block(st, &st->ix.ent[ref->entry], off, dst, n, 0) == 0 ? KVR_OK : KVR_ERR;
}

void kvr_store_unpin_locked(kvr_store_t *st, uint32_t entry)
{
    kvr_entry_t *e = &st->ix.ent[entry];

    KVR_DASSERT(store_locked(st));
    if (pin_del_locked(st, entry) == KVR_OK && e->pins > 0) {
        if (--e->pins == 0) {
            st->sh->pinned_entries--;
            if (e->state == KVR_ENT_ZOMBIE) {
                st->sh->zombies--;
                free_entry_locked(st, entry);
            }
        }
    }
}

void kvr_store_unpin(kvr_store_t *st, kvr_block_ref_t *ref)
{
    KVR_DASSERT(store_mine(st));
    if (store_lock(st) != KVR_OK)
        return;
    kvr_store_unpin_locked(st, ref->entry);
    store_unlock(st);
    ref->entry = KVR_NIL;
}

void kvr_store_unpin_flush(kvr_store_t *st)
{
    KVR_DASSERT(store_mine(st));
    if (st->unpin_n == 0 || store_lock(st) != KVR_OK)
        return;
    for (unsigned k = 0; k < st->unpin_n; k++)
        kvr_store_unpin_locked(st, st->unpin_q[k]);
    st->unpin_n = 0;
    store_unlock(st);
}

void kvr_store_unpin_later(kvr_store_t *st, kvr_block_ref_t *ref)
{
    if (st->unpin_n == KVR_STORE_UNPIN_BATCH)
        kvr_store_unpin_flush(st);
    if (st->unpin_n == KVR_STORE_UNPIN_BATCH) { /* the lock failed: never lose the pin */
        kvr_store_unpin(st, ref);
        return;
    }
    st->unpin_q[st->unpin_n++] = ref->entry;
    ref->entry = KVR_NIL;
}

int kvr_store_exists(kvr_store_t *st, uint16_t ns, const void *key, size_t klen, uint64_t *len)
{
    uint64_t khash;
    uint32_t i;
    int rc;

    KVR_DASSERT(store_mine(st));
    if (!kvr_store_key_valid(key, klen) || ns >= KVR_NS_MAX)
        return 0;
    khash = key_hash(st, ns, key, klen);
    rc = kvr_index_lookup_lockfree(&st->ix, ns, key, klen, khash, len);
    if (rc != KVR_AGAIN)
        return rc;
    if (store_lock(st) != KVR_OK)
        return 0;
    i = kvr_index_lookup_locked(&st->ix, ns, key, klen, khash);
    if (i != KVR_NIL && len != NULL)
        *len = st->ix.ent[i].length;
    store_unlock(st);
    return i != KVR_NIL;
}

int kvr_store_release(kvr_store_t *st, uint16_t ns, const void *key, size_t klen, uint32_t *refs_left)
{
    kvr_store_sh_t *sh = st->sh;
    uint32_t i;
    kvr_entry_t *e;
    int rc = lock_and_find(st, ns, key, klen, &i);

    if (rc != KVR_OK)
        return rc;
    e = &st->ix.ent[i];
    e->refs--;
    sh->total_refs--;
    sh->logical_bytes -= e->length;
    sh->ns_agg[ns].refs--;
    sh->ns_agg[ns].logical_bytes -= e->length;
    if (refs_left != NULL)
        *refs_left = e->refs;
    if (e->refs == 0)
        kvr_store_remove_block_locked(st, i);
    store_unlock(st);
    kvr_stat_add(st->my_stats, KVR_ST_DELETES, 1);
    ns_stat_add(st, ns, KVR_NSST_DELETES, 1);
    return KVR_OK;
}

/* ------------------------------------------------------------------ the publisher's resync */

void kvr_store_resync(kvr_store_t *st, kvr_store_scan_cb cb, void *ctx)
{
    kvr_entry_t *ent = st->ix.ent;

    if (store_lock(st) != KVR_OK)
        return;
    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++)
        if (ent[i].state == KVR_ENT_LIVE)
            cb(ctx, (uint32_t)i, ent[i].gen, ent[i].canon, ent[i].pool);
    /* The consumer's side of the change log, taken under the lock so that no append comes
     * between the scan and the new tail: every event up to head is in the scan. head is only
     * stored under the lock we hold (a plain value here); the release store of tail pairs with
     * the producers' acquire load of tail in kvr_chlog_append_locked (room in the ring). */
    kvr_atomic_store_release(&st->log->tail, kvr_atomic_load_relaxed(&st->log->head));
    /* Pairs with the consumer's acquire load of overflow (publisher.c): the tail store
     * above is visible once overflow reads 0. */
    kvr_atomic_store_release(&st->log->overflow, 0);
    store_unlock(st);
}
