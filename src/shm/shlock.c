/* shlock.c — see shlock.h. */
#include "shm/shlock.h"

#include "base/log.h"

#include <errno.h>
#include <string.h>

int kvr_shlock_init(kvr_shlock_t *l)
{
    pthread_mutexattr_t a;
    int rc;

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
    atomic_store_explicit(&l->holder, -1, memory_order_relaxed);
    return KVR_OK;
}

int kvr_shlock_lock(kvr_shlock_t *l, int my_slot, int *dead_slot)
{
    int rc = pthread_mutex_lock(&l->mutex);

    if (KVR_LIKELY(rc == 0)) {
        atomic_store_explicit(&l->holder, my_slot, memory_order_relaxed);
        return KVR_OK;
    }
    if (rc == EOWNERDEAD) {
        /* The holder field still names the dead holder, unless it died between taking the
         * mutex and recording itself (then it is -1, since unlock clears it). */
        *dead_slot = atomic_load_explicit(&l->holder, memory_order_relaxed);
        atomic_store_explicit(&l->holder, my_slot, memory_order_relaxed);
        kvr_warn("shared lock: previous holder (slot %d) died holding it; repairing", *dead_slot);
        return KVR_SHLOCK_RECOVERED;
    }
    kvr_error("pthread_mutex_lock: %s", strerror(rc));
    return KVR_ERR;
}

void kvr_shlock_consistent(kvr_shlock_t *l)
{
    pthread_mutex_consistent(&l->mutex);
}

void kvr_shlock_unlock(kvr_shlock_t *l)
{
    atomic_store_explicit(&l->holder, -1, memory_order_relaxed);
    pthread_mutex_unlock(&l->mutex);
}
