/*
 * dindex.c — the disk index (see dindex.h; docs/concurrency.md, "The disk index").
 *
 * The writer's sections follow the RAM index's seqlock (shm/index.c): odd `seq` with a release
 * fence before the first store, even `seq` with a release store after the last. Readers load
 * `seq` with acquire, read fields relaxed, take an acquire fence and re-check `seq`. Walks are
 * bounded by nslots steps, so a reader racing a relink never loops.
 */
#include "shm/dindex.h"

#include "base/atomics.h"
#include "base/barrier.h"

#include <xxhash.h>

#define LOOKUP_TRIES 64

static uint64_t pow2_at_least(uint64_t n)
{
    uint64_t p = 1;

    while (p < n)
        p <<= 1;
    return p;
}

/* The region: state, slots, key buckets, canonical links, canonical buckets; each array from a
 * cache line. */
static uint64_t words(uint64_t n)
{
    return KVR_ALIGN_UP(n * sizeof(uint32_t), (uint64_t)KVR_CACHELINE);
}

uint64_t kvr_dindex_bytes(uint64_t nslots)
{
    uint64_t nb = pow2_at_least(nslots);

    return sizeof(kvr_dindex_sh_t) + nslots * sizeof(kvr_dslot_t) + 2 * words(nb) + words(nslots) +
           2 * KVR_NS_MAX * sizeof(uint64_t);
}

void kvr_dindex_map(kvr_dindex_t *dx, void *base, uint64_t nslots)
{
    uint8_t *p = base;
    uint64_t nb = pow2_at_least(nslots);

    dx->sh = (kvr_dindex_sh_t *)p;
    p += sizeof(kvr_dindex_sh_t);
    dx->slot = (kvr_dslot_t *)p;
    p += nslots * sizeof(kvr_dslot_t);
    dx->buckets = (_Atomic uint32_t *)p;
    p += words(nb);
    dx->canon_next = (_Atomic uint32_t *)p;
    p += words(nslots);
    dx->canon_buckets = (_Atomic uint32_t *)p;
    p += words(nb);
    dx->ns_live = (uint64_t *)p;
    dx->ns_bytes = dx->ns_live + KVR_NS_MAX;
    dx->nslots = nslots;
    dx->nbuckets = nb;
}

static void seq_begin(kvr_dindex_t *dx)
{
    kvr_atomic_store_relaxed(&dx->sh->seq, kvr_atomic_load_relaxed(&dx->sh->seq) + 1);
    kvr_atomic_fence_release(); /* the odd value before the stores of the section */
}

static void seq_end(kvr_dindex_t *dx)
{
    kvr_atomic_store_release(&dx->sh->seq, kvr_atomic_load_relaxed(&dx->sh->seq) + 1);
}

void kvr_dindex_format(kvr_dindex_t *dx)
{
    uint64_t n = dx->nslots, q = kvr_atomic_load_relaxed(&dx->sh->seq);

    /* A writer that died inside a section (or a region never used) may have left seq odd:
     * make it even, so the section below is odd while it runs, as every section is. */
    kvr_atomic_store_relaxed(&dx->sh->seq, q + (q & 1));
    seq_begin(dx);
    dx->sh->nslots = n; /* for a reader of the segment (debugging): the handles carry their own */
    dx->sh->nbuckets = dx->nbuckets;
    for (uint64_t b = 0; b < dx->nbuckets; b++) {
        kvr_atomic_store_relaxed(&dx->buckets[b], KVR_NIL);
        kvr_atomic_store_relaxed(&dx->canon_buckets[b], KVR_NIL);
    }
    for (uint64_t i = 0; i < n; i++) {
        kvr_dslot_t *s = &dx->slot[i];
        uint32_t gen = KVR_DSLOT_GEN(kvr_atomic_load_relaxed(&s->sw)) + 1;
        kvr_atomic_store_relaxed(&s->sw, gen << 2 | KVR_DSLOT_FREE);
        kvr_atomic_store_relaxed(&s->chain_next, i + 1 < n ? (uint32_t)(i + 1) : KVR_NIL);
        kvr_atomic_store_relaxed(&dx->canon_next[i], KVR_NIL);
    }
    dx->sh->free_head = n > 0 ? 0 : KVR_NIL;
    kvr_atomic_store_relaxed(&dx->sh->live, 0);
    kvr_atomic_store_relaxed(&dx->sh->live_bytes, 0);
    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++) {
        kvr_atomic_store_relaxed(&dx->ns_live[ns], 0);
        kvr_atomic_store_relaxed(&dx->ns_bytes[ns], 0);
    }
    seq_end(dx);
}

