/* store.c — see store.h for the semantics and the recovery model. */
#include "core/store.h"

#include "base/log.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#include <xxhash.h>

#define BIT_TEST(bm, i) ((bm)[(i) >> 3] & (1u << ((i) & 7)))

static void repair_locked(kvr_store_t *st, int dead_slot);

void (*kvr_store_fault_hook)(int point);
#define FAULT_POINT(p)                                                                             \
    do {                                                                                           \
        if (KVR_UNLIKELY(kvr_store_fault_hook != NULL))                                            \
            kvr_store_fault_hook(p);                                                               \
    } while (0)

/* ------------------------------------------------------------------ locking */

static int store_lock(kvr_store_t *st)
{
    int dead = -1;
    int rc = kvr_shlock_lock(&st->sh->lock, st->slot, &dead);

    if (KVR_LIKELY(rc == KVR_OK))
        return KVR_OK;
    if (rc == KVR_SHLOCK_RECOVERED) {
        st->sh->lock_recoveries++;
        repair_locked(st, dead);
        kvr_shlock_consistent(&st->sh->lock);
        return KVR_OK;
    }
    return KVR_ERR;
}

static inline void store_unlock(kvr_store_t *st)
{
    int wake = st->log_wakeup;

    st->log_wakeup = 0;
    kvr_shlock_unlock(&st->sh->lock);
    if (wake && st->notify_fd >= 0) {
        uint64_t one = 1;
        (void)!write(st->notify_fd, &one, sizeof(one));
    }
}

/* Appends to the change log and remembers to wake its consumer after unlocking. Locked. */
static void log_event_locked(kvr_store_t *st, uint32_t op, uint64_t canon, uint32_t entry, uint32_t gen)
{
    if (kvr_chlog_append_locked(st->log, op, canon, entry, gen) == 1)
        st->log_wakeup = 1;
}

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
    st->ix.sh = &st->sh->index;
    st->ix.ent = kvr_seg_at(seg, h->off_entries);
    st->ix.buckets = kvr_seg_at(seg, h->off_buckets);
    st->ix.arena = &st->arena;
    st->log = kvr_seg_at(seg, h->off_log);
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

    bind_handles(&st, seg);
    memset(st.sh, 0, sizeof(*st.sh));
    if (kvr_shlock_init(&st.sh->lock) != KVR_OK)
        return KVR_ERR;
    st.sh->index.max_blocks = h->max_blocks;
    st.sh->index.nbuckets = h->nbuckets;
    st.sh->arena.npages = h->npages;
    st.sh->no_evict = no_evict ? 1 : 0;
    kvr_index_format(&st.ix);
    kvr_arena_format(&st.arena);
    kvr_chlog_format(st.log, h->log_capacity);
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
        kvr_stats_retire(&st.sh->stats[KVR_STATS_RETIRED], &st.sh->stats[s]);
    if (store_lock(&st) != KVR_OK)
        return KVR_ERR;
    repair_locked(&st, -1);
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

uint64_t kvr_store_default_canon(const void *key, size_t klen)
{
    const uint8_t *k = key;
    uint64_t v = 0;

    if (klen == 16) {
        size_t i;
        for (i = 0; i < 16; i++) {
            uint8_t c = k[i];
            uint8_t d = c >= '0' && c <= '9' ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : 0xff;
            if (d == 0xff)
                break;
            v = (v << 4) | d;
        }
        if (i == 16)
            return v;
    }
    return XXH3_64bits(key, klen);
}

static inline uint64_t pages_for(const kvr_store_t *st, uint64_t klen, uint64_t len)
{
    return (klen + len + st->page_size - 1) >> st->arena.page_shift;
}

uint64_t kvr_store_block_max(const kvr_store_t *st)
{
    uint64_t bytes = st->sh->arena.npages << st->arena.page_shift;

    /* pages_for(KVR_KEY_MAX, bytes - KVR_KEY_MAX) == npages: fits an empty arena exactly */
    return bytes > KVR_KEY_MAX ? bytes - KVR_KEY_MAX : 0;
}

/* ------------------------------------------------------------------ pin tables */

static inline kvr_pin_t *pin_table(const kvr_store_t *st, int slot)
{
    return st->pins_all + (uint64_t)slot * st->pin_slots;
}

static inline uint32_t pin_hash(uint32_t entry, uint32_t mask)
{
    return (entry * 0x9E3779B1u) & mask;
}

