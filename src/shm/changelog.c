/* changelog.c — see changelog.h. */
#include "shm/changelog.h"

void kvr_chlog_format(kvr_chlog_sh_t *log, uint64_t capacity)
{
    atomic_store_explicit(&log->head, 0, memory_order_relaxed);
    atomic_store_explicit(&log->tail, 0, memory_order_relaxed);
    log->capacity = capacity;
    atomic_store_explicit(&log->overflow, 0, memory_order_relaxed);
    atomic_store_explicit(&log->wake_batch, 0, memory_order_relaxed);
    atomic_store_explicit(&log->appended, 0, memory_order_relaxed);
    atomic_store_explicit(&log->dropped, 0, memory_order_relaxed);
    atomic_store_explicit(&log->timed, 0, memory_order_relaxed);
}

int kvr_chlog_append_locked(kvr_chlog_sh_t *log, uint32_t op, uint64_t canon, uint32_t entry, uint32_t gen)
{
    uint64_t h = atomic_load_explicit(&log->head, memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&log->tail, memory_order_acquire);
    kvr_chlog_event_t *e;

    if (h - t >= log->capacity) {
        atomic_store_explicit(&log->overflow, 1, memory_order_release);
        atomic_fetch_add_explicit(&log->dropped, 1, memory_order_relaxed);
        return KVR_ENOSPACE;
    }
    e = &log->ev[h & (log->capacity - 1)];
    e->canon = canon;
    e->entry = entry;
    e->gen_op = (gen << 2) | op;
    atomic_store_explicit(&log->head, h + 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(&log->appended, 1, memory_order_relaxed);
    t = atomic_load_explicit(&log->tail, memory_order_seq_cst);
    if (h + 1 - t == atomic_load_explicit(&log->wake_batch, memory_order_relaxed))
        return 1;
    return t == h && !atomic_load_explicit(&log->timed, memory_order_seq_cst) ? 1 : KVR_OK;
}

void kvr_chlog_set_timed(kvr_chlog_sh_t *log, int timed)
{
    atomic_store_explicit(&log->timed, timed ? 1u : 0u, memory_order_seq_cst);
}

void kvr_chlog_set_wake_batch(kvr_chlog_sh_t *log, uint32_t n)
{
    atomic_store_explicit(&log->wake_batch, n, memory_order_relaxed);
}

uint64_t kvr_chlog_count(kvr_chlog_sh_t *log)
{
    return atomic_load_explicit(&log->head, memory_order_seq_cst) - atomic_load_explicit(&log->tail, memory_order_relaxed);
}

size_t kvr_chlog_consume(kvr_chlog_sh_t *log, kvr_chlog_event_t *out, size_t max)
{
    uint64_t t = atomic_load_explicit(&log->tail, memory_order_relaxed);
    uint64_t h = atomic_load_explicit(&log->head, memory_order_seq_cst);
    size_t n = 0;

    while (t + n < h && n < max) {
        out[n] = log->ev[(t + n) & (log->capacity - 1)];
        n++;
    }
    atomic_store_explicit(&log->tail, t + n, memory_order_seq_cst);
    return n;
}
