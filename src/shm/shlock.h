/*
 * shlock.h — crash-recoverable locks in shared memory.
 *
 * A kvr_shlock_t is a process-shared robust pthread mutex plus the proc slot of its
 * current holder. When a holder dies, the next locker gets EOWNERDEAD from glibc; then
 * kvr_shlock_lock returns KVR_SHLOCK_RECOVERED with the dead holder's slot (or -1 when it
 * died before recording itself) and the caller must repair the protected state and call
 * kvr_shlock_consistent before unlocking. Unlocking without that makes the mutex
 * permanently ENOTRECOVERABLE (docs/concurrency.md, "Lock order").
 *
 * Lock order (the one place it is written down): there is one store lock
 * (kvr_store_sh_t.lock) guarding the index, arena, pin tables and change-log producer side.
 * No other shared lock is ever taken while holding it.
 *
 * kvr_shlock_held says whether the calling thread holds a lock: every `*_locked` function
 * asserts it (KVR_DASSERT, base/dassert.h). It is tracked only in asserting builds.
 */
#ifndef KVR_SHM_SHLOCK_H
#define KVR_SHM_SHLOCK_H

#include "common.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct {
    pthread_mutex_t mutex;
    _Atomic int32_t holder; /* proc slot of the holder, -1 when free or unknown */
    uint32_t pad_[(64 - sizeof(pthread_mutex_t) % 64 - 4) / 4];
} kvr_shlock_t;
static_assert(sizeof(kvr_shlock_t) % KVR_CACHELINE == 0, "shlock fills whole cache lines");

#define KVR_SHLOCK_RECOVERED 1

/* Initialises a free lock. Also forgets that this thread held it (warm restart). */
int kvr_shlock_init(kvr_shlock_t *l);

/*
 * Locks. Returns KVR_OK, or KVR_SHLOCK_RECOVERED with *dead_slot set to the slot of the
 * holder that died with the lock held (-1 if unknown): the caller repairs, then calls
 * kvr_shlock_consistent. Returns KVR_ERR only on an unrecoverable mutex (logged).
 * Asserts that the caller does not hold it already (it would wait for itself forever).
 */
int kvr_shlock_lock(kvr_shlock_t *l, int my_slot, int *dead_slot);
/* Both assert that the caller holds the lock. */
void kvr_shlock_consistent(kvr_shlock_t *l);
void kvr_shlock_unlock(kvr_shlock_t *l);

/*
 * 1 when the calling thread holds l, 0 when not. For assertions only: in a build without
 * KVR_DEBUG_ASSERTS nothing is tracked and it always answers 1. A forked child holds none of
 * its parent's locks (the mutex's owner is the parent's thread), and so it answers 0 there.
 */
int kvr_shlock_held(const kvr_shlock_t *l);

#endif