/* Adds one pin of entry to this process's table. KVR_OK or KVR_EBUSY. Locked. */
static int pin_add_locked(kvr_store_t *st, uint32_t entry)
{
    kvr_pin_t *t = pin_table(st, st->slot);
    uint32_t mask = st->pin_slots - 1, i = pin_hash(entry, mask);

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

/* ------------------------------------------------------------------ removal and eviction */

static void free_entry_locked(kvr_store_t *st, uint32_t i)
{
    kvr_entry_t *e = &st->ix.ent[i];

    if (e->first_page != KVR_NIL)
        kvr_arena_free_locked(&st->arena, e->first_page);
    kvr_index_entry_free_locked(&st->ix, i);
}

/*
 * Takes a LIVE block out of the resident set: it becomes invisible at once, its remove
 * event is logged, and its memory is freed now or, if pinned, at the last unpin. Locked.
 */
static void remove_block_locked(kvr_store_t *st, uint32_t i)
{
    kvr_store_sh_t *sh = st->sh;
    kvr_entry_t *e = &st->ix.ent[i];

    /* DYING is the roll-forward point: a repair completes what follows. */
    __atomic_store_n(&e->state, KVR_ENT_DYING, __ATOMIC_RELAXED);
    kvr_index_unlink_locked(&st->ix, i);
    FAULT_POINT(KVR_FAULT_REMOVE_UNLINKED);
    sh->unique_blocks--;
    sh->total_refs -= e->refs;
    sh->resident_bytes -= e->length;
    sh->logical_bytes -= e->length * e->refs;
    if (e->meta & KVR_ENT_ANNOUNCED) {
        log_event_locked(st, KVR_EV_REMOVE, e->canon, i, e->gen);
        e->meta &= (uint8_t)~KVR_ENT_ANNOUNCED;
    }
    if (e->pins > 0) {
        e->state = KVR_ENT_ZOMBIE;
        sh->zombies++;
    } else {
        free_entry_locked(st, i);
    }
}

/*
 * Makes room for `pages` pages and one entry by evicting least recently used unpinned
 * blocks. First checks that enough can be freed, so a put that cannot fit evicts nothing.
 * Returns KVR_OK or KVR_ENOSPACE. Locked.
 */
static int make_room_locked(kvr_store_t *st, uint64_t pages)
{
    kvr_store_sh_t *sh = st->sh;
    uint64_t have_pages = sh->arena.free_pages, have_entries = sh->index.nfree;
    uint32_t i;

    if (have_pages >= pages && have_entries >= 1)
        return KVR_OK;
    if (sh->no_evict || pages > sh->arena.npages)
        return KVR_ENOSPACE;
    /* Dry run from the LRU tail. */
    for (i = sh->index.lru_tail; i != KVR_NIL && (have_pages < pages || have_entries < 1);
         i = st->ix.ent[i].lru_prev) {
        const kvr_entry_t *e = &st->ix.ent[i];
        if (e->pins > 0)
            continue;
        have_pages += pages_for(st, e->key_len, e->length);
        have_entries++;
    }
    if (have_pages < pages || have_entries < 1)
        return KVR_ENOSPACE;
    i = sh->index.lru_tail;
    while (i != KVR_NIL && (sh->arena.free_pages < pages || sh->index.nfree < 1)) {
        kvr_entry_t *e = &st->ix.ent[i];
        uint32_t prev = e->lru_prev;
        if (e->pins == 0) {
            FAULT_POINT(KVR_FAULT_EVICTING);
            kvr_stat_add(st->my_stats, KVR_ST_EVICTIONS, 1);
            kvr_stat_add(st->my_stats, KVR_ST_EVICTED_BYTES, e->length);
            remove_block_locked(st, i);
        }
        i = prev;
    }
    return KVR_OK;
}

/* ------------------------------------------------------------------ put */

static void copy_into_chain(kvr_store_t *st, uint32_t head, uint64_t off, const uint8_t *src, uint64_t n)
{
    uint32_t run = head;
    uint64_t skip = off;
    uint8_t *p;
    uint64_t len;

    while (n > 0 && kvr_arena_next_span(&st->arena, &run, &skip, &p, &len)) {
        uint64_t k = len < n ? len : n;
        if (k == 0)
            continue;
        memcpy(p, src, k);
        src += k;
        n -= k;
    }
}

int kvr_store_put_begin(kvr_store_t *st, const void *key, size_t klen, uint64_t len, uint64_t canon,
                        kvr_put_txn_t *txn)
{
    kvr_store_sh_t *sh = st->sh;
    uint64_t khash, pages;
    uint32_t i, head;
    kvr_entry_t *e;
    int rc;

    if (!kvr_store_key_valid(key, klen))
        return KVR_EINVAL;
    khash = XXH3_64bits(key, klen);
    pages = pages_for(st, klen, len);
    if (store_lock(st) != KVR_OK)
        return KVR_ERR;
    i = kvr_index_lookup_locked(&st->ix, key, klen, khash);
    if (i != KVR_NIL) {
        e = &st->ix.ent[i];
        if (e->length != len) {
            store_unlock(st);
            kvr_stat_add(st->my_stats, KVR_ST_PUT_CONFLICT, 1);
            return KVR_ECONFLICT;
        }
        e->refs++;
        sh->total_refs++;
        sh->logical_bytes += len;
        kvr_index_touch_locked(&st->ix, i);
        store_unlock(st);
        kvr_stat_add(st->my_stats, KVR_ST_PUT_DEDUP, 1);
        return KVR_PUT_DEDUP;
    }
    rc = make_room_locked(st, pages);
    if (rc != KVR_OK) {
        store_unlock(st);
        kvr_stat_add(st->my_stats, KVR_ST_PUT_NOSPACE, 1);
        return rc;
    }
    i = kvr_index_entry_alloc_locked(&st->ix);
    head = kvr_arena_alloc_locked(&st->arena, pages);
    e = &st->ix.ent[i];
    e->khash = khash;
    e->canon = canon;
    e->length = len;
    kvr_index_set_key(e, key, klen);
    e->refs = 0;
    e->pins = 0;
    e->first_page = head;
    e->gen++;
    e->meta = (uint8_t)st->slot;
    /* State last: a crash before this leaves a FREE entry and unowned pages (reclaimed). */
    __atomic_store_n(&e->state, KVR_ENT_RESERVED, __ATOMIC_RELEASE);
    store_unlock(st);

    memcpy(kvr_arena_page(&st->arena, head), key, klen);
    txn->entry = i;
    txn->gen = e->gen;
    txn->length = len;
    txn->key_len = (uint16_t)klen;
    return KVR_OK;
}

int kvr_store_put_write(kvr_store_t *st, const kvr_put_txn_t *txn, uint64_t off, const void *src, uint64_t n)
{
    if (off > txn->length || n > txn->length - off)
        return KVR_EINVAL;
    copy_into_chain(st, st->ix.ent[txn->entry].first_page, txn->key_len + off, src, n);
    return KVR_OK;
}

size_t kvr_store_txn_iov(kvr_store_t *st, const kvr_put_txn_t *txn, uint64_t off, struct iovec *iov, size_t max)
{
    kvr_block_ref_t ref = {txn->entry, txn->gen, txn->length, 0};
    return kvr_store_ref_iov(st, &ref, off, iov, max);
}

int kvr_store_put_commit(kvr_store_t *st, kvr_put_txn_t *txn)
{
    kvr_store_sh_t *sh = st->sh;
    kvr_entry_t *e = &st->ix.ent[txn->entry];
    uint32_t other;
    int rc;

    if (store_lock(st) != KVR_OK)
        return KVR_ERR;
    if (e->state != KVR_ENT_RESERVED || e->gen != txn->gen) {
        /* Only a repair that believed us dead can take a reservation away. */
        store_unlock(st);
        kvr_error("store: reservation %u lost before commit", txn->entry);
        return KVR_ERR;
    }
    other = kvr_index_lookup_locked(&st->ix, kvr_index_key(&st->ix, e), e->key_len, e->khash);
    if (other != KVR_NIL) {
        /* A concurrent put of the same key committed first. */
        kvr_entry_t *o = &st->ix.ent[other];
        if (o->length == e->length) {
            o->refs++;
            sh->total_refs++;
            sh->logical_bytes += o->length;
            kvr_index_touch_locked(&st->ix, other);
            rc = KVR_PUT_DEDUP;
        } else {
            rc = KVR_ECONFLICT;
        }
        free_entry_locked(st, txn->entry);
        store_unlock(st);
        kvr_stat_add(st->my_stats, rc == KVR_PUT_DEDUP ? KVR_ST_PUT_DEDUP : KVR_ST_PUT_CONFLICT, 1);
        return rc;
    }
    e->refs = 1;
    kvr_index_link_locked(&st->ix, txn->entry); /* publishes: state LIVE, on the chain */
    FAULT_POINT(KVR_FAULT_COMMIT_LINKED);
    sh->unique_blocks++;
    sh->total_refs++;
    sh->resident_bytes += e->length;
    sh->logical_bytes += e->length;
    log_event_locked(st, KVR_EV_INSERT, e->canon, txn->entry, e->gen);
    e->meta |= KVR_ENT_ANNOUNCED;
    store_unlock(st);
    kvr_stat_add(st->my_stats, KVR_ST_PUT_NEW, 1);
    return KVR_PUT_CREATED;
}

void kvr_store_put_abort(kvr_store_t *st, kvr_put_txn_t *txn)
{
    kvr_entry_t *e = &st->ix.ent[txn->entry];

    if (store_lock(st) != KVR_OK)
        return;
    if (e->state == KVR_ENT_RESERVED && e->gen == txn->gen)
        free_entry_locked(st, txn->entry);
    store_unlock(st);
}

int kvr_store_put(kvr_store_t *st, const void *key, size_t klen, const void *data, uint64_t len, uint64_t canon)
{
    kvr_put_txn_t txn;
    int rc = kvr_store_put_begin(st, key, klen, len, canon, &txn);

    if (rc != KVR_OK)
        return rc;
    kvr_store_put_write(st, &txn, 0, data, len);
    return kvr_store_put_commit(st, &txn);
}

/* ------------------------------------------------------------------ get, exists, release */

/* Validates the key, takes the lock and looks it up: KVR_OK with the lock held and *i the
 * LIVE entry or KVR_NIL; KVR_EINVAL or KVR_ERR without the lock. */
static int lock_and_find(kvr_store_t *st, const void *key, size_t klen, uint32_t *i)
{
    uint64_t khash;

    if (!kvr_store_key_valid(key, klen))
        return KVR_EINVAL;
    khash = XXH3_64bits(key, klen);
    if (store_lock(st) != KVR_OK)
        return KVR_ERR;
    *i = kvr_index_lookup_locked(&st->ix, key, klen, khash);
    return KVR_OK;
}

int kvr_store_get(kvr_store_t *st, const void *key, size_t klen, kvr_block_ref_t *ref)
{
    uint32_t i;
    kvr_entry_t *e;
    int rc = lock_and_find(st, key, klen, &i);

    if (rc != KVR_OK)
        return rc;
    if (i == KVR_NIL) {
        store_unlock(st);
        kvr_stat_add(st->my_stats, KVR_ST_GET_MISS, 1);
        return KVR_ENOTFOUND;
    }
    if (pin_add_locked(st, i) != KVR_OK) {
        store_unlock(st);
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "store: pin table full (%u slots)", st->pin_slots);
        return KVR_EBUSY;
    }
    e = &st->ix.ent[i];
    FAULT_POINT(KVR_FAULT_PINNED);
    if (e->pins++ == 0)
        st->sh->pinned_entries++;
    kvr_index_touch_locked(&st->ix, i);
    ref->entry = i;
    ref->gen = e->gen;
    ref->length = e->length;
    ref->canon = e->canon;
    store_unlock(st);
    kvr_stat_add(st->my_stats, KVR_ST_GET_HIT, 1);
    return KVR_OK;
}

