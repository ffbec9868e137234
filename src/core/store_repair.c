/*
 * store_repair.c — the store's crash repair and its debug check (store.h, "Crash recovery").
 *
 * A repair runs with the store lock held, in three cases: the lock's previous holder died
 * with it (store_lock in store_int.h), the supervisor reaps a dead child
 * (kvr_store_reap_slot), and a warm restart re-attaches a segment (kvr_store_attach). It
 * rebuilds every derived structure from the ground truth; the steps are listed above
 * kvr_store_repair_locked. The debug check (kvr_store_check) verifies the same invariants
 * without changing anything; tests run it after every crash they stage.
 */
#include "base/log.h"
#include "core/store_int.h"

#include <stdlib.h>

typedef struct {
    kvr_store_t *st;
} dup_ctx_t;

/* A second LIVE entry with an already-linked key (only after a torn relink): retire it. */
static void drop_duplicate(void *ctx, uint32_t i)
{
    kvr_store_t *st = ((dup_ctx_t *)ctx)->st;
    kvr_entry_t *e = &st->ix.ent[i];

    KVR_DASSERT(store_locked(st));
    if (e->meta & KVR_ENT_ANNOUNCED)
        chlog_event_locked(st, KVR_EV_REMOVE, i);
    e->meta = 0;
    e->state = KVR_ENT_FREE;
}

/* A process that is ACTIVE in the process table and is not the one that just died. seq_cst
 * as ever; it pairs with the supervisor's store of DEAD (kvr_store_reap_slot), made before it
 * takes the lock, and with a claim's CAS from FREE (segment.c). */
static int proc_alive(const kvr_store_t *st, int slot, int dead_slot)
{
    return slot != dead_slot && kvr_atomic_load_seq_cst(&st->seg->procs[slot].state) == KVR_PROC_ACTIVE;
}

/* A writer that died inside a seqlock section left it odd: close it. seq_cst as ever; what
 * matters is that the even value is stored before the chains are rebuilt, and the rebuild's
 * own seq_begin/seq_end (index.c) order it for the lock-free readers. */
static void close_seqlock_locked(kvr_store_t *st)
{
    uint64_t seq = kvr_atomic_load_seq_cst(&st->sh->index.seq);

    KVR_DASSERT(store_locked(st));
    if (seq & 1)
        kvr_atomic_store_seq_cst(&st->sh->index.seq, seq + 1);
}

/* The dead process's pins die with it; they are recounted from the live tables below. */
static void clear_dead_pins_locked(kvr_store_t *st, int dead_slot)
{
    kvr_pin_t *t;

    KVR_DASSERT(store_locked(st));
    if (dead_slot < 0 || dead_slot >= KVR_MAX_PROCS)
        return;
    t = pin_table(st, dead_slot);
    for (uint32_t k = 0; k < st->pin_slots; k++) {
        t[k].entry = KVR_NIL;
        t[k].count = 0;
    }
}

/* Step 1: pins zeroed, unknown states and dead reservations freed, DYING rolled forward. */
static void settle_entries_locked(kvr_store_t *st, int dead_slot)
{
    kvr_entry_t *ent = st->ix.ent;
    uint32_t npools = kvr_atomic_load_relaxed(&st->sh->npools); /* stored under the lock we hold */

    KVR_DASSERT(store_locked(st));
    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++) {
        kvr_entry_t *e = &ent[i];
        e->pins = 0;
        if (e->state > KVR_ENT_DYING || (e->state != KVR_ENT_FREE && (e->ns >= KVR_NS_MAX || e->pool >= npools))) {
            e->state = KVR_ENT_FREE; /* not a state, a namespace or a pool: nothing to keep */
        } else if (e->state == KVR_ENT_RESERVED && !proc_alive(st, KVR_ENT_OWNER(e), dead_slot)) {
            e->state = KVR_ENT_FREE;
        } else if (e->state == KVR_ENT_DYING) {
            if (e->meta & KVR_ENT_ANNOUNCED)
                chlog_event_locked(st, KVR_EV_REMOVE, (uint32_t)i);
            e->meta &= (uint8_t)~KVR_ENT_ANNOUNCED;
            e->state = KVR_ENT_ZOMBIE;
        }
    }
}

