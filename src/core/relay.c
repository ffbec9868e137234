/* relay.c — see relay.h, relay_int.h and shm/relay_sh.h. */
#include "core/relay_int.h"

#include "base/barrier.h"
#include "base/clock.h"
#include "base/dassert.h"
#include "base/log.h"
#include "wire/cbi1.h"
#include "wire/ckf.h"
#include "wire/identity.h"
#include "wire/relay_validate.h"

static_assert(KVR_RELAY_STREAM_TYPES == KVR_STREAM_TYPES, "relay.h: stream types of shm/relay_sh.h");

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

uint64_t kvr_relay_bucket_count(const kvr_config_t *cfg, uint64_t max_blocks)
{
    uint64_t n = cfg->expected_unique_blocks ? cfg->expected_unique_blocks : max_blocks;
    uint64_t b = kvr_ckf_bucket_count(n ? n : 1);
    return b > (1u << 24) ? (1u << 24) : b;
}

static void bind_regions(kvr_relay_t *r, kvr_seg_t *seg)
{
    kvr_seg_hdr_t *h = seg->hdr;

    r->seg = seg;
    r->sh = kvr_seg_at(seg, h->off_relay);
    r->filters = kvr_seg_at(seg, h->off_filter);
    r->filter_words = KVR_ALIGN_UP(h->ckf_buckets * 8, 4096) / 8;
    for (int i = 0; i < KVR_RELAY_SNAPSHOTS; i++)
        r->snap[i] = kvr_seg_at(seg, h->off_snap + (uint64_t)i * KVR_ALIGN_UP(h->ckf_buckets * 8, 4096));
    r->ring = kvr_seg_at(seg, h->off_ring);
}

/* "ns/component/endpoint" -> its three parts (pointers into s). */
static int split_endpoint(const char *s, kvr_bytes_t parts[3])
{
    const char *p = s;
    for (int i = 0; i < 3; i++) {
        const char *slash = i < 2 ? strchr(p, '/') : p + strlen(p);
        if (slash == NULL || slash == p)
            return KVR_EINVAL;
        parts[i].ptr = p;
        parts[i].len = (size_t)(slash - p);
        p = slash + 1;
    }
    return KVR_OK;
}

int kvr_relay_pool_endpoint(const kvr_config_t *cfg, const char *ns_name, char ns[KVR_ENDPOINT_NS_MAX],
                            char component[KVR_CFG_STR_MAX], char endpoint[KVR_CFG_STR_MAX])
{
    kvr_bytes_t parts[3];

    /* each part is shorter than --endpoint (< KVR_CFG_STR_MAX) and ns_name is a namespace name
     * (<= KVR_NS_NAME_MAX): nothing is cut */
    if (split_endpoint(cfg->endpoint, parts) != KVR_OK || strlen(ns_name) > KVR_NS_NAME_MAX)
        return KVR_EINVAL;
    if (ns_name[0] == '\0' || strcmp(ns_name, "default") == 0)
        snprintf(ns, KVR_ENDPOINT_NS_MAX, "%.*s", (int)parts[0].len, parts[0].ptr);
    else
        snprintf(ns, KVR_ENDPOINT_NS_MAX, "%.*s.%s", (int)parts[0].len, parts[0].ptr, ns_name);
    snprintf(component, KVR_CFG_STR_MAX, "%.*s", (int)parts[1].len, parts[1].ptr);
    snprintf(endpoint, KVR_CFG_STR_MAX, "%.*s", (int)parts[2].len, parts[2].ptr);
    return KVR_OK;
}

void kvr_relay_take_pool(kvr_relay_t *r, uint32_t i, const char *ns_name, const char *model)
{
    kvr_relay_pool_t *p = &r->sh->pool[i];
    const kvr_config_t *cfg = r->cfg;
    char ns[KVR_ENDPOINT_NS_MAX], comp[KVR_CFG_STR_MAX], ep[KVR_CFG_STR_MAX];
    kvr_bytes_t m = {model, strlen(model)}, pn, pc, pe;

    KVR_DASSERT(i < r->sh->npools);
    kvr_identity_cache_default(&m, 1, (uint32_t)cfg->kv_block_size, !strcmp(cfg->hash_format, "eagle") ? 2 : 1,
                               p->cache_digest);
    if (kvr_relay_pool_endpoint(cfg, ns_name, ns, comp, ep) != KVR_OK)
        ns[0] = comp[0] = ep[0] = '\0'; /* --endpoint was checked at the start, the name is one: never */
    pn = (kvr_bytes_t){ns, strlen(ns)};
    pc = (kvr_bytes_t){comp, strlen(comp)};
    pe = (kvr_bytes_t){ep, strlen(ep)};
    kvr_identity_routing_default(pn, pc, pe, p->routing_digest);
}

