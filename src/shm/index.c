/* index.c — see index.h for the design. */
#include "shm/index.h"

#include "base/atomics.h"
#include "base/barrier.h"
#include "base/dassert.h"

#include <stdlib.h>
#include <xxhash.h>

#define LOCKFREE_RETRIES 64

static inline uint32_t bucket_of(const kvr_index_t *ix, uint64_t khash)
{
    return (uint32_t)(khash & (ix->sh->nbuckets - 1));
}

/* The canon bucket of (ns, canon): the hash is the client's (X-KV-Sequence-Hash), so it is mixed
 * under the namespace's secret seed, as a key is, before it picks a bucket: one namespace can
 * neither aim its hashes at another's chains nor learn anything from the layout. */
static inline uint32_t canon_bucket(const kvr_index_t *ix, uint16_t ns, uint64_t canon)
{
    return (uint32_t)(XXH3_64bits_withSeed(&canon, sizeof(canon), ix->seed[ns]) & (ix->sh->nbuckets - 1));
}

/* This process holds the store lock. */
KVR_DASSERT_FN static inline int index_locked(const kvr_index_t *ix)
{
    return kvr_shlock_held(ix->lock);
}

/* Seqlock writer side: the store lock is held, so plain increments are race-free among
 * writers (the relaxed loads of seq below read our own last store). */
static inline void seq_begin(kvr_index_t *ix)
{
    uint64_t s = kvr_atomic_load_relaxed(&ix->sh->seq);
    kvr_atomic_store_relaxed(&ix->sh->seq, s + 1);
    /* Orders the odd seq before the chain stores that follow: pairs with the reader's acquire
     * fence before its re-check of seq (kvr_index_lookup_lockfree), so a reader that saw any
     * of those stores sees seq changed. */
    kvr_atomic_fence_release();
}

static inline void seq_end(kvr_index_t *ix)
{
    uint64_t s = kvr_atomic_load_relaxed(&ix->sh->seq);
    /* Pairs with the reader's acquire load of seq at the start of a try: a reader that sees
     * this even value sees every chain store of the section. */
    kvr_atomic_store_release(&ix->sh->seq, s + 1);
}

/* Empties every chain, the free list and every LRU list (the entries are left as they are). The
 * bucket stores are relaxed: the format publishes them by fork, the rebuild inside its seqlock
 * section. */
static void clear_lists(kvr_index_t *ix)
{
    for (uint64_t b = 0; b < ix->sh->nbuckets; b++) {
        kvr_atomic_store_relaxed(&ix->buckets[b], KVR_NIL);
        kvr_atomic_store_relaxed(&ix->cbuckets[b], KVR_NIL);
    }
    ix->sh->free_head = KVR_NIL;
    ix->sh->nfree = 0;
    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++)
        ix->lru[ns].head = ix->lru[ns].tail = KVR_NIL;
}

void kvr_index_format(kvr_index_t *ix)
{
    kvr_index_sh_t *sh = ix->sh;

    /* Before any other process maps the segment: fork publishes it, nothing pairs. */
    kvr_atomic_store_relaxed(&sh->seq, 0);
    clear_lists(ix);
    sh->clock = 0;
    /* Push in reverse so low indices come out first. */
    for (uint64_t i = sh->max_blocks; i-- > 0;) {
        kvr_entry_t *e = &ix->ent[i];
        memset(e, 0, sizeof(*e));
        e->state = KVR_ENT_FREE;
        e->first_page = KVR_NIL;
        e->canon_next = KVR_NIL;
        e->chain_next = sh->free_head;
        sh->free_head = (uint32_t)i;
        sh->nfree++;
    }
}

void kvr_index_set_key(kvr_entry_t *e, uint16_t ns, const void *key, size_t klen)
{
    size_t n1 = klen < KVR_KEY_HEAD ? klen : KVR_KEY_HEAD;

    e->key_len = (uint16_t)klen;
    e->ns = ns;
    memcpy(e->key_head, key, n1);
    if (klen > KVR_KEY_HEAD)
        memcpy(e->key_tail, (const uint8_t *)key + KVR_KEY_HEAD,
               klen - KVR_KEY_HEAD < KVR_KEY_TAIL ? klen - KVR_KEY_HEAD : KVR_KEY_TAIL);
}

/*
 * Compares (ns, key) with the entry's: namespace and length, inline head, inline tail, then
 * (keys over KVR_KEY_HEAD + KVR_KEY_TAIL bytes) the
 * rest from the arena. In the lock-free path the bytes may be changing under us; the
 * seqlock discards such a result, and every read stays within the entry or the arena.
 */