/* Step 2: each LIVE or ZOMBIE entry's pins are the sum over the live processes' tables. */
static void recount_pins_locked(kvr_store_t *st, int dead_slot)
{
    kvr_seg_hdr_t *h = st->seg->hdr;
    kvr_entry_t *ent = st->ix.ent;

    KVR_DASSERT(store_locked(st));
    for (int s = 0; s < KVR_MAX_PROCS; s++) {
        kvr_pin_t *t = pin_table(st, s);
        if (!proc_alive(st, s, dead_slot))
            continue;
        for (uint32_t k = 0; k < st->pin_slots; k++) {
            uint32_t i = t[k].entry;
            if (i == KVR_NIL)
                continue;
            if (i < h->max_blocks && (ent[i].state == KVR_ENT_LIVE || ent[i].state == KVR_ENT_ZOMBIE))
                ent[i].pins += t[k].count;
        }
    }
}

/* Step 3: zombies nobody pins are freed; LIVE entries not yet announced are announced. */
static void free_zombies_announce_live_locked(kvr_store_t *st)
{
    kvr_entry_t *ent = st->ix.ent;

    KVR_DASSERT(store_locked(st));
    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++) {
        kvr_entry_t *e = &ent[i];
        if (e->state == KVR_ENT_ZOMBIE && e->pins == 0)
            e->state = KVR_ENT_FREE;
        else if (e->state == KVR_ENT_LIVE && !(e->meta & KVR_ENT_ANNOUNCED)) {
            chlog_event_locked(st, KVR_EV_INSERT, (uint32_t)i);
            e->meta |= KVR_ENT_ANNOUNCED;
        }
    }
}

/* Step 4, first half: validate chains into the used-page bitmap bm (cleared by the caller);
 * an entry with a broken chain is dropped. */
static void drop_broken_chains_locked(kvr_store_t *st, uint8_t *bm)
{
    kvr_entry_t *ent = st->ix.ent;

    KVR_DASSERT(store_locked(st));
    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++) {
        kvr_entry_t *e = &ent[i];
        if (e->state == KVR_ENT_FREE)
            continue;
        if (e->first_page == KVR_NIL ||
            !kvr_arena_claim_chain(&st->arena, e->first_page, pages_for(st, e->key_len, e->length), bm)) {
            kvr_warn("store repair: entry %llu has a broken chain; dropped", (unsigned long long)i);
            if (e->state == KVR_ENT_LIVE && (e->meta & KVR_ENT_ANNOUNCED))
                chlog_event_locked(st, KVR_EV_REMOVE, (uint32_t)i);
            e->meta = 0;
            e->state = KVR_ENT_FREE;
        }
    }
}

/* Step 5, first half: claims the surviving chains into bm (cleared by the caller) and
 * recomputes the aggregates from the entries. */
static void reclaim_and_count_locked(kvr_store_t *st, uint8_t *bm)
{
    kvr_store_sh_t *sh = st->sh;
    kvr_entry_t *ent = st->ix.ent;

    KVR_DASSERT(store_locked(st));
    sh->unique_blocks = sh->total_refs = sh->resident_bytes = sh->logical_bytes = 0;
    sh->pinned_entries = sh->zombies = 0;
    memset(sh->ns_agg, 0, sizeof(sh->ns_agg));
    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++) {
        kvr_entry_t *e = &ent[i];
        if (e->state == KVR_ENT_FREE)
            continue;
        kvr_arena_claim_chain(&st->arena, e->first_page, pages_for(st, e->key_len, e->length), bm);
        if (e->pins > 0)
            sh->pinned_entries++;
        if (e->state == KVR_ENT_ZOMBIE)
            sh->zombies++;
        if (e->state == KVR_ENT_RESERVED)
            sh->ns_agg[e->ns].reserved_bytes += e->length;
        if (e->state == KVR_ENT_LIVE) {
            sh->unique_blocks++;
            sh->total_refs += e->refs;
            sh->resident_bytes += e->length;
            sh->logical_bytes += e->length * e->refs;
            sh->ns_agg[e->ns].blocks++;
            sh->ns_agg[e->ns].refs += e->refs;
            sh->ns_agg[e->ns].resident_bytes += e->length;
            sh->ns_agg[e->ns].logical_bytes += e->length * e->refs;
        }
    }
}

