/*
 * publisher.c — the relay's single writer (docs/architecture.md, "A publication, step by step").
 *
 * One process, forked and supervised like the workers. It:
 *  0. takes on the relay pools (namespace, model) the store makes (take_pools): a filter, owner
 *     counts and a sequence each, and an identity it publishes (docs/tenancy.md, "Pools");
 *  1. drains the store's change log (insert/remove of a canonical hash in a pool, with the
 *     entry and its generation so that events a crash repair appended twice count once),
 *     applies owner counting (the first resident block of a hash inserts its fingerprint,
 *     the last one to leave removes it) to that pool's Cuckoo filter, which tracks dirty
 *     buckets;
 *  2. at a publication boundary (--publication-threshold events, or --publication-delay
 *     after the first pending one) drains each pool's dirty set into one CBI1 delta N -> N+1
 *     of that pool with absolute images, encodes the whole gRPC FilterUpdate message once
 *     into the shared frame ring, and bumps the pool's published sequence;
 *  3. admits new pool subscribers at their pool's sequence N with an exact copy of its filter
 *     at N (one of four snapshot copies, shared by subscribers admitted at the same N; when
 *     all are in use, new subscribers wait, like the reference's encoding permits);
 *  4. cuts subscribers whose unread frames exceed 16 frames or 16 MiB (SUBSCRIBER_LAGGED)
 *     and wakes the workers that stream to live subscribers; while the slowest one left falls
 *     behind, stretches the boundary of step 2 (coalescing, publisher_subs.c).
 *
 * A new publisher (start, or replacement after a crash) always begins a new generation:
 * layout_generation + 1, every pool's filter rebuilt from a scan of the index, sequences 0, catalog
 * revision + 1; subscribers of the old generation are closed (PUBLICATION_UNAVAILABLE).
 * A change-log overflow does the same without a restart.
 */
#include "proc/publisher.h"
#include "proc/publisher_int.h"

#include "wire/ckf.h"
#include "base/barrier.h"
#include "base/clock.h"
#include "base/dassert.h"
#include "base/log.h"
#include "core/owners.h"
#include "core/relay_int.h"
#include "core/store.h"
#include "shm/changelog.h"
#include "wire/cbi1.h"
#include "wire/relay_validate.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define LOG_BATCH 4096

unsigned kvr_pub_fail_alloc_at;
static unsigned pub_allocs;

/* Every buffer publish() grows goes through here, so a test can make one fail. */
static void *pub_realloc(void *old, size_t n)
{
    if (kvr_pub_fail_alloc_at != 0 && ++pub_allocs == kvr_pub_fail_alloc_at)
        return NULL;
    return realloc(old, n);
}

volatile sig_atomic_t pub_term; /* SIGTERM came (publisher_int.h) */
static void on_term(int sig)
{
    (void)sig;
    pub_term = 1;
}

/* ------------------------------------------------------------------ pools */

/* Takes on the pools the store made since we last looked (docs/tenancy.md, "Pools"): each gets
 * its filter over its shared region, emptied, and its identity; then the relay counts them
 * ready and the catalog revision moves, so that watchers list them. Out of memory it sets
 * resync (the caller starts a new generation, or exits, outside the store lock: this may run
 * in the rescan's callback). */
void pub_take_pools(pub_t *p)
{
    uint32_t n = kvr_store_pool_count(&p->store), from = p->npools, known = kvr_relay_pools_ready(&p->relay);

    KVR_DASSERT(pub_is_me(p));
    if (n > p->relay.sh->npools)
        n = p->relay.sh->npools; /* the store never makes more than the segment's --max-pools */
    if (n <= from)
        return;
    for (uint32_t i = from; i < n; i++) {
        pub_pool_t *pp = &p->pool[i];
        kvr_pool_info_t slot;
        if (kvr_ckf_init(&pp->ckf, kvr_relay_filter(&p->relay, i), p->relay.sh->bucket_count, p->relay.sh->seed, 0,
                         1) != KVR_OK ||
            kvr_owners_init(&pp->owners, 1024) != KVR_OK || kvr_owners_init(&pp->disk, 64) != KVR_OK) {
            kvr_error("publisher: out of memory for pool %u", i);
            p->resync = 1;
            n = i; /* the pools before it are whole */
            break;
        }
        kvr_ckf_clear(&pp->ckf);
        kvr_ckf_dirty_reset(&pp->ckf);
        pp->seq = 0;
        pp->blocks = 0;
        if (i < known)
            continue; /* a predecessor's pool: its identity stands, new_generation resets the rest */
        /* A new pool starts at sequence 0, empty: subscribers take a snapshot at 0 and deltas
         * follow. Our own stores: nobody reads a pool before it is counted ready. */
        kvr_atomic_store_seq_cst(&p->relay.sh->pool[i].published_seq, 0);
        for (int f = 0; f < KVR_RELAY_FRAMES; f++)
            kvr_atomic_store_seq_cst(&p->relay.sh->pool[i].frame[f].seq, 0);
        if (kvr_store_pool_info(&p->store, i, &slot) != KVR_OK) /* i < the count: never */
            slot.ns_name = slot.model = "";
        kvr_relay_take_pool(&p->relay, i, slot.ns_name, slot.model);
    }
    p->npools = n;
    if (n <= known)
        return;
    kvr_relay_set_pools_ready(&p->relay, n);
    /* the catalog rule: what it covers first (pools_ready), the revision after */
    kvr_atomic_fetch_add_seq_cst(&p->relay.sh->catalog_revision, 1);
}

