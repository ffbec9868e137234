/*
 * store_evict.c — making room for a PUT: a namespace's quota first, then fair eviction across
 * namespaces when the arena or the index is full (docs/tenancy.md, "Quotas and fair
 * eviction"), and the quotas the supervisor hands the store.
 */
#include "core/store.h"

#include "core/store_int.h"

#include <string.h>

/* With the disk tier on, an evicted block the tier did not admit (never read) or that the disk
 * writer did not copy in time (docs/ssd-tier.md, "Demotion and admission") is counted. */
static void count_disk_loss(kvr_store_t *st, const kvr_entry_t *e)
{
    if (st->dx.sh == NULL)
        return;
    if (!(e->meta & KVR_ENT_READ))
        kvr_stat_add(st->my_stats, KVR_ST_DISK_ADMIT_REJECTS, 1);
    else if (!kvr_store_on_disk_locked(st, e))
        kvr_stat_add(st->my_stats, KVR_ST_DISK_DROPS, 1);
}

/* Evicts one unpinned LIVE block, counted against its namespace. Locked. */
static void evict_locked(kvr_store_t *st, uint32_t i)
{
    kvr_entry_t *e = &st->ix.ent[i];

    FAULT_POINT(KVR_FAULT_EVICTING);
    count_disk_loss(st, e);
    kvr_stat_add(st->my_stats, KVR_ST_EVICTIONS, 1);
    kvr_stat_add(st->my_stats, KVR_ST_EVICTED_BYTES, e->length);
    ns_stat_add(st, e->ns, KVR_NSST_EVICTIONS, 1);
    ns_stat_add(st, e->ns, KVR_NSST_EVICTED_BYTES, e->length);
    kvr_store_remove_block_locked(st, i);
}

/* The least recently used unpinned block of namespace ns, or KVR_NIL. Locked. */
static uint32_t lru_victim_locked(const kvr_store_t *st, uint16_t ns)
{
    uint32_t i = st->ix.lru[ns].tail;

    while (i != KVR_NIL && st->ix.ent[i].pins > 0)
        i = st->ix.ent[i].lru_prev;
    return i;
}

/*
 * A namespace's quota: a PUT of len bytes in ns first evicts ns's own least recently used
 * unpinned blocks until what ns holds and has reserved, plus len, fits its memory=; never
 * another namespace's. KVR_OK, or KVR_EQUOTA when even that cannot make it fit (nothing is
 * evicted then). Locked.
 */
static int quota_room_locked(kvr_store_t *st, uint16_t ns, uint64_t len)
{
    const kvr_ns_agg_t *g = &st->sh->ns_agg[ns];
    uint64_t quota = st->sh->ns_quota[ns], have = 0, need;
    uint32_t i;

    KVR_DASSERT(store_locked(st));
    if (quota == 0 || g->resident_bytes + g->reserved_bytes + len <= quota)
        return KVR_OK;
    if (st->sh->no_evict || len > quota || g->reserved_bytes + len > quota)
        return KVR_EQUOTA;
    need = g->resident_bytes + g->reserved_bytes + len - quota;
    for (i = st->ix.lru[ns].tail; i != KVR_NIL && have < need; i = st->ix.ent[i].lru_prev)
        if (st->ix.ent[i].pins == 0)
            have += st->ix.ent[i].length; /* dry run: enough of ns's own is unpinned? */
    if (have < need)
        return KVR_EQUOTA;
    while (g->resident_bytes + g->reserved_bytes + len > quota && (i = lru_victim_locked(st, ns)) != KVR_NIL)
        evict_locked(st, i);
    return KVR_OK;
}

/*
 * When the arena is full, the namespace furthest over its fair share gives up its least
 * recently used unpinned block (docs/tenancy.md, "Quotas and fair eviction"). A namespace's
 * share is its memory= if it has one; the namespaces without one, among those holding blocks
 * and the one putting, split equally what the quotas leave of the arena. The putter's block
 * counts as held: it is the one that would be over. Returns the victim entry, or KVR_NIL when
 * no namespace has an unpinned block. Locked.
 */