void kvr_relay_set_pools_ready(kvr_relay_t *r, uint32_t n)
{
    /* release: the identities written before (kvr_relay_take_pool) are visible to a reader
     * that loads the count with acquire (kvr_relay_pools_ready) */
    kvr_atomic_store_release(&r->sh->pools_ready, n);
}

uint32_t kvr_relay_pools_ready(const kvr_relay_t *r)
{
    return (uint32_t)kvr_atomic_load_acquire(&r->sh->pools_ready);
}

int kvr_relay_format(kvr_relay_t *r, kvr_seg_t *seg, const kvr_config_t *cfg)
{
    kvr_relay_sh_t *sh;
    kvr_bytes_t parts[3], dc;
    uint64_t inc = 0;

    KVR_DASSERT(kvr_seg_am_supervisor(seg)); /* before the first fork: nobody else maps it */
    bind_regions(r, seg);
    r->cfg = cfg;
    sh = r->sh;
    memset(sh, 0, sizeof(*sh));
    if (getrandom(&inc, sizeof(inc), 0) != sizeof(inc))
        inc = kvr_clock_ns() ^ ((uint64_t)getpid() << 32);
    inc &= 0x7FFFFFFFFFFFFFFFull;
    sh->incarnation = inc ? inc : 1;
    sh->seed = KVR_CKF_DEFAULT_SEED;
    sh->bucket_count = seg->hdr->ckf_buckets;
    sh->npools = seg->hdr->relay_pools;
    if (split_endpoint(cfg->endpoint, parts) != KVR_OK) {
        kvr_error("relay: --endpoint must be namespace/component/endpoint, got '%s'", cfg->endpoint);
        return KVR_EINVAL;
    }
    dc.ptr = cfg->dc_id;
    dc.len = strlen(cfg->dc_id);
    sh->dc_id = kvr_identity_dc_id(dc);
    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++)
        kvr_atomic_store_relaxed(&sh->sub[i].state, KVR_SUB_FREE); /* before any fork */
    /* The publisher empties each pool's filter when it takes the pool on (take_pools); only
     * pool 0's is read before that (/debug/filter), so only it is emptied here: touching every
     * filter of --max-pools at start would cost their memory for pools never made. */
    memset(r->filters, 0, r->filter_words * 8);
    kvr_info("relay: up to %u pools of %llu buckets, incarnation %016llx, dc_id %016llx", sh->npools,
             (unsigned long long)sh->bucket_count, (unsigned long long)sh->incarnation,
             (unsigned long long)sh->dc_id);
    return KVR_OK;
}

void kvr_relay_attach(kvr_relay_t *r, kvr_seg_t *seg, const kvr_config_t *cfg, const kvr_relay_fds_t *fds)
{
    bind_regions(r, seg);
    r->cfg = cfg;
    r->fds = fds;
}

void kvr_relay_wake(int fd)
{
    uint64_t one = 1;
    if (fd >= 0)
        (void)!write(fd, &one, sizeof(one));
}

/* ------------------------------------------------------------------ admission */

int kvr_relay_admit(kvr_relay_t *r, int type, int slot, uint32_t limit)
{
    _Atomic uint32_t *a = &r->sh->active[type];
    uint32_t cur = kvr_atomic_load_relaxed(a); /* a first guess: the CAS checks it */

    KVR_DASSERT(slot == r->seg->slot && type >= 0 && type < KVR_STREAM_TYPES); /* our own share */
    /* The admission counts are seq_cst RMWs (docs/concurrency.md): the CAS orders against
     * the other workers' CASes and fetch_subs on the same count, so it never passes the
     * limit; the per-process share orders against the supervisor's exchange of it in
     * kvr_relay_release_all, so a dead worker's permits are given back exactly once. */
    do {
        if (cur >= limit)
            return 0;
    } while (!kvr_atomic_cas_seq_cst(a, &cur, cur + 1));
    kvr_atomic_fetch_add_seq_cst(&r->sh->per_proc[slot][type], 1);
    return 1;
}

