/*
 * store.h — the block store: the operations the HTTP layer calls, over the shared segment.
 *
 * Every key lives in a namespace (ns, 0 = "default"; docs/tenancy.md): the same key bytes in
 * two namespaces are two unrelated blocks, and no operation of one namespace can see, dedup
 * against, delete or time another's.
 *
 * Semantics (docs/http-contract.md):
 *  - put: a new key is stored with ref-count 1 ("created"); the same key with the same
 *    length is a dedup hit (ref-count + 1, bytes untouched); the same key with another
 *    length is a conflict (nothing changes); when even eviction cannot make room the answer
 *    is "no space" and nothing stored is damaged.
 *  - get pins the block and hands back a reference whose bytes stay valid and unchanged
 *    until unpin; a pinned block is never evicted or freed.
 *  - release (DELETE) drops one reference; at zero the block leaves the index at once and
 *    its memory is freed when the last pin goes.
 *  - Eviction, when a put does not fit: least recently used unpinned blocks (a block at zero
 *    references is never kept, so there is no separate zero-reference tier to drain first);
 *    with no_evict set the put gets "no space" instead.
 *  - Every block that enters (first reference) or leaves (last reference, eviction) appends
 *    an insert/remove event with its canonical hash to the change log.
 *  - A GET sees the complete bytes of one PUT or a miss: a block becomes visible only after
 *    its bytes are in the arena, and a visible block's bytes are never written again.
 *
 * Crash recovery: all mutations hold the one store lock. If a process dies holding it, the
 * next locker runs a full repair (kvr_store_repair_locked in store_repair.c) that rebuilds every derived
 * structure from the entries' states and the per-process pin tables, rolls interrupted
 * removals forward and drops interrupted inserts. The supervisor calls kvr_store_reap with
 * each dead child's pid, which does the same and frees the child's pins and reservations.
 */
#ifndef KVR_CORE_STORE_H
#define KVR_CORE_STORE_H

#include "common.h"
#include "shm/changelog.h"
#include "shm/dindex.h"
#include "shm/segment.h"
#include "shm/store_sh.h"

#include <sys/types.h>
#include <sys/uio.h>

/* put results (besides the KVR_E* errors of common.h) */
#define KVR_PUT_CREATED 1
#define KVR_PUT_DEDUP   2

/* A pinned block. Valid from a successful kvr_store_get until kvr_store_unpin. */
typedef struct {
    uint32_t entry;
    uint32_t gen;
    uint64_t length;
    uint64_t canon;
} kvr_block_ref_t;

/* An in-flight PUT between begin and commit/abort. */
typedef struct {
    uint32_t entry;
    uint32_t gen;
    uint64_t length;
    uint16_t key_len;
    uint8_t promote; /* set by the caller: a block read back from the disk tier, not a PUT (not counted as put_new) */
} kvr_put_txn_t;

typedef struct {
    uint64_t unique_blocks, total_refs, resident_bytes, logical_bytes, dedup_savings_bytes;
    uint64_t dedup_hits, get_hits, get_misses;
    uint64_t capacity_bytes, evictions, evicted_bytes, put_new, put_conflicts, deletes;
    uint64_t put_nospace, pinned_blocks, zombie_blocks, reserved_blocks, free_pages, total_pages, repairs, lock_recoveries;
    uint64_t log_appended, log_dropped;
} kvr_store_stats_t;

#define KVR_STORE_UNPIN_BATCH 64

struct kvr_store_s {
    kvr_seg_t *seg;
    kvr_store_sh_t *sh;
    kvr_index_t ix;
    kvr_arena_t arena;
    kvr_chlog_sh_t *log;
    kvr_dindex_t dx; /* the disk tier's index (dx.sh NULL: no disk tier in this segment) */
    kvr_pin_t *pins_all;
    uint32_t pin_slots;
    uint32_t page_size;
    int slot;
    kvr_stats_block_t *my_stats;
    uint8_t *scratch;
    int notify_fd;    /* eventfd of the change log's consumer, or -1 */
    int chlog_wakeup; /* set under the lock when an append asked to wake the consumer */
    /* kvr_store_unpin_later: pins to release at the next kvr_store_unpin_flush, in one lock */
    uint32_t unpin_q[KVR_STORE_UNPIN_BATCH];
    unsigned unpin_n;
};

/* Initialises the store's regions of a freshly created segment (the supervisor, once). */
int kvr_store_format(kvr_seg_t *seg, int no_evict);