/* ------------------------------------------------------------------ events */

/* The KV events of one owner more or less of canon in pool (medium m's): each medium's first
 * owner is a BlockStored of that medium, its last one leaving a BlockRemoved (the events count
 * owners as the filter does, but every owner: a hash the full filter left out is still stored).
 * A hash's RAM owners are its owners less its disk owners. ram0/disk0: the counts before. */
static void owner_events(pub_t *p, uint32_t pool, uint64_t canon, uint32_t ram0, uint32_t disk0)
{
    pub_pool_t *pp = &p->pool[pool];
    uint32_t disk1 = kvr_owners_count(&pp->disk, canon), all1 = kvr_owners_count(&pp->owners, canon);
    uint32_t ram1 = all1 >= disk1 ? all1 - disk1 : 0;

    if (p->kvev == NULL || p->rebuilding)
        return;
    if ((ram0 == 0) != (ram1 == 0))
        pub_kvev_op(p, pool, ram1 > 0, canon, KVR_KVEV_CPU);
    if ((disk0 == 0) != (disk1 == 0))
        pub_kvev_op(p, pool, disk1 > 0, canon, KVR_KVEV_DISK);
}

/* One more owner of canon in pool, a block in medium m (the arena: CPU; the disk tier: DISK). */
int pub_owner_add(pub_t *p, uint32_t pool, uint64_t canon, kvr_kvev_medium_t m)
{
    pub_pool_t *pp = &p->pool[pool];
    uint32_t disk0 = kvr_owners_count(&pp->disk, canon), all0 = kvr_owners_count(&pp->owners, canon);
    int rc = kvr_owners_add(&pp->owners, &pp->ckf, canon);

    if (rc == KVR_ERR)
        return rc;
    if (m == KVR_KVEV_DISK && kvr_owners_add(&pp->disk, NULL, canon) == KVR_ERR) {
        kvr_owners_del(&pp->owners, &pp->ckf, canon); /* as if never counted */
        return KVR_ERR;
    }
    owner_events(p, pool, canon, all0 - disk0, disk0);
    return rc;
}

/* One owner of canon in pool leaves, a block of medium m. */
int pub_owner_del(pub_t *p, uint32_t pool, uint64_t canon, kvr_kvev_medium_t m)
{
    pub_pool_t *pp = &p->pool[pool];
    uint32_t disk0 = kvr_owners_count(&pp->disk, canon), all0 = kvr_owners_count(&pp->owners, canon);
    int rc = kvr_owners_del(&pp->owners, &pp->ckf, canon);

    if (m == KVR_KVEV_DISK && kvr_owners_count(&pp->owners, canon) < all0) /* it did leave */
        kvr_owners_del(&pp->disk, NULL, canon);
    owner_events(p, pool, canon, all0 >= disk0 ? all0 - disk0 : 0, disk0);
    return rc;
}

static void apply_insert(pub_t *p, uint32_t e, uint32_t gen, uint64_t canon, uint32_t pool)
{
    pub_pool_t *pp;

    if (e >= p->max_blocks)
        return;
    if (pool >= p->npools)
        pub_take_pools(p); /* the pool was made before the block's insert was logged */
    if (pool >= p->npools)
        return; /* never expected: an entry names no pool of the store's table */
    if (p->ann_live[e] && p->ann_gen[e] == gen)
        return;           /* a repair's duplicate */
    if (p->ann_live[e]) { /* never expected: the older incarnation's remove was lost */
        p->pool[p->ann_pool[e]].blocks--;
        if (pub_owner_del(p, p->ann_pool[e], p->ann_canon[e], KVR_KVEV_CPU) == KVR_ERR)
            p->resync = 1;
    }
    pp = &p->pool[pool];
    pp->blocks++;
    p->ann_live[e] = 1;
    p->ann_gen[e] = gen;
    p->ann_canon[e] = canon;
    p->ann_pool[e] = (uint8_t)pool;
    switch (pub_owner_add(p, pool, canon, KVR_KVEV_CPU)) {
    case KVR_OK:
        break;
    case KVR_ENOSPACE:
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "publisher: filter full, a hash is not published (false negative)");
        break;
    default: /* out of memory: the owner was not counted; only a rebuild is exact again */
        p->resync = 1;
    }
}

