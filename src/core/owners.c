/*
 * owners.c — canonical hash -> owner count, driving filter inserts and removes
 * (docs/relay-contract.md §3.5).
 *
 * Linear probing over a power-of-two table of 16-byte entries; count == 0 marks a free slot.
 * Slots are chosen by a 64-bit finaliser of the hash, because canonical hashes may be
 * caller-chosen numbers (16-hex-digit keys, docs/http-contract.md §3.2) rather than well-mixed
 * values. Deletion shifts the following cluster back, so there are no tombstones.
 */
#include <stdlib.h>

#include "common.h"
#include "core/owners.h"

static inline size_t slot_of(uint64_t h, size_t mask)
{
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return (size_t)h & mask;
}

int kvr_owners_init(kvr_owners_t *o, size_t expected)
{
    size_t cap = 16;
    while (cap * 7 / 10 < expected)
        cap *= 2;
    o->tab = calloc(cap, sizeof(*o->tab));
    o->cap = o->tab ? cap : 0;
    o->n = 0;
    return o->tab ? KVR_OK : KVR_ERR;
}

void kvr_owners_destroy(kvr_owners_t *o)
{
    free(o->tab);
    o->tab = NULL;
    o->cap = o->n = 0;
}

static kvr_owner_ent_t *find(const kvr_owners_t *o, uint64_t h)
{
    size_t mask = o->cap - 1;
    for (size_t i = slot_of(h, mask);; i = (i + 1) & mask) {
        kvr_owner_ent_t *e = &o->tab[i];
        if (e->count == 0)
            return NULL;
        if (e->hash == h)
            return e;
    }
}

static int grow(kvr_owners_t *o)
{
    size_t cap = o->cap * 2;
    kvr_owner_ent_t *tab = calloc(cap, sizeof(*tab));
    if (!tab)
        return KVR_ERR;
    for (size_t j = 0; j < o->cap; j++) {
        if (o->tab[j].count == 0)
            continue;
        size_t i = slot_of(o->tab[j].hash, cap - 1);
        while (tab[i].count)
            i = (i + 1) & (cap - 1);
        tab[i] = o->tab[j];
    }
    free(o->tab);
    o->tab = tab;
    o->cap = cap;
    return KVR_OK;
}

/* Frees slot i and shifts the rest of its cluster back into place. */
static void erase_at(kvr_owners_t *o, size_t i)
{
    size_t mask = o->cap - 1;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (o->tab[j].count == 0)
            break;
        size_t home = slot_of(o->tab[j].hash, mask);
        /* Move j into the hole at i when its home is not within (i, j]. */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            o->tab[i] = o->tab[j];
            i = j;
        }
    }
    o->tab[i].count = 0;
    o->tab[i].resident = 0;
    o->n--;
}

int kvr_owners_add(kvr_owners_t *o, kvr_ckf_t *f, uint64_t h)
{
    kvr_owner_ent_t *e = find(o, h);
    if (e) {
        if (e->count == UINT32_MAX)
            return KVR_ERR;
        if (!e->resident && f != NULL) {
            int rc = kvr_ckf_insert(f, h);
            if (rc == KVR_ERR)
                return KVR_ERR;
            e->resident = rc == KVR_OK;
        }
        e->count++;
        return e->resident || f == NULL ? KVR_OK : KVR_ENOSPACE;
    }
    if ((o->n + 1) * 10 > o->cap * 7 && grow(o) != KVR_OK)
        return KVR_ERR;
    int rc = f != NULL ? kvr_ckf_insert(f, h) : KVR_ENOSPACE; /* no filter: counted, never resident */
    if (rc == KVR_ERR)
        return KVR_ERR;
    size_t mask = o->cap - 1;
    size_t i = slot_of(h, mask);
    while (o->tab[i].count)
        i = (i + 1) & mask;
    o->tab[i].hash = h;
    o->tab[i].count = 1;
    o->tab[i].resident = rc == KVR_OK;
    o->n++;
    return rc == KVR_OK || f == NULL ? KVR_OK : KVR_ENOSPACE;
}

int kvr_owners_del(kvr_owners_t *o, kvr_ckf_t *f, uint64_t h)
{
    kvr_owner_ent_t *e = find(o, h);
    if (!e)
        return KVR_ENOTFOUND;
    if (e->count > 1) {
        e->count--;
        return KVR_OK;
    }
    int rc = KVR_OK;
    if (e->resident) {
        rc = kvr_ckf_remove(f, h);
        if (rc == KVR_ERR)
            return KVR_ERR; /* out of memory: still owned, still resident */
        if (rc != KVR_OK)
            rc = KVR_ERR; /* the copy was not there: invariant violation */
    }
    erase_at(o, (size_t)(e - o->tab));
    return rc;
}

uint32_t kvr_owners_count(const kvr_owners_t *o, uint64_t h)
{
    const kvr_owner_ent_t *e = find(o, h);
    return e ? e->count : 0;
}

int kvr_owners_resident(const kvr_owners_t *o, uint64_t h)
{
    const kvr_owner_ent_t *e = find(o, h);
    return e ? (int)e->resident : 0;
}