static inline int key_equal(const kvr_index_t *ix, const kvr_entry_t *e, uint16_t ns, const void *key, size_t klen)
{
    const uint8_t *k = key;
    size_t n1 = klen < KVR_KEY_HEAD ? klen : KVR_KEY_HEAD;
    uint32_t fp;

    /* Relaxed: under the seqlock a torn value is discarded by the seq re-check. */
    if (kvr_atomic_load_relaxed(&e->key_len) != klen || kvr_atomic_load_relaxed(&e->ns) != ns ||
        memcmp(e->key_head, k, n1) != 0)
        return 0;
    if (klen <= KVR_KEY_HEAD)
        return 1;
    if (memcmp(e->key_tail, k + KVR_KEY_HEAD,
               klen - KVR_KEY_HEAD < KVR_KEY_TAIL ? klen - KVR_KEY_HEAD : KVR_KEY_TAIL) != 0)
        return 0;
    if (klen <= KVR_KEY_HEAD + KVR_KEY_TAIL)
        return 1;
    fp = kvr_atomic_load_relaxed(&e->first_page); /* relaxed: validated by the seq re-check */
    return fp < ix->arena->sh->npages &&
           memcmp(kvr_arena_page(ix->arena, fp) + KVR_KEY_HEAD + KVR_KEY_TAIL, k + KVR_KEY_HEAD + KVR_KEY_TAIL,
                  klen - KVR_KEY_HEAD - KVR_KEY_TAIL) == 0;
}

uint32_t kvr_index_lookup_locked(const kvr_index_t *ix, uint16_t ns, const void *key, size_t klen, uint64_t khash)
{
    /* Under the lock: relaxed, the only writers are lock holders. */
    uint32_t i = kvr_atomic_load_relaxed(&ix->buckets[bucket_of(ix, khash)]);

    KVR_DASSERT(index_locked(ix));
    while (i != KVR_NIL) {
        const kvr_entry_t *e = &ix->ent[i];
        if (e->khash == khash && key_equal(ix, e, ns, key, klen))
            return i;
        i = e->chain_next;
    }
    return KVR_NIL;
}

int kvr_index_lookup_lockfree(const kvr_index_t *ix, uint16_t ns, const void *key, size_t klen, uint64_t khash,
                              uint64_t *length)
{
    const uint64_t max = ix->sh->max_blocks;

    for (int attempt = 0; attempt < LOCKFREE_RETRIES; attempt++) {
        /* Pairs with seq_end's release store: the chains of the last finished section are
         * visible to the loads below. */
        uint64_t s1 = kvr_atomic_load_acquire(&ix->sh->seq);
        uint64_t steps = 0, len = 0;
        int found = 0;
        uint32_t i;

        if (s1 & 1) {
            kvr_cpu_relax();
            continue;
        }
        i = kvr_atomic_load_relaxed(&ix->buckets[bucket_of(ix, khash)]); /* validated by the re-check */
        while (i != KVR_NIL && i < max && steps++ < max) {
            const kvr_entry_t *e = &ix->ent[i];
            /* Relaxed reads of fields a writer may be changing; the seq check below
             * discards anything read during a change. key_len is bounded by the compare. */
            if (kvr_atomic_load_relaxed(&e->khash) == khash && key_equal(ix, e, ns, key, klen)) {
                found = 1;
                len = kvr_atomic_load_relaxed(&e->length);
                break;
            }
            i = kvr_atomic_load_relaxed(&e->chain_next);
        }
        /* Orders the loads above before the re-check of seq: pairs with seq_begin's release
         * fence, so if any load saw a store of a section, the re-check sees seq moved. */
        kvr_atomic_fence_acquire();
        if (kvr_atomic_load_relaxed(&ix->sh->seq) == s1) {
            if (found && length != NULL)
                *length = len;
            return found;
        }
    }
    return KVR_AGAIN;
}

int kvr_index_canon_locked(const kvr_index_t *ix, uint16_t ns, uint32_t pool, uint64_t canon)
{
    /* Under the lock: relaxed, the only writers are lock holders. */
    uint32_t i = kvr_atomic_load_relaxed(&ix->cbuckets[canon_bucket(ix, ns, canon)]);

    KVR_DASSERT(index_locked(ix));
    while (i != KVR_NIL) {
        const kvr_entry_t *e = &ix->ent[i];
        if (e->canon == canon && e->pool == pool)
            return 1;
        i = e->canon_next;
    }
    return 0;
}