static void apply_remove(pub_t *p, uint32_t e, uint32_t gen)
{
    if (e >= p->max_blocks || !p->ann_live[e] || p->ann_gen[e] != gen)
        return;
    p->ann_live[e] = 0;
    p->pool[p->ann_pool[e]].blocks--;
    if (pub_owner_del(p, p->ann_pool[e], p->ann_canon[e], KVR_KVEV_CPU) == KVR_ERR)
        p->resync = 1; /* out of memory, or a copy that was not there: rebuild */
}

static void scan_cb(void *ctx, uint32_t e, uint32_t gen, uint64_t canon, uint32_t pool)
{
    apply_insert(ctx, e, gen, canon, pool);
}

/* ------------------------------------------------------------------ publication */

static void new_generation(pub_t *p, const char *why);

/* While deltas coalesce (p->coalesce > 1) the boundary is the stretched delay alone, so that
 * the frame rate is at most one per stretched delay whatever the PUT rate; a delta still goes
 * out once this many events are pending (unless --publication-threshold says more): each event
 * dirties a bucket or two (a few hundred on a rare kick chain), so its images stay far below
 * the 349,525 a delta may carry (docs/relay-contract.md §4.1) and 16 such frames below 16 MiB. */
#define COALESCE_EVENTS_MAX 32768ull

uint64_t pub_threshold(const pub_t *p)
{
    uint64_t t = p->cfg->publication_threshold;

    return p->coalesce <= 1 || t >= COALESCE_EVENTS_MAX ? t : COALESCE_EVENTS_MAX;
}

uint64_t pub_delay(const pub_t *p)
{
    return p->delay_ns * (p->coalesce ? p->coalesce : 1);
}

/* Grows the image and message buffers for a delta of up to `dirty` images. */
static int reserve_buffers(pub_t *p, size_t dirty)
{
    size_t need;

    if (dirty > p->images_cap) {
        kvr_ckf_image_t *ni = pub_realloc(p->images, dirty * sizeof(*ni));
        if (ni == NULL)
            return KVR_ERR;
        p->images = ni;
        p->images_cap = dirty;
    }
    if (dirty > KVR_CBI1_MAX_DELTA_IMAGES)
        dirty = KVR_CBI1_MAX_DELTA_IMAGES; /* a larger delta is never encoded */
    need = kvr_cbi1_delta_size(dirty) + KVR_RELAY_ENVELOPE_MAX;
    if (need > p->msg_cap) {
        uint8_t *nm = pub_realloc(p->msg, need);
        if (nm == NULL)
            return KVR_ERR;
        p->msg = nm;
        p->msg_cap = need;
    }
    return KVR_OK;
}

void pub_record_latency(pub_t *p, unsigned base, uint64_t first_ns)
{
    kvr_stat_hist(p->store.my_stats, base, (kvr_clock_ns() - first_ns) / 1000);
}

/* Copies an encoded delta message into the ring and publishes it as pool's sequence seq.
 * Cannot fail. The writer's side of the ring protocol is kvr_relay_put_frame (core/relay.c),
 * next to the reader's. */
static void put_frame(pub_t *p, uint32_t pool, uint64_t seq, size_t len, size_t payload_len)
{
    KVR_DASSERT(pub_owns_relay(p));
    kvr_relay_put_frame(&p->relay, pool, seq, p->msg, len, payload_len);
    p->pool[pool].seq = seq;
}

/* The pools' block counts, for the load streams: a gauge, relaxed (read relaxed). */
static void mirror_blocks(pub_t *p)
{
    for (uint32_t i = 0; i < p->npools; i++)
        kvr_atomic_store_relaxed(&p->relay.sh->pool[i].blocks, p->pool[i].blocks);
}

/* Closes pool's subscribers and drops its snapshot copies: they resubscribe to copies taken
 * from the filter as it is now (the reference hub re-snapshots too). */
static void resnapshot_pool(pub_t *p, uint32_t pool)
{
    kvr_relay_sh_t *sh = p->relay.sh;

    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++) {
        /* seq_cst: pairs with the worker's CAS to REQUESTED, which published its pool */
        uint32_t st = kvr_atomic_load_seq_cst(&sh->sub[i].state);
        if ((st == KVR_SUB_REQUESTED || st == KVR_SUB_LIVE) && sh->sub[i].pool == pool)
            pub_close_sub(p, i, KVR_RELAY_REASON_PUBLICATION_UNAVAILABLE);
    }
    for (int k = 0; k < KVR_RELAY_SNAPSHOTS; k++)
        if (kvr_atomic_load_seq_cst(&sh->snap[k].pool) == pool)
            kvr_atomic_store_seq_cst(&sh->snap[k].valid, 0); /* see snapshot_copy */
}