/*
 * Warm restart: a re-attached segment (seg->attached) whose processes are all gone. Reinitialises
 * the lock, clears every pin table, folds every process's counters into the retired block and
 * runs the full repair (reservations and half-written blocks dropped, aggregates recomputed).
 * Returns KVR_OK, or KVR_ERR when the store was never formatted.
 */
int kvr_store_attach(kvr_seg_t *seg, int no_evict);

/* Opens this process's handle; seg->slot must be claimed (kvr_seg_proc_claim). */
int kvr_store_open(kvr_store_t *st, kvr_seg_t *seg);

/*
 * The largest block the arena can ever hold, under any key: a block's pages hold its key
 * (up to KVR_KEY_MAX bytes) and its payload together, so this is the arena's bytes less the
 * longest key. Anything larger would fail only after its body was read (507) even in an empty
 * store; the supervisor clamps --max-block-size to it so that such a PUT gets 413 from its head.
 */
uint64_t kvr_store_block_max(const kvr_store_t *st);

/* Validates a decoded key: 1..KVR_KEY_MAX bytes, no NUL. */
int kvr_store_key_valid(const void *key, size_t klen);

/*
 * One-shot put of len bytes from data. canon is the canonical hash for the filter of relay pool
 * `pool` (kvr_store_pool: the caller resolves it from the namespace and the model).
 * Returns KVR_PUT_CREATED, KVR_PUT_DEDUP, KVR_ECONFLICT, KVR_ENOSPACE, KVR_EINVAL or KVR_ERR.
 */
int kvr_store_put(kvr_store_t *st, uint16_t ns, uint32_t pool, const void *key, size_t klen, const void *data,
                  uint64_t len, uint64_t canon);

/*
 * Two-phase put, for bodies that arrive in pieces: begin reserves the entry and pages
 * (returns KVR_OK with *txn, or KVR_PUT_DEDUP / KVR_ECONFLICT / KVR_ENOSPACE / KVR_EINVAL);
 * write copies payload bytes at an offset; commit publishes the block (KVR_PUT_CREATED, or
 * KVR_PUT_DEDUP / KVR_ECONFLICT when a concurrent put of the same key committed first);
 * abort gives everything back.
 */
int kvr_store_put_begin(kvr_store_t *st, uint16_t ns, uint32_t pool, const void *key, size_t klen, uint64_t len,
                        uint64_t canon, kvr_put_txn_t *txn);
int kvr_store_put_write(kvr_store_t *st, const kvr_put_txn_t *txn, uint64_t off, const void *src,
                        uint64_t n);
/* Fills iov with the payload spans of a reservation from offset off; returns the count. */
size_t kvr_store_txn_iov(kvr_store_t *st, const kvr_put_txn_t *txn, uint64_t off, struct iovec *iov,
                         size_t max);
/* The same over the whole chain, key then payload, from byte `from` of it (the disk tier reads
 * a record's body, which is laid out so, straight into a reservation). */
size_t kvr_store_txn_chain_iov(kvr_store_t *st, const kvr_put_txn_t *txn, uint64_t from, struct iovec *iov,
                               size_t max);
int kvr_store_put_commit(kvr_store_t *st, kvr_put_txn_t *txn);
void kvr_store_put_abort(kvr_store_t *st, kvr_put_txn_t *txn);

/* Pins a resident block. Returns KVR_OK, KVR_ENOTFOUND, KVR_EBUSY (pin table full), KVR_EINVAL.
 * Counts the GET's hit or miss (kvr_store_get_counted with both). */
int kvr_store_get(kvr_store_t *st, uint16_t ns, const void *key, size_t klen, kvr_block_ref_t *ref);

/* The same, counting only the outcomes `count` names (KVR_GET_COUNT_*): a GET that may still be
 * served from the disk tier counts its miss only once that misses too (kvr_store_count_miss),
 * and its hit when it pins the block it promoted (docs/ssd-tier.md, "Metrics"). */
#define KVR_GET_COUNT_HIT  1u
#define KVR_GET_COUNT_MISS 2u
int kvr_store_get_counted(kvr_store_t *st, uint16_t ns, const void *key, size_t klen, kvr_block_ref_t *ref,
                          unsigned count);
void kvr_store_count_miss(kvr_store_t *st, uint16_t ns);

/* Fills iov with the pinned payload's spans from offset off; returns the count (<= max). */
size_t kvr_store_ref_iov(kvr_store_t *st, const kvr_block_ref_t *ref, uint64_t off, struct iovec *iov,
                         size_t max);

/* Copies n payload bytes from offset off of a pinned block. Returns KVR_OK or KVR_EINVAL. */
int kvr_store_read(kvr_store_t *st, const kvr_block_ref_t *ref, uint64_t off, void *dst, uint64_t n);