/*
 * Full repair, lock held. Ground truth: each entry's state/fields, each chain in the page
 * map, and the pin tables of live processes. Everything else is rebuilt:
 *  1. reservations of dead processes are dropped; interrupted removals (DYING) roll forward;
 *  2. pins are recounted from live processes' pin tables (the dead one's is cleared);
 *  3. zombies nobody pins are freed; LIVE blocks whose insert event may be missing are
 *     announced again (the consumer de-duplicates by entry and generation);
 *  4. chains, LRU and the free list are rebuilt; chains are validated, invalid ones dropped;
 *  5. the arena's free lists are rebuilt from the used-page bitmap; aggregates recomputed.
 * The steps run in this order, each over the result of the one before.
 */
void kvr_store_repair_locked(kvr_store_t *st, int dead_slot)
{
    kvr_store_sh_t *sh = st->sh;
    kvr_seg_hdr_t *h = st->seg->hdr;
    uint8_t *bm = st->scratch;
    dup_ctx_t dctx = {st};

    KVR_DASSERT(store_locked(st));
    close_seqlock_locked(st);
    clear_dead_pins_locked(st, dead_slot);
    settle_entries_locked(st, dead_slot);
    recount_pins_locked(st, dead_slot);
    free_zombies_announce_live_locked(st);

    memset(bm, 0, (h->npages + 7) / 8);
    drop_broken_chains_locked(st, bm);
    kvr_index_rebuild_locked(&st->ix, drop_duplicate, &dctx);
    /* Duplicates were freed after their chains were claimed: claim again from scratch. */
    memset(bm, 0, (h->npages + 7) / 8);
    reclaim_and_count_locked(st, bm);
    kvr_arena_rebuild_locked(&st->arena, bm);

    sh->repairs++;
    kvr_stat_add(st->my_stats, KVR_ST_REPAIRS, 1);
    kvr_info("store repair done (dead slot %d): %llu blocks resident, %llu pages free", dead_slot,
             (unsigned long long)sh->unique_blocks, (unsigned long long)sh->arena.free_pages);
}

void kvr_store_retire_stats(kvr_store_t *st, int slot)
{
    kvr_ns_stats_t *from = st->sh->ns_stats[slot], *into = st->sh->ns_stats[KVR_STATS_RETIRED];

    kvr_stats_retire(&st->sh->stats[KVR_STATS_RETIRED], &st->sh->stats[slot]);
    /* as kvr_stats_retire: relaxed, readers may see a sum one counter late */
    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++)
        for (unsigned i = 0; i < KVR_NSST_N; i++) {
            uint64_t *c = &into[ns].c[i];
            kvr_atomic_store_relaxed(c, kvr_atomic_load_relaxed(c) + kvr_atomic_load_relaxed(&from[ns].c[i]));
            kvr_atomic_store_relaxed(&from[ns].c[i], 0);
        }
}

int kvr_store_reap_slot(kvr_store_t *st, int slot)
{
    kvr_proc_sh_t *p;

    /* The supervisor's own handle: it alone reaps (the process table names its role). */
    KVR_DASSERT(store_mine(st) && st->seg->procs[st->slot].role == KVR_ROLE_SUPERVISOR);
    if (slot < 0 || slot >= KVR_MAX_PROCS || slot == st->slot)
        return KVR_ENOTFOUND;
    p = &st->seg->procs[slot];
    /* seq_cst, before the lock: the repair's proc_alive loads see the slot dead. */
    kvr_atomic_store_seq_cst(&p->state, KVR_PROC_DEAD);
    if (store_lock(st) != KVR_OK)
        return KVR_ERR;
    kvr_store_repair_locked(st, slot);
    store_unlock(st);
    kvr_store_retire_stats(st, slot);
    /* pid before state: a claim's CAS of state from FREE (segment.c) then stores its own pid,
     * and a reader that sees FREE never takes the stale pid for a live one (seq_cst both). */
    kvr_atomic_store_seq_cst(&p->pid, 0);
    kvr_atomic_store_seq_cst(&p->state, KVR_PROC_FREE);
    return KVR_OK;
}