/*
 * Publishes pool's dirty set as its next delta. The dirty set is the only record of what
 * changed since the last publication, so everything that can fail (the buffers) comes before
 * it is drained: on failure nothing is drained and the delta is retried later (KVR_ERR).
 * After the drain, an encoding failure (never expected: the buffers are sized) starts a new
 * generation rather than leave mirrors silently behind. Sets *sent when a frame went out.
 */
static int publish_pool(pub_t *p, uint32_t pool, int *sent)
{
    kvr_relay_sh_t *sh = p->relay.sh;
    pub_pool_t *pp = &p->pool[pool];
    size_t dirty = kvr_ckf_dirty_count(&pp->ckf), n, len, plen;
    uint64_t seq = pp->seq + 1;
    kvr_cbi1_hdr_t hdr = {sh->seed, sh->bucket_count, sh->dc_id, seq};
    uint8_t *payload;

    if (dirty == 0)
        return KVR_OK;
    if (reserve_buffers(p, dirty) != KVR_OK)
        return KVR_ERR;
    n = kvr_ckf_drain(&pp->ckf, p->images);
    if (n == 0)
        return KVR_OK; /* net reversion: nothing changed since the last publication */
    if (n > KVR_CBI1_MAX_DELTA_IMAGES) {
        kvr_warn("publisher: delta of %zu images for pool %u is too large; its subscribers must resnapshot", n, pool);
        resnapshot_pool(p, pool);
        return KVR_OK;
    }
    plen = kvr_cbi1_delta_size(n);
    len = kvr_relay_filter_update(&p->relay, pool, p->generation, pp->seq, seq,
                                  DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_DELTA, plen, p->msg,
                                  p->msg_cap, &payload);
    if (len == 0 || kvr_cbi1_encode_delta(payload, plen, &hdr, pp->seq, p->images, n) == NULL) {
        kvr_error("publisher: cannot encode delta %llu of pool %u; starting a new generation",
                  (unsigned long long)seq, pool);
        new_generation(p, "delta encoding failed");
        return KVR_OK;
    }
    put_frame(p, pool, seq, len, plen);
    kvr_stat_add(p->store.my_stats, KVR_ST_RELAY + KVR_RC_DELTAS, 1);
    kvr_stat_add(p->store.my_stats, KVR_ST_RELAY + KVR_RC_DELTA_BYTES, len);
    if (p->coalesce > 1)
        kvr_stat_add(p->store.my_stats, KVR_ST_RELAY + KVR_RC_COALESCED, 1);
    *sent = 1;
    return KVR_OK;
}

/*
 * A publication boundary: every pool with changes publishes its delta. Returns KVR_OK when
 * every filter is now exact at its published sequence; KVR_ERR when a pool's buffers could
 * not grow (its changes stay dirty, the pending count stays, and the main loop comes back).
 */
static int publish(pub_t *p)
{
    uint64_t now = kvr_clock_ns();
    uint64_t gen = p->generation;
    int sent = 0, rc = KVR_OK;

    if (now < p->retry_at_ns)
        return KVR_ERR;
    for (uint32_t i = 0; i < p->npools && p->generation == gen; i++)
        if (publish_pool(p, i, &sent) != KVR_OK)
            rc = KVR_ERR;
    if (rc != KVR_OK) {
        p->retry_at_ns = now + 10000000ull;
        KVR_LOG_RATELIMITED(KVR_LOG_ERROR, "publisher: out of memory for a delta; retrying");
    } else {
        p->retry_at_ns = 0;
        p->pending = 0; /* first_pending_ns stays: the latency below is measured from it */
    }
    if (sent) {
        if (rc == KVR_OK)                                                /* else the retry's publication records it, once */
            pub_record_latency(p, KVR_ST_PUB_HIST, p->first_pending_ns); /* first pending event -> published */
        pub_check_lag(p);
        pub_wake_live_workers(p);
    }
    return rc;
}

/* A snapshot copy of pool's filter exact at its published sequence: one already taken, or a
 * free one filled now. -1 when every copy is being streamed. */