size_t kvr_store_ref_iov(kvr_store_t *st, const kvr_block_ref_t *ref, uint64_t off, struct iovec *iov, size_t max)
{
    const kvr_entry_t *e = &st->ix.ent[ref->entry];
    uint32_t run = e->first_page;
    uint64_t skip = e->key_len + off, left = off < ref->length ? ref->length - off : 0;
    uint8_t *p;
    uint64_t len;
    size_t n = 0;

    while (left > 0 && n < max && kvr_arena_next_span(&st->arena, &run, &skip, &p, &len)) {
        uint64_t k = len < left ? len : left;
        if (k == 0)
            continue;
        iov[n].iov_base = p;
        iov[n].iov_len = k;
        n++;
        left -= k;
    }
    return n;
}

int kvr_store_read(kvr_store_t *st, const kvr_block_ref_t *ref, uint64_t off, void *dst, uint64_t n)
{
    const kvr_entry_t *e = &st->ix.ent[ref->entry];
    uint32_t run = e->first_page;
    uint64_t skip = e->key_len + off;
    uint8_t *out = dst, *p;
    uint64_t len;

    if (off > ref->length || n > ref->length - off)
        return KVR_EINVAL;
    while (n > 0 && kvr_arena_next_span(&st->arena, &run, &skip, &p, &len)) {
        uint64_t k = len < n ? len : n;
        if (k == 0)
            continue;
        memcpy(out, p, k);
        out += k;
        n -= k;
    }
    return n == 0 ? KVR_OK : KVR_ERR;
}