int kvr_index_canon_lockfree(const kvr_index_t *ix, uint16_t ns, uint32_t pool, uint64_t canon)
{
    const uint64_t max = ix->sh->max_blocks;
    const uint32_t b = canon_bucket(ix, ns, canon);

    for (int attempt = 0; attempt < LOCKFREE_RETRIES; attempt++) {
        /* Pairs with seq_end's release store: the chains of the last finished section are
         * visible to the loads below. */
        uint64_t s1 = kvr_atomic_load_acquire(&ix->sh->seq);
        uint64_t steps = 0;
        int found = 0;
        uint32_t i;

        if (s1 & 1) {
            kvr_cpu_relax();
            continue;
        }
        i = kvr_atomic_load_relaxed(&ix->cbuckets[b]); /* validated by the re-check */
        while (i != KVR_NIL && i < max && steps++ < max) {
            const kvr_entry_t *e = &ix->ent[i];
            /* Relaxed reads of fields a writer may be changing (an entry freed and reused
             * while we walk); the seq check below discards anything read during a change. */
            if (kvr_atomic_load_relaxed(&e->canon) == canon && kvr_atomic_load_relaxed(&e->pool) == pool) {
                found = 1;
                break;
            }
            i = kvr_atomic_load_relaxed(&e->canon_next);
        }
        /* Orders the loads above before the re-check of seq: pairs with seq_begin's release
         * fence, so if any load saw a store of a section, the re-check sees seq moved. */
        kvr_atomic_fence_acquire();
        if (kvr_atomic_load_relaxed(&ix->sh->seq) == s1)
            return found;
    }
    return KVR_AGAIN;
}

uint32_t kvr_index_entry_alloc_locked(kvr_index_t *ix)
{
    kvr_index_sh_t *sh = ix->sh;
    uint32_t i = sh->free_head;

    KVR_DASSERT(index_locked(ix));
    if (i == KVR_NIL)
        return KVR_NIL;
    sh->free_head = ix->ent[i].chain_next;
    sh->nfree--;
    ix->ent[i].chain_next = KVR_NIL;
    return i;
}

void kvr_index_entry_free_locked(kvr_index_t *ix, uint32_t i)
{
    kvr_index_sh_t *sh = ix->sh;
    kvr_entry_t *e = &ix->ent[i];

    KVR_DASSERT(index_locked(ix));
    e->state = KVR_ENT_FREE;
    e->meta = 0;
    e->first_page = KVR_NIL;
    e->refs = 0;
    e->pins = 0;
    e->chain_next = sh->free_head;
    sh->free_head = i;
    sh->nfree++;
}

static void lru_push_head(kvr_index_t *ix, uint32_t i)
{
    kvr_entry_t *e = &ix->ent[i];
    kvr_lru_t *l = &ix->lru[e->ns];

    e->lru_prev = KVR_NIL;
    e->lru_next = l->head;
    if (l->head != KVR_NIL)
        ix->ent[l->head].lru_prev = i;
    else
        l->tail = i;
    l->head = i;
}

static void lru_remove(kvr_index_t *ix, uint32_t i)
{
    kvr_entry_t *e = &ix->ent[i];
    kvr_lru_t *l = &ix->lru[e->ns];

    if (e->lru_prev != KVR_NIL)
        ix->ent[e->lru_prev].lru_next = e->lru_next;
    else
        l->head = e->lru_next;
    if (e->lru_next != KVR_NIL)
        ix->ent[e->lru_next].lru_prev = e->lru_prev;
    else
        l->tail = e->lru_prev;
    e->lru_prev = e->lru_next = KVR_NIL;
}

void kvr_index_link_locked(kvr_index_t *ix, uint32_t i)
{
    kvr_entry_t *e = &ix->ent[i];
    uint32_t b = bucket_of(ix, e->khash), cb = canon_bucket(ix, e->ns, e->canon);

    KVR_DASSERT(index_locked(ix));
    e->atime = ++ix->sh->clock;
    lru_push_head(ix, i);
    /* Relaxed stores inside the seqlock section: seq_begin's fence and seq_end's release
     * order them for the lock-free readers of either chain. */
    seq_begin(ix);
    kvr_atomic_store_relaxed(&e->chain_next, kvr_atomic_load_relaxed(&ix->buckets[b]));
    kvr_atomic_store_relaxed(&e->canon_next, kvr_atomic_load_relaxed(&ix->cbuckets[cb]));
    kvr_atomic_store_relaxed(&e->state, KVR_ENT_LIVE);
    kvr_atomic_store_relaxed(&ix->buckets[b], i);
    kvr_atomic_store_relaxed(&ix->cbuckets[cb], i);
    seq_end(ix);
}

