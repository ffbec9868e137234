/*
 * store_int.h — what store.c (the store's operations) and store_repair.c (crash repair and the
 * debug check) share. Internal to src/core/store*.c: nothing else includes it.
 *
 * Naming: a function that ends in _locked expects the store lock held by this process, and
 * asserts it (store_locked, base/dassert.h); store_lock / store_unlock take and drop it, the
 * former running the full repair when the previous holder died with it.
 */
#ifndef KVR_CORE_STORE_INT_H
#define KVR_CORE_STORE_INT_H

#include "base/barrier.h"
#include "base/dassert.h"
#include "core/store.h"

#include <unistd.h>

/* 1 when this process holds the store lock (only tracked in asserting builds: dassert.h). */
KVR_DASSERT_FN static inline int store_locked(const kvr_store_t *st)
{
    return kvr_shlock_held(&st->sh->lock);
}

/* 1 when st is this process's own handle: its process slot is claimed by this pid, so the pin
 * table and stats block it writes are its own (docs/concurrency.md: one writer each). */
KVR_DASSERT_FN static inline int store_mine(const kvr_store_t *st)
{
    return st->slot >= 0 && st->slot < KVR_MAX_PROCS &&
           kvr_atomic_load_relaxed(&st->seg->procs[st->slot].pid) == (int32_t)getpid();
}

/* 1 when LIVE entry e's key has a copy of its length in the disk index (a lock-free lookup;
 * the key is at the head of the block's first page); 0 without a disk tier. Locked. */
int kvr_store_on_disk_locked(const kvr_store_t *st, const kvr_entry_t *e);

/* The full repair, lock held (store_repair.c). dead_slot: the process that died, or -1. */
void kvr_store_repair_locked(kvr_store_t *st, int dead_slot);

/* Takes the store lock; repairs first when its previous holder died with it. KVR_OK or KVR_ERR. */
static inline int store_lock(kvr_store_t *st)
{
    int dead = -1;
    int rc = kvr_shlock_lock(&st->sh->lock, st->slot, &dead);

    if (KVR_LIKELY(rc == KVR_OK))
        return KVR_OK;
    if (rc == KVR_SHLOCK_RECOVERED) {
        st->sh->lock_recoveries++;
        kvr_store_repair_locked(st, dead);
        kvr_shlock_consistent(&st->sh->lock);
        return KVR_OK;
    }
    return KVR_ERR;
}

/* Drops the store lock, then wakes the change log's consumer if an append asked for it. */
static inline void store_unlock(kvr_store_t *st)
{
    int wake = st->chlog_wakeup;

    st->chlog_wakeup = 0;
    kvr_shlock_unlock(&st->sh->lock);
    if (wake && st->notify_fd >= 0) {
        uint64_t one = 1;
        (void)!write(st->notify_fd, &one, sizeof(one));
    }
}

/* Appends entry i's insert or remove to the change log and remembers to wake its consumer
 * after unlocking. */
static inline void chlog_event_locked(kvr_store_t *st, uint32_t op, uint32_t i)
{
    const kvr_entry_t *e = &st->ix.ent[i];

    if (kvr_chlog_append_locked(st->log, &st->sh->lock, op, e->canon, i, e->gen, e->pool) == 1)
        st->chlog_wakeup = 1;
}

static inline kvr_pin_t *pin_table(const kvr_store_t *st, int slot)
{
    return st->pins_all + (uint64_t)slot * st->pin_slots;
}

/* Arena pages of a block: its key and its payload share them. */
static inline uint64_t pages_for(const kvr_store_t *st, uint64_t klen, uint64_t len)
{
    return (klen + len + st->page_size - 1) >> st->arena.page_shift;
}

/* A named point of a critical section where the crash tests make SIGKILL land. */
#define FAULT_POINT(p) \
    do { \
        if (KVR_UNLIKELY(kvr_store_fault_hook != NULL)) \
            kvr_store_fault_hook(p); \
    } while (0)

/* Takes a LIVE block out of the resident set (store.c). Locked. */
void kvr_store_remove_block_locked(kvr_store_t *st, uint32_t i);

/* Room for a PUT of len bytes (pages pages) in ns: KVR_OK, KVR_EQUOTA or KVR_ENOSPACE
 * (store_evict.c). Locked. */
int kvr_store_make_room_locked(kvr_store_t *st, uint16_t ns, uint64_t len, uint64_t pages);

/* Pins LIVE entry i for this process and describes it in *ref: KVR_OK, or KVR_EBUSY (the pin
 * table is full). kvr_store_unpin_locked undoes it. Locked. */
int kvr_store_pin_locked(kvr_store_t *st, uint32_t i, kvr_block_ref_t *ref);
void kvr_store_unpin_locked(kvr_store_t *st, uint32_t entry);

/* A namespace counter of this process (store_sh.h: its owner alone writes its row). */
static inline void ns_stat_add(kvr_store_t *st, uint16_t ns, unsigned i, uint64_t v)
{
    uint64_t *c = &st->sh->ns_stats[st->slot >= 0 ? st->slot : KVR_STATS_RETIRED][ns].c[i];
    kvr_atomic_store_relaxed(c, kvr_atomic_load_relaxed(c) + v);
}

/* Folds a dead (or, at a warm re-attach, gone) process's counters into the retired block and
 * row, and zeroes its own (store_repair.c). The supervisor, with no writer of either running. */
void kvr_store_retire_stats(kvr_store_t *st, int slot);

#endif