void kvr_dindex_hash(uint64_t seed, const void *key, size_t klen, uint64_t *h1, uint64_t *h2)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(key, klen, seed);

    *h1 = h.low64;
    *h2 = h.high64;
}

static uint64_t bucket_of(const kvr_dindex_t *dx, uint64_t h1)
{
    return h1 & (dx->nbuckets - 1);
}

/* Canonical hashes come from clients (X-KV-Sequence-Hash: perhaps small counters), so they
 * are hashed again, with the pool as the seed. */
static uint64_t canon_bucket_of(const kvr_dindex_t *dx, uint8_t pool, uint64_t canon)
{
    return XXH3_64bits_withSeed(&canon, sizeof(canon), pool) & (dx->nbuckets - 1);
}

/* Inside a section: slot i into the canonical chain of its (pool, canon), at the head. */
static void canon_link(kvr_dindex_t *dx, uint32_t i)
{
    _Atomic uint32_t *b = &dx->canon_buckets[canon_bucket_of(dx, dx->slot[i].pool, dx->slot[i].canon)];

    kvr_atomic_store_relaxed(&dx->canon_next[i], kvr_atomic_load_relaxed(b));
    kvr_atomic_store_relaxed(b, i);
}

/* Inside a section: slot i out of the canonical chain of (pool, canon), which it is on. */
static void canon_unlink(kvr_dindex_t *dx, uint32_t i, uint8_t pool, uint64_t canon)
{
    _Atomic uint32_t *link = &dx->canon_buckets[canon_bucket_of(dx, pool, canon)];
    uint32_t j;

    while ((j = kvr_atomic_load_relaxed(link)) != KVR_NIL && j != i)
        link = &dx->canon_next[j];
    if (j == i)
        kvr_atomic_store_relaxed(link, kvr_atomic_load_relaxed(&dx->canon_next[i]));
    kvr_atomic_store_relaxed(&dx->canon_next[i], KVR_NIL);
}

/* The writer's own walk (no other process relinks, so plain reads). */
static uint32_t find_mine(const kvr_dindex_t *dx, const kvr_dslot_t *v)
{
    uint32_t i = kvr_atomic_load_relaxed(&dx->buckets[bucket_of(dx, v->h1)]);

    while (i != KVR_NIL) {
        const kvr_dslot_t *s = &dx->slot[i];
        if (s->h1 == v->h1 && s->h2 == v->h2 && s->ns == v->ns && s->key_len == v->key_len &&
            KVR_DSLOT_STATE(kvr_atomic_load_relaxed(&s->sw)) != KVR_DSLOT_FREE)
            return i;
        i = s->chain_next;
    }
    return KVR_NIL;
}

/* Copies the place and the key's identity of v into slot s (inside a section). */
static void fill(kvr_dslot_t *s, const kvr_dslot_t *v)
{
    kvr_atomic_store_relaxed(&s->h1, v->h1);
    kvr_atomic_store_relaxed(&s->h2, v->h2);
    kvr_atomic_store_relaxed(&s->canon, v->canon);
    kvr_atomic_store_relaxed(&s->length, v->length);
    kvr_atomic_store_relaxed(&s->version, v->version);
    kvr_atomic_store_relaxed(&s->page, v->page);
    kvr_atomic_store_relaxed(&s->off4k, v->off4k);
    kvr_atomic_store_relaxed(&s->key_len, v->key_len);
    kvr_atomic_store_relaxed(&s->ns, v->ns);
    kvr_atomic_store_relaxed(&s->pool, v->pool);
}

