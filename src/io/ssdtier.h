/*
 * ssdtier.h — the disk tier's engine, as its one writer drives it: the file, its pages and the
 * disk index together (docs/ssd-tier.md). Opening restores the index from the file; demoting
 * appends a block and indexes it; reaping turns workers' deletes into tombstones; recycling a
 * page drops its slots; reading checks a record against its slot and its checksum.
 *
 * Everything here runs in the disk writer, synchronously. Workers only look the index up and
 * read records (kvr_ssdt_read's checks are theirs to repeat on their own ring).
 */
#ifndef KVR_IO_SSDTIER_H
#define KVR_IO_SSDTIER_H

#include "io/ssdpages.h"
#include "shm/dindex.h"

/* Where a record's namespace is now (the tenants table may have changed since it was written):
 * KVR_OK with its id, seed and the pool of (namespace, model), or KVR_ENOTFOUND when the
 * namespace is gone or the pool cannot be made (the record is not restored). */
typedef int (*kvr_ssdt_resolve_fn)(void *ctx, const kvr_ssd_rec_t *rec, uint16_t *ns, uint64_t *seed, uint8_t *pool);

typedef struct {
    uint64_t restored;           /* records indexed by the last open */
    uint64_t restore_superseded; /* older records of a key written again later */
    uint64_t restore_tombstoned; /* records of keys deleted later */
    uint64_t restore_unknown_ns; /* records of namespaces that are gone */
    uint64_t restore_index_full; /* records the index had no slot for */
    uint64_t demoted, demoted_bytes;
    uint64_t demote_index_full;                  /* written, but the index had no slot: not kept */
    uint64_t tombstones;                         /* deletes written down */
    uint64_t recycled_slots;                     /* slots dropped with their page */
    uint64_t quota_evicted, quota_evicted_bytes; /* dropped to keep a namespace to its ssd= */
    uint64_t compacted, compacted_bytes;         /* records copied from a page about to be recycled */
    uint64_t compacted_pages;
    uint64_t read_ok, read_bad; /* kvr_ssdt_read: served, refused (stale, other key, checksum) */
} kvr_ssdt_stats_t;

typedef struct {
    kvr_ssdf_t f;
    kvr_ssdp_t p;
    kvr_dindex_t *dx;
    kvr_ssdt_resolve_fn resolve;
    void *resolve_ctx;
    uint64_t reap_cursor;
    uint64_t kills_seen;              /* every kill up to this count is reaped (or its slot gone) */
    uint64_t cycle_kills;             /* the kill count when the scan in progress started */
    uint64_t cycle_left;              /* slots that scan has still to look at (0: none in progress) */
    uint64_t quota_kills[KVR_NS_MAX]; /* the kill count after a namespace's last ssd= drops */
    kvr_ssdt_stats_t st;
    kvr_ssdf_scan_t scan; /* what the last open's scan found */
    /* told each slot that was filled, moved or freed after the restore (the relay's owners of
     * disk blocks, proc/publisher_ssd.c); NULL: nobody */
    void (*on_slot)(void *ctx, uint32_t id);
    void *on_slot_ctx;
} kvr_ssdt_t;

/* A block to demote: its identity in the store and the names its record carries. */
typedef struct {
    uint16_t ns;
    uint8_t pool;
    uint64_t seed; /* the namespace's */
    const void *key;
    uint16_t key_len;
    uint64_t length, canon;
    const char *ns_name, *model;
} kvr_ssdt_blk_t;

/*
 * Opens (or formats) the file and restores dx from it: dx is formatted, then every record the
 * scan keeps is indexed, the latest write of a key winning and a key's tombstone dropping what
 * was written of it before. KVR_OK, KVR_EINVAL (the file is refused, logged), KVR_ERR.
 */
int kvr_ssdt_open(kvr_ssdt_t *t, const char *path, uint64_t size, uint64_t page_size, kvr_dindex_t *dx,
                  kvr_ssdt_resolve_fn resolve, void *ctx);
/* Seals the open page (a clean stop) and closes the file. */
void kvr_ssdt_close(kvr_ssdt_t *t);

/*
 * Appends a block (body: key then payload, in KVR_SSD_ALIGN-aligned pieces as the arena holds
 * them) and indexes it; a record of the same key written before is no longer indexed. KVR_OK,
 * KVR_EINVAL (larger than half a page: never admitted), KVR_ENOSPACE (every index slot in use:
 * the record is written but not kept), KVR_ERR (an I/O error, logged).
 */