static void unpin_locked(kvr_store_t *st, uint32_t entry)
{
    kvr_entry_t *e = &st->ix.ent[entry];

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
    if (store_lock(st) != KVR_OK)
        return;
    unpin_locked(st, ref->entry);
    store_unlock(st);
    ref->entry = KVR_NIL;
}

void kvr_store_unpin_flush(kvr_store_t *st)
{
    if (st->unpin_n == 0 || store_lock(st) != KVR_OK)
        return;
    for (unsigned k = 0; k < st->unpin_n; k++)
        unpin_locked(st, st->unpin_q[k]);
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

int kvr_store_exists(kvr_store_t *st, const void *key, size_t klen, uint64_t *len)
{
    uint64_t khash;
    uint32_t i;
    int rc;

    if (!kvr_store_key_valid(key, klen))
        return 0;
    khash = XXH3_64bits(key, klen);
    rc = kvr_index_lookup_lockfree(&st->ix, key, klen, khash, len);
    if (rc != KVR_AGAIN)
        return rc;
    if (store_lock(st) != KVR_OK)
        return 0;
    i = kvr_index_lookup_locked(&st->ix, key, klen, khash);
    if (i != KVR_NIL && len != NULL)
        *len = st->ix.ent[i].length;
    store_unlock(st);
    return i != KVR_NIL;
}

int kvr_store_release(kvr_store_t *st, const void *key, size_t klen, uint32_t *refs_left)
{
    kvr_store_sh_t *sh = st->sh;
    uint32_t i;
    kvr_entry_t *e;
    int rc = lock_and_find(st, key, klen, &i);

    if (rc != KVR_OK)
        return rc;
    if (i == KVR_NIL) {
        store_unlock(st);
        return KVR_ENOTFOUND;
    }
    e = &st->ix.ent[i];
    e->refs--;
    sh->total_refs--;
    sh->logical_bytes -= e->length;
    if (refs_left != NULL)
        *refs_left = e->refs;
    if (e->refs == 0)
        remove_block_locked(st, i);
    store_unlock(st);
    kvr_stat_add(st->my_stats, KVR_ST_DELETES, 1);
    return KVR_OK;
}

/* ------------------------------------------------------------------ stats */

uint64_t kvr_store_counter(const kvr_store_t *st, unsigned i)
{
    return kvr_stats_sum(st->sh->stats, KVR_MAX_PROCS + 1, i);
}

void kvr_store_log_positions(const kvr_store_t *st, uint64_t *head, uint64_t *tail)
{
    *head = atomic_load(&st->log->head);
    *tail = atomic_load(&st->log->tail);
}

void kvr_store_stats(kvr_store_t *st, kvr_store_stats_t *o)
{
    kvr_store_sh_t *sh = st->sh;
    const kvr_stats_block_t *b = sh->stats;
    const unsigned n = KVR_MAX_PROCS + 1;

    memset(o, 0, sizeof(*o));
    if (store_lock(st) == KVR_OK) {
        o->unique_blocks = sh->unique_blocks;
        o->total_refs = sh->total_refs;
        o->resident_bytes = sh->resident_bytes;
        o->logical_bytes = sh->logical_bytes;
        o->pinned_blocks = sh->pinned_entries;
        o->zombie_blocks = sh->zombies;
        o->free_pages = sh->arena.free_pages;
        o->repairs = sh->repairs;
        o->lock_recoveries = sh->lock_recoveries;
        store_unlock(st);
    }
    o->dedup_savings_bytes = o->logical_bytes > o->resident_bytes ? o->logical_bytes - o->resident_bytes : 0;
    o->total_pages = sh->arena.npages;
    o->capacity_bytes = sh->arena.npages * st->page_size;
    o->dedup_hits = kvr_stats_sum(b, n, KVR_ST_PUT_DEDUP);
    o->get_hits = kvr_stats_sum(b, n, KVR_ST_GET_HIT);
    o->get_misses = kvr_stats_sum(b, n, KVR_ST_GET_MISS);
    o->evictions = kvr_stats_sum(b, n, KVR_ST_EVICTIONS);
    o->evicted_bytes = kvr_stats_sum(b, n, KVR_ST_EVICTED_BYTES);
    o->put_new = kvr_stats_sum(b, n, KVR_ST_PUT_NEW);
    o->put_conflicts = kvr_stats_sum(b, n, KVR_ST_PUT_CONFLICT);
    o->put_nospace = kvr_stats_sum(b, n, KVR_ST_PUT_NOSPACE);
    o->deletes = kvr_stats_sum(b, n, KVR_ST_DELETES);
    o->log_appended = atomic_load_explicit(&st->log->appended, memory_order_relaxed);
    o->log_dropped = atomic_load_explicit(&st->log->dropped, memory_order_relaxed);
}

/* ------------------------------------------------------------------ repair */

typedef struct {
    kvr_store_t *st;
} dup_ctx_t;

/* A second LIVE entry with an already-linked key (only after a torn relink): retire it. */
static void drop_duplicate(void *ctx, uint32_t i)
{
    kvr_store_t *st = ((dup_ctx_t *)ctx)->st;
    kvr_entry_t *e = &st->ix.ent[i];

    if (e->meta & KVR_ENT_ANNOUNCED)
        log_event_locked(st, KVR_EV_REMOVE, e->canon, i, e->gen);
    e->meta = 0;
    e->state = KVR_ENT_FREE;
}

static int proc_alive(const kvr_store_t *st, int slot, int dead_slot)
{
    return slot != dead_slot && atomic_load(&st->seg->procs[slot].state) == KVR_PROC_ACTIVE;
}

/* A writer that died inside a seqlock section left it odd: close it. */
static void close_seqlock_locked(kvr_store_sh_t *sh)
{
    uint64_t seq = atomic_load(&sh->index.seq);

    if (seq & 1)
        atomic_store(&sh->index.seq, seq + 1);
}

/* The dead process's pins die with it; they are recounted from the live tables below. */
static void clear_dead_pins_locked(kvr_store_t *st, int dead_slot)
{
    kvr_pin_t *t;

    if (dead_slot < 0 || dead_slot >= KVR_MAX_PROCS)
        return;
    t = pin_table(st, dead_slot);
    for (uint32_t k = 0; k < st->pin_slots; k++) {
        t[k].entry = KVR_NIL;
        t[k].count = 0;
    }
}

/* Step 1: pins zeroed, unknown states and dead reservations freed, DYING rolled forward. */
static void settle_entries_locked(kvr_store_t *st, int dead_slot)
{
    kvr_entry_t *ent = st->ix.ent;

    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++) {
        kvr_entry_t *e = &ent[i];
        e->pins = 0;
        if (e->state > KVR_ENT_DYING) {
            e->state = KVR_ENT_FREE;
        } else if (e->state == KVR_ENT_RESERVED && !proc_alive(st, KVR_ENT_OWNER(e), dead_slot)) {
            e->state = KVR_ENT_FREE;
        } else if (e->state == KVR_ENT_DYING) {
            if (e->meta & KVR_ENT_ANNOUNCED)
                log_event_locked(st, KVR_EV_REMOVE, e->canon, (uint32_t)i, e->gen);
            e->meta &= (uint8_t)~KVR_ENT_ANNOUNCED;
            e->state = KVR_ENT_ZOMBIE;
        }
    }
}