void kvr_relay_release(kvr_relay_t *r, int type, int slot)
{
    KVR_DASSERT(slot == r->seg->slot && type >= 0 && type < KVR_STREAM_TYPES);
    /* seq_cst RMWs, as in kvr_relay_admit: our share first, so that the supervisor's
     * exchange never gives back a permit that we gave back already */
    kvr_atomic_fetch_sub_seq_cst(&r->sh->per_proc[slot][type], 1);
    kvr_atomic_fetch_sub_seq_cst(&r->sh->active[type], 1);
}

void kvr_relay_release_all(kvr_relay_t *r, int slot)
{
    KVR_DASSERT(kvr_seg_am_supervisor(r->seg) && slot > 0 && slot < KVR_MAX_PROCS); /* a dead child's */
    for (int t = 0; t < KVR_STREAM_TYPES; t++) {
        /* seq_cst RMWs: against the dead worker's last fetch_add/fetch_sub of its share
         * (kvr_relay_admit, kvr_relay_release) and the other workers' CASes on the count */
        uint32_t n = kvr_atomic_exchange_seq_cst(&r->sh->per_proc[slot][t], 0);
        if (n)
            kvr_atomic_fetch_sub_seq_cst(&r->sh->active[t], n);
    }
}

/* ------------------------------------------------------------------ subscribers */

/* ------------------------------------------------------------------ status */

void kvr_relay_status(const kvr_seg_t *seg, kvr_relay_status_t *st)
{
    const kvr_relay_sh_t *sh;

    memset(st, 0, sizeof(*st));
    if (seg->hdr->ckf_buckets == 0)
        return;
    sh = kvr_seg_at(seg, seg->hdr->off_relay);
    /* A status for /debug/relay and /metrics: relaxed loads of independent values (the
     * identity below is immutable after the fork); a reader may see one event late. */
    st->generation = kvr_atomic_load_relaxed(&sh->generation);
    st->pools = (uint32_t)kvr_atomic_load_relaxed(&sh->pools_ready);
    for (uint32_t i = 0; i < st->pools && i < KVR_POOLS_MAX; i++)
        st->published_seq += kvr_atomic_load_relaxed(&sh->pool[i].published_seq);
    st->catalog_revision = kvr_atomic_load_relaxed(&sh->catalog_revision);
    st->bucket_count = sh->bucket_count;
    st->seed = sh->seed;
    st->dc_id = sh->dc_id;
    st->incarnation = sh->incarnation;
    st->publisher_pid = kvr_atomic_load_relaxed(&sh->publisher_pid);
    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++)
        st->live_subscribers += kvr_atomic_load_relaxed(&sh->sub[i].state) == KVR_SUB_LIVE;
    for (int t = 0; t < KVR_STREAM_TYPES; t++)
        st->active[t] = kvr_atomic_load_relaxed(&sh->active[t]);
}

uint64_t kvr_relay_generation(const kvr_relay_t *r)
{
    /* seq_cst: against the publisher's seq_cst store of it (new_generation) and, with the
     * revision below, the catalog rule of docs/concurrency.md (emit_catalog loads the
     * revision first, the generation after) */
    return kvr_atomic_load_seq_cst(&r->sh->generation);
}

uint64_t kvr_relay_catalog_revision(const kvr_relay_t *r)
{
    /* seq_cst: against the publisher's and the supervisor's seq_cst fetch_adds, made after
     * the generation or publisher_running they cover (the catalog rule) */
    return kvr_atomic_load_seq_cst(&r->sh->catalog_revision);
}

uint64_t kvr_relay_incarnation(const kvr_relay_t *r)
{
    return r->sh->incarnation;
}

uint64_t kvr_relay_buckets(const kvr_relay_t *r)
{
    return r->sh->bucket_count;
}

