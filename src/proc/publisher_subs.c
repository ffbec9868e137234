/*
 * publisher_subs.c — the publisher's side of the subscriber slots (shm/relay_sh.h): admitting
 * is in publisher.c (it needs a publication); here are the CASes, the snapshot references,
 * reclaiming slots of dead workers, cutting laggards and waking the workers that stream.
 */
#include "proc/publisher_int.h"

#include "base/clock.h"
#include "base/dassert.h"
#include "base/log.h"
#include "wire/relay_validate.h"

#include <string.h>

/*
 * The publisher's side of the slot protocol (shm/relay_sh.h): REQUESTED -> LIVE,
 * REQUESTED|LIVE -> CLOSED, RELEASING -> FREE, and dead owners' slots -> RELEASING. Each
 * is a CAS from the state we saw; losing one means the worker moved first (always to
 * RELEASING), which the next scan handles.
 */
int pub_sub_cas(kvr_relay_sub_t *s, uint32_t from, uint32_t to)
{
    /* seq_cst CAS: pairs with the workers' CASes and loads of state (core/relay.c). Our
     * stores of a slot's fields before it (snap_*, cursor, close_reason) are visible to a
     * worker that sees the new state. */
    return kvr_atomic_cas_seq_cst(&s->state, &from, to);
}

void pub_wake_owner(pub_t *p, uint64_t owner)
{
    int slot = KVR_SUB_OWNER_SLOT(owner);
    if (slot >= 0 && slot < KVR_MAX_PROCS)
        kvr_relay_wake(p->relay.fds->worker[slot]);
}

void pub_take_ref(pub_t *p, int i, int k)
{
    p->held[i] = (int8_t)k;
    p->refs[k]++;
    p->relay.sh->snap[k].refs = p->refs[k];
}

static void drop_ref(pub_t *p, int i)
{
    int k = p->held[i];
    if (k < 0)
        return;
    p->held[i] = -1;
    p->refs[k]--;
    p->relay.sh->snap[k].refs = p->refs[k];
}

void pub_close_sub(pub_t *p, int i, int reason)
{
    kvr_relay_sub_t *s = &p->relay.sh->sub[i];
    /* seq_cst loads of state: pair with the workers' state CASes (core/relay.c). */
    uint32_t st = kvr_atomic_load_seq_cst(&s->state);

    KVR_DASSERT(pub_is_me(p));
    /* The reference stays held until the worker releases the slot: it may be reading the
     * copy right now. */
    while (st == KVR_SUB_LIVE || st == KVR_SUB_REQUESTED) {
        /* Before the CAS to CLOSED, which publishes it: the worker reads it after it sees
         * CLOSED (core/relay.c). */
        kvr_atomic_store_seq_cst(&s->close_reason, (uint32_t)reason);
        if (pub_sub_cas(s, st, KVR_SUB_CLOSED)) {
            /* owner: pairs with the worker's claim CAS of it, made before its state CAS */
            pub_wake_owner(p, kvr_atomic_load_seq_cst(&s->owner));
            return;
        }
        st = kvr_atomic_load_seq_cst(&s->state);
    }
}

static int owner_alive(pub_t *p, uint64_t owner)
{
    const kvr_proc_sh_t *pr;
    int slot = KVR_SUB_OWNER_SLOT(owner);
    if (slot < 0 || slot >= KVR_MAX_PROCS)
        return 0;
    pr = &p->seg->procs[slot];
    /* seq_cst: state pairs with a claim's CAS and the reap's seq_cst stores (pid cleared
     * before FREE, kvr_store_reap_slot); pid with the claim's release store of it. */
    return kvr_atomic_load_seq_cst(&pr->state) == KVR_PROC_ACTIVE &&
           kvr_atomic_load_seq_cst(&pr->pid) == KVR_SUB_OWNER_PID(owner);
}

/* RELEASING -> FREE: nobody reads the slot's copy any more. `owner` is cleared last, so
 * a worker's claim (a CAS on owner) always finds the slot FREE. */
