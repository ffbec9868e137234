/*
 * ssdwriter.c — the disk writer thread (see ssdwriter.h; docs/ssd-tier.md).
 */
#include "proc/ssdwriter.h"

#include "base/barrier.h"
#include "base/clock.h"
#include "base/log.h"
#include "core/tenants_table.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct kvr_ssdw_s {
    kvr_ssdw_config_t cfg;
    kvr_seg_t *seg;
    kvr_store_t st;
    kvr_ssdt_t tier;
    kvr_tenants_view_t tv;
    uint32_t *wrote; /* per RAM entry: its generation + 1 when its copy is on disk (0: none) */
    struct iovec *iov;
    size_t iov_max;
    kvr_demote_t *picks;
    /* The round's picks in flight, settled in pick order from `head` (docs/ssd-tier.md,
     * "The writer's queue"): each pick's record and state; picks [head, next) are reserved. */
    struct commit_s *pc;
    uint8_t *ps; /* PICK_* */
    unsigned head, next;
    uint64_t cut_version;   /* a write of this page version failed this pass: later ones give up */
    unsigned pass, retries; /* the round's pass, and picks it gave up to retry */
    pthread_t th;
    pthread_mutex_t mu; /* guards `out`, the stats as of the last round, and the dirty set */
    kvr_ssdw_stats_t now, out;
    uint8_t *dirty_bit; /* per slot: on the dirty list */
    uint32_t *dirty;    /* the dirty list (at most one entry per slot) */
    size_t ndirty, nslots;
    int dirtied;         /* slots went dirty this round: wake the publisher */
    int failed;          /* a write failed this round */
    unsigned backoff_ms; /* the pause after a round with a failed write: 100 ms, doubling to 1 s */
    int stop, state;     /* atomics */
};

/* A restored record's namespace and pool now: the pool table first, else the tenants table's
 * namespace of that name (a pool is made for it). */
static int resolve(void *ctx, const kvr_ssd_rec_t *rec, uint16_t *ns, uint64_t *seed, uint8_t *pool)
{
    kvr_ssdw_t *w = ctx;
    uint32_t n = kvr_store_pool_count(&w->st);
    kvr_pool_info_t pi;
    int id;

    for (uint32_t i = 0; i < n; i++)
        if (kvr_store_pool_info(&w->st, i, &pi) == KVR_OK && strcmp(pi.ns_name, rec->ns) == 0 &&
            strcmp(pi.model, rec->model) == 0) {
            *ns = pi.ns;
            *pool = (uint8_t)i;
            *seed = kvr_store_ns_seed(&w->st, pi.ns);
            return KVR_OK;
        }
    kvr_tenants_view_refresh(&w->tv);
    if ((id = kvr_tenants_ns_find(&w->tv, rec->ns)) < 0)
        return KVR_ENOTFOUND;
    int p = kvr_store_pool(&w->st, (uint16_t)id, rec->ns, rec->model, rec->model_len, KVR_POOLS_MAX);
    if (p < 0)
        return KVR_ENOTFOUND;
    *ns = (uint16_t)id;
    *pool = (uint8_t)p;
    *seed = kvr_store_ns_seed(&w->st, (uint16_t)id);
    return KVR_OK;
}

/* The engine's observer: slot id changed (the writer's thread). */
static void on_slot(void *ctx, uint32_t id)
{
    kvr_ssdw_t *w = ctx;

    pthread_mutex_lock(&w->mu);
    if (id < w->nslots && !(w->dirty_bit[id / 8] & (1u << (id % 8)))) {
        w->dirty_bit[id / 8] |= (uint8_t)(1u << (id % 8));
        w->dirty[w->ndirty++] = id;
    }
    pthread_mutex_unlock(&w->mu);
    w->dirtied = 1;
}

static void wake(kvr_ssdw_t *w)
{
    uint64_t one = 1;

    if (w->dirtied && w->cfg.wake_fd >= 0 && write(w->cfg.wake_fd, &one, sizeof(one)) < 0) {
        /* a full eventfd counter still wakes the reader */
    }
    w->dirtied = 0;
}

size_t kvr_ssdw_take_dirty(kvr_ssdw_t *w, uint32_t *out, size_t max)
{
    size_t n = 0;

    pthread_mutex_lock(&w->mu);
    while (n < max && w->ndirty > 0) {
        uint32_t id = w->dirty[--w->ndirty];
        w->dirty_bit[id / 8] &= (uint8_t) ~(1u << (id % 8));
        out[n++] = id;
    }
    pthread_mutex_unlock(&w->mu);
    return n;
}

static int written(void *ctx, uint32_t entry, uint32_t gen)
{
    const kvr_ssdw_t *w = ctx;
    return w->wrote[entry] == gen + 1;
}