/* Step 2: each LIVE or ZOMBIE entry's pins are the sum over the live processes' tables. */
static void recount_pins_locked(kvr_store_t *st, int dead_slot)
{
    kvr_seg_hdr_t *h = st->seg->hdr;
    kvr_entry_t *ent = st->ix.ent;

    for (int s = 0; s < KVR_MAX_PROCS; s++) {
        kvr_pin_t *t = pin_table(st, s);
        if (!proc_alive(st, s, dead_slot))
            continue;
        for (uint32_t k = 0; k < st->pin_slots; k++) {
            uint32_t i = t[k].entry;
            if (i == KVR_NIL)
                continue;
            if (i < h->max_blocks && (ent[i].state == KVR_ENT_LIVE || ent[i].state == KVR_ENT_ZOMBIE))
                ent[i].pins += t[k].count;
        }
    }
}

/* Step 3: zombies nobody pins are freed; LIVE entries not yet announced are announced. */
static void free_zombies_announce_live_locked(kvr_store_t *st)
{
    kvr_entry_t *ent = st->ix.ent;

    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++) {
        kvr_entry_t *e = &ent[i];
        if (e->state == KVR_ENT_ZOMBIE && e->pins == 0)
            e->state = KVR_ENT_FREE;
        else if (e->state == KVR_ENT_LIVE && !(e->meta & KVR_ENT_ANNOUNCED)) {
            log_event_locked(st, KVR_EV_INSERT, e->canon, (uint32_t)i, e->gen);
            e->meta |= KVR_ENT_ANNOUNCED;
        }
    }
}

