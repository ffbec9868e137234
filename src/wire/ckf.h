/*
 * ckf.h — the Cuckoo filter kvrelay publishes (docs/relay-contract.md §3).
 *
 * Layout: the filter is a dense array of bucket_count u64 words (power of two in
 * 2..2^24); each word holds four 16-bit fingerprint slots, slot s = (word >> 16s) & 0xFFFF,
 * 0 = empty (§3.1). That array is the only shared state: it may live in the shared segment
 * and carries no pointers or metadata. Everything else — the pointer to it, the addressing
 * constants, the SplitMix RNG state, the undo log and the dirty set — sits in a
 * per-process handle (kvr_ckf_t) owned by the single writer, the publisher.
 *
 * Addressing (§3.3): prepare(h) = one xxh3 of u64le(h) under the seed -> (fp, a); b = alt(a,
 * fp) = a ^ delta(fp), delta = xxh3(u16le(fp), seed ^ 0x9E3779B97F4A7C15) & mask, with the
 * zero-fingerprint (0 -> 1) and zero-delta (0 -> 1) rules. Lookup = prepare + alt + two
 * SWAR tests. Insertion, kicks, RNG and the all-or-nothing undo follow §3.4 exactly, so the
 * same event order yields the same buckets as the reference producer.
 *
 * Concurrency: one writer per filter. Words are written with relaxed 64-bit atomic stores,
 * so a process reading the array concurrently never sees a torn word, but a lookup racing
 * a kick may miss an entry that is in transit; readers that need an exact image must
 * synchronise with the writer (publication snapshots are taken by the writer itself).
 */
#ifndef KVR_CKF_H
#define KVR_CKF_H

#include <stddef.h>
#include <stdint.h>

#define KVR_CKF_DEFAULT_SEED      0x5DEECE66D1B54A33ULL
#define KVR_CKF_ALT_DOMAIN        0x9E3779B97F4A7C15ULL /* ALTERNATE_BUCKET_DOMAIN */
#define KVR_CKF_SPLITMIX_INC      0x9E3779B97F4A7C15ULL /* SPLITMIX_INCREMENT */
#define KVR_CKF_DEFAULT_MAX_KICKS 500u
#define KVR_CKF_MAX_KICKS         4096u
#define KVR_CKF_SLOTS             4u
#define KVR_CKF_FP_BITS           16u
#define KVR_CKF_MIN_BUCKETS       2ULL
#define KVR_CKF_MAX_BUCKETS       (1ULL << 24) /* CBI1 MAX_BUCKET_COUNT */

#define KVR_CKF_LANES_LO 0x0001000100010001ULL
#define KVR_CKF_LANES_HI 0x8000800080008000ULL

/* Addressing constants for one (seed, bucket_count). */
typedef struct kvr_ckf_addr {
    uint64_t seed;
    uint64_t alt_seed; /* seed ^ KVR_CKF_ALT_DOMAIN */
    uint64_t mask;     /* bucket_count - 1 */
} kvr_ckf_addr_t;

/* Result of prepare(): fingerprint (never 0) and the two candidate buckets (a != b). */
typedef struct kvr_ckf_probe {
    uint16_t fp;
    uint32_t a;
    uint32_t b;
} kvr_ckf_probe_t;

/* One bucket's absolute new value, as carried by a CBI1 delta (docs/relay-contract.md
 * §4.1). */
typedef struct kvr_ckf_image {
    uint32_t bucket;
    uint64_t value;
} kvr_ckf_image_t;

/* Per-process handle. Fields are private to ckf.c except where noted. */
typedef struct kvr_ckf {
    uint64_t *buckets;     /* caller-provided array of bucket_count words (may be shared) */
    uint64_t bucket_count; /* read-only after init */
    kvr_ckf_addr_t addr;   /* read-only after init */
    uint64_t rng;          /* SplitMix64 state, starts at lane_rng_seed(seed, 0) */
    uint32_t max_kicks;
    uint64_t items; /* fingerprints currently stored (inserts - removes) */
    uint64_t kicks; /* total kick steps taken, for statistics */
    /* undo log of the insert in progress: (bucket, value before the write) */
    kvr_ckf_image_t *touch;
    uint64_t *order; /* scratch for ordering the log at commit */
    uint32_t n_touch;
    /* dirty set (only when tracking): bitmap + (bucket, last published value) list */
    uint64_t *dirty_bits;
    kvr_ckf_image_t *dirty;
    size_t n_dirty, cap_dirty;
} kvr_ckf_t;

/* ---- sizing and addressing (pure) ---------------------------------------------------- */

/* docs/relay-contract.md §3.2: next_pow2(max(floor((5n+15)/16), 2)); n = 0 is treated as 1. May
 * exceed KVR_CKF_MAX_BUCKETS (the caller rejects such layouts). */
uint64_t kvr_ckf_bucket_count(uint64_t n);

/* 1 when bucket_count is a power of two in 2..2^24. */
int kvr_ckf_valid_bucket_count(uint64_t bucket_count);