/* A block the pick found with a copy on disk already (promoted, or restored): not pinned,
 * remembered so that the next rounds pass it over without a lookup. */
static int found_on_disk(void *ctx, uint32_t entry, uint32_t gen)
{
    kvr_ssdw_t *w = ctx;
    w->wrote[entry] = gen + 1;
    w->now.already_on_disk++;
    return 1;
}

typedef struct commit_s {
    kvr_ssdw_t *w;
    kvr_ssdt_blk_t b;
    kvr_ssdp_loc_t loc;
} commit_t;

/* Record writes in flight at most, in bytes (fio's queue of 32 writes of 2 MiB); one write
 * of a larger block goes alone. */
#define WRITE_BYTES_MAX (64ull << 20)

enum { PICK_SETTLED = 0,
       PICK_FLIGHT = 1,
       PICK_OK = 2,
       PICK_BAD = 3,
       PICK_RETRY = 4 }; /* written after a failed write of its page: written again, still pinned */

/* Passes over a round's picks: the first, and those that retry picks given up with a failed
 * write of their page. Each pass settles for good at least the pick whose write failed, so a
 * round of n picks ends within n passes; the bound is a guard. */
#define ROUND_PASSES (KVR_SSDP_WRITES_MAX + 1)

static int do_index(void *ctx)
{
    commit_t *c = ctx;
    return kvr_ssdt_index(&c->w->tier, &c->b, &c->loc);
}

/* Pick i's write completed (ok or not, or one before it in its page failed): its copy is
 * indexed, or it is released. */
static void settle(kvr_ssdw_t *w, unsigned i)
{
    commit_t *c = &w->pc[i];
    kvr_demote_t *d = &w->picks[i];
    int wrote_ok = w->ps[i] == PICK_OK, ok = wrote_ok && c->loc.version != w->cut_version, rc;

    w->ps[i] = PICK_SETTLED;
    kvr_ssdp_settle(&w->tier.p, i, &c->loc, ok);
    if (!ok) {
        if (!wrote_ok) {
            /* the block stays in RAM only: not tried again (a failing device would make every
             * retry seal another page), and the writer backs off (run) */
            w->cut_version = c->loc.version;
            w->wrote[d->ref.entry] = d->ref.gen + 1;
            w->now.write_errors++;
            w->failed = 1;
        } else if (w->pass + 1 < ROUND_PASSES) { /* written after a failed one of its page */
            w->ps[i] = PICK_RETRY;
            w->retries++;
            return;
        }
        kvr_store_demote_release(&w->st, d);
        return;
    }
    rc = kvr_store_demote_commit(&w->st, d, do_index, c);
    if (rc == KVR_OK)
        w->wrote[d->ref.entry] = d->ref.gen + 1;
    else {
        kvr_ssdt_unwrite(&w->tier, &c->loc);
        w->now.stale += rc == KVR_ENOTFOUND;
    }
}

/* Settles the picks from head on as far as their writes have completed. */
static void settle_ready(kvr_ssdw_t *w)
{
    while (w->head < w->next && w->ps[w->head] != PICK_FLIGHT) {
        if (w->ps[w->head] == PICK_OK || w->ps[w->head] == PICK_BAD)
            settle(w, w->head);
        w->head++;
    }
}

/* Takes one completed write (waits for it when wait), then settles what it lets. 0: none. */
static int take(kvr_ssdw_t *w, int wait)
{
    unsigned slot;
    int ok;

    if (kvr_ssdp_next(&w->tier.p, wait, &slot, &ok) != 1)
        return 0;
    if (slot < w->next && w->ps[slot] == PICK_FLIGHT)
        w->ps[slot] = ok ? PICK_OK : PICK_BAD;
    settle_ready(w);
    return 1;
}

/* Waits until no write is in flight and every pick reserved is settled. */
static void drain(kvr_ssdw_t *w)
{
    settle_ready(w);
    while (w->head < w->next)
        if (!take(w, 1)) {
            kvr_error("ssd: the writer's ring failed with writes in flight");
            break;
        }
}

