/*
 * arena.h — the block arena: payload pages handed out as chains of runs.
 *
 * The arena is npages pages of page_size bytes (4 KiB by default). A block's bytes live in
 * a chain of runs (maximal stretches of consecutive pages); the page map records, at the
 * head page of every run, its length and the next run of the same chain, and at its tail
 * page the head's index. Free runs sit on 32 segregated lists by floor(log2(length)), each
 * doubly linked through the page map, with a bitmap of non-empty lists.
 *
 *  - Allocation of n pages is O(1) per run: the lowest non-empty list whose runs are all
 *    >= n gives one contiguous run (split, the tail goes back); when no run is that long,
 *    runs are gathered from the longest lists down. So allocation never fails while enough
 *    pages are free in total: there is no external fragmentation collapse, and the fill is
 *    limited only by the rounding of each block to whole pages.
 *  - Free is O(1) per run and coalesces with free neighbours (boundary tags), so churn
 *    returns to long runs and chains stay short.
 *
 * Crash safety: the ground truth is the chains of live index entries. kvr_arena_rebuild_locked
 * throws away every free list and rebuilds them from a scan of the used-page bitmap that
 * the caller derives from those chains.
 *
 * Locking: every function that reads or writes the free lists or the page map's tags needs
 * the store lock, and asserts it (the handle's `lock`): the `_locked` ones and
 * kvr_arena_claim_chain. Two need none. kvr_arena_format runs before any other process maps
 * the segment. kvr_arena_next_span (and kvr_arena_chain_runs) only read a used chain's `len`
 * and `next`, which change only when the chain is allocated, freed or claimed by a repair, all
 * under the lock; so a walker that keeps the chain from being freed, by a pin on its block or
 * by owning its reservation, may walk it without the lock. kvr_arena_next_span asserts that
 * each run it reads is in use (a free one means that promise was broken); the store asserts
 * the pin or the reservation (docs/concurrency.md, "Reading a block without the lock").
 */
#ifndef KVR_SHM_ARENA_H
#define KVR_SHM_ARENA_H

#include "common.h"
#include "base/barrier.h"
#include "shm/shlock.h"

#define KVR_ARENA_CLASSES 32
#define KVR_PAGE_FREE     0x80000000u /* in kvr_page_t.len (at heads) and .tail (at tails) */

/* Page-map record. Meaningful at run heads (len, next, prev) and run tails (tail). */
typedef struct {
    uint32_t len;  /* at a head: run length in pages | KVR_PAGE_FREE */
    uint32_t next; /* used run: next run of the chain; free run: next on its free list */
    uint32_t prev; /* free run: previous on its free list */
    uint32_t tail; /* at a tail: head page index | KVR_PAGE_FREE */
} kvr_page_t;
static_assert(sizeof(kvr_page_t) == 16, "page map record");

/* Shared arena state (inside kvr_store_sh_t). */
typedef struct {
    uint32_t class_head[KVR_ARENA_CLASSES];
    uint32_t class_bitmap;
    uint32_t high_water; /* pages [0, high_water) have been handed out at least once */
    uint64_t npages;
    uint64_t free_pages;
} kvr_arena_sh_t;
static_assert(sizeof(kvr_arena_sh_t) == 4 * KVR_ARENA_CLASSES + 24, "arena state layout");

/* Process-local handle. */
typedef struct {
    kvr_arena_sh_t *sh;
    kvr_page_t *pages;
    uint8_t *data;
    uint32_t page_shift;
    const kvr_shlock_t *lock; /* the store lock; NULL: a private arena (tests), nothing to hold */
} kvr_arena_t;

/* Formats an empty arena: one free run of every page. */
void kvr_arena_format(kvr_arena_t *a);

/*
 * Allocates n pages (n >= 1) as a chain; returns its head page, or KVR_NIL when fewer than
 * n pages are free (nothing is changed then). Caller holds the store lock.
 */
uint32_t kvr_arena_alloc_locked(kvr_arena_t *a, uint64_t n);

/* Frees every run of the chain starting at head. Caller holds the store lock. */
void kvr_arena_free_locked(kvr_arena_t *a, uint32_t head);

/* Number of runs in a chain (bounded walk; returns 0 on a malformed chain). The caller keeps
 * the chain, as for kvr_arena_next_span. */
uint32_t kvr_arena_chain_runs(const kvr_arena_t *a, uint32_t head);

/*
 * Validates the chain at head (in range, no overlap with pages already set in used_bitmap,
 * exactly `expect_pages` pages) and, if valid, marks its pages in used_bitmap and rewrites
 * its boundary tags. Returns 1 if valid, 0 if not (bitmap then unchanged). Caller holds the
 * store lock (a repair, or the debug check).
 */
int kvr_arena_claim_chain(kvr_arena_t *a, uint32_t head, uint64_t expect_pages, uint8_t *used_bitmap);

/* Rebuilds every free list from used_bitmap (1 = used). Caller holds the store lock. */
void kvr_arena_rebuild_locked(kvr_arena_t *a, const uint8_t *used_bitmap);

/*
 * The arena's high-water mark: every page below it has been handed out at least once (the
 * allocator cuts runs from their low end, so a fresh arena fills from page 0 up). Written under
 * the store lock by kvr_arena_alloc_locked, never lowered; read without the lock by the workers'
 * prefault threads (proc/prefault.c), for whom a stale value only delays a mapping.
 */
static inline uint64_t kvr_arena_high_water(const kvr_arena_t *a)
{
    return kvr_atomic_load_relaxed(&a->sh->high_water); /* see above: pairs with nothing */
}

/* Pointer to page p. */
static inline uint8_t *kvr_arena_page(const kvr_arena_t *a, uint32_t p)
{
    return a->data + ((uint64_t)p << a->page_shift);
}

/*
 * Iterates a chain as byte spans: *run is the current run head (start with the chain head),
 * *skip bytes of it already consumed. Returns the span's pointer and length via out args;
 * returns 0 when the chain ends. No lock: the caller keeps the chain from being freed (a pin
 * or a reservation it owns; see "Locking" above), and each run read is asserted in use.
 */
int kvr_arena_next_span(const kvr_arena_t *a, uint32_t *run, uint64_t *skip, uint8_t **ptr, uint64_t *len);

/* Debug/test: verifies every list, tag and the free-page count. Returns KVR_OK or KVR_ERR. */
int kvr_arena_check_locked(const kvr_arena_t *a, const uint8_t *used_bitmap);

#endif