uint64_t kvr_relay_pool_blocks(const kvr_relay_t *r, uint32_t pool)
{
    return kvr_atomic_load_relaxed(&r->sh->pool[pool].blocks); /* the publisher's relaxed gauge */
}

uint64_t kvr_relay_filter_word(const kvr_relay_t *r, uint32_t pool, uint64_t i)
{
    return kvr_atomic_load_relaxed(&kvr_relay_filter(r, pool)[i]); /* the publisher's relaxed stores (wire/ckf.c) */
}

int kvr_relay_present(const kvr_relay_t *r)
{
    return r != NULL && r->sh != NULL;
}

int kvr_relay_pool_find(const kvr_relay_t *r, const Dynamo__Kvrelay__V1__KvPoolId *want)
{
    const kvr_relay_sh_t *sh = r->sh;
    const Dynamo__Kvrelay__V1__DigestIdentity *c = want->indexer_domain->cache_semantics;
    const Dynamo__Kvrelay__V1__DigestIdentity *rt = want->indexer_domain->routing_scope;
    uint32_t n = kvr_relay_pools_ready(r);
    kvr_relay_ident_t id;

    kvr_relay_ident(r, 0, 0, &id); /* the sources, the same for every pool */
    if (want->dc_id != sh->dc_id || c->digest.len != 16 || rt->digest.len != 16 || c->source != id.cache.source ||
        rt->source != id.routing.source)
        return -1;
    for (uint32_t i = 0; i < n; i++)
        if (memcmp(c->digest.data, sh->pool[i].cache_digest, 16) == 0 &&
            memcmp(rt->digest.data, sh->pool[i].routing_digest, 16) == 0)
            return (int)i;
    return -1;
}

/* ------------------------------------------------------------------ subscribers */

/* The worker's CAS for a transition it owns; 0 when the slot was not in `from`. seq_cst:
 * against the publisher's CASes of the same state (publisher_subs.c), so that each
 * transition is taken from the state its taker saw, and every field written before the CAS
 * is visible to whoever sees the new state. */
static int sub_move(kvr_relay_sub_t *s, uint32_t from, uint32_t to)
{
    return kvr_atomic_cas_seq_cst(&s->state, &from, to);
}

/* Debug check of the worker's side: the slot is ours (its owner word names this process). */
KVR_DASSERT_FN static int sub_mine(const kvr_relay_t *r, int idx)
{
    uint64_t w;

    if (idx < 0 || idx >= KVR_RELAY_MAX_SUBS)
        return 0;
    w = kvr_atomic_load_relaxed(&r->sh->sub[idx].owner); /* our own store, until we release */
    return KVR_SUB_OWNER_PID(w) == (int32_t)getpid() && KVR_SUB_OWNER_SLOT(w) == r->seg->slot;
}

int kvr_relay_sub_open(kvr_relay_t *r, int owner_slot, uint64_t generation, uint32_t pool)
{
    uint64_t me = KVR_SUB_OWNER(getpid(), owner_slot);

    KVR_DASSERT(owner_slot == r->seg->slot); /* a worker claims for itself */
    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++) {
        kvr_relay_sub_t *s = &r->sh->sub[i];
        uint64_t nobody = 0;
        /* The relaxed load skips taken slots cheaply; the claim is the CAS, seq_cst against
         * the other workers' claims and the publisher's seq_cst clear of `owner` after it
         * freed the slot (publisher_subs.c), which our state CAS below then finds FREE. */
        if (kvr_atomic_load_relaxed(&s->owner) != 0 || !kvr_atomic_cas_seq_cst(&s->owner, &nobody, me))
            continue;
        /* The publisher frees a slot (state FREE) before it clears `owner`, so a slot we
         * own is FREE; if not, the protocol was broken: leave the slot to the publisher. */
        if (!sub_move(s, KVR_SUB_FREE, KVR_SUB_CLAIMED)) {
            kvr_error("relay: subscriber slot %d owned by nobody but not free", i);
            kvr_atomic_store_seq_cst(&s->owner, 0); /* as the publisher clears it: before a new claim */
            continue;
        }
        /* The slot's fields, ours while CLAIMED: relaxed, published to the publisher by the
         * seq_cst CAS to REQUESTED below (a release, which its CAS or load of state acquires). */
        s->generation = generation;
        s->pool = pool;
        kvr_atomic_store_relaxed(&s->close_reason, 0);
        kvr_atomic_store_relaxed(&s->snap_seq, 0);
        kvr_atomic_store_relaxed(&s->snap_index, -1);
        kvr_atomic_store_relaxed(&s->snap_done, 0);
        kvr_atomic_store_relaxed(&s->cursor, 0);
        if (!sub_move(s, KVR_SUB_CLAIMED, KVR_SUB_REQUESTED))
            return -1; /* only the publisher's dead-owner repair moves a CLAIMED slot: not us */
        if (r->fds != NULL)
            kvr_relay_wake(r->fds->publisher);
        return i;
    }
    return -1;
}

