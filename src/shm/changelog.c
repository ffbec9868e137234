/*
 * changelog.c — see changelog.h; the protocol is in docs/concurrency.md, "Change log".
 *
 * Every access to the ring's shared fields is one of base/barrier.h's accessors, and each
 * says what it pairs with on the other side.
 */
#include "shm/changelog.h"

#include "base/barrier.h"
#include "base/dassert.h"

void kvr_chlog_format(kvr_chlog_sh_t *log, uint64_t capacity)
{
    /* Before any other process maps the segment: fork publishes these, nothing pairs. */
    kvr_atomic_store_relaxed(&log->head, 0);
    kvr_atomic_store_relaxed(&log->tail, 0);
    log->capacity = capacity;
    kvr_atomic_store_relaxed(&log->overflow, 0);
    kvr_atomic_store_relaxed(&log->wake_batch, 0);
    kvr_atomic_store_relaxed(&log->appended, 0);
    kvr_atomic_store_relaxed(&log->dropped, 0);
    kvr_atomic_store_relaxed(&log->timed, 0);
}

int kvr_chlog_append_locked(kvr_chlog_sh_t *log, const kvr_shlock_t *lock, uint32_t op, uint64_t canon,
                            uint32_t entry, uint32_t gen, uint32_t pool)
{
    /* head is written only by producers, all under the store lock: our own last value. */
    uint64_t h = kvr_atomic_load_relaxed(&log->head);
    /* Pairs with the consumer's tail store (kvr_chlog_consume; kvr_store_resync): the slots
     * below tail are copied out before we may overwrite them. */
    uint64_t t = kvr_atomic_load_acquire(&log->tail);
    kvr_chlog_event_t *e;

    KVR_DASSERT(kvr_shlock_held(lock));
    if (h - t >= log->capacity) {
        /* Pairs with the consumer's acquire load of overflow (publisher.c). */
        kvr_atomic_store_release(&log->overflow, 1);
        kvr_atomic_fetch_add_relaxed(&log->dropped, 1); /* a counter: pairs with nothing */
        return KVR_ENOSPACE;
    }
    e = &log->ev[h & (log->capacity - 1)];
    e->canon = canon;
    e->entry = entry;
    e->gen_op = (gen << 2) | op;
    e->pool = pool;
    /* seq_cst: (1) as a release, pairs with the consumer's head load, so the event written
     * above is visible to it; (2) with the seq_cst tail and timed loads below against the
     * consumer's seq_cst tail/timed stores and head load, the Dekker pattern: either the
     * consumer's next head load sees this event, or our tail load sees the tail that emptied
     * the ring (or the lowered timed flag) and we report "wake". */
    kvr_atomic_store_seq_cst(&log->head, h + 1);
    kvr_atomic_fetch_add_relaxed(&log->appended, 1); /* a counter: pairs with nothing */
    /* seq_cst: the load half of the Dekker pattern above (pairs with kvr_chlog_consume's
     * seq_cst tail store). */
    t = kvr_atomic_load_seq_cst(&log->tail);
    /* Relaxed: set once by the consumer at its start, long before; a stale value only moves
     * one wake-up (docs/concurrency.md, "Change log"). */
    if (h + 1 - t == kvr_atomic_load_relaxed(&log->wake_batch))
        return 1;
    /* seq_cst: pairs with the consumer's seq_cst store of timed (kvr_chlog_set_timed), the
     * same Dekker pattern: it lowers timed, then loads head (kvr_chlog_count). */
    return t == h && !kvr_atomic_load_seq_cst(&log->timed) ? 1 : KVR_OK;
}

void kvr_chlog_set_timed(kvr_chlog_sh_t *log, int timed)
{
    /* seq_cst: the store half of the Dekker pattern with the append's seq_cst load of timed;
     * the consumer loads head (seq_cst) after lowering it. */
    kvr_atomic_store_seq_cst(&log->timed, timed ? 1u : 0u);
}

void kvr_chlog_set_wake_batch(kvr_chlog_sh_t *log, uint32_t n)
{
    kvr_atomic_store_relaxed(&log->wake_batch, n); /* pairs with nothing: see the append's load */
}

uint64_t kvr_chlog_count(kvr_chlog_sh_t *log)
{
    /* head seq_cst: pairs with the append's seq_cst head store (the event is visible, and the
     * Dekker pattern after kvr_chlog_set_timed). tail relaxed: only the consumer stores it. */
    return kvr_atomic_load_seq_cst(&log->head) - kvr_atomic_load_relaxed(&log->tail);
}

size_t kvr_chlog_consume(kvr_chlog_sh_t *log, kvr_chlog_event_t *out, size_t max)
{
    uint64_t t = kvr_atomic_load_relaxed(&log->tail); /* our own last store (the only consumer) */
    /* seq_cst: pairs with the append's seq_cst head store; the events below h are written. */
    uint64_t h = kvr_atomic_load_seq_cst(&log->head);
    size_t n = 0;

    while (t + n < h && n < max) {
        out[n] = log->ev[(t + n) & (log->capacity - 1)];
        n++;
    }
    /* seq_cst: as a release, pairs with the append's acquire tail load (the copied slots may be
     * reused); and the store half of the Dekker pattern with the append's seq_cst tail load. */
    kvr_atomic_store_seq_cst(&log->tail, t + n);
    return n;
}
