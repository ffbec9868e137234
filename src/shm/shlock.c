/* shlock.c — see shlock.h. */
#include "shm/shlock.h"

#include "base/atomics.h"
#include "base/barrier.h"
#include "base/dassert.h"
#include "base/log.h"

#include <errno.h>
#include <string.h>

#ifdef KVR_DEBUG_ASSERTS
/* The lock this thread holds (processes are single-threaded and there is one shared lock;
 * the store never nests it). Cleared in a forked child, which holds nothing of its parent's. */
static _Thread_local const kvr_shlock_t *held_lock;

static void forget_held_lock(void)
{
    held_lock = NULL;
}

__attribute__((constructor)) static void shlock_register_atfork(void)
{
    pthread_atfork(NULL, NULL, forget_held_lock);
}
#define SET_HELD(l) (held_lock = (l))
#else
#define SET_HELD(l) ((void)0)
#endif

int kvr_shlock_held(const kvr_shlock_t *l)
{
#ifdef KVR_DEBUG_ASSERTS
    return held_lock == l;
#else
    (void)l;
    return 1;
#endif
}

int kvr_shlock_init(kvr_shlock_t *l)
{
    pthread_mutexattr_t a;
    int rc;

#ifdef KVR_DEBUG_ASSERTS
    if (held_lock == l)
        held_lock = NULL;
#endif
    memset(l, 0, sizeof(*l));
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    rc = pthread_mutex_init(&l->mutex, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0) {
        kvr_error("pthread_mutex_init: %s", strerror(rc));
        return KVR_ERR;
    }
    /* Before any other process maps it (format) or while none is alive (warm restart). */
    kvr_atomic_store_relaxed(&l->holder, -1);
    return KVR_OK;
}

/*
 * The store lock is held for a few microseconds (an index probe, a reservation, an eviction),
 * and its other takers are the other workers, each on a core of its own when busy: a short
 * spin with trylock catches most releases, where blocking costs a futex wait and wake and two
 * context switches (about 10 us on our VM). glibc's robust mutexes never spin by themselves.
 * The bound keeps a taker whose holder was preempted from spinning for long: then it blocks.
 */
#define SPIN_TRIES 64

static int lock_mutex(kvr_shlock_t *l)
{
    for (int i = 0; i < SPIN_TRIES; i++) {
        int rc;
#ifdef __GLIBC__
        /* Look before the CAS (glibc's lock word: the holder's TID, 0 when free), so that the
         * spin reads a shared cache line instead of bouncing it. Relaxed: a hint only; the
         * trylock below is the acquire. */
        if (__atomic_load_n(&l->mutex.__data.__lock, __ATOMIC_RELAXED) != 0) {
            for (int k = 0; k < 8; k++)
                kvr_cpu_relax();
            continue;
        }
#endif
        rc = pthread_mutex_trylock(&l->mutex);
        if (rc != EBUSY)
            return rc; /* 0, EOWNERDEAD, or an error: as pthread_mutex_lock would */
    }
    return pthread_mutex_lock(&l->mutex);
}

/*
 * `holder` is written and read only by the mutex's holder (here, and by the next locker after
 * EOWNERDEAD), so the mutex orders every access to it: relaxed. A holder killed between the
 * mutex and its store leaves the previous value, -1 since the last unlock cleared it.
 */
int kvr_shlock_lock(kvr_shlock_t *l, int my_slot, int *dead_slot)
{
    int rc;

    KVR_DASSERT(!kvr_shlock_held(l));
    rc = lock_mutex(l);
    if (KVR_LIKELY(rc == 0)) {
        kvr_atomic_store_relaxed(&l->holder, my_slot); /* ordered by the mutex (above) */
        SET_HELD(l);
        return KVR_OK;
    }
    if (rc == EOWNERDEAD) {
        /* The holder field still names the dead holder, unless it died between taking the
         * mutex and recording itself (then it is -1, since unlock clears it). */
        *dead_slot = kvr_atomic_load_relaxed(&l->holder); /* ordered by the mutex (above) */
        kvr_atomic_store_relaxed(&l->holder, my_slot);
        SET_HELD(l);
        kvr_warn("shared lock: previous holder (slot %d) died holding it; repairing", *dead_slot);
        return KVR_SHLOCK_RECOVERED;
    }
    kvr_error("pthread_mutex_lock: %s", strerror(rc));
    return KVR_ERR;
}

void kvr_shlock_consistent(kvr_shlock_t *l)
{
    KVR_DASSERT(kvr_shlock_held(l));
    pthread_mutex_consistent(&l->mutex);
}

void kvr_shlock_unlock(kvr_shlock_t *l)
{
    KVR_DASSERT(kvr_shlock_held(l));
    kvr_atomic_store_relaxed(&l->holder, -1); /* ordered by the mutex's unlock (below) */
    SET_HELD(NULL);
    pthread_mutex_unlock(&l->mutex);
}