static void free_sub(pub_t *p, int i)
{
    kvr_relay_sub_t *s = &p->relay.sh->sub[i];

    KVR_DASSERT(pub_is_me(p));
    drop_ref(p, i);
    /* owner cleared after the state CAS: pairs with the worker's claim, a CAS of owner from
     * 0, which then finds the slot FREE. */
    if (pub_sub_cas(s, KVR_SUB_RELEASING, KVR_SUB_FREE))
        kvr_atomic_store_seq_cst(&s->owner, 0);
}

/* Frees released slots, takes back the slots of dead workers, and drops the reference of
 * a subscriber that has sent its whole snapshot. */
void pub_reclaim_subscribers(pub_t *p)
{
    KVR_DASSERT(pub_is_me(p));
    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++) {
        kvr_relay_sub_t *s = &p->relay.sh->sub[i];
        /* seq_cst, as every slot access: pair with the workers' CASes of state and owner */
        uint32_t st = kvr_atomic_load_seq_cst(&s->state);
        uint64_t owner = kvr_atomic_load_seq_cst(&s->owner);

        if (st == KVR_SUB_RELEASING) {
            free_sub(p, i);
        } else if (st != KVR_SUB_FREE && !owner_alive(p, owner)) {
            if (pub_sub_cas(s, st, KVR_SUB_RELEASING)) /* its worker died: the slot is ours */
                free_sub(p, i);
        } else if (st == KVR_SUB_FREE && owner != 0 && !owner_alive(p, owner)) {
            kvr_atomic_cas_seq_cst(&s->owner, &owner, 0); /* died between its two CASes */
        } else if (st == KVR_SUB_LIVE && p->held[i] >= 0 && kvr_atomic_load_seq_cst(&s->snap_done)) {
            /* snap_done pairs with the worker's store of it once its snapshot is sent */
            drop_ref(p, i);
        }
    }
}

/* A new publisher process inherits the slots of the one before: a subscriber that is still
 * streaming its snapshot holds that copy. */
void pub_rebuild_refs(pub_t *p)
{
    memset(p->held, -1, sizeof(p->held));
    memset(p->refs, 0, sizeof(p->refs));
    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++) {
        kvr_relay_sub_t *s = &p->relay.sh->sub[i];
        /* seq_cst: state pairs with the workers' CASes; snap_index was stored by our
         * predecessor before its CAS to LIVE; snap_done pairs with the worker's store */
        uint32_t st = kvr_atomic_load_seq_cst(&s->state);
        int k = kvr_atomic_load_seq_cst(&s->snap_index);
        if ((st == KVR_SUB_LIVE || st == KVR_SUB_CLOSED) && k >= 0 && k < KVR_RELAY_SNAPSHOTS &&
            !kvr_atomic_load_seq_cst(&s->snap_done))
            pub_take_ref(p, i, k);
    }
}

/* Sum of (payload + 256) of pool's frames [cursor, seq]: what a subscriber has queued
 * (docs/relay-contract.md, "A pool stream", step 5), or
 * UINT64_MAX when the frame before its cursor is no longer indexed (far behind). */
static uint64_t queued_bytes(pub_t *p, uint32_t pool, uint64_t cursor)
{
    const kvr_relay_pool_t *rp = &p->relay.sh->pool[pool];
    uint64_t top, seq = p->pool[pool].seq;
    const kvr_relay_frame_t *b;

    if (cursor > seq)
        return 0;
    top = rp->frame[seq % KVR_RELAY_FRAMES].queue_cum;
    if (cursor <= 1)
        return top;
    b = &rp->frame[(cursor - 1) % KVR_RELAY_FRAMES];
    if (kvr_atomic_load_seq_cst(&b->seq) != cursor - 1) /* our own store (the only writer) */
        return UINT64_MAX;
    return top - b->queue_cum;
}

/*
 * Coalescing (docs/relay-contract.md §5.3). A frame costs every subscriber about the same to
 * read whatever it carries, so when the slowest one falls behind, fewer frames carrying more
 * changes each are what lets it catch up: a publication that finds it more than
 * COALESCE_UP_FRAMES behind stretches the boundary to its cap (--publication-coalesce-max) at
 * once. Doubling step by step spent the 16-frame bound at the fast cadence: a reader that
 * paused from a caught-up state was cut after some 0.6 s instead of 1 s. A publication or scan
 * that finds every subscriber at most one frame behind halves it again, at most once per
 * boundary in force (so that it does not halve on the first frame read). With no live
 * subscriber there is nobody to coalesce for.
 *
 * A subscriber that stopped reading keeps the stretch at its cap until its 16 frames are
 * queued and it is cut: publication waits at most cap x --publication-delay, so the others
 * see at most that latency for at most 17 publications.
 */
