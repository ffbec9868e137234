/* Unit tests of the change log ring on its own (src/shm/changelog.c), without a store. */
#include "shm/changelog.h"
#include "shm/shlock.h"

#include <criterion/criterion.h>
#include <stdint.h>

/* The wake rule of the change log: an append to the empty ring wakes an untimed consumer, not
 * a timed one; reaching the wake batch wakes either. */
Test(changelog, change_log_wakes_an_untimed_consumer_and_at_the_batch)
{
    static _Alignas(64) uint8_t mem[sizeof(kvr_chlog_sh_t) + 64 * sizeof(kvr_chlog_event_t)];
    kvr_chlog_sh_t *log = (kvr_chlog_sh_t *)mem;
    kvr_chlog_event_t ev[64];
    kvr_shlock_t lock; /* appends hold the store lock: a private one stands in for it */
    int dead;

    cr_assert_eq(kvr_shlock_init(&lock), KVR_OK);
    cr_assert_eq(kvr_shlock_lock(&lock, 0, &dead), KVR_OK);
    kvr_chlog_format(log, 64);
    kvr_chlog_set_wake_batch(log, 4);
    cr_assert_eq(kvr_chlog_append_locked(log, &lock, KVR_EV_INSERT, 1, 1, 1, 0), 1, "empty, untimed: wake");
    cr_assert_eq(kvr_chlog_append_locked(log, &lock, KVR_EV_INSERT, 2, 2, 1, 0), KVR_OK, "not empty: no wake");
    cr_assert_eq(kvr_chlog_consume(log, ev, 64), 2);

    kvr_chlog_set_timed(log, 1);
    for (uint32_t i = 0; i < 3; i++)
        cr_assert_eq(kvr_chlog_append_locked(log, &lock, KVR_EV_INSERT, 10 + i, 10 + i, 1, 0), KVR_OK,
                     "timed: the first appends wake nobody (append %u)", i);
    cr_assert_eq(kvr_chlog_append_locked(log, &lock, KVR_EV_REMOVE, 13, 13, 1, 0), 1, "the batch wakes a timed consumer");
    cr_assert_eq(kvr_chlog_count(log), 4, "nothing is lost while unannounced");
    cr_assert_eq(kvr_chlog_consume(log, ev, 64), 4);

    kvr_chlog_set_timed(log, 0);
    cr_assert_eq(kvr_chlog_append_locked(log, &lock, KVR_EV_INSERT, 20, 20, 1, 0), 1, "untimed again: wake");
    kvr_shlock_unlock(&lock);
}