/* The entry before i on the chain that starts at *head and continues through the link at byte
 * offset `link` of each entry: KVR_NIL when i is first; *found says whether i is on it at all.
 * Lock held: plain reads (relaxed for the bucket head, as every load of it). */
static uint32_t chain_prev(const kvr_index_t *ix, _Atomic uint32_t *head, size_t link, uint32_t i, int *found)
{
    uint32_t cur = kvr_atomic_load_relaxed(head), prev = KVR_NIL;

    while (cur != KVR_NIL && cur != i) {
        prev = cur;
        cur = *(const uint32_t *)((const uint8_t *)&ix->ent[cur] + link);
    }
    *found = cur == i;
    return prev;
}

void kvr_index_unlink_locked(kvr_index_t *ix, uint32_t i)
{
    kvr_entry_t *e = &ix->ent[i];
    uint32_t b = bucket_of(ix, e->khash), cb = canon_bucket(ix, e->ns, e->canon);
    int on_key, on_canon;
    uint32_t prev, cprev;

    KVR_DASSERT(index_locked(ix));
    /* Both walks before the section: only the relinks below are inside the seqlock window. A
     * canon chain holds every entry of its (namespace, hash) bucket, so this walk is as long
     * as the number of LIVE entries that share the hash (docs/kv-lookup.md, "Cost"). */
    prev = chain_prev(ix, &ix->buckets[b], offsetof(kvr_entry_t, chain_next), i, &on_key);
    cprev = chain_prev(ix, &ix->cbuckets[cb], offsetof(kvr_entry_t, canon_next), i, &on_canon);
    /* Relaxed stores inside the seqlock section, ordered by seq_begin/seq_end as in link. */
    seq_begin(ix);
    if (on_key) {
        if (prev == KVR_NIL)
            kvr_atomic_store_relaxed(&ix->buckets[b], e->chain_next);
        else
            kvr_atomic_store_relaxed(&ix->ent[prev].chain_next, e->chain_next);
    }
    if (on_canon) {
        if (cprev == KVR_NIL)
            kvr_atomic_store_relaxed(&ix->cbuckets[cb], e->canon_next);
        else
            kvr_atomic_store_relaxed(&ix->ent[cprev].canon_next, e->canon_next);
    }
    kvr_atomic_store_relaxed(&e->chain_next, KVR_NIL);
    kvr_atomic_store_relaxed(&e->canon_next, KVR_NIL);
    seq_end(ix);
    lru_remove(ix, i);
}

void kvr_index_touch_locked(kvr_index_t *ix, uint32_t i)
{
    KVR_DASSERT(index_locked(ix));
    ix->ent[i].atime = ++ix->sh->clock;
    if (ix->lru[ix->ent[i].ns].head == i)
        return;
    lru_remove(ix, i);
    lru_push_head(ix, i);
}

static const kvr_entry_t *sort_base;
static int by_atime_desc(const void *a, const void *b)
{
    uint64_t x = sort_base[*(const uint32_t *)a].atime, y = sort_base[*(const uint32_t *)b].atime;
    return x < y ? 1 : x > y ? -1
                             : 0;
}

void kvr_index_rebuild_locked(kvr_index_t *ix, kvr_index_dup_cb dup, void *ctx)
{
    kvr_index_sh_t *sh = ix->sh;
    uint32_t *live = malloc(sizeof(uint32_t) * (sh->max_blocks ? sh->max_blocks : 1));
    uint64_t nlive = 0, maxclock = 0;

    KVR_DASSERT(index_locked(ix));
    /* One seqlock section around the whole rebuild: lock-free readers retry, then lock. */
    seq_begin(ix);
    clear_lists(ix);
    for (uint64_t i = sh->max_blocks; i-- > 0;) {
        kvr_entry_t *e = &ix->ent[i];
        e->lru_prev = e->lru_next = KVR_NIL;
        if (e->atime > maxclock)
            maxclock = e->atime;
        e->canon_next = KVR_NIL;
        if (e->state == KVR_ENT_FREE) {
            e->first_page = KVR_NIL;
            e->chain_next = sh->free_head;
            sh->free_head = (uint32_t)i;
            sh->nfree++;
        } else {
            e->chain_next = KVR_NIL;
            if (e->state == KVR_ENT_LIVE && live != NULL)
                live[nlive++] = (uint32_t)i;
        }
    }
    if (sh->clock < maxclock)
        sh->clock = maxclock;
    /* Link LIVE entries, oldest first, so the LRU head ends up the most recent. */
    if (live != NULL) {
        sort_base = ix->ent;
        qsort(live, nlive, sizeof(uint32_t), by_atime_desc);
        for (uint64_t k = nlive; k-- > 0;) {
            uint32_t i = live[k];
            kvr_entry_t *e = &ix->ent[i];
            uint32_t b = bucket_of(ix, e->khash), cb = canon_bucket(ix, e->ns, e->canon);
            if (kvr_index_lookup_locked(ix, e->ns, kvr_index_key(ix, e), e->key_len, e->khash) != KVR_NIL) {
                dup(ctx, i);
                continue;
            }
            e->chain_next = kvr_atomic_load_relaxed(&ix->buckets[b]);
            kvr_atomic_store_relaxed(&ix->buckets[b], i);
            e->canon_next = kvr_atomic_load_relaxed(&ix->cbuckets[cb]);
            kvr_atomic_store_relaxed(&ix->cbuckets[cb], i);
            lru_push_head(ix, i);
        }
        free(live);
    }
    seq_end(ix);
}