/* Step 4, first half: validate chains into the used-page bitmap bm (cleared by the caller);
 * an entry with a broken chain is dropped. */
static void drop_broken_chains_locked(kvr_store_t *st, uint8_t *bm)
{
    kvr_entry_t *ent = st->ix.ent;

    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++) {
        kvr_entry_t *e = &ent[i];
        if (e->state == KVR_ENT_FREE)
            continue;
        if (e->first_page == KVR_NIL ||
            !kvr_arena_claim_chain(&st->arena, e->first_page, pages_for(st, e->key_len, e->length), bm)) {
            kvr_warn("store repair: entry %llu has a broken chain; dropped", (unsigned long long)i);
            if (e->state == KVR_ENT_LIVE && (e->meta & KVR_ENT_ANNOUNCED))
                log_event_locked(st, KVR_EV_REMOVE, e->canon, (uint32_t)i, e->gen);
            e->meta = 0;
            e->state = KVR_ENT_FREE;
        }
    }
}

/* Step 5, first half: claims the surviving chains into bm (cleared by the caller) and
 * recomputes the aggregates from the entries. */
static void reclaim_and_count_locked(kvr_store_t *st, uint8_t *bm)
{
    kvr_store_sh_t *sh = st->sh;
    kvr_entry_t *ent = st->ix.ent;

    sh->unique_blocks = sh->total_refs = sh->resident_bytes = sh->logical_bytes = 0;
    sh->pinned_entries = sh->zombies = 0;
    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++) {
        kvr_entry_t *e = &ent[i];
        if (e->state == KVR_ENT_FREE)
            continue;
        kvr_arena_claim_chain(&st->arena, e->first_page, pages_for(st, e->key_len, e->length), bm);
        if (e->pins > 0)
            sh->pinned_entries++;
        if (e->state == KVR_ENT_ZOMBIE)
            sh->zombies++;
        if (e->state == KVR_ENT_LIVE) {
            sh->unique_blocks++;
            sh->total_refs += e->refs;
            sh->resident_bytes += e->length;
            sh->logical_bytes += e->length * e->refs;
        }
    }
}

