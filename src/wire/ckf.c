/*
 * ckf.c — Cuckoo filter addressing, mutation and dirty tracking (docs/relay-contract.md §3).
 *
 * Hot paths: prepare() and alt() are one XXH3 call each on 8 and 2 bytes (XXH_INLINE_ALL
 * lets the compiler specialise the short-input paths); a bucket test is one SWAR
 * expression. Insert keeps an undo log of (bucket, previous word) for every write so a
 * failed kick chain is rolled back completely (docs/relay-contract.md §3.4: a capacity
 * omission leaves no trace).
 *
 * Dirty tracking (docs/relay-contract.md §3.5): a bitmap says whether a bucket is in the dirty set
 * and a list holds (bucket, value when first touched since the last drain) in first-touch
 * order. Only successful operations enter the set; within one insert the touched buckets
 * are entered once each in ascending bucket order, as the reference mutator reports them.
 * Draining emits a bucket only if its word differs from the recorded one, which drops
 * buckets that returned to their published value ("net reversion"). Room in the list is
 * reserved before any write, so an allocation failure never leaves a half-applied insert.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <stdlib.h>

#include "base/barrier.h"
#include "common.h"
#include "wire/ckf.h"

/* Words are only ever stored by the single writer (the publisher, when the filter is the
 * shared one); relaxed atomics keep concurrent readers in other processes free of torn
 * words (plain movs on x86-64). No ordering: a reader may see a mixture of two moments,
 * which is why subscribers are served from copies (docs/concurrency.md, the filter row). */
static inline uint64_t ld(const uint64_t *p)
{
    return kvr_atomic_load_relaxed(p);
}
static inline void st(uint64_t *p, uint64_t v)
{
    kvr_atomic_store_relaxed(p, v);
}

/* ---- sizing and addressing ------------------------------------------------------------ */

uint64_t kvr_ckf_bucket_count(uint64_t n)
{
    if (n == 0)
        n = 1;
    /* floor((5n + 15) / 16) without overflow: n = 16q + r. */
    uint64_t v = (n / 16) * 5 + ((n % 16) * 5 + 15) / 16;
    if (v < 2)
        v = 2;
    if (v > (1ULL << 63))
        return 0; /* not representable */
    return 1ULL << (64 - __builtin_clzll(v - 1));
}

int kvr_ckf_valid_bucket_count(uint64_t bc)
{
    return bc >= KVR_CKF_MIN_BUCKETS && bc <= KVR_CKF_MAX_BUCKETS && (bc & (bc - 1)) == 0;
}

void kvr_ckf_addr_init(kvr_ckf_addr_t *addr, uint64_t seed, uint64_t bucket_count)
{
    addr->seed = seed;
    addr->alt_seed = seed ^ KVR_CKF_ALT_DOMAIN;
    addr->mask = bucket_count - 1;
}

static inline __attribute__((always_inline)) uint32_t alt_of(const kvr_ckf_addr_t *addr, uint32_t bucket, uint16_t fp)
{
    uint8_t b[2];
    kvr_put_le16(b, fp);
    uint64_t delta = XXH3_64bits_withSeed(b, 2, addr->alt_seed) & addr->mask;
    if (delta == 0)
        delta = 1; /* zero-delta rule: a != b always */
    return bucket ^ (uint32_t)delta;
}

static inline __attribute__((always_inline)) kvr_ckf_probe_t prepare_of(const kvr_ckf_addr_t *addr, uint64_t h)
{
    uint8_t b[8];
    kvr_put_le64(b, h);
    uint64_t mixed = XXH3_64bits_withSeed(b, 8, addr->seed);
    kvr_ckf_probe_t p;
    p.fp = (uint16_t)mixed;
    if (p.fp == 0)
        p.fp = 1; /* zero-fingerprint rule: 0 marks an empty slot */
    p.a = (uint32_t)((mixed >> 16) & addr->mask);
    p.b = alt_of(addr, p.a, p.fp);
    return p;
}

kvr_ckf_probe_t kvr_ckf_prepare(const kvr_ckf_addr_t *addr, uint64_t h)
{
    return prepare_of(addr, h);
}

uint32_t kvr_ckf_alt(const kvr_ckf_addr_t *addr, uint32_t bucket, uint16_t fp)
{
    return alt_of(addr, bucket, fp);
}

int kvr_ckf_lookup(const uint64_t *buckets, const kvr_ckf_addr_t *addr, uint64_t h)
{
    kvr_ckf_probe_t p = prepare_of(addr, h);
    return kvr_ckf_word_has(buckets[p.a], p.fp) | kvr_ckf_word_has(buckets[p.b], p.fp);
}

/* ---- RNG ----------------------------------------------------------------------------- */