int kvr_store_reap(kvr_store_t *st, pid_t pid)
{
    int slot = kvr_seg_proc_find(st->seg, pid);
    return slot < 0 ? KVR_ENOTFOUND : kvr_store_reap_slot(st, slot);
}

/* ------------------------------------------------------------------ the debug check */

#define CHECK(cond, ...) \
    do { \
        if (!(cond)) { \
            kvr_error("store check: " __VA_ARGS__); \
            rc = KVR_ERR; \
            goto done; \
        } \
    } while (0)

/* Sums the pin tables into pins[] (one count per entry); only active slots may hold pins. */
static int check_pin_tables_locked(kvr_store_t *st, uint32_t *pins)
{
    kvr_seg_hdr_t *h = st->seg->hdr;
    int rc = KVR_OK;

    KVR_DASSERT(store_locked(st));
    for (int s = 0; s < KVR_MAX_PROCS; s++) {
        kvr_pin_t *t = pin_table(st, s);
        /* seq_cst as ever; a status check under the lock: no reap runs meanwhile */
        int alive = kvr_atomic_load_seq_cst(&st->seg->procs[s].state) == KVR_PROC_ACTIVE;
        for (uint32_t k = 0; k < st->pin_slots; k++) {
            if (t[k].entry == KVR_NIL)
                continue;
            CHECK(alive, "slot %d is not active but holds pins", s);
            CHECK(t[k].entry < h->max_blocks && t[k].count > 0, "bad pin record in slot %d", s);
            pins[t[k].entry] += t[k].count;
        }
    }
done:
    return rc;
}

/* One entry against the pin tables' count for it, its chain (claimed into bm, so overlaps
 * show) and its state's invariants; counted into c as far as it got. */
static int check_entry_locked(kvr_store_t *st, uint64_t i, uint32_t pins, uint8_t *bm, kvr_store_stats_t *c)
{
    kvr_entry_t *e = &st->ix.ent[i];
    int rc = KVR_OK;

    KVR_DASSERT(store_locked(st));
    CHECK(e->pins == pins, "entry %llu pins %u, pin tables say %u", (unsigned long long)i, e->pins, pins);
    if (e->state == KVR_ENT_FREE) {
        CHECK(e->pins == 0, "free entry %llu pinned", (unsigned long long)i);
        return KVR_OK;
    }
    CHECK(e->state != KVR_ENT_DYING, "entry %llu left DYING", (unsigned long long)i);
    CHECK(kvr_arena_claim_chain(&st->arena, e->first_page, pages_for(st, e->key_len, e->length), bm),
          "entry %llu chain invalid or overlapping", (unsigned long long)i);
    if (e->pins)
        c->pinned_blocks++;
    if (e->state == KVR_ENT_ZOMBIE) {
        CHECK(e->pins > 0, "unpinned zombie %llu", (unsigned long long)i);
        c->zombie_blocks++;
    }
    if (e->state == KVR_ENT_LIVE) {
        CHECK(e->refs > 0, "live entry %llu with zero refs", (unsigned long long)i);
        CHECK(e->meta & KVR_ENT_ANNOUNCED, "live entry %llu not announced", (unsigned long long)i);
        c->unique_blocks++;
        c->total_refs += e->refs;
        c->resident_bytes += e->length;
        c->logical_bytes += e->length * e->refs;
    }
    c->reserved_blocks += e->state == KVR_ENT_RESERVED;
    if (e->state == KVR_ENT_RESERVED) /* seq_cst: against the reaper's seq_cst stores of state */
        CHECK(kvr_atomic_load_seq_cst(&st->seg->procs[KVR_ENT_OWNER(e)].state) == KVR_PROC_ACTIVE,
              "reservation %llu owned by a dead slot", (unsigned long long)i);
done:
    return rc;
}

