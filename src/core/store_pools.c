/*
 * store_pools.c — the relay pools' table (kvr_store_sh_t.pool): one pool per (namespace,
 * model) that has stored a block, so that the relay publishes one filter per pool
 * (docs/tenancy.md, "Pools"). Append-only for the life of the segment: a PUT finds its pool
 * without a lock, and only the first PUT of a new (namespace, model) takes the store lock to
 * add one. The rules (who writes, in which order) are in store_sh.h and docs/concurrency.md.
 */
#include "store_int.h"

#include "base/log.h"

#include <stdio.h>
#include <string.h>

int kvr_store_model_valid(const char *model, size_t len)
{
    if (len == 0 || len > KVR_NS_MODEL_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)model[i] <= 0x20 || (unsigned char)model[i] >= 0x7f)
            return 0;
    return 1;
}

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

int kvr_store_pool(kvr_store_t *st, uint16_t ns, const char *ns_name, const char *model, size_t mlen)
{
    kvr_store_sh_t *sh = st->sh;
    uint32_t n, max = st->seg->hdr->relay_pools;
    kvr_pool_sh_t *p;
    int i;

    if (!kvr_store_model_valid(model, mlen) || ns >= KVR_NS_MAX)
        return KVR_EINVAL;
    /* acquire: pairs with the release store of npools below; the slots under it are whole */
    i = pool_find(sh, kvr_atomic_load_acquire(&sh->npools), ns, model, mlen);
    if (i >= 0)
        return i;
    if (store_lock(st) != KVR_OK)
        return KVR_ERR;
    n = kvr_atomic_load_relaxed(&sh->npools); /* only stored under the lock we hold */
    i = pool_find(sh, n, ns, model, mlen);    /* made while we waited for the lock */
    if (i < 0 && n < max && n < KVR_POOLS_MAX) {
        p = &sh->pool[n];
        memset(p, 0, sizeof(*p));
        p->ns = ns;
        p->model_len = (uint8_t)mlen;
        memcpy(p->model, model, mlen);
        snprintf(p->ns_name, sizeof(p->ns_name), "%s", ns_name != NULL ? ns_name : "");
        /* release: the slot's bytes above are visible to whoever loads the new count with
         * acquire (PUTs, the publisher, the catalog) */
        kvr_atomic_store_release(&sh->npools, n + 1);
        i = (int)n;
        kvr_info("relay: pool %d is namespace \"%s\", model \"%.*s\"", i, p->ns_name, (int)mlen, model);
    }
    store_unlock(st);
    return i >= 0 ? i : KVR_ENOSPACE;
}

uint32_t kvr_store_pool_count(const kvr_store_t *st)
{
    return kvr_atomic_load_acquire(&st->sh->npools); /* pairs with kvr_store_pool's release */
}

int kvr_store_pool_info(const kvr_store_t *st, uint32_t i, kvr_pool_info_t *out)
{
    const kvr_pool_sh_t *p = &st->sh->pool[i];

    if (i >= kvr_store_pool_count(st)) /* acquire: the slot below the count is whole */
        return KVR_ENOTFOUND;
    out->ns = p->ns;
    out->ns_name = p->ns_name;
    out->model = p->model;
    return KVR_OK;
}
