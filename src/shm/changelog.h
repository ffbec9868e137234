/*
 * changelog.h — the change log: a bounded multi-producer, single-consumer ring of
 * (insert | remove, canonical hash) events, from the store to the publisher.
 *
 * Producers append under the store lock (so the producer side needs no lock of its own; the
 * append asserts it); the one consumer (the publisher) reads without any lock. The layout
 * records no consumer: the publisher asserts its own role before it consumes
 * (proc/publisher.c). The whole protocol is in docs/concurrency.md, "Change log". Ordering:
 *   head  stored by a producer after the event is written (seq_cst, so it also orders
 *         before the producer's load of tail below), loaded by the consumer (seq_cst);
 *   tail  stored by the consumer after it has copied the events (seq_cst), loaded by
 *         producers: with acquire to detect a full ring, then with seq_cst after the head
 *         store to decide whether to wake the consumer. With both sides seq_cst, an append
 *         is either seen by the consumer's last head load or sees the tail that emptied
 *         the ring and reports "wake" (the Dekker pattern; docs/concurrency.md, "Change log").
 * head and tail sit on separate cache lines. When the ring is full the event is dropped and
 * the sticky `overflow` flag is set: the consumer must then rebuild from a scan of the
 * index (kvr_store_resync) instead of guessing; nothing is lost silently.
 *
 * Events also carry the block's relay pool, the entry index and its generation: a crash repair may append an event
 * a second time (at least once), and the consumer de-duplicates by (entry, gen).
 */
#ifndef KVR_SHM_CHANGELOG_H
#define KVR_SHM_CHANGELOG_H

#include "common.h"
#include "shm/shlock.h"

#include <stdatomic.h>

enum { KVR_EV_INSERT = 1,
       KVR_EV_REMOVE = 2 };

typedef struct {
    uint64_t canon;
    uint32_t entry;
    uint32_t gen_op; /* gen << 2 | op */
    uint32_t pool;   /* the relay pool of the block (kvr_store_sh_t.pool) */
    uint32_t pad_;
} kvr_chlog_event_t;
static_assert(sizeof(kvr_chlog_event_t) == 24, "log event layout");

typedef struct {
    _Atomic uint64_t head; /* producers, under the store lock */
    uint64_t pad0_[7];
    _Atomic uint64_t tail; /* the consumer */
    uint64_t pad1_[7];
    uint64_t capacity; /* power of two */
    _Atomic uint32_t overflow;
    _Atomic uint32_t wake_batch; /* the consumer: also wake me when this many are queued */
    _Atomic uint64_t appended;   /* events appended since format (for stats) */
    _Atomic uint64_t dropped;    /* events dropped on overflow */
    _Atomic uint32_t timed;      /* the consumer: my sleep ends within a --publication-delay */
    uint32_t pad2_;
    uint64_t pad3_[3];
    kvr_chlog_event_t ev[];
} kvr_chlog_sh_t;
static_assert(offsetof(kvr_chlog_sh_t, tail) == 64, "head and tail on separate lines");
static_assert(sizeof(kvr_chlog_sh_t) == 192, "log header layout");

static inline uint32_t kvr_chlog_op(const kvr_chlog_event_t *e)
{
    return e->gen_op & 3u;
}
static inline uint32_t kvr_chlog_gen(const kvr_chlog_event_t *e)
{
    return e->gen_op >> 2;
}

/* Formats an empty log: before any other process maps the segment. */
void kvr_chlog_format(kvr_chlog_sh_t *log, uint64_t capacity);

/*
 * Appends one event; on a full ring sets overflow and returns KVR_ENOSPACE. Returns 1 when
 * the ring was empty and the consumer is not in a timed sleep (it may be asleep for long: wake
 * it), or when the ring now holds wake_batch events (a consumer that waits wants them now),
 * KVR_OK otherwise. The head store and the loads of tail and timed are sequentially
 * consistent, as are the consumer's stores of tail and timed and its head load, so an append
 * is either seen by the consumer's last check or reported here as "wake". `lock` is the store
 * lock, which the caller holds (asserted).
 */
int kvr_chlog_append_locked(kvr_chlog_sh_t *log, const kvr_shlock_t *lock, uint32_t op, uint64_t canon,
                            uint32_t entry, uint32_t gen, uint32_t pool);

/* The consumer: appends also report "wake" when the ring reaches n events (0: only when it
 * was empty), so a consumer may leave events queued for a while without being woken by each. */
void kvr_chlog_set_wake_batch(kvr_chlog_sh_t *log, uint32_t n);

/* The consumer, before it sleeps: timed 1 says the sleep ends within a publication delay, so
 * an append to the empty ring need not wake it (it looks by itself); 0 asks for that wake-up.
 * After lowering it the consumer must check kvr_chlog_count once more before sleeping: an append
 * that saw it raised wrote no wake-up, and that check sees the append. */
void kvr_chlog_set_timed(kvr_chlog_sh_t *log, int timed);

/* The consumer: events queued now. */
uint64_t kvr_chlog_count(kvr_chlog_sh_t *log);

/*
 * Consumer: copies up to max events into out and advances the tail. Returns the count.
 * Only one process may consume.
 */
size_t kvr_chlog_consume(kvr_chlog_sh_t *log, kvr_chlog_event_t *out, size_t max);

#endif