/* Pick i (a pinned block): its write reserved and submitted, or the pick released. */
static void write_pick(kvr_ssdw_t *w, unsigned i)
{
    kvr_demote_t *d = &w->picks[i];
    size_t n = kvr_store_ref_chain_iov(&w->st, &d->ref, w->iov, w->iov_max);
    commit_t *c = &w->pc[i];
    kvr_pool_info_t pi;
    uint64_t span, q;
    int rc;

    w->ps[i] = PICK_SETTLED;
    w->next = i; /* the waits below settle the picks before this one; it joins once reserved */
    if (n == 0 || kvr_store_pool_info(&w->st, d->pool, &pi) != KVR_OK) {
        kvr_store_demote_release(&w->st, d);
        return;
    }
    *c = (commit_t){.w = w};
    c->b = (kvr_ssdt_blk_t){.ns = d->ns, .pool = d->pool, .seed = kvr_store_ns_seed(&w->st, d->ns), .key = w->iov[0].iov_base, .key_len = d->key_len, .length = d->ref.length, .canon = d->ref.canon, .ns_name = pi.ns_name, .model = pi.model};
    /* no disk copy: the pick looked under the store lock, and only this thread adds copies */
    if ((q = kvr_store_ssd_quota(&w->st, d->ns)) > 0 && d->ref.length > q) {
        w->wrote[d->ref.entry] = d->ref.gen + 1; /* larger than its namespace's ssd=: never */
        w->now.quota_rejects++;
        kvr_store_demote_release(&w->st, d);
        return;
    }
    if (kvr_ssdt_turn_due(&w->tier, &c->b)) { /* it opens a page: compaction's chance at it, empty */
        drain(w);
        if (w->tier.p.inflight == 0 && kvr_ssdt_turn(&w->tier) == KVR_ERR)
            w->failed = 1;
    }
    span = kvr_ssd_rec_span(d->key_len, d->ref.length);
    for (;;) {
        while (w->tier.p.inflight > 0 && w->tier.p.inflight_bytes + span > WRITE_BYTES_MAX && take(w, 1))
            ;
        if ((rc = kvr_ssdt_reserve(&w->tier, &c->b, w->iov, (int)n, &c->loc, i)) != KVR_AGAIN)
            break;
        drain(w); /* a seal is due: every write before this one settled first */
        if (w->tier.p.inflight > 0)
            break;
    }
    c->b.ns_name = c->b.model = NULL; /* pi's: the record has them */
    if (rc != KVR_OK) {
        /* not reserved (an error before the write, or a ring that failed): as a failed write */
        w->wrote[d->ref.entry] = d->ref.gen + 1;
        w->now.write_errors++;
        w->failed = 1;
        kvr_store_demote_release(&w->st, d);
        return;
    }
    w->ps[i] = PICK_FLIGHT;
    w->next = i + 1;
    while (take(w, 0)) /* settle what completed meanwhile, without waiting */
        ;
}

/* ssd= of every namespace (the supervisor's copy in the store, read without the lock). */
static void quotas(kvr_ssdw_t *w)
{
    for (uint16_t ns = 0; ns < KVR_NS_MAX; ns++) {
        uint64_t q = kvr_store_ssd_quota(&w->st, ns);
        if (q > 0 && kvr_dindex_ns_bytes(&w->st.dx, ns) > q)
            kvr_ssdt_quota(&w->tier, ns, q);
    }
}

/* A flush stalls the writes queued behind it (docs/ssd-tier.md, "Syncs"), so a sync starts
 * when a round had nothing to copy or reap (idle), at most every IDLE_SYNC_MS so that a
 * trickle of copies does not keep one always in flight, and in any round once sync_ms has
 * passed since the last one started, or since the first write that none covers. */
#define IDLE_SYNC_MS 250

static void sync_round(kvr_ssdw_t *w, int idle, uint64_t *last_sync)
{
    uint64_t now = kvr_clock_ms(), since = now - *last_sync, syncs = w->tier.p.st.syncs;

    if (w->tier.p.unsynced == 0 && !w->tier.p.sync_busy) {
        *last_sync = now; /* nothing waits for a sync: the interval counts from the next write */
        return;
    }
    if ((idle && since >= (IDLE_SYNC_MS < w->cfg.sync_ms ? IDLE_SYNC_MS : w->cfg.sync_ms)) || since >= w->cfg.sync_ms) {
        kvr_ssdp_sync(&w->tier.p); /* started on the writer's ring; finished by a later round */
        if (w->tier.p.st.syncs != syncs)
            *last_sync = now; /* one started (none does while one is in flight: tried again) */
    }
}