/* A new generation with state st: seq_cst, so a worker's CAS on the old generation fails. */
static void set_state(kvr_dslot_t *s, uint32_t st)
{
    uint32_t w = kvr_atomic_load_relaxed(&s->sw);

    /* An exchange, not a store: a worker may be killing the old generation at this moment;
     * either its CAS came first (the old word was DEAD) or it fails on the new generation. */
    kvr_atomic_exchange_seq_cst(&s->sw, (KVR_DSLOT_GEN(w) + 1) << 2 | st);
}

/* The writer's gauges, read by workers (/kv/stats): relaxed stores of its own last values
 * (modular adds: a decrease is the two's complement). */
static void gauges(kvr_dindex_t *dx, uint16_t ns, uint64_t dlive, uint64_t dbytes)
{
    kvr_atomic_store_relaxed(&dx->sh->live, kvr_atomic_load_relaxed(&dx->sh->live) + dlive);
    kvr_atomic_store_relaxed(&dx->sh->live_bytes, kvr_atomic_load_relaxed(&dx->sh->live_bytes) + dbytes);
    if (ns < KVR_NS_MAX) {
        kvr_atomic_store_relaxed(&dx->ns_live[ns], kvr_atomic_load_relaxed(&dx->ns_live[ns]) + dlive);
        kvr_atomic_store_relaxed(&dx->ns_bytes[ns], kvr_atomic_load_relaxed(&dx->ns_bytes[ns]) + dbytes);
    }
}

int kvr_dindex_put(kvr_dindex_t *dx, const kvr_dslot_t *v, uint32_t *id, kvr_dslot_t *old)
{
    uint32_t i = find_mine(dx, v);
    uint64_t b;

    if (i != KVR_NIL) {
        kvr_dslot_t *s = &dx->slot[i];
        kvr_dindex_get(dx, i, old);
        seq_begin(dx);
        canon_unlink(dx, i, old->pool, old->canon);
        fill(s, v);
        canon_link(dx, i);
        set_state(s, KVR_DSLOT_LIVE);
        seq_end(dx);
        gauges(dx, v->ns, 0, v->length - old->length); /* one key: one namespace */
        *id = i;
        return KVR_OK;
    }
    old->page = KVR_NIL;
    if ((i = dx->sh->free_head) == KVR_NIL)
        return KVR_ENOSPACE;
    b = bucket_of(dx, v->h1);
    seq_begin(dx);
    dx->sh->free_head = dx->slot[i].chain_next;
    fill(&dx->slot[i], v);
    kvr_atomic_store_relaxed(&dx->slot[i].chain_next, kvr_atomic_load_relaxed(&dx->buckets[b]));
    canon_link(dx, i);
    set_state(&dx->slot[i], KVR_DSLOT_LIVE);
    kvr_atomic_store_relaxed(&dx->buckets[b], i);
    seq_end(dx);
    gauges(dx, v->ns, 1, v->length);
    *id = i;
    return KVR_OK;
}

int kvr_dindex_move_live(kvr_dindex_t *dx, uint32_t id, uint32_t sw, const kvr_dslot_t *v)
{
    kvr_dslot_t *s;
    uint32_t w = sw;
    uint64_t len;

    if (KVR_DSLOT_STATE(sw) != KVR_DSLOT_LIVE || id >= dx->nslots)
        return 0;
    s = &dx->slot[id];
    seq_begin(dx);
    /* the next generation, LIVE: a worker's kill of the word it read fails from here on */
    if (!kvr_atomic_cas_seq_cst(&s->sw, &w, (KVR_DSLOT_GEN(sw) + 1) << 2 | KVR_DSLOT_LIVE)) {
        seq_end(dx);
        return 0;
    }
    len = s->length;
    canon_unlink(dx, id, s->pool, s->canon);
    fill(s, v); /* the same key: its chain by key stays */
    canon_link(dx, id);
    seq_end(dx);
    gauges(dx, s->ns, 0, v->length - len);
    return 1;
}

