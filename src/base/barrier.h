/*
 * barrier.h — named accessors for every field that processes share without a lock.
 *
 * A lock-free access to shared memory anywhere in src/ goes through one of these, so that its ordering is in its name and a grep finds every one of them; each call
 * site says in a comment what it pairs with (the store on the other side, or why none is
 * needed). docs/concurrency.md has the table of who writes what with which ordering.
 *
 *   kvr_atomic_load_relaxed, kvr_atomic_store_relaxed
 *       atomicity only: a counter, a hint, a field that a seqlock or a later acquire validates
 *   kvr_atomic_load_acquire, kvr_atomic_store_release
 *       a hand-off: what the writer wrote before its release store is visible to a reader
 *       after its acquire load of the value stored
 *   kvr_atomic_load_seq_cst, kvr_atomic_store_seq_cst
 *       also one total order with every other seq_cst access: needed where each side stores
 *       one variable and then loads the other (the Dekker pattern of the change log)
 *   kvr_atomic_fence_acquire, _release, _seq_cst
 *       the same orderings for a group of relaxed accesses
 *   kvr_atomic_fetch_add_*, kvr_atomic_fetch_sub_seq_cst, kvr_atomic_fetch_or_seq_cst,
 *   kvr_atomic_fetch_and_seq_cst, kvr_atomic_exchange_seq_cst, kvr_atomic_cas_seq_cst
 *       read-modify-writes
 *
 * (Not kvr_store_*: that prefix is the block store's, core/store.h.)
 *
 * Like liburing's barrier.h, each macro casts its pointer to a pointer to _Atomic of the
 * pointed-to type, so one accessor serves fields declared _Atomic and plain fields that are
 * shared only sometimes (an index entry's chain link, read under the seqlock), with gcc and
 * clang alike. They compile to exactly the C11 atomic of the same ordering.
 */
#ifndef KVR_BASE_BARRIER_H
#define KVR_BASE_BARRIER_H

#include <stdatomic.h>

#define KVR_ATOMIC_PTR_(p) ((_Atomic __typeof__(*(p)) *)(p))

#define kvr_atomic_load_relaxed(p) atomic_load_explicit(KVR_ATOMIC_PTR_(p), memory_order_relaxed)
#define kvr_atomic_load_acquire(p) atomic_load_explicit(KVR_ATOMIC_PTR_(p), memory_order_acquire)
#define kvr_atomic_load_seq_cst(p) atomic_load_explicit(KVR_ATOMIC_PTR_(p), memory_order_seq_cst)

#define kvr_atomic_store_relaxed(p, v) atomic_store_explicit(KVR_ATOMIC_PTR_(p), (v), memory_order_relaxed)
#define kvr_atomic_store_release(p, v) atomic_store_explicit(KVR_ATOMIC_PTR_(p), (v), memory_order_release)
#define kvr_atomic_store_seq_cst(p, v) atomic_store_explicit(KVR_ATOMIC_PTR_(p), (v), memory_order_seq_cst)

#define kvr_atomic_fetch_add_relaxed(p, v) atomic_fetch_add_explicit(KVR_ATOMIC_PTR_(p), (v), memory_order_relaxed)
#define kvr_atomic_fetch_add_seq_cst(p, v) atomic_fetch_add_explicit(KVR_ATOMIC_PTR_(p), (v), memory_order_seq_cst)
#define kvr_atomic_fetch_sub_seq_cst(p, v) atomic_fetch_sub_explicit(KVR_ATOMIC_PTR_(p), (v), memory_order_seq_cst)
#define kvr_atomic_fetch_or_seq_cst(p, v)  atomic_fetch_or_explicit(KVR_ATOMIC_PTR_(p), (v), memory_order_seq_cst)
#define kvr_atomic_fetch_and_seq_cst(p, v) atomic_fetch_and_explicit(KVR_ATOMIC_PTR_(p), (v), memory_order_seq_cst)
#define kvr_atomic_exchange_seq_cst(p, v)  atomic_exchange_explicit(KVR_ATOMIC_PTR_(p), (v), memory_order_seq_cst)
/* Strong compare-and-swap; *expected takes the value found when it fails. */
#define kvr_atomic_cas_seq_cst(p, expected, desired) \
    atomic_compare_exchange_strong_explicit(KVR_ATOMIC_PTR_(p), (expected), (desired), \
                                            memory_order_seq_cst, memory_order_seq_cst)

#define kvr_atomic_fence_acquire() atomic_thread_fence(memory_order_acquire)
#define kvr_atomic_fence_release() atomic_thread_fence(memory_order_release)
#define kvr_atomic_fence_seq_cst() atomic_thread_fence(memory_order_seq_cst)

#endif