/* The per-namespace aggregates against a scan of the LIVE entries. */
static int check_ns_locked(kvr_store_t *st)
{
    kvr_ns_agg_t scan[KVR_NS_MAX];
    int rc = KVR_OK;

    memset(scan, 0, sizeof(scan));

    KVR_DASSERT(store_locked(st));
    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++) {
        const kvr_entry_t *e = &st->ix.ent[i];
        if (e->state != KVR_ENT_LIVE && e->state != KVR_ENT_RESERVED)
            continue;
        CHECK(e->ns < KVR_NS_MAX, "entry %llu in namespace %u", (unsigned long long)i, e->ns);
        CHECK(e->pool < kvr_atomic_load_relaxed(&st->sh->npools), "entry %llu in pool %u", (unsigned long long)i,
              e->pool);
        if (e->state == KVR_ENT_RESERVED) {
            scan[e->ns].reserved_bytes += e->length;
            continue;
        }
        scan[e->ns].blocks++;
        scan[e->ns].refs += e->refs;
        scan[e->ns].resident_bytes += e->length;
        scan[e->ns].logical_bytes += e->length * e->refs;
    }
    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++)
        CHECK(memcmp(&scan[ns], &st->sh->ns_agg[ns], sizeof(scan[ns])) == 0,
              "namespace %u: %llu blocks %llu refs %llu bytes, the scan says %llu, %llu and %llu", ns,
              (unsigned long long)st->sh->ns_agg[ns].blocks, (unsigned long long)st->sh->ns_agg[ns].refs,
              (unsigned long long)st->sh->ns_agg[ns].resident_bytes, (unsigned long long)scan[ns].blocks,
              (unsigned long long)scan[ns].refs, (unsigned long long)scan[ns].resident_bytes);
done:
    return rc;
}

/* The whole scan, lock held: index, pin tables, every entry, the arena, then the
 * aggregates against what the scan counted into c. */
static int check_locked(kvr_store_t *st, uint32_t *pins, uint8_t *bm, kvr_store_stats_t *c)
{
    kvr_store_sh_t *sh = st->sh;
    int rc = KVR_OK;

    KVR_DASSERT(store_locked(st));
    CHECK(kvr_index_check_locked(&st->ix) == KVR_OK, "index chains/LRU/free list inconsistent");
    if (check_pin_tables_locked(st, pins) != KVR_OK)
        return KVR_ERR;
    for (uint64_t i = 0; i < st->seg->hdr->max_blocks; i++)
        if (check_entry_locked(st, i, pins[i], bm, c) != KVR_OK)
            return KVR_ERR;
    CHECK(kvr_arena_check_locked(&st->arena, bm) == KVR_OK, "arena free lists inconsistent");
    CHECK(c->unique_blocks == sh->unique_blocks && c->total_refs == sh->total_refs &&
              c->resident_bytes == sh->resident_bytes && c->logical_bytes == sh->logical_bytes,
          "aggregates differ from the scan (blocks %llu/%llu refs %llu/%llu bytes %llu/%llu)",
          (unsigned long long)c->unique_blocks, (unsigned long long)sh->unique_blocks,
          (unsigned long long)c->total_refs, (unsigned long long)sh->total_refs,
          (unsigned long long)c->resident_bytes, (unsigned long long)sh->resident_bytes);
    CHECK(c->pinned_blocks == sh->pinned_entries && c->zombie_blocks == sh->zombies, "pinned/zombie counts differ");
    rc = check_ns_locked(st);
done:
    return rc;
}

int kvr_store_check(kvr_store_t *st, kvr_store_stats_t *out)
{
    kvr_seg_hdr_t *h = st->seg->hdr;
    uint32_t *pins = calloc(h->max_blocks, sizeof(uint32_t));
    uint8_t *bm = calloc((h->npages + 7) / 8 + 1, 1);
    kvr_store_stats_t c;
    int rc;

    /* Only the scan's own counts are filled in; every other field of out stays zero. */
    memset(&c, 0, sizeof(c));
    if (pins == NULL || bm == NULL) {
        free(pins);
        free(bm);
        return KVR_ERR;
    }
    if (store_lock(st) != KVR_OK) {
        free(pins);
        free(bm);
        return KVR_ERR;
    }
    rc = check_locked(st, pins, bm, &c);
    store_unlock(st);
    if (out != NULL)
        *out = c;
    free(pins);
    free(bm);
    return rc;
}