#define COALESCE_UP_FRAMES (KVR_RELAY_QUEUE_FRAMES / 4)

static void coalesce(pub_t *p, uint64_t worst, int live, int published)
{
    uint64_t now = kvr_clock_ns();
    uint32_t m = p->coalesce, max = (uint32_t)p->cfg->publication_coalesce_max;

    if (!live)
        m = 1;
    else if (published && worst > COALESCE_UP_FRAMES)
        m = max;
    else if (worst <= 1 && m > 1 && now >= p->coalesce_ns + pub_delay(p))
        m /= 2;
    if (m == p->coalesce)
        return;
    p->coalesce = m;
    p->coalesce_ns = now;
    kvr_stat_set(p->store.my_stats, KVR_ST_RELAY_COALESCE, m);
}

/* Measures every live subscriber's lag; with `cut` (after a publication), closes those past
 * the queue limits. The largest lag left is a level in our stats block
 * (kvrelay_relay_subscriber_lag_frames), and moves the coalescing. */
static void lag_pass(pub_t *p, int cut)
{
    kvr_relay_sh_t *sh = p->relay.sh;
    uint64_t worst = 0;
    int live = 0;

    KVR_DASSERT(pub_owns_relay(p));
    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++) {
        kvr_relay_sub_t *s = &sh->sub[i];
        uint64_t cursor, frames, seq;
        uint32_t pool;
        /* acquire: LIVE is our own CAS, or a worker's later one (a slot seen LIVE is ours to
         * judge); its pool was written before the worker's CAS to REQUESTED, which our
         * admission saw */
        if (kvr_atomic_load_acquire(&s->state) != KVR_SUB_LIVE || (pool = s->pool) >= p->npools)
            continue;
        seq = p->pool[pool].seq;
        /* acquire: pairs with the worker's release store of cursor after it sent a frame */
        cursor = kvr_atomic_load_acquire(&s->cursor);
        frames = seq + 1 > cursor ? seq + 1 - cursor : 0;
        if (cut && (frames > KVR_RELAY_QUEUE_FRAMES || queued_bytes(p, pool, cursor) > KVR_RELAY_QUEUE_BYTES)) {
            kvr_info("publisher: subscriber %d lagged (%llu frames behind)", i, (unsigned long long)frames);
            pub_close_sub(p, i, KVR_RELAY_REASON_SUBSCRIBER_LAGGED);
            continue;
        }
        live = 1;
        if (frames > worst)
            worst = frames;
    }
    /* Only we write our block; /metrics' relaxed loads may see it one pass late. */
    kvr_stat_set(p->store.my_stats, KVR_ST_RELAY_SUB_LAG, worst);
    coalesce(p, worst, live, cut);
}

void pub_check_lag(pub_t *p)
{
    lag_pass(p, 1);
}

void pub_sample_lag(pub_t *p)
{
    lag_pass(p, 0);
}

void pub_wake_live_workers(pub_t *p)
{
    uint64_t mask = 0;
    kvr_relay_sh_t *sh = p->relay.sh;

    static_assert(KVR_MAX_PROCS <= 64, "one mask bit per process slot");
    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++) {
        kvr_relay_sub_t *s = &sh->sub[i];
        /* seq_cst as every slot access; a wake-up sent to a worker that just left is harmless */
        int w = KVR_SUB_OWNER_SLOT(kvr_atomic_load_seq_cst(&s->owner));
        if (kvr_atomic_load_seq_cst(&s->state) == KVR_SUB_LIVE && w >= 0 && w < KVR_MAX_PROCS)
            mask |= 1ull << w;
    }
    for (int w = 0; w < KVR_MAX_PROCS; w++)
        if (mask & (1ull << w))
            kvr_relay_wake(p->relay.fds->worker[w]);
}
