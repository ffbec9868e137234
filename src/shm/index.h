/*
 * index.h — the block index: a fixed table of entries, chained hash buckets, an exact LRU.
 *
 * Entries live in one array sized at start (max_blocks); a free entry sits on a singly
 * linked free list. A resident block's entry is on its bucket's chain (keyed by the XXH3 of
 * the decoded key bytes) and on its namespace's LRU list. The key bytes themselves are stored at the
 * start of the block's first arena run, right before the payload, so the index carries no
 * per-entry key buffer; the first 57 bytes are also kept inline in the entry, so a lookup of a
 * key of up to 57 bytes reads two adjacent cache lines and nothing else.
 *
 * A second chain links the same LIVE entries by their canonical hash (`canon`, what the relay
 * filter publishes), so that "does pool p hold a block with canonical hash h" is answered
 * exactly, without a key (POST /batch/lookup, docs/kv-lookup.md). Its buckets (`cbuckets`, as
 * many as the key buckets) are chosen by the XXH3 of the hash seeded with the entry's
 * namespace seed (kvr_store_sh_t.ns_seed), and each entry carries its link (`canon_next`). Several
 * LIVE entries may share (pool, canon): two keys of one sequence hash. The canon chain is linked,
 * unlinked and rebuilt in the same critical sections and seqlock windows as the key chain.
 *
 * A key's identity is (namespace, key bytes): the namespace id is stored on the entry and
 * compared with the length, and the chain hash is seeded per namespace with a secret of the
 * segment (kvr_store_sh_t.ns_seed), so one namespace's lookup never walks toward, nor can
 * aim a collision at, another's entry for the same bytes.
 *
 * Concurrency: every mutation happens under the store lock, and every `_locked` function
 * asserts it (the handle's `lock`). Lookups that only need an answer (exists, HEAD) run
 * without the lock under a seqlock: writers bump `seq` to odd before relinking a chain and
 * back to even after; a reader retries when it saw an odd or changed value, and after a
 * bounded number of retries takes the lock. The fields such a reader loads (bucket heads, an
 * entry's khash, chain_next, key_len, key bytes, length, first_page; on the canon chain canon,
 * pool and canon_next) are stored and loaded with relaxed atomics (base/barrier.h) wherever they
 * can be read that way.
 *
 * Entry states:
 *   FREE      on the free list
 *   RESERVED  owned by an in-flight PUT of proc `owner`; not on a chain; its pages fill up
 *   LIVE      on a chain and the LRU; visible
 *   ZOMBIE    unlinked (deleted to zero refs) but still pinned by a GET; freed at last unpin
 *   DYING     being removed: a crash here is rolled forward by the repair
 * The ANNOUNCED flag says the block's insert event is in the change log and its remove
 * event is not yet.
 */
#ifndef KVR_SHM_INDEX_H
#define KVR_SHM_INDEX_H

#include "common.h"
#include "shm/arena.h"

#include <stdatomic.h>

enum { KVR_ENT_FREE = 0,
       KVR_ENT_RESERVED = 1,
       KVR_ENT_LIVE = 2,
       KVR_ENT_ZOMBIE = 3,
       KVR_ENT_DYING = 4 };
#define KVR_ENT_ANNOUNCED 0x80u /* in kvr_entry_t.meta; low 6 bits: owner proc slot */
#define KVR_ENT_READ      0x40u /* in meta: read (GET, or PUT again) since stored: the disk tier admits it */
#define KVR_ENT_OWNER(e)  ((e)->meta & 0x3fu)

#define KVR_KEY_HEAD 46 /* key bytes kept inline on the entry's first cache line */
#define KVR_KEY_TAIL 11 /* and on its second: keys up to 57 bytes never touch the arena */

/*
 * 128 bytes, two cache lines: the first holds everything a lookup reads for keys up to 46
 * bytes (hash, chain link, length, state and namespace of the key, its first 46 bytes); the second the
 * rest of the entry (with its relay pool and its canon chain link: a lookup by canonical hash reads
 * this line only) and key bytes 46..56. The full key is also stored in the arena.
 */
typedef struct {
    uint64_t khash;      /* XXH3_64bits of the key */
    uint32_t chain_next; /* next entry on the bucket chain (or the free list) */
    uint16_t key_len;
    uint8_t state;
    uint8_t meta; /* owner slot | KVR_ENT_READ | KVR_ENT_ANNOUNCED */
    uint16_t ns;  /* the namespace the key belongs to: part of its identity */
    uint8_t key_head[KVR_KEY_HEAD];

    uint64_t canon;  /* canonical hash published in the filter */
    uint64_t length; /* payload bytes */
    uint64_t atime;  /* LRU clock at last touch; orders the LRU after a rebuild */
    uint32_t lru_prev;
    uint32_t lru_next;
    uint32_t first_page; /* head run of the arena chain: key bytes, then payload */
    uint32_t refs;       /* dedup reference count */
    uint32_t pins;       /* GETs in flight; derived from the per-process pin tables */
    uint32_t gen;        /* bumped at every reservation; names this incarnation in events */
    uint32_t canon_next; /* next entry on the canon chain (KVR_NIL when last or not linked) */
    uint8_t pool;        /* the relay pool (namespace, model) it is published in */
    uint8_t key_tail[KVR_KEY_TAIL];
} __attribute__((aligned(128))) kvr_entry_t;
static_assert(sizeof(kvr_entry_t) == 128, "an entry is two cache lines");
static_assert(offsetof(kvr_entry_t, key_head) == 18, "entry layout");
static_assert(offsetof(kvr_entry_t, canon) == 64, "entry layout");
static_assert(offsetof(kvr_entry_t, canon_next) == 112, "entry layout");
static_assert(offsetof(kvr_entry_t, key_tail) == 117, "entry layout");
static_assert(KVR_KEY_HEAD + KVR_KEY_TAIL == 57, "inline key bytes (docs and tests say 57)");