static int snapshot_copy(pub_t *p, uint32_t pool)
{
    kvr_relay_sh_t *sh = p->relay.sh;
    uint64_t seq = p->pool[pool].seq;

    KVR_DASSERT(pub_owns_relay(p));
    /* Our own stores (the only writer of the copies' headers): seq_cst as ever. */
    for (int k = 0; k < KVR_RELAY_SNAPSHOTS; k++)
        if (kvr_atomic_load_seq_cst(&sh->snap[k].valid) &&
            kvr_atomic_load_seq_cst(&sh->snap[k].generation) == p->generation &&
            kvr_atomic_load_seq_cst(&sh->snap[k].pool) == pool && kvr_atomic_load_seq_cst(&sh->snap[k].seq) == seq)
            return k;
    /* A copy nobody holds (refs counted here, privately) is read by no worker: the stores
     * below race with no reader. valid 1 last, release: pairs with a reader's acquire of it
     * before it reads the copy (core/relay.c). */
    for (int k = 0; k < KVR_RELAY_SNAPSHOTS; k++)
        if (p->refs[k] == 0) {
            kvr_atomic_store_seq_cst(&sh->snap[k].valid, 0);
            memcpy(p->relay.snap[k], kvr_relay_filter(&p->relay, pool), sh->bucket_count * 8);
            kvr_atomic_store_seq_cst(&sh->snap[k].pool, pool);
            kvr_atomic_store_seq_cst(&sh->snap[k].seq, seq);
            kvr_atomic_store_seq_cst(&sh->snap[k].generation, p->generation);
            kvr_atomic_store_release(&sh->snap[k].valid, 1);
            return k;
        }
    return -1;
}

/* Admits waiting subscribers at their pool's current sequence, sharing or taking snapshot
 * copies. */
static void admit_subscribers(pub_t *p)
{
    kvr_relay_sh_t *sh = p->relay.sh;
    int exact = -1; /* not yet known */
    uint32_t pool;

    KVR_DASSERT(pub_owns_relay(p));
    pub_reclaim_subscribers(p);
    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++) {
        kvr_relay_sub_t *s = &sh->sub[i];
        int use;

        if (kvr_atomic_load_seq_cst(&s->state) != KVR_SUB_REQUESTED) /* pairs with the worker's CAS */
            continue;
        /* the worker wrote generation and pool before its CAS to REQUESTED, seen above */
        if (s->generation != p->generation || (pool = s->pool) >= p->npools) {
            pub_close_sub(p, i, KVR_RELAY_REASON_PRODUCER_CHANGED);
            continue;
        }
        if (exact < 0) /* the copy must be exact at a published sequence: publish what is due */
            exact = p->pending == 0 ? 1 : publish(p) == KVR_OK;
        if (!exact)
            return;                                                /* out of memory: wait */
        KVR_DASSERT(kvr_ckf_dirty_count(&p->pool[pool].ckf) == 0); /* nothing pending: nothing dirty */
        if ((use = snapshot_copy(p, pool)) < 0)
            continue; /* every copy is being streamed: this one waits, another pool's may share one */
        /* Written before the CAS to LIVE, which publishes them to the worker (it reads them
         * after it sees LIVE, core/relay.c). */
        kvr_atomic_store_seq_cst(&s->snap_index, use);
        kvr_atomic_store_seq_cst(&s->snap_seq, p->pool[pool].seq);
        kvr_atomic_store_seq_cst(&s->cursor, p->pool[pool].seq + 1);
        if (pub_sub_cas(s, KVR_SUB_REQUESTED, KVR_SUB_LIVE)) { /* else it was just released */
            pub_take_ref(p, i, use);
            pub_wake_owner(p, kvr_atomic_load_seq_cst(&s->owner)); /* pairs with the claim CAS */
        }
    }
}

/* ------------------------------------------------------------------ generations */

