/*
 * owners.h — owner counting for the Cuckoo filter (docs/relay-contract.md §3.5).
 *
 * The filter holds one fingerprint copy per canonical hash that has at least one owner (a
 * resident block); owners themselves are never in the filter. This table maps canonical
 * hash -> (owner count, resident-in-filter flag) and drives the filter: the first owner
 * inserts, further owners and owners leaving while others remain change nothing, the last
 * owner removes. Process-private (the publisher owns it), open addressing with linear
 * probing and backward-shift deletion, grown at 70 % load.
 *
 * Capacity omission (docs/relay-contract.md §3.4): when the filter insert fails the owner is
 * still counted but the hash is marked not resident (a false negative, never corruption); a
 * later owner of the same hash retries the insert, and the last owner leaving removes a copy
 * only when one was inserted. Unlike the reference, kvrelay's owners are anonymous blocks, so
 * the count must keep every owner to know when the last one leaves.
 */
#ifndef KVR_OWNERS_H
#define KVR_OWNERS_H

#include <stddef.h>
#include <stdint.h>

#include "wire/ckf.h"

typedef struct kvr_owner_ent {
    uint64_t hash;
    uint32_t count;    /* 0 = empty slot */
    uint32_t resident; /* 1 when one fingerprint copy is in the filter */
} kvr_owner_ent_t;

typedef struct kvr_owners {
    kvr_owner_ent_t *tab;
    size_t cap; /* power of two */
    size_t n;   /* distinct hashes with count > 0 */
} kvr_owners_t;

/* Sizes the table for about `expected` hashes. KVR_OK or KVR_ERR (out of memory). */
int kvr_owners_init(kvr_owners_t *o, size_t expected);
void kvr_owners_destroy(kvr_owners_t *o);

/*
 * One more owner of h. On the first owner (or while h is owned but not resident) inserts
 * h into f; f NULL: a table that only counts (never resident; KVR_OK or KVR_ERR). Returns KVR_OK when h is now in the filter, KVR_ENOSPACE when the owner was
 * counted but the filter insert failed (h not resident), KVR_ERR on out of memory
 * (nothing changed).
 */
int kvr_owners_add(kvr_owners_t *o, kvr_ckf_t *f, uint64_t h);

/*
 * One owner of h leaves. When it was the last, removes h's copy from f (if resident).
 * Returns KVR_OK; KVR_ENOTFOUND when h has no owner (a no-op); KVR_ERR when the filter
 * could not record the removal (out of memory; nothing changed) or did not hold the
 * resident copy (an invariant violation; the entry is dropped).
 */
int kvr_owners_del(kvr_owners_t *o, kvr_ckf_t *f, uint64_t h);

/* Current owner count of h (0 when unknown) and whether its copy is in the filter. */
uint32_t kvr_owners_count(const kvr_owners_t *o, uint64_t h);
int kvr_owners_resident(const kvr_owners_t *o, uint64_t h);

#endif