void kvr_dindex_remove(kvr_dindex_t *dx, uint32_t id)
{
    kvr_dslot_t *s = &dx->slot[id];
    _Atomic uint32_t *link = &dx->buckets[bucket_of(dx, s->h1)];
    uint32_t i;

    while ((i = kvr_atomic_load_relaxed(link)) != KVR_NIL && i != id)
        link = (_Atomic uint32_t *)&dx->slot[i].chain_next;
    if (i != id)
        return; /* not linked: free already */
    seq_begin(dx);
    kvr_atomic_store_relaxed(link, s->chain_next);
    canon_unlink(dx, id, s->pool, s->canon);
    set_state(s, KVR_DSLOT_FREE);
    kvr_atomic_store_relaxed(&s->chain_next, dx->sh->free_head);
    seq_end(dx);
    dx->sh->free_head = id;
    gauges(dx, s->ns, (uint64_t)-1, (uint64_t)0 - s->length);
}

uint64_t kvr_dindex_drop_page(kvr_dindex_t *dx, uint32_t page, uint64_t version, void (*cb)(void *, uint32_t),
                              void *ctx)
{
    uint64_t n = 0;

    for (uint64_t i = 0; i < dx->nslots; i++) {
        const kvr_dslot_t *s = &dx->slot[i];
        if (KVR_DSLOT_STATE(kvr_atomic_load_relaxed(&s->sw)) != KVR_DSLOT_FREE && s->page == page &&
            s->version == version) {
            kvr_dindex_remove(dx, (uint32_t)i);
            if (cb != NULL)
                cb(ctx, (uint32_t)i);
            n++;
        }
    }
    return n;
}

void kvr_dindex_get(const kvr_dindex_t *dx, uint32_t id, kvr_dslot_t *out)
{
    const kvr_dslot_t *s = &dx->slot[id];

    *out = (kvr_dslot_t){.h1 = s->h1, .h2 = s->h2, .canon = s->canon, .length = s->length, .version = s->version, .page = s->page, .off4k = s->off4k, .chain_next = s->chain_next, .sw = kvr_atomic_load_relaxed(&s->sw), .key_len = s->key_len, .ns = s->ns, .pool = s->pool};
}

uint64_t kvr_dindex_live(const kvr_dindex_t *dx)
{
    return kvr_atomic_load_relaxed(&dx->sh->live);
}

uint64_t kvr_dindex_live_bytes(const kvr_dindex_t *dx)
{
    return kvr_atomic_load_relaxed(&dx->sh->live_bytes);
}

uint64_t kvr_dindex_ns_live(const kvr_dindex_t *dx, uint16_t ns)
{
    return ns < KVR_NS_MAX ? kvr_atomic_load_relaxed(&dx->ns_live[ns]) : 0;
}

uint64_t kvr_dindex_ns_bytes(const kvr_dindex_t *dx, uint16_t ns)
{
    return ns < KVR_NS_MAX ? kvr_atomic_load_relaxed(&dx->ns_bytes[ns]) : 0;
}

uint32_t kvr_dindex_scan_dead(const kvr_dindex_t *dx, uint64_t *cursor, uint64_t limit, uint64_t *scanned)
{
    uint64_t n = dx->nslots, i = *cursor % n;

    if (limit > n)
        limit = n;
    for (uint64_t k = 0; k < limit; k++, i = i + 1 == n ? 0 : i + 1) {
        if (KVR_DSLOT_STATE(kvr_atomic_load_relaxed(&dx->slot[i].sw)) == KVR_DSLOT_DEAD) {
            *cursor = i + 1 == n ? 0 : i + 1;
            *scanned = k + 1;
            return (uint32_t)i;
        }
    }
    *cursor = i;
    *scanned = limit;
    return KVR_NIL;
}

