/*
 * store_lookup.c — the exact lookup by canonical hash (docs/kv-lookup.md): does a pool hold a
 * resident block whose canonical hash is h? Answered from the index's canon chains
 * (shm/index.h), never from the relay filter, so there are no false positives.
 *
 * No lock on the common path: each hash is walked under the index's seqlock
 * (kvr_index_canon_lockfree). A hash whose walk kept meeting writers is left for a second pass
 * that takes the store lock once for all of them, so a batch of 4,096 hashes takes the lock at
 * most once, however busy the writers are. Then the hashes not held in RAM are looked up in
 * the disk index (shm/dindex.h, kvr_dindex_has_canon): a block on disk is held too.
 */
#include "core/store.h"

#include "core/store_int.h"

size_t kvr_store_lookup_hashes(kvr_store_t *st, uint32_t pool, const uint64_t *h, size_t n, uint8_t *held)
{
    uint16_t ns;
    size_t again = 0, prefix = 0;

    KVR_DASSERT(store_mine(st));
    /* acquire: pairs with kvr_store_pool's release store of npools (the slot is whole) */
    if (pool >= kvr_atomic_load_acquire(&st->sh->npools)) {
        memset(held, 0, n);
        return 0;
    }
    ns = st->sh->pool[pool].ns;
    for (size_t k = 0; k < n; k++) {
        int rc = kvr_index_canon_lockfree(&st->ix, ns, pool, h[k]);
        held[k] = rc == KVR_AGAIN ? 2 : rc == 1; /* 2: answered under the lock below */
        again += rc == KVR_AGAIN;
    }
    if (again > 0) {
        int locked = store_lock(st) == KVR_OK; /* a failed lock answers "not held", as exists does */
        for (size_t k = 0; k < n; k++)
            if (held[k] == 2)
                held[k] = locked && kvr_index_canon_locked(&st->ix, ns, pool, h[k]);
        if (locked)
            store_unlock(st);
    }
    /* the disk tier's blocks are held too (slower hits): its index by canonical hash, lock-free;
     * a chain the writer kept changing answers "not held" */
    if (st->dx.sh != NULL)
        for (size_t k = 0; k < n; k++)
            if (!held[k])
                held[k] = kvr_dindex_has_canon(&st->dx, (uint8_t)pool, h[k]) == 1;
    while (prefix < n && held[prefix])
        prefix++;
    return prefix;
}