/* Fills addr for (seed, bucket_count); bucket_count must be valid. */
void kvr_ckf_addr_init(kvr_ckf_addr_t *addr, uint64_t seed, uint64_t bucket_count);

/* prepare() and alt() of docs/relay-contract.md §3.3. */
kvr_ckf_probe_t kvr_ckf_prepare(const kvr_ckf_addr_t *addr, uint64_t h);
uint32_t kvr_ckf_alt(const kvr_ckf_addr_t *addr, uint32_t bucket, uint16_t fp);

/* Membership test over any bucket array with the given addressing (plain loads: for
 * private arrays such as a consumer mirror). */
int kvr_ckf_lookup(const uint64_t *buckets, const kvr_ckf_addr_t *addr, uint64_t h);

/* ---- bucket-word SWAR helpers (a lookup, docs/relay-contract.md §3.3) ------------------- */

static inline uint64_t kvr_ckf_match_mask(uint64_t word, uint16_t fp)
{
    uint64_t x = word ^ ((uint64_t)fp * KVR_CKF_LANES_LO);
    return (x - KVR_CKF_LANES_LO) & ~x & KVR_CKF_LANES_HI;
}
/* 1 when some slot of word equals fp. */
static inline int kvr_ckf_word_has(uint64_t word, uint16_t fp)
{
    return kvr_ckf_match_mask(word, fp) != 0;
}
/* Lowest slot equal to fp (0..3), or -1. first(w, 0) is the first empty slot. */
static inline int kvr_ckf_word_first(uint64_t word, uint16_t fp)
{
    uint64_t m = kvr_ckf_match_mask(word, fp);
    return m ? (int)(__builtin_ctzll(m) >> 4) : -1;
}
static inline uint16_t kvr_ckf_word_slot(uint64_t word, unsigned slot)
{
    return (uint16_t)(word >> (16 * slot));
}
static inline uint64_t kvr_ckf_word_with(uint64_t word, unsigned slot, uint16_t fp)
{
    unsigned sh = 16 * slot;
    return (word & ~(0xFFFFULL << sh)) | ((uint64_t)fp << sh);
}

/* ---- SplitMix64 RNG (docs/relay-contract.md §3.4) ------------------------------------ */

uint64_t kvr_ckf_rng_next(uint64_t *state);
uint64_t kvr_ckf_lane_rng_seed(uint64_t seed, uint64_t lane);

/* ---- the writer's handle ------------------------------------------------------------- */

/*
 * Attaches a handle to buckets[0..bucket_count) (not cleared: it may hold a live image).
 * max_kicks 0 selects the default (500); it must be <= 4096. track_dirty enables the
 * dirty set used to build deltas. Returns KVR_OK, KVR_EINVAL or KVR_ERR (out of memory).
 */
int kvr_ckf_init(kvr_ckf_t *f, uint64_t *buckets, uint64_t bucket_count, uint64_t seed,
                 uint32_t max_kicks, int track_dirty);
/* Frees the handle's private memory; never touches the bucket array. */
void kvr_ckf_destroy(kvr_ckf_t *f);
/* Zeroes every bucket and forgets the dirty set and item count (a fresh, empty filter). */
void kvr_ckf_clear(kvr_ckf_t *f);

/*
 * Inserts one fingerprint copy of h (docs/relay-contract.md §3.4). KVR_OK on success.
 * KVR_ENOSPACE when max_kicks were exhausted: every write was undone, nothing became dirty
 * (the RNG has advanced, as in the reference). KVR_ERR when the dirty set could not grow
 * (nothing changed).
 */
int kvr_ckf_insert(kvr_ckf_t *f, uint64_t h);

/* Removes one copy of h: the lowest matching slot of bucket a, else of b. KVR_OK, or
 * KVR_ENOTFOUND (an invariant violation for the caller: h was not resident), KVR_ERR when
 * the dirty set could not grow (nothing changed). */
int kvr_ckf_remove(kvr_ckf_t *f, uint64_t h);

/* 1 when h's fingerprint is in bucket a or b (false positives ~ 8/65536 x load). */
int kvr_ckf_contains(const kvr_ckf_t *f, uint64_t h);

/* contains() for n hashes at once, with the bucket loads prefetched: out[i] = 0/1. */
void kvr_ckf_contains_many(const kvr_ckf_t *f, const uint64_t *h, size_t n, uint8_t *out);

/* Number of dirty buckets (an upper bound on the next drain's image count). */
size_t kvr_ckf_dirty_count(const kvr_ckf_t *f);

/*
 * Drains the dirty set into out (room for kvr_ckf_dirty_count() images): one image per
 * dirty bucket whose value differs from its last published value, in first-touch order
 * (within one insert, ascending bucket order, as the reference). Returns the count and
 * leaves the dirty set empty: the drained values are now "published".
 */
size_t kvr_ckf_drain(kvr_ckf_t *f, kvr_ckf_image_t *out);

/* Forgets the dirty set without emitting (after a full snapshot was published). */
void kvr_ckf_dirty_reset(kvr_ckf_t *f);

#endif