uint32_t kvr_dindex_next_dead(const kvr_dindex_t *dx, uint64_t *cursor)
{
    uint64_t scanned;

    return kvr_dindex_scan_dead(dx, cursor, dx->nslots, &scanned);
}

uint64_t kvr_dindex_kills(const kvr_dindex_t *dx)
{
    return kvr_atomic_load_seq_cst(&dx->sh->kills);
}

/* A reader's copy of slot s, field by field (relaxed: the caller validates it by seq); the
 * state word is returned and copied too. */
static uint32_t copy_relaxed(const kvr_dslot_t *s, kvr_dslot_t *out)
{
    out->h1 = kvr_atomic_load_relaxed(&s->h1);
    out->h2 = kvr_atomic_load_relaxed(&s->h2);
    out->canon = kvr_atomic_load_relaxed(&s->canon);
    out->length = kvr_atomic_load_relaxed(&s->length);
    out->version = kvr_atomic_load_relaxed(&s->version);
    out->page = kvr_atomic_load_relaxed(&s->page);
    out->off4k = kvr_atomic_load_relaxed(&s->off4k);
    out->key_len = kvr_atomic_load_relaxed(&s->key_len);
    out->ns = kvr_atomic_load_relaxed(&s->ns);
    out->pool = kvr_atomic_load_relaxed(&s->pool);
    out->chain_next = kvr_atomic_load_relaxed(&s->chain_next);
    return out->sw = kvr_atomic_load_relaxed(&s->sw);
}

/* One lock-free try: 1 found (*out, *id, *sw), 0 absent, KVR_AGAIN when the section moved. */
static int lookup_once(const kvr_dindex_t *dx, uint16_t ns, uint64_t h1, uint64_t h2, uint16_t key_len,
                       kvr_dslot_t *out, uint32_t *id, uint32_t *sw)
{
    /* Pairs with seq_end's release store: the chains of the last section are visible. */
    uint64_t s1 = kvr_atomic_load_acquire(&dx->sh->seq), steps = 0, n = dx->nslots;
    uint32_t i, w = 0;
    int found = 0;

    if (s1 & 1)
        return KVR_AGAIN;
    i = kvr_atomic_load_relaxed(&dx->buckets[bucket_of(dx, h1)]);
    while (i != KVR_NIL && i < n && steps++ < n) {
        const kvr_dslot_t *s = &dx->slot[i];
        if (kvr_atomic_load_relaxed(&s->h1) == h1 && kvr_atomic_load_relaxed(&s->h2) == h2 &&
            kvr_atomic_load_relaxed(&s->ns) == ns && kvr_atomic_load_relaxed(&s->key_len) == key_len) {
            w = copy_relaxed(s, out);
            found = KVR_DSLOT_STATE(w) == KVR_DSLOT_LIVE;
            break;
        }
        i = kvr_atomic_load_relaxed(&s->chain_next);
    }
    /* Orders the loads above before the re-check: pairs with seq_begin's release fence. */
    kvr_atomic_fence_acquire();
    if (kvr_atomic_load_relaxed(&dx->sh->seq) != s1)
        return KVR_AGAIN;
    out->sw = w;
    *id = i;
    *sw = w;
    return found;
}

int kvr_dindex_lookup(const kvr_dindex_t *dx, uint16_t ns, uint64_t h1, uint64_t h2, uint16_t key_len,
                      kvr_dslot_t *out, uint32_t *id)
{
    uint32_t sw;

    for (int t = 0; t < LOOKUP_TRIES; t++) {
        int rc = lookup_once(dx, ns, h1, h2, key_len, out, id, &sw);
        if (rc != KVR_AGAIN)
            return rc;
        kvr_cpu_relax();
    }
    return KVR_AGAIN;
}