/*
 * Full repair, lock held. Ground truth: each entry's state/fields, each chain in the page
 * map, and the pin tables of live processes. Everything else is rebuilt:
 *  1. reservations of dead processes are dropped; interrupted removals (DYING) roll forward;
 *  2. pins are recounted from live processes' pin tables (the dead one's is cleared);
 *  3. zombies nobody pins are freed; LIVE blocks whose insert event may be missing are
 *     announced again (the consumer de-duplicates by entry and generation);
 *  4. chains, LRU and the free list are rebuilt; chains are validated, invalid ones dropped;
 *  5. the arena's free lists are rebuilt from the used-page bitmap; aggregates recomputed.
 * The steps run in this order, each over the result of the one before.
 */
static void repair_locked(kvr_store_t *st, int dead_slot)
{
    kvr_store_sh_t *sh = st->sh;
    kvr_seg_hdr_t *h = st->seg->hdr;
    uint8_t *bm = st->scratch;
    dup_ctx_t dctx = {st};

    close_seqlock_locked(sh);
    clear_dead_pins_locked(st, dead_slot);
    settle_entries_locked(st, dead_slot);
    recount_pins_locked(st, dead_slot);
    free_zombies_announce_live_locked(st);

    memset(bm, 0, (h->npages + 7) / 8);
    drop_broken_chains_locked(st, bm);
    kvr_index_rebuild_locked(&st->ix, drop_duplicate, &dctx);
    /* Duplicates were freed after their chains were claimed: claim again from scratch. */
    memset(bm, 0, (h->npages + 7) / 8);
    reclaim_and_count_locked(st, bm);
    kvr_arena_rebuild_locked(&st->arena, bm);

    sh->repairs++;
    kvr_stat_add(st->my_stats, KVR_ST_REPAIRS, 1);
    kvr_info("store repair done (dead slot %d): %llu blocks resident, %llu pages free", dead_slot,
             (unsigned long long)sh->unique_blocks, (unsigned long long)sh->arena.free_pages);
}

int kvr_store_reap_slot(kvr_store_t *st, int slot)
{
    kvr_proc_sh_t *p;

    if (slot < 0 || slot >= KVR_MAX_PROCS || slot == st->slot)
        return KVR_ENOTFOUND;
    p = &st->seg->procs[slot];
    atomic_store(&p->state, KVR_PROC_DEAD);
    if (store_lock(st) != KVR_OK)
        return KVR_ERR;
    repair_locked(st, slot);
    store_unlock(st);
    kvr_stats_retire(&st->sh->stats[KVR_STATS_RETIRED], &st->sh->stats[slot]);
    atomic_store(&p->pid, 0);
    atomic_store(&p->state, KVR_PROC_FREE);
    return KVR_OK;
}

int kvr_store_reap(kvr_store_t *st, pid_t pid)
{
    int slot = kvr_seg_proc_find(st->seg, pid);
    return slot < 0 ? KVR_ENOTFOUND : kvr_store_reap_slot(st, slot);
}

void kvr_store_resync(kvr_store_t *st, kvr_store_scan_cb cb, void *ctx)
{
    kvr_entry_t *ent = st->ix.ent;

    if (store_lock(st) != KVR_OK)
        return;
    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++)
        if (ent[i].state == KVR_ENT_LIVE)
            cb(ctx, (uint32_t)i, ent[i].gen, ent[i].canon);
    atomic_store_explicit(&st->log->tail, atomic_load(&st->log->head), memory_order_release);
    atomic_store_explicit(&st->log->overflow, 0, memory_order_release);
    store_unlock(st);
}

/* ------------------------------------------------------------------ debug view */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            kvr_error("store check: " __VA_ARGS__);                                                \
            rc = KVR_ERR;                                                                          \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* Sums the pin tables into pins[] (one count per entry); only active slots may hold pins. */
static int check_pin_tables_locked(kvr_store_t *st, uint32_t *pins)
{
    kvr_seg_hdr_t *h = st->seg->hdr;
    int rc = KVR_OK;

    for (int s = 0; s < KVR_MAX_PROCS; s++) {
        kvr_pin_t *t = pin_table(st, s);
        int alive = atomic_load(&st->seg->procs[s].state) == KVR_PROC_ACTIVE;
        for (uint32_t k = 0; k < st->pin_slots; k++) {
            if (t[k].entry == KVR_NIL)
                continue;
            CHECK(alive, "slot %d is not active but holds pins", s);
            CHECK(t[k].entry < h->max_blocks && t[k].count > 0, "bad pin record in slot %d", s);
            pins[t[k].entry] += t[k].count;
        }
    }
done:
    return rc;
}

