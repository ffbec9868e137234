/*
 * store_demote.c — what the disk writer asks of the store (see store.h, "The disk writer's
 * side"; docs/ssd-tier.md, "Demotion and admission").
 */
#include "core/store.h"

#include "core/store_int.h"

int kvr_store_on_disk_locked(const kvr_store_t *st, const kvr_entry_t *e)
{
    kvr_dslot_t s;
    uint64_t h1, h2;
    uint32_t id;
    const uint8_t *key = kvr_arena_page(st->ix.arena, e->first_page);

    if (st->dx.sh == NULL)
        return 0;
    kvr_dindex_hash(kvr_store_ns_seed(st, e->ns), key, e->key_len, &h1, &h2);
    return kvr_dindex_lookup(&st->dx, e->ns, h1, h2, e->key_len, &s, &id) == 1 && s.length == e->length;
}

unsigned kvr_store_demote_pick(kvr_store_t *st, uint64_t window, kvr_demote_t *out, unsigned cap,
                               kvr_demote_skip_fn skip, kvr_demote_skip_fn on_disk, void *ctx)
{
    unsigned n = 0;

    if (cap == 0 || store_lock(st) != KVR_OK)
        return 0;
    for (unsigned ns = 0; ns < KVR_NS_MAX && n < cap; ns++) {
        uint64_t seen = 0;
        for (uint32_t i = st->ix.lru[ns].tail; i != KVR_NIL && n < cap && seen < window; i = st->ix.ent[i].lru_prev) {
            kvr_entry_t *e = &st->ix.ent[i];
            seen += e->length;
            if (e->state != KVR_ENT_LIVE || !(e->meta & KVR_ENT_READ) || (skip != NULL && skip(ctx, i, e->gen)))
                continue;
            if (kvr_store_on_disk_locked(st, e)) { /* promoted, or restored: never pinned for nothing */
                if (on_disk != NULL)
                    (void)on_disk(ctx, i, e->gen);
                continue;
            }
            if (kvr_store_pin_locked(st, i, &out[n].ref) != KVR_OK)
                break; /* the pin table is full: the rest waits for the next round */
            out[n].ns = e->ns;
            out[n].key_len = e->key_len;
            out[n].pool = e->pool;
            n++;
        }
    }
    store_unlock(st);
    return n;
}

int kvr_store_demote_commit(kvr_store_t *st, kvr_demote_t *d, int (*put)(void *ctx), void *ctx)
{
    const kvr_entry_t *e = &st->ix.ent[d->ref.entry];
    int rc = KVR_ENOTFOUND;

    if (store_lock(st) != KVR_OK)
        return KVR_ERR;
    if (e->state == KVR_ENT_LIVE && e->gen == d->ref.gen)
        rc = put(ctx);
    kvr_store_unpin_locked(st, d->ref.entry);
    store_unlock(st);
    return rc;
}

void kvr_store_demote_release(kvr_store_t *st, kvr_demote_t *d)
{
    if (store_lock(st) != KVR_OK)
        return;
    kvr_store_unpin_locked(st, d->ref.entry);
    store_unlock(st);
}

uint64_t kvr_store_ns_seed(const kvr_store_t *st, uint16_t ns)
{
    return st->sh->ns_seed[ns < KVR_NS_MAX ? ns : 0];
}