/* One lock-free walk of a canonical chain: 1, 0, or KVR_AGAIN when the section moved. */
static int canon_once(const kvr_dindex_t *dx, uint8_t pool, uint64_t canon)
{
    /* Pairs with seq_end's release store: the chains of the last section are visible. */
    uint64_t s1 = kvr_atomic_load_acquire(&dx->sh->seq), steps = 0, n = dx->nslots;
    uint32_t i;
    int found = 0;

    if (s1 & 1)
        return KVR_AGAIN;
    i = kvr_atomic_load_relaxed(&dx->canon_buckets[canon_bucket_of(dx, pool, canon)]);
    while (i != KVR_NIL && i < n && steps++ < n) {
        const kvr_dslot_t *s = &dx->slot[i];
        if (kvr_atomic_load_relaxed(&s->canon) == canon && kvr_atomic_load_relaxed(&s->pool) == pool &&
            KVR_DSLOT_STATE(kvr_atomic_load_relaxed(&s->sw)) == KVR_DSLOT_LIVE) {
            found = 1;
            break;
        }
        i = kvr_atomic_load_relaxed(&dx->canon_next[i]);
    }
    /* Orders the loads above before the re-check: pairs with seq_begin's release fence. */
    kvr_atomic_fence_acquire();
    return kvr_atomic_load_relaxed(&dx->sh->seq) == s1 ? found : KVR_AGAIN;
}

int kvr_dindex_has_canon(const kvr_dindex_t *dx, uint8_t pool, uint64_t canon)
{
    for (int t = 0; t < LOOKUP_TRIES; t++) {
        int rc = canon_once(dx, pool, canon);
        if (rc != KVR_AGAIN)
            return rc;
        kvr_cpu_relax();
    }
    return KVR_AGAIN;
}

int kvr_dindex_peek(const kvr_dindex_t *dx, uint32_t id, kvr_dslot_t *out)
{
    const kvr_dslot_t *s;

    if (id >= dx->nslots)
        return 0;
    s = &dx->slot[id];
    for (int t = 0; t < LOOKUP_TRIES; t++) {
        uint64_t s1 = kvr_atomic_load_acquire(&dx->sh->seq);
        uint32_t w;
        if (s1 & 1) {
            kvr_cpu_relax();
            continue;
        }
        w = copy_relaxed(s, out);
        kvr_atomic_fence_acquire(); /* pairs with seq_begin's release fence */
        if (kvr_atomic_load_relaxed(&dx->sh->seq) == s1)
            return KVR_DSLOT_STATE(w) == KVR_DSLOT_LIVE;
    }
    return KVR_AGAIN;
}

int kvr_dindex_kill(kvr_dindex_t *dx, uint16_t ns, uint64_t h1, uint64_t h2, uint16_t key_len)
{
    kvr_dslot_t got;
    uint32_t id, sw;

    for (int t = 0; t < LOOKUP_TRIES; t++) {
        int rc = lookup_once(dx, ns, h1, h2, key_len, &got, &id, &sw);
        if (rc == KVR_AGAIN) {
            kvr_cpu_relax();
            continue;
        }
        if (rc == 0)
            return 0;
        if (kvr_dindex_kill_seen(dx, id, sw))
            return 1;
    }
    return KVR_AGAIN;
}

int kvr_dindex_kill_seen(kvr_dindex_t *dx, uint32_t id, uint32_t sw)
{
    uint32_t want = sw;

    /* The generation in the word makes a slot the writer freed or reused since the look fail. */
    if (KVR_DSLOT_STATE(sw) != KVR_DSLOT_LIVE || id >= dx->nslots ||
        !kvr_atomic_cas_seq_cst(&dx->slot[id].sw, &want, (sw & ~3u) | KVR_DSLOT_DEAD))
        return 0;
    /* after the CAS: the writer that sees this count finds the slot DEAD (kvr_ssdt_reap) */
    kvr_atomic_fetch_add_seq_cst(&dx->sh->kills, 1);
    return 1;
}