/* Shared index state (inside kvr_store_sh_t). seq sits on its own cache line. */
typedef struct {
    _Atomic uint64_t seq; /* seqlock over the chains; odd while a writer relinks */
    uint64_t pad0_[7];
    uint64_t max_blocks;
    uint64_t nbuckets;
    uint32_t free_head;
    uint32_t pad1_[3]; /* the LRU lists are per namespace: kvr_index_t.lru */
    uint64_t nfree;
    uint64_t clock; /* LRU clock, bumped under the store lock */
    uint64_t pad2_[2];
} kvr_index_sh_t;
static_assert(sizeof(kvr_index_sh_t) == 128, "index state layout");

/* One namespace's LRU list of LIVE entries, through their lru_prev / lru_next. */
typedef struct {
    uint32_t head; /* most recently used */
    uint32_t tail; /* least recently used */
} kvr_lru_t;

typedef struct {
    kvr_index_sh_t *sh;
    kvr_lru_t *lru; /* KVR_NS_MAX lists, by the entries' namespace (kvr_store_sh_t.ns_lru) */
    kvr_entry_t *ent;
    _Atomic uint32_t *buckets;
    _Atomic uint32_t *cbuckets; /* the canon chains' heads, nbuckets of them */
    const uint64_t *seed;       /* KVR_NS_MAX namespace seeds (kvr_store_sh_t.ns_seed): canon buckets */
    kvr_arena_t *arena;
    const kvr_shlock_t *lock; /* the store lock (asserted held by the _locked functions) */
} kvr_index_t;

/* Formats an empty index: before any other process maps the segment, so no lock. */
void kvr_index_format(kvr_index_t *ix);

static inline const uint8_t *kvr_index_key(const kvr_index_t *ix, const kvr_entry_t *e)
{
    return kvr_arena_page(ix->arena, e->first_page);
}

/* Copies the inline parts of a key into a (reserved, not yet linked) entry; the store lock is
 * held, as for every write of an entry. */
void kvr_index_set_key(kvr_entry_t *e, uint16_t ns, const void *key, size_t klen);

/* Finds the LIVE entry for (ns, key); khash is the key's hash under the namespace's seed
 * (kvr_store's key_hash). Returns its index or KVR_NIL. Locked. */
uint32_t kvr_index_lookup_locked(const kvr_index_t *ix, uint16_t ns, const void *key, size_t klen, uint64_t khash);

/*
 * Lock-free lookup (seqlock). Returns 1 and copies length (if non-NULL) when the key is
 * LIVE, 0 when absent, KVR_AGAIN when writers kept interfering (caller takes the lock).
 */
int kvr_index_lookup_lockfree(const kvr_index_t *ix, uint16_t ns, const void *key, size_t klen, uint64_t khash,
                              uint64_t *length);

/*
 * By canonical hash: 1 when an entry of pool `pool` (a pool of namespace ns) with canonical hash
 * canon is on the canon chain (LIVE), else 0. The locked form walks under the store lock; the
 * lock-free one under the seqlock, returning KVR_AGAIN when writers kept interfering (the caller
 * takes the lock). It reads only the second cache line of each entry on the chain.
 */
int kvr_index_canon_locked(const kvr_index_t *ix, uint16_t ns, uint32_t pool, uint64_t canon);
int kvr_index_canon_lockfree(const kvr_index_t *ix, uint16_t ns, uint32_t pool, uint64_t canon);

/* Pops a free entry (state untouched) or returns KVR_NIL. Locked. */
uint32_t kvr_index_entry_alloc_locked(kvr_index_t *ix);
/* Returns an entry to the free list and marks it FREE. Locked. */
void kvr_index_entry_free_locked(kvr_index_t *ix, uint32_t i);

/* Links entry i onto its bucket chain, its canon chain and the head of its namespace's LRU, state
 * LIVE. Locked. */
void kvr_index_link_locked(kvr_index_t *ix, uint32_t i);
/* Unlinks entry i from both chains and the LRU (state unchanged). Locked. */
void kvr_index_unlink_locked(kvr_index_t *ix, uint32_t i);
/* Moves entry i to the LRU head. Locked. */
void kvr_index_touch_locked(kvr_index_t *ix, uint32_t i);

/*
 * Rebuilds both chains, the LRU lists (ordered by atime) and the free list from the entries' states:
 * LIVE entries are linked (a second LIVE entry with the same key is returned in *dups via
 * callback), every FREE entry goes on the free list. Locked.
 */
typedef void (*kvr_index_dup_cb)(void *ctx, uint32_t i);
void kvr_index_rebuild_locked(kvr_index_t *ix, kvr_index_dup_cb dup, void *ctx);

/* Debug/test: verifies both chains (every LIVE entry exactly once on each, in its bucket), the LRU
 * and the free list against states. KVR_OK or KVR_ERR. */
int kvr_index_check_locked(const kvr_index_t *ix);

#endif