static void new_generation(pub_t *p, const char *why)
{
    kvr_relay_sh_t *sh = p->relay.sh;
    size_t hashes;

    KVR_DASSERT(pub_is_me(p));
    /* Every pool made so far is rebuilt below; a pool that cannot be taken on (out of memory)
     * leaves resync set, and we exit after the rescan, outside the store lock. */
    p->resync = 0;
    pub_take_pools(p);
    /* The relay's generation: stored by the publishers (one at a time) and by the supervisor
     * before it forks the first; seq_cst as every store of the new generation below. */
    p->generation = kvr_atomic_load_seq_cst(&sh->generation) + 1;
    /* Old-generation streams end; new subscribers must present the new producer. The
     * references of streams still sending an old snapshot stay until they release. */
    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++)
        pub_close_sub(p, i, KVR_RELAY_REASON_PUBLICATION_UNAVAILABLE);
    /* seq_cst, as ever: the workers read these with acquire (published_seq, frame seq: a
     * reader of the old generation finds nothing to read) or seq_cst. */
    for (int k = 0; k < KVR_RELAY_SNAPSHOTS; k++)
        kvr_atomic_store_seq_cst(&sh->snap[k].valid, 0);
    for (uint32_t i = 0; i < p->npools; i++) {
        kvr_atomic_store_seq_cst(&sh->pool[i].published_seq, 0);
        for (int f = 0; f < KVR_RELAY_FRAMES; f++)
            kvr_atomic_store_seq_cst(&sh->pool[i].frame[f].seq, 0);
    }
    /* Every byte of the old generation is now below the tail: a reader still copying one
     * drops its copy at its re-check (kvr_relay_read_frame), as it would after a wrap. */
    kvr_atomic_store_seq_cst(&sh->ring_tail, kvr_atomic_load_seq_cst(&sh->ring_head));

    for (uint32_t i = 0; i < p->npools; i++) {
        pub_pool_t *pp = &p->pool[i];
        kvr_ckf_clear(&pp->ckf);
        pp->blocks = 0;
        kvr_owners_destroy(&pp->owners);
        kvr_owners_destroy(&pp->disk);
        if (kvr_owners_init(&pp->owners, 1024) != KVR_OK || kvr_owners_init(&pp->disk, 64) != KVR_OK) {
            kvr_error("publisher: out of memory for owner counting; exiting (a new publisher starts over)");
            _exit(71);
        }
    }
    memset(p->ann_live, 0, p->max_blocks);
    p->rebuilding = 1;
    kvr_store_resync(&p->store, scan_cb, p); /* takes on pools made since (apply_insert) */
    pub_ssd_rebuild(p);                      /* the disk tier's blocks own their hashes too */
    p->rebuilding = 0;
    if (p->resync) {
        kvr_error("publisher: out of memory rebuilding the filter; exiting (a new publisher starts over)");
        _exit(71);
    }
    hashes = 0;
    for (uint32_t i = 0; i < p->npools; i++) {
        kvr_ckf_dirty_reset(&p->pool[i].ckf); /* a new generation starts from a snapshot at 0 */
        p->pool[i].seq = 0;
        hashes += p->pool[i].owners.n;
    }
    mirror_blocks(p);
    p->pending = 0;
    p->retry_at_ns = 0;
    p->coalesce = 1; /* every subscriber was closed above */
    kvr_stat_set(p->store.my_stats, KVR_ST_RELAY_COALESCE, 1);
    /* The catalog rule (docs/concurrency.md, the relay status row): generation first, the revision
     * after, so a worker that loads the revision and then the generation (emit_catalog) never
     * sends a catalog older than its revision. seq_cst stores and RMW, as ever. */
    kvr_atomic_store_seq_cst(&sh->generation, p->generation);
    kvr_atomic_fetch_add_seq_cst(&sh->catalog_revision, 1);
    kvr_atomic_store_seq_cst(&sh->publisher_pid, (uint32_t)getpid()); /* status, and the owner check */
    kvr_stat_add(p->store.my_stats, KVR_ST_RELAY + KVR_RC_GENERATIONS, 1);
    pub_kvev_generation(p); /* the events' streams state the rebuilt owners (AllBlocksCleared first) */
    kvr_info("publisher: generation %llu (%s): %zu hashes in the filters of %u pools", (unsigned long long)p->generation,
             why, hashes, p->npools);
}

/* ------------------------------------------------------------------ main */

/* The subscriber slots are scanned (256 of them, twice) after a wake-up, but at most once per
 * SCAN_NS: a busy log wakes us thousands of times a second, and a request that arrives in
 * between waits at most that long (scan_due keeps the poll's timeout that short). Without
 * any wake-up they are scanned every SCAN_IDLE_NS, as the poll's longest timeout was. */
#define SCAN_NS      1000000ull
#define LINGER_NS    250000ull    /* at most --publication-delay */
#define SCAN_IDLE_NS 100000000ull /* without a wake-up: dead owners, finished snapshots */

static void scan_slots(pub_t *p)
{
    uint64_t now = kvr_clock_ns();

    if (now < p->scanned_ns + (p->scan_due ? SCAN_NS : SCAN_IDLE_NS))
        return;
    p->scan_due = 0;
    p->scanned_ns = now;
    admit_subscribers(p);
    pub_sample_lag(p); /* subscribers catch up between publications too */
}

/* Events queued in the change log; notes when the log was first seen non-empty. */
static uint64_t log_queued(pub_t *p, uint64_t now)
{
    uint64_t queued = kvr_chlog_count(p->store.log);

    if (queued > 0 && p->log_seen_ns == 0)
        p->log_seen_ns = p->unwoken_ns ? p->unwoken_ns : now;
    return queued;
}