kvr_relay_poll_t kvr_relay_sub_poll(kvr_relay_t *r, int idx, kvr_relay_sub_view_t *v)
{
    kvr_relay_sub_t *s = &r->sh->sub[idx];
    uint32_t st;

    KVR_DASSERT(sub_mine(r, idx));
    /* seq_cst: against the publisher's CAS to LIVE or CLOSED (publisher_subs.c); what it
     * wrote before the CAS (close_reason, snap_seq, snap_index, cursor) is visible after */
    st = kvr_atomic_load_seq_cst(&s->state);
    memset(v, 0, sizeof(*v));
    if (st == KVR_SUB_CLOSED) {
        v->reason = (int)kvr_atomic_load_relaxed(&s->close_reason); /* published by the CAS */
        return KVR_SUBP_CLOSED;
    }
    /* seq_cst: against the publisher's seq_cst store of a new generation (new_generation) */
    if (kvr_atomic_load_seq_cst(&r->sh->generation) != s->generation)
        return KVR_SUBP_RETIRED;
    if (st != KVR_SUB_LIVE)
        return KVR_SUBP_WAITING;
    /* snap_seq and snap_index were written before the CAS to LIVE, which the load of
     * state above synchronised with */
    v->snap_seq = kvr_atomic_load_relaxed(&s->snap_seq);
    v->chunk_count = kvr_cbi1_chunk_count(r->sh->bucket_count);
    return KVR_SUBP_LIVE;
}

size_t kvr_relay_sub_chunk(kvr_relay_t *r, int idx, uint32_t chunk, uint8_t *dst, size_t cap)
{
    kvr_relay_sub_t *s = &r->sh->sub[idx];
    size_t len;

    KVR_DASSERT(sub_mine(r, idx));
    /* The copy stays ours while the slot is not RELEASING: the publisher drops its
     * reference only after snap_done or once we released the slot. snap_index and snap_seq:
     * relaxed, published by the CAS to LIVE that kvr_relay_sub_poll saw. */
    len = kvr_relay_snapshot_chunk(r, kvr_atomic_load_relaxed(&s->snap_index), s->pool, s->generation,
                                   kvr_atomic_load_relaxed(&s->snap_seq), chunk, dst, cap);
    if (len > 0 && chunk + 1 == kvr_cbi1_chunk_count(r->sh->bucket_count)) {
        /* release: our reads of the copy come before the publisher, which acquires
         * snap_done, drops its reference and may overwrite the copy */
        kvr_atomic_store_release(&s->snap_done, 1);
        if (r->fds != NULL)
            kvr_relay_wake(r->fds->publisher);
    }
    return len;
}

ssize_t kvr_relay_sub_next_frame(kvr_relay_t *r, int idx, uint8_t *dst, size_t cap, uint64_t *seq)
{
    kvr_relay_sub_t *s = &r->sh->sub[idx];
    uint64_t c;
    ssize_t n;

    KVR_DASSERT(sub_mine(r, idx));
    /* relaxed: ours since the publisher's admission, published to us by its CAS to LIVE */
    c = kvr_atomic_load_relaxed(&s->cursor);
    n = kvr_relay_read_frame(r, s->pool, s->generation, c, dst, cap);
    if (n > 0) {
        *seq = c;
        /* release: the publisher's lag check reads the cursor to count our queue */
        kvr_atomic_store_release(&s->cursor, c + 1);
    }
    return n;
}

