/*
 * publisher_ssd.c — the disk tier in the publisher (docs/ssd-tier.md, "Routers, events,
 * tenants"): its disk writer thread, and the blocks on disk counted as owners of their canonical
 * hashes, so that a block evicted from RAM but kept on disk stays in the relay's filter and
 * leaves it only when neither tier holds it.
 *
 * The writer marks the disk index's slots that change; here each marked slot is read (a
 * lock-free peek) and compared with what this process last counted for it: an owner leaves
 * for what it held, one comes for what it holds now. A slot peeked mid-change is marked again
 * by the writer after the change, so the count converges on the index.
 */
#include "proc/publisher_int.h"

#include "base/clock.h"
#include "base/log.h"
#include "proc/ssdwriter.h"

#include <stdlib.h>
#include <time.h>

#define DIRTY_BATCH 4096

struct pub_ssd {
    kvr_ssdw_t *w;
    uint64_t nslots;
    uint8_t *live;   /* per slot: counted as an owner */
    uint8_t *pool;   /* of which pool */
    uint64_t *canon; /* of which hash */
    uint32_t ids[DIRTY_BATCH];
};

int pub_ssd_start(pub_t *p)
{
    const kvr_config_t *cfg = p->cfg;
    struct pub_ssd *d;
    kvr_ssdw_config_t sc = {.path = cfg->ssd_path, .size = cfg->ssd_size, .page_size = cfg->ssd_page_size, .window = cfg->ssd_window, .batch = 16, .interval_ms = 10, .sync_ms = (unsigned)cfg->ssd_sync_interval_ms, .wake_fd = p->wake_fd};

    if (cfg->ssd_path[0] == '\0')
        return KVR_OK;
    if ((d = calloc(1, sizeof(*d))) == NULL)
        return KVR_ERR;
    d->nslots = p->seg->hdr->ssd_slots;
    d->live = calloc(d->nslots, 1);
    d->pool = calloc(d->nslots, 1);
    d->canon = calloc(d->nslots, sizeof(*d->canon));
    if (d->live == NULL || d->pool == NULL || d->canon == NULL || (d->w = kvr_ssdw_start(&sc, p->seg)) == NULL) {
        free(d->live);
        free(d->pool);
        free(d->canon);
        free(d);
        return KVR_ERR;
    }
    p->ssd = d;
    /* Ready only once the disk index is restored: until then every disk block would be a miss.
     * The watchdog sees a heartbeat meanwhile; a restore that fails is logged, and the server
     * goes on without the tier's old blocks (the index stays empty). */
    while (kvr_ssdw_state(d->w) == 0 && !pub_term) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        kvr_seg_heartbeat(p->seg);
        nanosleep(&ts, NULL);
    }
    return KVR_OK;
}

/* One slot's owner count brought to what the index says now. */
static void apply_slot(pub_t *p, struct pub_ssd *d, uint32_t id)
{
    kvr_dslot_t s;
    int live = kvr_dindex_peek(&p->store.dx, id, &s) == 1;

    if (live && s.pool >= p->npools)
        pub_take_pools(p);
    if (live && s.pool >= p->npools)
        live = 0; /* never expected: a slot names no pool of the store's table */
    if (d->live[id] && (!live || s.canon != d->canon[id] || s.pool != d->pool[id])) {
        if (pub_owner_del(p, d->pool[id], d->canon[id], KVR_KVEV_DISK) == KVR_ERR)
            p->resync = 1;
        d->live[id] = 0;
    }
    if (live && !d->live[id]) {
        if (pub_owner_add(p, s.pool, s.canon, KVR_KVEV_DISK) == KVR_ERR)
            p->resync = 1;
        d->live[id] = 1;
        d->canon[id] = s.canon;
        d->pool[id] = s.pool;
    }
}

void pub_ssd_apply(pub_t *p)
{
    struct pub_ssd *d = p->ssd;
    kvr_ssdw_stats_t ws;
    size_t n;

    if (d == NULL)
        return;
    kvr_ssdw_stats(d->w, &ws); /* the writer's counts since it started, as ours (one writer per block) */
    kvr_stat_set(p->store.my_stats, KVR_ST_DISK_WRITES, ws.tier.demoted);
    kvr_stat_set(p->store.my_stats, KVR_ST_DISK_WRITE_BYTES, ws.tier.demoted_bytes);
    kvr_stat_set(p->store.my_stats, KVR_ST_DISK_WRITE_ERRORS, ws.write_errors);
    kvr_stat_set(p->store.my_stats, KVR_ST_DISK_EVICTIONS, ws.tier.recycled_slots);
    kvr_stat_set(p->store.my_stats, KVR_ST_DISK_QUOTA_EVICTIONS, ws.tier.quota_evicted);
    kvr_stat_set(p->store.my_stats, KVR_ST_DISK_QUOTA_REJECTS, ws.quota_rejects);
    kvr_stat_set(p->store.my_stats, KVR_ST_DISK_COMPACTED_PAGES, ws.tier.compacted_pages);
    kvr_stat_set(p->store.my_stats, KVR_ST_DISK_COMPACTED, ws.tier.compacted);
    kvr_stat_set(p->store.my_stats, KVR_ST_DISK_SYNCS, ws.syncs);
    for (unsigned i = 0; i < KVR_PUB_BUCKETS + 2; i++)
        kvr_stat_set(p->store.my_stats, KVR_ST_DISK_WRITE_HIST + i, ws.write_hist[i]);
    while ((n = kvr_ssdw_take_dirty(d->w, d->ids, DIRTY_BATCH)) > 0) {
        kvr_seg_heartbeat(p->seg);
        for (size_t i = 0; i < n; i++) {
            if (p->pending == 0)
                p->first_pending_ns = kvr_clock_ns();
            apply_slot(p, d, d->ids[i]);
            p->pending++;
        }
    }
}

void pub_ssd_rebuild(pub_t *p)
{
    struct pub_ssd *d = p->ssd;

    if (d == NULL)
        return;
    for (uint64_t i = 0; i < d->nslots; i++)
        if (d->live[i] && d->pool[i] < p->npools && pub_owner_add(p, d->pool[i], d->canon[i], KVR_KVEV_DISK) == KVR_ERR)
            p->resync = 1;
}

void pub_ssd_stop(pub_t *p)
{
    struct pub_ssd *d = p->ssd;

    if (d == NULL)
        return;
    kvr_ssdw_stop(d->w);
    free(d->live);
    free(d->pool);
    free(d->canon);
    free(d);
    p->ssd = NULL;
}