static void pause_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *run(void *arg)
{
    kvr_ssdw_t *w = arg;
    uint64_t last_sync;

    if (kvr_ssdt_open(&w->tier, w->cfg.path, w->cfg.size, w->cfg.page_size, &w->st.dx, resolve, w) != KVR_OK) {
        kvr_atomic_store_release(&w->state, -1);
        return NULL;
    }
    quotas(w);                               /* a quota lowered while the server was down: before the publisher learns the blocks */
    for (uint32_t i = 0; i < w->nslots; i++) /* the publisher learns every restored block */
        on_slot(w, i);
    wake(w);
    w->tier.on_slot = on_slot;
    w->tier.on_slot_ctx = w;
    kvr_atomic_store_release(&w->state, 1);
    last_sync = kvr_clock_ms();
    while (!kvr_atomic_load_acquire(&w->stop)) {
        int reaped = kvr_ssdt_reap(&w->tier, 256);
        if (kvr_ssdt_compact(&w->tier) == KVR_ERR) /* before the picks: nothing is in flight */
            w->failed = 1;
        unsigned n = kvr_store_demote_pick(&w->st, w->cfg.window, w->picks, w->cfg.batch, written, found_on_disk, w);
        for (w->pass = 0; w->pass < ROUND_PASSES && (w->pass == 0 || w->retries > 0); w->pass++) {
            w->head = w->next = 0;
            w->cut_version = 0;
            w->retries = 0;
            for (unsigned i = 0; i < n; i++)
                if (w->pass == 0 || w->ps[i] == PICK_RETRY)
                    write_pick(w, i);
            drain(w); /* a pass ends with nothing in flight: reaping appends tombstones */
        }
        quotas(w);
        sync_round(w, n == 0 && reaped <= 0, &last_sync);
        kvr_ssdp_reap(&w->tier.p, 0); /* sealed pages' headers, once their syncs are done */
        w->now.rounds++;
        w->now.picked += n;
        w->now.tier = w->tier.st;
        memcpy(w->now.write_hist, w->tier.p.st.write_hist, sizeof(w->now.write_hist));
        w->now.syncs = w->tier.p.st.syncs;
        pthread_mutex_lock(&w->mu);
        w->out = w->now;
        pthread_mutex_unlock(&w->mu);
        wake(w);
        if (w->failed) { /* a failing device: fewer pages sealed early, fewer lines logged */
            w->backoff_ms = w->backoff_ms == 0 ? 100 : (w->backoff_ms * 2 < 1000 ? w->backoff_ms * 2 : 1000);
            w->failed = 0;
            pause_ms(w->backoff_ms);
        } else if (n == 0 && reaped <= 0) {
            pause_ms(w->cfg.interval_ms);
        } else {
            w->backoff_ms = 0;
        }
    }
    kvr_ssdt_reap(&w->tier, UINT32_MAX); /* a clean stop writes down every delete */
    kvr_ssdt_close(&w->tier);
    return NULL;
}

static void free_all(kvr_ssdw_t *w)
{
    free(w->iov);
    free(w->wrote);
    free(w->picks);
    free(w->pc);
    free(w->ps);
    free(w->dirty);
    free(w->dirty_bit);
    free(w);
}

kvr_ssdw_t *kvr_ssdw_start(const kvr_ssdw_config_t *cfg, kvr_seg_t *seg)
{
    kvr_ssdw_t *w = calloc(1, sizeof(*w));

    if (w == NULL)
        return NULL;
    w->cfg = *cfg;
    w->seg = seg;
    if (w->cfg.batch == 0)
        w->cfg.batch = 16;
    if (w->cfg.batch > KVR_SSDP_WRITES_MAX)
        w->cfg.batch = KVR_SSDP_WRITES_MAX;
    if (kvr_store_open(&w->st, seg) != KVR_OK || w->st.dx.sh == NULL) {
        kvr_error("ssd: the segment has no disk index");
        free(w);
        return NULL;
    }
    kvr_tenants_view_init(&w->tv, seg);
    w->iov_max = kvr_store_block_max(&w->st) / seg->hdr->page_size + 2;
    w->iov = calloc(w->iov_max, sizeof(*w->iov));
    w->wrote = calloc(seg->hdr->max_blocks, sizeof(*w->wrote));
    w->picks = calloc(w->cfg.batch, sizeof(*w->picks));
    w->pc = calloc(w->cfg.batch, sizeof(*w->pc));
    w->ps = calloc(w->cfg.batch, sizeof(*w->ps));
    w->nslots = w->st.dx.nslots;
    w->dirty = calloc(w->nslots, sizeof(*w->dirty));
    w->dirty_bit = calloc(w->nslots / 8 + 1, 1);
    pthread_mutex_init(&w->mu, NULL);
    if (w->iov == NULL || w->wrote == NULL || w->picks == NULL || w->pc == NULL || w->ps == NULL || w->dirty == NULL || w->dirty_bit == NULL ||
        pthread_create(&w->th, NULL, run, w) != 0) {
        kvr_error("ssd: the disk writer cannot start");
        pthread_mutex_destroy(&w->mu);
        free_all(w);
        return NULL;
    }
    return w;
}

int kvr_ssdw_state(const kvr_ssdw_t *w)
{
    return kvr_atomic_load_acquire(&w->state);
}

void kvr_ssdw_stop(kvr_ssdw_t *w)
{
    kvr_atomic_store_release(&w->stop, 1);
    pthread_join(w->th, NULL);
    pthread_mutex_destroy(&w->mu);
    free_all(w);
}

void kvr_ssdw_stats(kvr_ssdw_t *w, kvr_ssdw_stats_t *out)
{
    pthread_mutex_lock(&w->mu);
    *out = w->out;
    pthread_mutex_unlock(&w->mu);
}