/* One entry against the pin tables' count for it, its chain (claimed into bm, so overlaps
 * show) and its state's invariants; counted into c as far as it got. */
static int check_entry_locked(kvr_store_t *st, uint64_t i, uint32_t pins, uint8_t *bm, kvr_store_stats_t *c)
{
    kvr_entry_t *e = &st->ix.ent[i];
    int rc = KVR_OK;

    CHECK(e->pins == pins, "entry %llu pins %u, pin tables say %u", (unsigned long long)i, e->pins, pins);
    if (e->state == KVR_ENT_FREE) {
        CHECK(e->pins == 0, "free entry %llu pinned", (unsigned long long)i);
        return KVR_OK;
    }
    CHECK(e->state != KVR_ENT_DYING, "entry %llu left DYING", (unsigned long long)i);
    CHECK(kvr_arena_claim_chain(&st->arena, e->first_page, pages_for(st, e->key_len, e->length), bm),
          "entry %llu chain invalid or overlapping", (unsigned long long)i);
    if (e->pins)
        c->pinned_blocks++;
    if (e->state == KVR_ENT_ZOMBIE) {
        CHECK(e->pins > 0, "unpinned zombie %llu", (unsigned long long)i);
        c->zombie_blocks++;
    }
    if (e->state == KVR_ENT_LIVE) {
        CHECK(e->refs > 0, "live entry %llu with zero refs", (unsigned long long)i);
        CHECK(e->meta & KVR_ENT_ANNOUNCED, "live entry %llu not announced", (unsigned long long)i);
        c->unique_blocks++;
        c->total_refs += e->refs;
        c->resident_bytes += e->length;
        c->logical_bytes += e->length * e->refs;
    }
    c->reserved_blocks += e->state == KVR_ENT_RESERVED;
    if (e->state == KVR_ENT_RESERVED)
        CHECK(atomic_load(&st->seg->procs[KVR_ENT_OWNER(e)].state) == KVR_PROC_ACTIVE,
              "reservation %llu owned by a dead slot", (unsigned long long)i);
done:
    return rc;
}

/* The whole scan, lock held: index, pin tables, every entry, the arena, then the
 * aggregates against what the scan counted into c. */
static int check_locked(kvr_store_t *st, uint32_t *pins, uint8_t *bm, kvr_store_stats_t *c)
{
    kvr_store_sh_t *sh = st->sh;
    int rc = KVR_OK;

    CHECK(kvr_index_check_locked(&st->ix) == KVR_OK, "index chains/LRU/free list inconsistent");
    if (check_pin_tables_locked(st, pins) != KVR_OK)
        return KVR_ERR;
    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++)
        if (check_entry_locked(st, i, pins[i], bm, c) != KVR_OK)
            return KVR_ERR;
    CHECK(kvr_arena_check_locked(&st->arena, bm) == KVR_OK, "arena free lists inconsistent");
    CHECK(c->unique_blocks == sh->unique_blocks && c->total_refs == sh->total_refs &&
              c->resident_bytes == sh->resident_bytes && c->logical_bytes == sh->logical_bytes,
          "aggregates differ from the scan (blocks %llu/%llu refs %llu/%llu bytes %llu/%llu)",
          (unsigned long long)c->unique_blocks, (unsigned long long)sh->unique_blocks,
          (unsigned long long)c->total_refs, (unsigned long long)sh->total_refs,
          (unsigned long long)c->resident_bytes, (unsigned long long)sh->resident_bytes);
    CHECK(c->pinned_blocks == sh->pinned_entries && c->zombie_blocks == sh->zombies, "pinned/zombie counts differ");
done:
    return rc;
}

int kvr_store_check(kvr_store_t *st, kvr_store_stats_t *out)
{
    kvr_seg_hdr_t *h = st->seg->hdr;
    uint32_t *pins = calloc(h->max_blocks, sizeof(uint32_t));
    uint8_t *bm = calloc((h->npages + 7) / 8 + 1, 1);
    kvr_store_stats_t c;
    int rc;

    /* Only the scan's own counts are filled in; every other field of out stays zero. */
    memset(&c, 0, sizeof(c));
    if (pins == NULL || bm == NULL) {
        free(pins);
        free(bm);
        return KVR_ERR;
    }
    if (store_lock(st) != KVR_OK) {
        free(pins);
        free(bm);
        return KVR_ERR;
    }
    rc = check_locked(st, pins, bm, &c);
    store_unlock(st);
    if (out != NULL)
        *out = c;
    free(pins);
    free(bm);
    return rc;
}