int kvr_relay_sub_pending(const kvr_relay_t *r, int idx)
{
    KVR_DASSERT(sub_mine(r, idx));
    /* a hint for when to read next: acquire pairs with the publisher's release store of
     * published_seq (put_frame); the cursor is our own */
    const kvr_relay_sub_t *s = &r->sh->sub[idx];

    return kvr_atomic_load_acquire(&r->sh->pool[s->pool].published_seq) >= kvr_atomic_load_relaxed(&s->cursor);
}

void kvr_relay_sub_close(kvr_relay_t *r, int idx)
{
    kvr_relay_sub_t *s = &r->sh->sub[idx];
    uint32_t st;

    KVR_DASSERT(sub_mine(r, idx));
    st = kvr_atomic_load_seq_cst(&s->state); /* as sub_move: against the publisher's CASes */
    /* Every state a stream can leave the slot in; the publisher may move it between our
     * load and the CAS (REQUESTED -> LIVE -> CLOSED), so retry from what we saw. The CAS is
     * seq_cst against the publisher's (publisher_subs.c), as sub_move's. */
    while (st == KVR_SUB_REQUESTED || st == KVR_SUB_LIVE || st == KVR_SUB_CLOSED) {
        if (kvr_atomic_cas_seq_cst(&s->state, &st, KVR_SUB_RELEASING))
            break;
    }
    if (r->fds != NULL)
        kvr_relay_wake(r->fds->publisher);
}

/* ------------------------------------------------------------------ the frame ring
 *
 * One writer (the publisher, kvr_relay_put_frame) and any number of readers (workers,
 * kvr_relay_read_frame) that never write; docs/concurrency.md, "The relay ring and its
 * frames", has the protocol and why each ordering is needed. In short, two seqlocks:
 *
 *   the index entry frame[seq % 64]: `seq` is its sequence count, 0 (never a delta's
 *   sequence) the "being written" mark that an odd count is in a classic seqlock;
 *   the ring bytes: `ring_tail`, the cumulative offset below which bytes may be gone, only
 *   grows (a new generation moves it to ring_head, which never goes back).
 *
 * A reader acquires seq, copies, fences, re-checks both: anything it copied from a write
 * that started after its first load shows as a moved seq or tail, and the copy is dropped.
 */

/* Places len bytes at the ring head, never wrapping a frame; returns its cumulative offset. */
static uint64_t ring_reserve(kvr_relay_sh_t *sh, size_t len)
{
    uint64_t head = kvr_atomic_load_seq_cst(&sh->ring_head), pos; /* our own store: one writer */
    uint64_t tail = kvr_atomic_load_relaxed(&sh->ring_tail);      /* ours too */

    pos = head % KVR_RELAY_RING_BYTES;
    if (pos + len > KVR_RELAY_RING_BYTES)
        head += KVR_RELAY_RING_BYTES - pos; /* skip the tail end */
    /* Everything below head + len - RING is about to be overwritten: readers must see that
     * first. The release store publishes the new tail; it pairs with the workers' load of
     * ring_tail after their copy and acquire fence (kvr_relay_read_frame). The tail never
     * goes back: a new generation moved it up to ring_head, past every old byte. */
    if (head + len > KVR_RELAY_RING_BYTES && head + len - KVR_RELAY_RING_BYTES > tail)
        kvr_atomic_store_release(&sh->ring_tail, head + len - KVR_RELAY_RING_BYTES);
    /* The full fence orders that tail store before every later store of ours: the frame's
     * bytes (memcpy into the ring in kvr_relay_put_frame) and ring_head. A release store
     * alone orders only what comes before it, so without the fence the new bytes could be
     * visible before the tail that says the old ones are gone. It pairs with the reader's
     * acquire fence: a reader that copied an overwritten byte then sees the new tail. */
    kvr_atomic_fence_seq_cst();
    kvr_atomic_store_seq_cst(&sh->ring_head, head + len); /* read only by us: pairs with nothing */
    return head;
}