int kvr_ssdt_demote(kvr_ssdt_t *t, const kvr_ssdt_blk_t *b, const struct iovec *body, int nbody);
/* The same in two steps, for a writer that must decide under the store lock whether the block
 * is still the one it copied: kvr_ssdt_write appends (the record counts as live from here),
 * then kvr_ssdt_index indexes it (KVR_OK or KVR_ENOSPACE, as above) or kvr_ssdt_unwrite gives
 * it up (the block was deleted or replaced meanwhile: the record is left to its page). */
int kvr_ssdt_write(kvr_ssdt_t *t, const kvr_ssdt_blk_t *b, const struct iovec *body, int nbody, kvr_ssdp_loc_t *loc);
int kvr_ssdt_index(kvr_ssdt_t *t, const kvr_ssdt_blk_t *b, const kvr_ssdp_loc_t *loc);
void kvr_ssdt_unwrite(kvr_ssdt_t *t, const kvr_ssdp_loc_t *loc);
/* kvr_ssdt_write on the writer's ring (kvr_ssdp_reserve's rules: KVR_AGAIN while a seal waits
 * for the writes in flight): the record counts as live once its write is settled ok
 * (kvr_ssdp_next, kvr_ssdp_settle), then kvr_ssdt_index or kvr_ssdt_unwrite as above. */
int kvr_ssdt_reserve(kvr_ssdt_t *t, const kvr_ssdt_blk_t *b, const struct iovec *body, int nbody, kvr_ssdp_loc_t *loc,
                     unsigned slot);

/* Turns up to max slots that workers killed (DELETE) into tombstones and frees them. The
 * number reaped, or KVR_ERR on an I/O error (the slot stays DEAD and is tried again). */
int kvr_ssdt_reap(kvr_ssdt_t *t, unsigned max);

/*
 * Compaction (docs/ssd-tier.md, "Compaction"): when every page is in use, the sealed page the
 * next opening would recycle holds live records over half of what it used, the open page has
 * room for all of them, and fewer pages were compacted than half the pages opened, its live
 * records are copied to the write head (synchronous appends: call it with nothing in flight)
 * and their slots moved, so the recycle drops nothing still indexed. 1 compacted, 0 not,
 * KVR_ERR on a failed write (what was copied stays copied).
 */
int kvr_ssdt_compact(kvr_ssdt_t *t);

/* Whether block b's record would open a page (kvr_ssdp_full_for). */
int kvr_ssdt_turn_due(const kvr_ssdt_t *t, const kvr_ssdt_blk_t *b);
/* Seals the open page and opens the next (kvr_ssdp_turn), then tries compaction while the new
 * page is empty: the writer calls it, with nothing in flight, before a record that would open
 * a page, so that a round of many records does not fill the fresh page past the room a
 * compaction needs before the next round's check. KVR_OK, KVR_AGAIN (writes in flight),
 * KVR_ERR (no page opened, or a compaction's write failed). */
int kvr_ssdt_turn(kvr_ssdt_t *t);

/*
 * ssd= (docs/ssd-tier.md, "Namespaces"): when namespace ns holds more than `quota` bytes on
 * disk in LIVE copies (0: no quota), its oldest are dropped until it holds 7/8 of it: pages in
 * the order they were opened, records in a page in the order they were written. A drop is a
 * DELETE's kill (LIVE to DEAD, CAS on the word read): kvr_ssdt_reap writes its tombstone and
 * frees it, so a dropped copy stays dropped across restarts; the next drops of ns wait until
 * the reaper has seen these. Two passes over the index's slots, so a namespace at its quota
 * pays them once per eighth of its quota written. Returns the bytes dropped.
 */
uint64_t kvr_ssdt_quota(kvr_ssdt_t *t, uint16_t ns, uint64_t quota);

/*
 * Reads the block a slot points at into buf (KVR_SSD_ALIGN-aligned, kvr_ssd_rec_span bytes of
 * it): the record's header must carry the slot's page version and exactly `key`, and its body
 * its checksum. KVR_OK (buf holds key then payload), KVR_ENOTFOUND (the page was recycled or
 * the key is another's: a miss), KVR_EINVAL (torn or corrupted: a miss, logged), KVR_ERR.
 */
int kvr_ssdt_read(kvr_ssdt_t *t, const kvr_dslot_t *s, const void *key, size_t klen, void *buf);

#endif