static uint32_t fair_victim_locked(const kvr_store_t *st, uint16_t putter, uint64_t len)
{
    const kvr_store_sh_t *sh = st->sh;
    uint64_t cap = sh->arena.npages << st->arena.page_shift, quotas = 0, shared = 0, held = 0, tried = 0, rest;

    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++) {
        held |= (uint64_t)(sh->ns_agg[ns].blocks > 0) << ns;
        quotas += sh->ns_quota[ns];
        shared += sh->ns_quota[ns] == 0 && (held >> ns & 1 || ns == putter);
    }
    /* One division per eviction, not one per namespace: under a steady PUT load this runs
     * for every new block, with the store lock held. */
    rest = (cap > quotas ? cap - quotas : 0) / (shared ? shared : 1);
    for (;;) { /* the most over share first; one without an unpinned block is passed over */
        int64_t best_over = INT64_MIN;
        int best = -1;
        uint32_t i;
        for (uint64_t m = held & ~tried; m != 0; m &= m - 1) { /* the namespaces holding blocks */
            unsigned ns = (unsigned)__builtin_ctzll(m);
            uint64_t share = sh->ns_quota[ns] ? sh->ns_quota[ns] : rest;
            int64_t over = (int64_t)(sh->ns_agg[ns].resident_bytes + (ns == putter ? len : 0)) - (int64_t)share;
            if (over <= best_over)
                continue;
            best_over = over;
            best = (int)ns;
        }
        if (best < 0)
            return KVR_NIL;
        i = lru_victim_locked(st, (uint16_t)best);
        if (i != KVR_NIL)
            return i;
        tried |= 1ull << best;
    }
}

/*
 * Makes room for a PUT of len bytes in ns (`pages` pages and one entry): ns's quota first,
 * then, when the arena or the index is full, fair eviction across namespaces. First checks
 * that enough can be freed, so a put that cannot fit evicts nothing. Returns KVR_OK,
 * KVR_EQUOTA or KVR_ENOSPACE. Locked.
 */
int kvr_store_make_room_locked(kvr_store_t *st, uint16_t ns, uint64_t len, uint64_t pages)
{
    kvr_store_sh_t *sh = st->sh;
    uint64_t have_pages = sh->arena.free_pages, have_entries = sh->index.nfree;
    uint32_t i;
    int rc;

    KVR_DASSERT(store_locked(st));
    static_assert(KVR_NS_MAX <= 64, "fair_victim_locked keeps one bit per namespace");
    if ((rc = quota_room_locked(st, ns, len)) != KVR_OK)
        return rc;
    if (sh->arena.free_pages >= pages && sh->index.nfree >= 1)
        return KVR_OK;
    if (sh->no_evict || pages > sh->arena.npages)
        return KVR_ENOSPACE;
    /* Dry run over every namespace's unpinned blocks, in any order: if all of them would do,
     * the fair order below gets there too. */
    for (unsigned n = 0; n < KVR_NS_MAX && (have_pages < pages || have_entries < 1); n++)
        for (i = sh->ns_lru[n].tail; i != KVR_NIL && (have_pages < pages || have_entries < 1);
             i = st->ix.ent[i].lru_prev) {
            const kvr_entry_t *e = &st->ix.ent[i];
            if (e->pins > 0)
                continue;
            have_pages += pages_for(st, e->key_len, e->length);
            have_entries++;
        }
    if (have_pages < pages || have_entries < 1)
        return KVR_ENOSPACE;
    while ((sh->arena.free_pages < pages || sh->index.nfree < 1) && (i = fair_victim_locked(st, ns, len)) != KVR_NIL)
        evict_locked(st, i);
    return KVR_OK;
}

void kvr_store_set_quotas(kvr_store_t *st, const uint64_t quota[KVR_NS_MAX], const uint64_t ssd[KVR_NS_MAX])
{
    if (store_lock(st) != KVR_OK)
        return;
    memcpy(st->sh->ns_quota, quota, sizeof(st->sh->ns_quota));
    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++) /* the disk writer reads them without the lock */
        kvr_atomic_store_relaxed(&st->sh->ns_ssd_quota[ns], ssd[ns]);
    store_unlock(st);
}

uint64_t kvr_store_ssd_quota(const kvr_store_t *st, uint16_t ns)
{
    return ns < KVR_NS_MAX ? kvr_atomic_load_relaxed(&st->sh->ns_ssd_quota[ns]) : 0;
}