void kvr_relay_put_frame(kvr_relay_t *r, uint32_t pool, uint64_t seq, const uint8_t *msg, size_t len,
                         size_t payload_len)
{
    kvr_relay_sh_t *sh = r->sh;
    kvr_relay_pool_t *p = &sh->pool[pool];
    kvr_relay_frame_t *f = &p->frame[seq % KVR_RELAY_FRAMES], *prev = &p->frame[(seq - 1) % KVR_RELAY_FRAMES];
    uint64_t off, queue;

    /* the publisher that started the generation; sequences count from 1 */
    KVR_DASSERT(kvr_atomic_load_relaxed(&sh->publisher_pid) == (uint32_t)getpid() && seq != 0 &&
                len <= KVR_RELAY_RING_BYTES);
    off = ring_reserve(sh, len);
    /* The old occupant (seq - 64) is going: mark the entry "being written" (0) before any
     * of it changes. The release fence orders that 0 before every store below (bytes and
     * fields): it pairs with the reader's acquire fence, so a reader that copied a new
     * value sees seq moved when it re-checks. */
    kvr_atomic_store_relaxed(&f->seq, 0);
    kvr_atomic_fence_release();
    memcpy(r->ring + off % KVR_RELAY_RING_BYTES, msg, len);
    /* queue_cum is ours alone (the lag check); prev->seq is our own store */
    queue = seq > 1 && kvr_atomic_load_relaxed(&prev->seq) == seq - 1 ? prev->queue_cum : 0;
    f->queue_cum = queue + payload_len + KVR_RELAY_FRAME_OVERHEAD;
    kvr_atomic_store_relaxed(&f->cum_off, off);
    kvr_atomic_store_relaxed(&f->len, (uint32_t)len);
    /* Pairs with the reader's acquire load of f->seq: the fields and bytes above are visible
     * to a reader that sees seq. */
    kvr_atomic_store_release(&f->seq, seq);
    /* Pairs with the reader's acquire load of published_seq: the frame and its index entry
     * are visible to a reader that sees seq published. */
    kvr_atomic_store_release(&p->published_seq, seq);
}

ssize_t kvr_relay_read_frame(kvr_relay_t *r, uint32_t pool, uint64_t generation, uint64_t seq, uint8_t *dst,
                             size_t cap)
{
    kvr_relay_sh_t *sh = r->sh;
    kvr_relay_pool_t *p = &sh->pool[pool];
    kvr_relay_frame_t *f = &p->frame[seq % KVR_RELAY_FRAMES];
    uint64_t off, len, pos;

    if (seq == 0)
        return -1; /* never a delta: 0 is the entry's "being written" mark */
    /* The generation first: a new one counts from sequence 1 again, so an entry may hold the
     * same seq twice, but never in the same generation. acquire: pairs with the publisher's
     * seq_cst store of it (new_generation), made before any frame of that generation. */
    if (kvr_atomic_load_acquire(&sh->generation) != generation)
        return 0; /* retired: the caller's next poll ends the stream with the reason */
    if (kvr_atomic_load_acquire(&p->published_seq) < seq)
        return 0;
    /* acquire: pairs with put_frame's release store of seq; the fields are this frame's */
    if (kvr_atomic_load_acquire(&f->seq) != seq)
        return -1;
    off = kvr_atomic_load_relaxed(&f->cum_off);
    len = kvr_atomic_load_relaxed(&f->len);
    if (len > cap)
        return -1;
    pos = off % KVR_RELAY_RING_BYTES;
    if (pos + len > KVR_RELAY_RING_BYTES)
        return -1; /* frames never wrap (the publisher skips the tail); a torn index entry */
    /* Plain bytes, as any seqlock's payload: they may be overwritten while we copy, and the
     * checks below decide whether the copy is used at all. */
    memcpy(dst, r->ring + pos, len);
    /* The acquire fence orders the copy and the field loads above before the re-checks
     * below (an acquire load orders only what follows it). It pairs with the publisher's
     * release fence after its 0 in seq and its seq_cst fence after the new ring_tail: if we
     * read anything a later write stored, the re-check sees that write's mark. */
    kvr_atomic_fence_acquire();
    if (kvr_atomic_load_relaxed(&sh->generation) != generation)
        return 0; /* retired meanwhile, as above */
    if (kvr_atomic_load_relaxed(&sh->ring_tail) > off || kvr_atomic_load_relaxed(&f->seq) != seq)
        return -1; /* overwritten while we copied: the subscriber lagged */
    return (ssize_t)len;
}

