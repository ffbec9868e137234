/*
 * store_pools.c — the relay pools' table (kvr_store_sh_t.pool): one pool per (namespace,
 * model) that has stored a block, so that the relay publishes one filter per pool
 * (docs/tenancy.md, "Pools"). Append-only for the life of the segment: a PUT finds its pool
 * without a lock, and only the first PUT of a new (namespace, model) takes the store lock to
 * add one. The rules (who writes, in which order) are in store_sh.h and docs/concurrency.md.
 */
#include "store_int.h"

#include "base/log.h"
#include "wire/keys.h"

#include <stdio.h>
#include <string.h>

/* The slot of (ns, model) among the first n, or -1. Slots below a published count never change. */
static int pool_find(const kvr_store_sh_t *sh, uint32_t n, uint16_t ns, const char *model, size_t mlen)
{
    for (uint32_t i = 0; i < n; i++) {
        const kvr_pool_sh_t *p = &sh->pool[i];
        if (p->ns == ns && p->model_len == mlen && memcmp(p->model, model, mlen) == 0)
            return (int)i;
    }
    return -1;
}

/* Pools of namespace ns among the first n. */
static uint32_t pools_of(const kvr_store_sh_t *sh, uint32_t n, uint16_t ns)
{
    uint32_t k = 0;

    for (uint32_t i = 0; i < n; i++)
        k += sh->pool[i].ns == ns;
    return k;
}

int kvr_store_pool(kvr_store_t *st, uint16_t ns, const char *ns_name, const char *model, size_t mlen, uint32_t ns_max)
{
    kvr_store_sh_t *sh = st->sh;
    uint32_t n, max = st->seg->hdr->relay_pools;
    kvr_pool_sh_t *p;
    int i, rc;

    if (!kvr_model_valid(model, mlen) || ns >= KVR_NS_MAX)
        return KVR_EINVAL;
    /* acquire: pairs with the release store of npools below; the slots under it are whole */
    i = pool_find(sh, kvr_atomic_load_acquire(&sh->npools), ns, model, mlen);
    if (i >= 0)
        return i;
    if (store_lock(st) != KVR_OK)
        return KVR_ERR;
    n = kvr_atomic_load_relaxed(&sh->npools); /* only stored under the lock we hold */
    i = pool_find(sh, n, ns, model, mlen);    /* made while we waited for the lock */
    rc = i;
    if (i < 0 && (n >= max || n >= KVR_POOLS_MAX)) {
        rc = KVR_ENOSPACE;
    } else if (i < 0 && pools_of(sh, n, ns) >= ns_max) {
        rc = KVR_EQUOTA;
    } else if (i < 0) {
        p = &sh->pool[n];
        memset(p, 0, sizeof(*p));
        p->ns = ns;
        p->model_len = (uint8_t)mlen;
        memcpy(p->model, model, mlen);
        snprintf(p->ns_name, sizeof(p->ns_name), "%s", ns_name != NULL ? ns_name : "");
        /* release: the slot's bytes above are visible to whoever loads the new count with
         * acquire (PUTs, the publisher, the catalog) */
        kvr_atomic_store_release(&sh->npools, n + 1);
        rc = (int)n;
        kvr_info("relay: pool %d is namespace \"%s\", model \"%.*s\"", rc, p->ns_name, (int)mlen, model);
    }
    store_unlock(st);
    return rc;
}

int kvr_store_pool_find(const kvr_store_t *st, uint16_t ns, const char *model, size_t mlen)
{
    int i;

    if (!kvr_model_valid(model, mlen) || ns >= KVR_NS_MAX)
        return KVR_EINVAL;
    /* acquire: pairs with kvr_store_pool's release store of npools; the slots under it are whole */
    i = pool_find(st->sh, kvr_atomic_load_acquire(&st->sh->npools), ns, model, mlen);
    return i >= 0 ? i : KVR_ENOTFOUND;
}

uint32_t kvr_store_pool_count(const kvr_store_t *st)
{
    return kvr_atomic_load_acquire(&st->sh->npools); /* pairs with kvr_store_pool's release */
}

int kvr_store_pool_info(const kvr_store_t *st, uint32_t i, kvr_pool_info_t *out)
{
    const kvr_pool_sh_t *p;

    if (i >= kvr_store_pool_count(st)) /* acquire: the slot below the count is whole */
        return KVR_ENOTFOUND;
    p = &st->sh->pool[i];
    out->ns = p->ns;
    out->ns_name = p->ns_name;
    out->model = p->model;
    return KVR_OK;
}

/* A slot as kvr_store_pool writes it: terminated strings, a valid model of model_len bytes. */
static int slot_whole(const kvr_pool_sh_t *p)
{
    return p->ns < KVR_NS_MAX && memchr(p->ns_name, '\0', sizeof(p->ns_name)) != NULL &&
           p->model_len <= KVR_MODEL_MAX && p->model[p->model_len] == '\0' && kvr_model_valid(p->model, p->model_len);
}

void kvr_store_pools_attach_locked(kvr_store_t *st)
{
    kvr_store_sh_t *sh = st->sh;
    uint32_t n = kvr_atomic_load_relaxed(&sh->npools), keep = 0; /* under the lock, before any fork */

    KVR_DASSERT(store_locked(st));
    if (n > st->seg->hdr->relay_pools || n > KVR_POOLS_MAX)
        n = st->seg->hdr->relay_pools < KVR_POOLS_MAX ? st->seg->hdr->relay_pools : KVR_POOLS_MAX;
    while (keep < n && slot_whole(&sh->pool[keep]))
        keep++;
    if (keep != kvr_atomic_load_relaxed(&sh->npools))
        kvr_warn("store: the pool table of the re-attached segment is cut to its first %u whole pools "
                 "(the repair frees the blocks of the others)",
                 keep);
    kvr_atomic_store_relaxed(&sh->npools, keep); /* nobody else maps the segment yet */
}
