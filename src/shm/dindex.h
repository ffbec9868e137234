/*
 * dindex.h — the disk index: where each block the disk tier holds lies in its file, in the
 * shared segment so that any worker can find it (docs/ssd-tier.md, "The disk index").
 *
 * One 64-byte slot per disk record, on hash chains like the RAM index's (by key, and a second
 * set by pool and canonical hash for lookups by hash). A slot holds no key
 * bytes: a key is matched by two independent 64-bit hashes seeded with its namespace's secret
 * seed, its namespace and its length; a reader of the block then compares the full key with the
 * record's own copy.
 *
 * Writers: the disk writer alone inserts, moves and removes slots, each change inside a seqlock
 * section (`seq` odd while it relinks). Readers (workers) look up without a lock and retry when
 * the section moved. The one field another process writes is a slot's state word: a worker's
 * DELETE turns LIVE into DEAD with a CAS that names the slot's generation, so a slot the writer
 * has reused since is never killed by mistake; the writer then reaps DEAD slots. Every field's
 * writer, reader and ordering: docs/concurrency.md, "The disk index".
 */
#ifndef KVR_SHM_DINDEX_H
#define KVR_SHM_DINDEX_H

#include "common.h"

enum { KVR_DSLOT_FREE = 0,
       KVR_DSLOT_LIVE = 1,
       KVR_DSLOT_DEAD = 2 };

/* A slot's state word: generation << 2 | state. The generation goes up each time the writer
 * frees or refills the slot. */
#define KVR_DSLOT_STATE(w) ((w)&3u)
#define KVR_DSLOT_GEN(w)   ((w) >> 2)

typedef struct {
    uint64_t h1, h2;  /* the key's hashes under its namespace's seed (h1 picks the bucket) */
    uint64_t canon;   /* the canonical hash the relay publishes */
    uint64_t length;  /* payload bytes */
    uint64_t version; /* the version of the page the record is in */
    uint32_t page;    /* the record's page */
    uint32_t off4k;   /* its offset in the page, in KVR_SSD_ALIGN units */
    uint32_t chain_next;
    uint32_t sw; /* state word (above): atomic */
    uint16_t key_len;
    uint16_t ns;
    uint8_t pool;
    uint8_t pad_[3];
} kvr_dslot_t;
static_assert(sizeof(kvr_dslot_t) == 64, "a disk slot is one cache line");

typedef struct {
    _Atomic uint64_t seq; /* odd while the writer relinks */
    uint64_t pad0_[7];
    uint64_t nslots, nbuckets;
    uint32_t free_head; /* the writer's */
    uint32_t pad1_;
    uint64_t live, live_bytes; /* slots in use (LIVE or DEAD) and their payload: the writer's */
    _Atomic uint64_t kills;    /* LIVE -> DEAD turns ever made (workers' DELETEs): the reaper's cue */
    uint64_t pad2_[2];
} kvr_dindex_sh_t;
static_assert(sizeof(kvr_dindex_sh_t) == 128, "disk index state layout");

/* A process's handle (private memory): the geometry is fixed when the region is made. */
typedef struct {
    kvr_dindex_sh_t *sh;
    kvr_dslot_t *slot;
    _Atomic uint32_t *buckets;
    /* The second set of chains, by (pool, canonical hash): /batch/lookup's question. One link
     * per slot, beside the slots (a slot is one cache line, full), and buckets of their own. */
    _Atomic uint32_t *canon_next;
    _Atomic uint32_t *canon_buckets;
    /* Per namespace: slots in use (LIVE or DEAD) and their payload bytes, the writer's gauges
     * as live and live_bytes are (an ssd= quota is checked against them). */
    uint64_t *ns_live, *ns_bytes;
    uint64_t nslots, nbuckets;
} kvr_dindex_t;

/* Bytes of the region for nslots slots (state, slots, key buckets, canonical links and
 * buckets, the per-namespace gauges). */
uint64_t kvr_dindex_bytes(uint64_t nslots);
/* Points dx at a region of kvr_dindex_bytes(nslots) bytes at base; kvr_dindex_format empties
 * it (before anyone reads it, or by the writer inside a seqlock section when it rebuilds). */
void kvr_dindex_map(kvr_dindex_t *dx, void *base, uint64_t nslots);
void kvr_dindex_format(kvr_dindex_t *dx);

/* The key's two hashes under seed. */
void kvr_dindex_hash(uint64_t seed, const void *key, size_t klen, uint64_t *h1, uint64_t *h2);