/* ------------------------------------------------------------------ messages */

void kvr_relay_ident(const kvr_relay_t *r, uint32_t pool, uint64_t generation, kvr_relay_ident_t *id)
{
    const kvr_relay_sh_t *sh = r->sh;
    const kvr_relay_pool_t *p = &sh->pool[pool];

    dynamo__kvrelay__v1__digest_identity__init(&id->cache);
    id->cache.digest.data = (uint8_t *)p->cache_digest;
    id->cache.digest.len = 16;
    id->cache.source = DYNAMO__KVRELAY__V1__IDENTITY_SOURCE__IDENTITY_SOURCE_DEFAULT_DERIVED;
    dynamo__kvrelay__v1__digest_identity__init(&id->routing);
    id->routing.digest.data = (uint8_t *)p->routing_digest;
    id->routing.digest.len = 16;
    id->routing.source = DYNAMO__KVRELAY__V1__IDENTITY_SOURCE__IDENTITY_SOURCE_DEFAULT_DERIVED;
    dynamo__kvrelay__v1__indexer_domain_id__init(&id->domain);
    id->domain.cache_semantics = &id->cache;
    id->domain.routing_scope = &id->routing;
    dynamo__kvrelay__v1__kv_pool_id__init(&id->pool);
    id->pool.identity_version = KVR_RELAY_POOL_IDENTITY_VERSION;
    id->pool.indexer_domain = &id->domain;
    id->pool.dc_id = sh->dc_id;
    dynamo__kvrelay__v1__ckf_format__init(&id->format);
    id->format.format_version = 1;
    id->format.seed = sh->seed;
    id->format.bucket_count = sh->bucket_count;
    id->format.fingerprint_bits = 16;
    id->format.slots_per_bucket = 4;
    dynamo__kvrelay__v1__producer_identity__init(&id->producer);
    id->producer.pool_id = &id->pool;
    id->producer.producer_incarnation = sh->incarnation;
    id->producer.layout_generation = generation;
    id->producer.ckf_format = &id->format;
    dynamo__kvrelay__v1__relay_identity__init(&id->relay);
    id->relay.drt_instance_id = 0;
    id->relay.relay_incarnation = sh->incarnation;
}

size_t kvr_relay_filter_update(const kvr_relay_t *r, uint32_t pool, uint64_t generation, uint64_t base_seq,
                               uint64_t seq, int kind, size_t payload_len, uint8_t *dst, size_t cap, uint8_t **payload)
{
    kvr_relay_ident_t id;
    kvr_wire_filter_update_t u;

    kvr_relay_ident(r, pool, generation, &id);
    u.relay = &id.relay;
    u.producer = &id.producer;
    u.base_seq = base_seq;
    u.seq = seq;
    u.send_ts_us = kvr_clock_wall_us();
    u.kind = kind;
    return kvr_wire_filter_update(&u, payload_len, dst, cap, payload);
}

size_t kvr_relay_chunk_msg_max(const kvr_relay_t *r)
{
    return kvr_cbi1_chunk_size(r->sh->bucket_count, 0) + KVR_RELAY_ENVELOPE_MAX;
}

size_t kvr_relay_snapshot_chunk(const kvr_relay_t *r, int k, uint32_t pool, uint64_t generation, uint64_t seq,
                                uint32_t chunk, uint8_t *dst, size_t cap)
{
    const kvr_relay_sh_t *sh = r->sh;
    size_t plen = kvr_cbi1_chunk_size(sh->bucket_count, chunk), len;
    kvr_cbi1_hdr_t hdr = {sh->seed, sh->bucket_count, sh->dc_id, seq};
    uint8_t *payload;

    if (plen == 0 || k < 0 || k >= KVR_RELAY_SNAPSHOTS)
        return 0;
    len = kvr_relay_filter_update(r, pool, generation, seq, seq, DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_SNAPSHOT_CHUNK,
                                  plen, dst, cap, &payload);
    if (len == 0 || kvr_cbi1_encode_chunk(payload, plen, &hdr, r->snap[k], chunk) == NULL)
        return 0;
    return len;
}