/* A pinned block's chain, key then payload, as iovecs over the arena (page-aligned runs, the
 * last one cut at the block's end): the disk tier's record body. The count, or 0 when more than
 * max would be needed. */
size_t kvr_store_ref_chain_iov(kvr_store_t *st, const kvr_block_ref_t *ref, struct iovec *iov, size_t max);

/*
 * The disk writer's side (store_demote.c; docs/ssd-tier.md, "Demotion and admission").
 *
 * kvr_store_demote_pick pins up to cap blocks nearest eviction, for the writer to copy to disk:
 * from the least recently used end of each namespace's LRU list, within its first `window`
 * bytes, the LIVE blocks read since they were stored (admission) that skip() does not refuse
 * (the writer's own record of what it wrote) and that have no copy on disk yet: one with a
 * copy (a block promoted from the disk, or restored) is passed to on_disk() instead, unpinned,
 * so that a small arena is not pinned whole for copies the writer would drop. Returns how many
 * it pinned into out.
 * kvr_store_demote_commit then calls put(ctx) under the store lock only if the block is still
 * the same LIVE block (not deleted, evicted or replaced meanwhile), so that a DELETE, which
 * kills the disk copy after it removes the RAM one, never misses a copy put after its check;
 * it returns put's result, or KVR_ENOTFOUND without calling it. Either way the pin is released.
 * kvr_store_demote_release releases a pick that is not committed.
 */
typedef struct {
    kvr_block_ref_t ref; /* pinned */
    uint16_t ns;
    uint16_t key_len;
    uint8_t pool;
} kvr_demote_t;
typedef int (*kvr_demote_skip_fn)(void *ctx, uint32_t entry, uint32_t gen);
unsigned kvr_store_demote_pick(kvr_store_t *st, uint64_t window, kvr_demote_t *out, unsigned cap,
                               kvr_demote_skip_fn skip, kvr_demote_skip_fn on_disk, void *ctx);
int kvr_store_demote_commit(kvr_store_t *st, kvr_demote_t *d, int (*put)(void *ctx), void *ctx);
void kvr_store_demote_release(kvr_store_t *st, kvr_demote_t *d);
/* The namespace seed of ns (the disk index hashes keys with it). */
uint64_t kvr_store_ns_seed(const kvr_store_t *st, uint16_t ns);

/* Releases a pin taken by kvr_store_get. */
void kvr_store_unpin(kvr_store_t *st, kvr_block_ref_t *ref);

/*
 * The same, deferred to the next kvr_store_unpin_flush (or to the call that fills the batch),
 * so that a worker takes the store lock once for every pin its loop iteration releases
 * instead of once each. The pin stays in this process's pin table until then, so a death in
 * between is repaired like any other pin. The owner of the loop flushes before it blocks.
 */
void kvr_store_unpin_later(kvr_store_t *st, kvr_block_ref_t *ref);
void kvr_store_unpin_flush(kvr_store_t *st);

/* 1 when resident (length in *len if non-NULL), 0 when not; never pins, usually lock-free. */
int kvr_store_exists(kvr_store_t *st, uint16_t ns, const void *key, size_t klen, uint64_t *len);

/*
 * Exact lookup by canonical hash (docs/kv-lookup.md): for each of the n hashes h[k], held[k] = 1
 * when pool `pool` holds a resident (LIVE) block whose canonical hash is h[k] (any of its keys),
 * else 0. Returns the prefix: how many consecutive hashes from h[0] are held. A pool that does
 * not exist (>= kvr_store_pool_count) holds nothing. Lock-free under the index's seqlock; the
 * hashes whose walk writers kept interfering with are answered together under one store lock.
 * With the disk tier on, a block on disk is held too (the disk index's canonical chains,
 * lock-free; a chain its writer kept changing answers "not held").
 */
size_t kvr_store_lookup_hashes(kvr_store_t *st, uint32_t pool, const uint64_t *h, size_t n, uint8_t *held);

/* DELETE: one reference less. Returns KVR_OK with *refs_left, or KVR_ENOTFOUND / KVR_EINVAL. */
int kvr_store_release(kvr_store_t *st, uint16_t ns, const void *key, size_t klen, uint32_t *refs_left);

void kvr_store_stats(kvr_store_t *st, kvr_store_stats_t *out);

/* The supervisor, at every publication of the tenants table: each namespace's memory= in
 * payload bytes (0: none), which its PUTs then keep to by evicting their own blocks, and its
 * ssd= (0: none), which the disk writer keeps to by dropping its oldest disk copies. */