uint64_t kvr_ckf_rng_next(uint64_t *state)
{
    *state += KVR_CKF_SPLITMIX_INC;
    uint64_t z = *state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

uint64_t kvr_ckf_lane_rng_seed(uint64_t seed, uint64_t lane)
{
    uint64_t s = seed ^ ((lane + 1) * KVR_CKF_SPLITMIX_INC);
    return kvr_ckf_rng_next(&s);
}

/* ---- handle -------------------------------------------------------------------------- */

int kvr_ckf_init(kvr_ckf_t *f, uint64_t *buckets, uint64_t bucket_count, uint64_t seed,
                 uint32_t max_kicks, int track_dirty)
{
    memset(f, 0, sizeof(*f));
    if (!buckets || !kvr_ckf_valid_bucket_count(bucket_count) || max_kicks > KVR_CKF_MAX_KICKS)
        return KVR_EINVAL;
    f->buckets = buckets;
    f->bucket_count = bucket_count;
    kvr_ckf_addr_init(&f->addr, seed, bucket_count);
    f->rng = kvr_ckf_lane_rng_seed(seed, 0);
    f->max_kicks = max_kicks ? max_kicks : KVR_CKF_DEFAULT_MAX_KICKS;
    f->touch = malloc(((size_t)f->max_kicks + 2) * sizeof(*f->touch));
    f->order = malloc(((size_t)f->max_kicks + 2) * sizeof(*f->order));
    if (!f->touch || !f->order)
        goto fail;
    if (track_dirty) {
        f->dirty_bits = calloc((bucket_count + 63) / 64, sizeof(uint64_t));
        if (!f->dirty_bits)
            goto fail;
    }
    for (uint64_t i = 0; i < bucket_count; i++)
        if (buckets[i])
            f->items += 4 - (unsigned)__builtin_popcountll(kvr_ckf_match_mask(buckets[i], 0));
    return KVR_OK;
fail:
    kvr_ckf_destroy(f);
    return KVR_ERR;
}

void kvr_ckf_destroy(kvr_ckf_t *f)
{
    free(f->touch);
    free(f->order);
    free(f->dirty_bits);
    free(f->dirty);
    f->touch = NULL;
    f->order = NULL;
    f->dirty_bits = NULL;
    f->dirty = NULL;
    f->n_dirty = f->cap_dirty = 0;
}

void kvr_ckf_clear(kvr_ckf_t *f)
{
    for (uint64_t i = 0; i < f->bucket_count; i++)
        st(&f->buckets[i], 0);
    kvr_ckf_dirty_reset(f);
    f->items = 0;
}

/* Makes room for `more` new dirty entries (never more than bucket_count in total). */
static int dirty_reserve(kvr_ckf_t *f, size_t more)
{
    if (!f->dirty_bits)
        return KVR_OK;
    size_t want = f->n_dirty + more;
    if (want > f->bucket_count)
        want = (size_t)f->bucket_count;
    if (want <= f->cap_dirty)
        return KVR_OK;
    size_t cap = f->cap_dirty ? f->cap_dirty : 256;
    while (cap < want)
        cap *= 2;
    if (cap > f->bucket_count)
        cap = (size_t)f->bucket_count;
    kvr_ckf_image_t *d = realloc(f->dirty, cap * sizeof(*d));
    if (!d)
        return KVR_ERR;
    f->dirty = d;
    f->cap_dirty = cap;
    return KVR_OK;
}

/* Enters bucket into the dirty set with `before` as its published value, unless present. */
static inline void dirty_mark(kvr_ckf_t *f, uint32_t bucket, uint64_t before)
{
    uint64_t bit = 1ULL << (bucket & 63);
    uint64_t *w = &f->dirty_bits[bucket >> 6];
    if (*w & bit)
        return;
    *w |= bit;
    f->dirty[f->n_dirty].bucket = bucket;
    f->dirty[f->n_dirty].value = before;
    f->n_dirty++;
}

static int cmp_u64(const void *pa, const void *pb)
{
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return (a > b) - (a < b);
}

/* Commits the successful insert's writes to the dirty set: ascending bucket order, each
 * bucket once, with the value it had before this insert's first write to it. */
static void commit_touches(kvr_ckf_t *f)
{
    if (!f->dirty_bits)
        return;
    if (f->n_touch == 1) {
        dirty_mark(f, f->touch[0].bucket, f->touch[0].value);
        return;
    }
    /* Sort keys (bucket << 32 | log position): the first key of each bucket is its
     * first write. */
    for (uint32_t i = 0; i < f->n_touch; i++)
        f->order[i] = ((uint64_t)f->touch[i].bucket << 32) | i;
    qsort(f->order, f->n_touch, sizeof(*f->order), cmp_u64);
    for (uint32_t i = 0; i < f->n_touch; i++) {
        uint32_t b = (uint32_t)(f->order[i] >> 32);
        if (i > 0 && (uint32_t)(f->order[i - 1] >> 32) == b)
            continue;
        dirty_mark(f, b, f->touch[(uint32_t)f->order[i]].value);
    }
}

static inline void write_logged(kvr_ckf_t *f, uint32_t bucket, uint64_t before, uint64_t after)
{
    f->touch[f->n_touch].bucket = bucket;
    f->touch[f->n_touch].value = before;
    f->n_touch++;
    st(&f->buckets[bucket], after);
}

/* Puts fp into the lowest empty slot of bucket, if any. */
static inline int put_empty(kvr_ckf_t *f, uint32_t bucket, uint16_t fp)
{
    uint64_t w = f->buckets[bucket];
    int s = kvr_ckf_word_first(w, 0);
    if (s < 0)
        return 0;
    write_logged(f, bucket, w, kvr_ckf_word_with(w, (unsigned)s, fp));
    return 1;
}

int kvr_ckf_insert(kvr_ckf_t *f, uint64_t h)
{
    if (dirty_reserve(f, (size_t)f->max_kicks + 2) != KVR_OK)
        return KVR_ERR;
    kvr_ckf_probe_t p = prepare_of(&f->addr, h);
    f->n_touch = 0;
    if (put_empty(f, p.a, p.fp) || put_empty(f, p.b, p.fp))
        goto done;

    uint32_t bucket = (kvr_ckf_rng_next(&f->rng) & 1) == 0 ? p.a : p.b;
    uint16_t fp = p.fp;
    for (uint32_t k = 0; k < f->max_kicks; k++) {
        uint64_t w = f->buckets[bucket];
        unsigned slot = (unsigned)(kvr_ckf_rng_next(&f->rng) & 3);
        uint16_t victim = kvr_ckf_word_slot(w, slot);
        write_logged(f, bucket, w, kvr_ckf_word_with(w, slot, fp));
        f->kicks++;
        fp = victim;
        bucket = alt_of(&f->addr, bucket, fp);
        if (put_empty(f, bucket, fp))
            goto done;
    }
    /* Capacity exhausted: undo every write in reverse order. */
    while (f->n_touch > 0) {
        f->n_touch--;
        st(&f->buckets[f->touch[f->n_touch].bucket], f->touch[f->n_touch].value);
    }
    return KVR_ENOSPACE;
done:
    commit_touches(f);
    f->n_touch = 0;
    f->items++;
    return KVR_OK;
}

int kvr_ckf_remove(kvr_ckf_t *f, uint64_t h)
{
    if (dirty_reserve(f, 1) != KVR_OK)
        return KVR_ERR;
    kvr_ckf_probe_t p = prepare_of(&f->addr, h);
    uint32_t cand[2] = {p.a, p.b};
    for (int i = 0; i < 2; i++) {
        uint64_t w = f->buckets[cand[i]];
        int s = kvr_ckf_word_first(w, p.fp);
        if (s < 0)
            continue;
        st(&f->buckets[cand[i]], kvr_ckf_word_with(w, (unsigned)s, 0));
        if (f->dirty_bits)
            dirty_mark(f, cand[i], w);
        f->items--;
        return KVR_OK;
    }
    return KVR_ENOTFOUND;
}

int kvr_ckf_contains(const kvr_ckf_t *f, uint64_t h)
{
    kvr_ckf_probe_t p = prepare_of(&f->addr, h);
    return kvr_ckf_word_has(ld(&f->buckets[p.a]), p.fp) |
           kvr_ckf_word_has(ld(&f->buckets[p.b]), p.fp);
}

void kvr_ckf_contains_many(const kvr_ckf_t *f, const uint64_t *h, size_t n, uint8_t *out)
{
    enum { BATCH = 16 };
    kvr_ckf_probe_t p[BATCH];
    for (size_t base = 0; base < n; base += BATCH) {
        size_t m = n - base < BATCH ? n - base : BATCH;
        for (size_t i = 0; i < m; i++) {
            p[i] = prepare_of(&f->addr, h[base + i]);
            __builtin_prefetch(&f->buckets[p[i].a]);
            __builtin_prefetch(&f->buckets[p[i].b]);
        }
        for (size_t i = 0; i < m; i++)
            out[base + i] = (uint8_t)(kvr_ckf_word_has(ld(&f->buckets[p[i].a]), p[i].fp) |
                                      kvr_ckf_word_has(ld(&f->buckets[p[i].b]), p[i].fp));
    }
}

size_t kvr_ckf_dirty_count(const kvr_ckf_t *f)
{
    return f->n_dirty;
}

size_t kvr_ckf_drain(kvr_ckf_t *f, kvr_ckf_image_t *out)
{
    size_t n = 0;
    for (size_t i = 0; i < f->n_dirty; i++) {
        uint32_t b = f->dirty[i].bucket;
        f->dirty_bits[b >> 6] &= ~(1ULL << (b & 63));
        uint64_t now = f->buckets[b];
        if (now != f->dirty[i].value) {
            out[n].bucket = b;
            out[n].value = now;
            n++;
        }
    }
    f->n_dirty = 0;
    return n;
}

void kvr_ckf_dirty_reset(kvr_ckf_t *f)
{
    for (size_t i = 0; i < f->n_dirty; i++) {
        uint32_t b = f->dirty[i].bucket;
        f->dirty_bits[b >> 6] &= ~(1ULL << (b & 63));
    }
    f->n_dirty = 0;
}