/* Every canon chain: LIVE entries of that bucket only, each entry at most once (bitmap `seen`,
 * max_blocks bits, cleared by the caller); returns how many were linked, or UINT64_MAX. */
static uint64_t check_canon_chains(const kvr_index_t *ix, uint64_t live, uint8_t *seen)
{
    const kvr_index_sh_t *sh = ix->sh;
    uint64_t linked = 0;

    for (uint64_t b = 0; b < sh->nbuckets; b++) {
        /* seq_cst as the other checks' loads: the lock is held, no store races it, nothing pairs */
        for (uint32_t i = kvr_atomic_load_seq_cst(&ix->cbuckets[b]); i != KVR_NIL; i = ix->ent[i].canon_next) {
            const kvr_entry_t *e = &ix->ent[i];
            if (i >= sh->max_blocks || e->state != KVR_ENT_LIVE || e->ns >= KVR_NS_MAX ||
                canon_bucket(ix, e->ns, e->canon) != b || (seen[i / 8] & (1u << (i % 8))) || ++linked > live)
                return UINT64_MAX;
            seen[i / 8] |= (uint8_t)(1u << (i % 8));
        }
    }
    return linked;
}

int kvr_index_check_locked(const kvr_index_t *ix)
{
    const kvr_index_sh_t *sh = ix->sh;
    uint64_t live = 0, linked = 0, lru = 0, freecnt = 0;
    uint32_t prev = KVR_NIL;
    uint8_t *seen;

    KVR_DASSERT(index_locked(ix));
    /* Lock held: no writer is inside a section; seq_cst as it always was, nothing pairs. */
    if (kvr_atomic_load_seq_cst(&sh->seq) & 1)
        return KVR_ERR;
    for (uint64_t i = 0; i < sh->max_blocks; i++)
        live += ix->ent[i].state == KVR_ENT_LIVE;
    for (uint64_t b = 0; b < sh->nbuckets; b++) {
        /* seq_cst as the seq load above: the lock is held, no store races it, nothing pairs */
        for (uint32_t i = kvr_atomic_load_seq_cst(&ix->buckets[b]); i != KVR_NIL; i = ix->ent[i].chain_next) {
            if (i >= sh->max_blocks || ix->ent[i].state != KVR_ENT_LIVE || bucket_of(ix, ix->ent[i].khash) != b)
                return KVR_ERR;
            if (++linked > live)
                return KVR_ERR;
        }
    }
    seen = calloc(sh->max_blocks / 8 + 1, 1);
    if (seen == NULL)
        return KVR_ERR;
    linked = linked == live ? check_canon_chains(ix, live, seen) : UINT64_MAX;
    free(seen);
    if (linked != live) /* every LIVE entry once on its canon chain, nothing else */
        return KVR_ERR;
    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++) {
        prev = KVR_NIL;
        for (uint32_t i = ix->lru[ns].head; i != KVR_NIL; i = ix->ent[i].lru_next) {
            if (i >= sh->max_blocks || ix->ent[i].state != KVR_ENT_LIVE || ix->ent[i].ns != ns ||
                ix->ent[i].lru_prev != prev)
                return KVR_ERR;
            if (prev != KVR_NIL && ix->ent[prev].atime < ix->ent[i].atime)
                return KVR_ERR;
            if (++lru > live)
                return KVR_ERR;
            prev = i;
        }
        if (ix->lru[ns].tail != prev)
            return KVR_ERR;
    }
    for (uint32_t i = sh->free_head; i != KVR_NIL; i = ix->ent[i].chain_next) {
        if (i >= sh->max_blocks || ix->ent[i].state != KVR_ENT_FREE || ++freecnt > sh->max_blocks)
            return KVR_ERR;
    }
    if (lru != live || freecnt != sh->nfree)
        return KVR_ERR;
    return KVR_OK;
}