void kvr_store_set_quotas(kvr_store_t *st, const uint64_t quota[KVR_NS_MAX], const uint64_t ssd[KVR_NS_MAX]);
/* ssd= of namespace ns (a relaxed load: the disk writer's, without the lock). */
uint64_t kvr_store_ssd_quota(const kvr_store_t *st, uint16_t ns);

/* One namespace's share: what it holds now, and its counters summed over every process. */
typedef struct {
    uint64_t blocks, refs, resident_bytes, logical_bytes;
    uint64_t get_hits, get_misses, put_new, put_dedup, put_conflicts, evictions, evicted_bytes, deletes;
} kvr_store_ns_stats_t;
void kvr_store_ns_stats(kvr_store_t *st, uint16_t ns, kvr_store_ns_stats_t *out);

/* Counter i (KVR_ST_*) summed over every process's stats block and the retired one. */
uint64_t kvr_store_counter(const kvr_store_t *st, unsigned i);

/* The change log's positions (appended up to head, consumed up to tail), for /debug/relay. */
void kvr_store_log_positions(const kvr_store_t *st, uint64_t *head, uint64_t *tail);

/*
 * Supervisor: a child died. Repairs whatever it held (its lock, pins, reservations), retires
 * its stats and frees its slot. Returns KVR_OK, or KVR_ENOTFOUND when pid had no slot.
 */
int kvr_store_reap(kvr_store_t *st, pid_t pid);
int kvr_store_reap_slot(kvr_store_t *st, int slot);

/*
 * Calls cb for every resident block under the lock, and marks the change log consumed up
 * to that point (clears overflow). The publisher's resync after an overflow.
 */
typedef void (*kvr_store_scan_cb)(void *ctx, uint32_t entry, uint32_t gen, uint64_t canon, uint32_t pool);
void kvr_store_resync(kvr_store_t *st, kvr_store_scan_cb cb, void *ctx);

/* ---- relay pools (store_pools.c; the table is kvr_store_sh_t.pool, its rules in store_sh.h) */

/*
 * The pool of (ns, model): found without a lock, or made under the store lock as the next
 * slot. ns_name is recorded with a new pool (the relay derives its identity from it).
 * Returns the pool id, KVR_ENOSPACE when the segment's --max-pools are all taken, KVR_EQUOTA
 * when namespace ns has ns_max pools already, or KVR_EINVAL for an invalid model
 * (kvr_model_valid).
 */
int kvr_store_pool(kvr_store_t *st, uint16_t ns, const char *ns_name, const char *model, size_t mlen,
                   uint32_t ns_max);

/* The pool of (ns, model) if it exists: never makes one (a lookup's pool, store_lookup.c). Returns
 * the pool id, KVR_ENOTFOUND, or KVR_EINVAL for an invalid model or namespace. Lock-free. */
int kvr_store_pool_find(const kvr_store_t *st, uint16_t ns, const char *model, size_t mlen);

/* A warm restart, before the repair (which then frees the entries of pools cut here): keeps the
 * longest prefix of whole slots within the segment's --max-pools. */
void kvr_store_pools_attach_locked(kvr_store_t *st);

/* Pools made so far (acquire: the slots below it are whole and never change). */
uint32_t kvr_store_pool_count(const kvr_store_t *st);

/* What a pool is: its namespace (id and name) and model. The strings live in the segment and
 * never change. */
typedef struct {
    uint16_t ns;
    const char *ns_name;
    const char *model;
} kvr_pool_info_t;

/* Pool i's description: KVR_OK, or KVR_ENOTFOUND when i >= kvr_store_pool_count. */
int kvr_store_pool_info(const kvr_store_t *st, uint32_t i, kvr_pool_info_t *out);

/* Debug view: full consistency check of every structure against a scan. KVR_OK or KVR_ERR
 * (the reason is logged). Also fills *out with the scan's totals if non-NULL. */
int kvr_store_check(kvr_store_t *st, kvr_store_stats_t *out);

/*
 * Fault injection for the crash tests: when set, called at named points inside the store's
 * critical sections (a test makes it sleep so that SIGKILL lands there). NULL in production.
 */
enum { KVR_FAULT_COMMIT_LINKED = 1,
       KVR_FAULT_REMOVE_UNLINKED = 2,
       KVR_FAULT_EVICTING = 3,
       KVR_FAULT_PINNED = 4 };
extern void (*kvr_store_fault_hook)(int point);

/* Canonical hash of a key when the PUT carries none (docs/http-contract.md, "Operations"). */
uint64_t kvr_store_default_canon(const void *key, size_t klen);

#endif