/* Sleeps until a wake-up or the earliest of: a partial delta's --publication-delay, the end
 * of the linger on queued events, a delta's worth queued (at once), a due slot scan, and
 * while busy (the last turn consumed events) one delay from now.
 *
 * A sleep that ends within a delay is timed (kvr_chlog_set_timed): the workers' appends to the
 * empty log then write no eventfd, and the events wait for the timer, no longer than a delay
 * since they may have come (unwoken_ns, which log_seen_ns takes). Under a steady load that is
 * one wake-up per delay, each consuming and publishing what came, instead of one for the first
 * append after every consume plus the timers: on a small VM a wake-up costs 100-150 us of CPU
 * when the cores are busy (docs/concurrency.md, "Change log"). */
static void wait_for_work(pub_t *p)
{
    struct pollfd pfd[2] = {{p->wake_fd, POLLIN, 0}, {pub_kvev_fd(p), POLLIN, 0}};
    struct timespec timeout = {0, 100000000};
    uint64_t now = kvr_clock_ns(), queued = log_queued(p, now), due = UINT64_MAX, ns = 100000000ull;
    int timed;

    KVR_DASSERT(pub_is_me(p)); /* the change log's only consumer */
    if (p->pending > 0)
        due = p->first_pending_ns + pub_delay(p);
    if (queued > 0 && p->log_seen_ns + p->linger_ns < due)
        due = p->log_seen_ns + p->linger_ns;
    if (queued >= p->cfg->publication_threshold)
        due = now;
    if (p->busy && now + p->delay_ns < due)
        due = now + p->delay_ns;
    if (p->scan_due && p->scanned_ns + SCAN_NS < due)
        due = p->scanned_ns + SCAN_NS;
    if (p->replay_due)
        due = now; /* replay requests left waiting */
    if (pub_kvev_due(p) < due)
        due = pub_kvev_due(p); /* a pool's KV events have waited their interval */
    if (due != UINT64_MAX) {
        if (due < p->retry_at_ns)
            due = p->retry_at_ns;
        ns = due > now ? due - now : 0;
        if (ns < 100000000ull)
            timeout = (struct timespec){(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    }
    timed = ns <= p->delay_ns;
    kvr_chlog_set_timed(p->store.log, timed);
    if (timed) {
        if (p->unwoken_ns == 0)
            p->unwoken_ns = now;
    } else {
        uint64_t since = p->unwoken_ns;
        p->unwoken_ns = 0;
        if (queued == 0 && kvr_chlog_count(p->store.log) > 0) {
            p->unwoken_ns = since; /* appended while the flag was up: no wake-up is coming for */
            return;                /* it, and it may have come as early as that */
        }
    }
    /* the replay socket's ZMQ_FD says "look at the socket", not "a request is there"; its
     * service drains it every turn (publisher_turn) */
    if (ppoll(pfd, pfd[1].fd >= 0 ? 2 : 1, &timeout, NULL) > 0 && (pfd[0].revents & POLLIN)) {
        uint64_t v;
        (void)!read(p->wake_fd, &v, sizeof(v));
        p->scan_due = 1; /* perhaps a subscriber's request */
    }
}

/* Applies every queued event, one at a time as the reference producer: a boundary every
 * --publication-threshold events, whatever the batch the log handed over. Latency counts from
 * log_seen_ns: when we first saw the log non-empty after a wake-up, or, for events that came
 * unannounced during a timed sleep, when that sleep began (before any of them came). */
static void consume_log(pub_t *p, kvr_chlog_event_t *ev)
{
    size_t n;

    KVR_DASSERT(pub_is_me(p)); /* the change log's only consumer */
    p->busy = 0;
    while ((n = kvr_chlog_consume(p->store.log, ev, LOG_BATCH)) > 0) {
        p->busy = 1;
        kvr_seg_heartbeat(p->seg); /* a busy log keeps us here: still alive */
        for (size_t i = 0; i < n; i++) {
            if (p->pending == 0)
                p->first_pending_ns = p->log_seen_ns ? p->log_seen_ns : kvr_clock_ns();
            if (kvr_chlog_op(&ev[i]) == KVR_EV_INSERT)
                apply_insert(p, ev[i].entry, kvr_chlog_gen(&ev[i]), ev[i].canon, ev[i].pool);
            else
                apply_remove(p, ev[i].entry, kvr_chlog_gen(&ev[i]));
            if (++p->pending >= pub_threshold(p))
                publish(p);
        }
    }
    if (p->busy)
        mirror_blocks(p);
    p->log_seen_ns = 0;
    if (p->unwoken_ns != 0)
        p->unwoken_ns = kvr_clock_ns(); /* the log was empty here: what is queued came later */
}

/* One turn of the main loop. Appends wake us only when the log goes from empty to one event
 * while we are not in a timed sleep (wait_for_work); then we linger up to linger_ns without
 * consuming, so the log stays non-empty and the workers' appends write no eventfd. They do not
 * wake us when a delta's worth has come (wake batch 0): a timed sleep ends within a delay
 * anyway, and under load that wake-up came every 16 events, thousands of times a second at
 * 100-150 us of CPU each on a busy small VM, a sixth of the server's CPU at 16 KiB PUTs
 * (docs/concurrency.md, "Change log"). */
static void publisher_turn(pub_t *p, kvr_chlog_event_t *ev)
{
    uint64_t now, queued;

    kvr_seg_heartbeat(p->seg); /* the supervisor's watchdog */
    wait_for_work(p);
    p->replay_due = pub_kvev_service(p); /* the KV events' replay requests */
    /* acquire: pairs with the producer's release store of overflow (kvr_chlog_append_locked) */
    if (kvr_atomic_load_acquire(&p->store.log->overflow)) {
        kvr_warn("publisher: change log overflowed; rebuilding from the index");
        new_generation(p, "change-log overflow");
        p->log_seen_ns = 0;
    }
    pub_take_pools(p); /* a PUT made one: the catalog lists it before any block of it is published */
    now = kvr_clock_ns();
    queued = log_queued(p, now);
    if (queued > 0 && queued < p->cfg->publication_threshold && now < p->log_seen_ns + p->linger_ns) {
        scan_slots(p); /* a subscriber's wake-up: keep lingering */
        pub_kvev_flush_due(p, now);
        return;
    }
    consume_log(p, ev);
    pub_ssd_apply(p); /* the disk tier's slots that changed */
    if (p->resync) {
        kvr_error("publisher: out of memory in owner counting; rebuilding from the index");
        new_generation(p, "owner counting out of memory");
    }
    if (p->pending > 0 && kvr_clock_ns() >= p->first_pending_ns + pub_delay(p))
        publish(p);
    pub_kvev_flush_due(p, kvr_clock_ns());
    scan_slots(p);
}

void kvr_publisher_main(const kvr_config_t *cfg, kvr_seg_t *seg, int slot, const kvr_relay_fds_t *fds)
{
    static pub_t pub;
    pub_t *p = &pub;
    kvr_chlog_event_t *ev = malloc(sizeof(*ev) * LOG_BATCH);
    struct sigaction sa;
    sigset_t none;

    kvr_log_set_role("publisher");
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGPIPE, &sa, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    p->cfg = cfg;
    p->seg = seg;
    p->wake_fd = fds->publisher;
    p->delay_ns = cfg->publication_delay_us * 1000;
    p->linger_ns = p->delay_ns < LINGER_NS ? p->delay_ns : LINGER_NS;
    p->coalesce = 1;
    p->scan_due = 1;
    if (ev == NULL || kvr_seg_proc_claim_at(seg, slot, KVR_ROLE_PUBLISHER) < 0 ||
        kvr_store_open(&p->store, seg) != KVR_OK)
        _exit(70);
    kvr_relay_attach(&p->relay, seg, cfg, fds);
    p->max_blocks = seg->hdr->max_blocks;
    p->ann_gen = calloc(p->max_blocks, sizeof(uint32_t));
    p->ann_live = calloc(p->max_blocks, 1);
    p->ann_canon = calloc(p->max_blocks, sizeof(uint64_t));
    p->ann_pool = calloc(p->max_blocks, 1);
    if (p->ann_gen == NULL || p->ann_live == NULL || p->ann_canon == NULL || p->ann_pool == NULL)
        _exit(70);
    pub_rebuild_refs(p);
    if (pub_kvev_open(p) != KVR_OK) {
        kvr_error("publisher: the KV events cannot start (above); exiting");
        _exit(70);
    }
    if (pub_ssd_start(p) != KVR_OK)
        _exit(70);
    new_generation(p, "start");
    /* release: pairs with the supervisor's acquire load of ready (its watchdog) and with
     * kvr_seg_worker_load's (role was written before, at the claim) */
    kvr_atomic_store_release(&seg->procs[slot].ready, 1);
    /* seq_cst, as ever: read by the workers (kvr_seg_publisher_up) and the supervisor */
    kvr_atomic_store_seq_cst(&seg->hdr->ctl.publisher_running, 1);
    /* the catalog lists the pool only while a publisher runs: that changed too, after the
     * generation's bump (a worker that sent that revision without the pool sends again) */
    kvr_atomic_fetch_add_seq_cst(&p->relay.sh->catalog_revision, 1);

    kvr_chlog_set_wake_batch(p->store.log, 0); /* see publisher_turn */
    kvr_chlog_set_timed(p->store.log, 0);      /* a dead predecessor's flag */
    while (!pub_term)
        publisher_turn(p, ev);
    kvr_info("publisher: stopping");
    pub_ssd_stop(p); /* seals the open page: a clean stop */
    exit(0);
}