/*
 * Writer: records where (ns, h1, h2, key_len) now lies, from v (every field but chain_next and
 * sw). A slot of that key, LIVE or DEAD, is moved to v's place (*old gets what it held, and
 * KVR_OK); otherwise a free slot is taken (*old->page = KVR_NIL). KVR_ENOSPACE when every slot is
 * in use. *id gets the slot.
 */
int kvr_dindex_put(kvr_dindex_t *dx, const kvr_dslot_t *v, uint32_t *id, kvr_dslot_t *old);
/* Writer: frees slot id (its block left the disk). */
void kvr_dindex_remove(kvr_dindex_t *dx, uint32_t id);
/* Writer: points slot id, still the LIVE word sw as kvr_dindex_get read it, at v's place
 * (page, off4k, version; length, canon and pool too), by a CAS to the next generation that a
 * worker's kill of it would make fail: 1 moved; 0 when a worker killed it meanwhile (it stays
 * DEAD: compaction never revives a deleted key). v is the slot's own key (h1, h2, ns, key_len
 * as read): only the place and what the record says may differ. */
int kvr_dindex_move_live(kvr_dindex_t *dx, uint32_t id, uint32_t sw, const kvr_dslot_t *v);
/* Writer: frees every slot that points into page `page` of incarnation `version` (the page is
 * being recycled); returns how many. cb (optional) is told each slot freed. */
uint64_t kvr_dindex_drop_page(kvr_dindex_t *dx, uint32_t page, uint64_t version, void (*cb)(void *, uint32_t),
                              void *ctx);
/* Writer: a copy of slot id's fields (its state word read atomically). */
void kvr_dindex_get(const kvr_dindex_t *dx, uint32_t id, kvr_dslot_t *out);
/* Slots in use (LIVE or DEAD): a gauge, exact for the writer. */
uint64_t kvr_dindex_live(const kvr_dindex_t *dx);
uint64_t kvr_dindex_live_bytes(const kvr_dindex_t *dx);
/* The same for namespace ns (< KVR_NS_MAX). */
uint64_t kvr_dindex_ns_live(const kvr_dindex_t *dx, uint16_t ns);
uint64_t kvr_dindex_ns_bytes(const kvr_dindex_t *dx, uint16_t ns);
/* Writer: the next DEAD slot from *cursor on (wrapping once), or KVR_NIL; *cursor moves past it. */
uint32_t kvr_dindex_next_dead(const kvr_dindex_t *dx, uint64_t *cursor);
/* Writer: the same over at most `limit` slots from *cursor; *scanned says how many it looked
 * at (up to and including the one returned), and *cursor moves past them. */
uint32_t kvr_dindex_scan_dead(const kvr_dindex_t *dx, uint64_t *cursor, uint64_t limit, uint64_t *scanned);
/* The kills made so far (a seq_cst load: a kill counted here is a DEAD slot a scan will find). */
uint64_t kvr_dindex_kills(const kvr_dindex_t *dx);

/*
 * Reader, lock-free: 1 with a copy of the LIVE slot of (ns, h1, h2, key_len) in *out (its state
 * word in out->sw) and its index in *id, 0 when there is none, KVR_AGAIN when the writer kept changing the chains (the
 * caller answers a miss: there is no lock to fall back to, and a miss is always safe).
 */
int kvr_dindex_lookup(const kvr_dindex_t *dx, uint16_t ns, uint64_t h1, uint64_t h2, uint16_t key_len,
                      kvr_dslot_t *out, uint32_t *id);
/* Reader, lock-free: 1 when a LIVE slot of pool holds a block with canonical hash canon, 0 when
 * none does, KVR_AGAIN when the writer kept changing the chains (the caller answers "not
 * held": a lookup's "no" costs a recomputation, never a wrong block). */
int kvr_dindex_has_canon(const kvr_dindex_t *dx, uint8_t pool, uint64_t canon);
/* Reader, lock-free, by slot index: 1 with a copy of slot id when it is LIVE, 0 when it is not,
 * KVR_AGAIN when the writer kept changing it. */
int kvr_dindex_peek(const kvr_dindex_t *dx, uint32_t id, kvr_dslot_t *out);
/* Reader: turns the LIVE slot of that key DEAD (a DELETE). 1 when it did, 0 when there was
 * none, KVR_AGAIN as above. */
int kvr_dindex_kill(kvr_dindex_t *dx, uint16_t ns, uint64_t h1, uint64_t h2, uint16_t key_len);
/* Its second half: slot id, as a lookup saw it (out->sw), turned DEAD: 1, or 0 when the slot
 * is no longer that LIVE generation (the writer moved, freed or reused it since). */
int kvr_dindex_kill_seen(kvr_dindex_t *dx, uint32_t id, uint32_t sw);

#endif
