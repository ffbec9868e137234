/*
 * api_disk.c — a GET served from the disk tier (see api.h, "A GET whose key is not in RAM";
 * docs/ssd-tier.md, "Reads and promotion").
 *
 * The block is reserved like a PUT of its key and length, and its record is read straight into
 * the reservation: the record's header into a 4 KiB buffer of its own, its body (key, then
 * payload, as the arena lays a block out) into the reserved pages, the last page's spare bytes
 * taking the record's padding. Nothing is copied. Then the header must be the slot's page
 * version with this very key and length, and the body its checksum; the reservation is
 * committed (the block is in RAM again: promotion), pinned and sent as any RAM block. Anything
 * else is a miss: the reservation goes back, the client gets 404 and fetches the block again.
 */
#include "io/api_int.h"

#include "base/clock.h"
#include "base/log.h"
#include "io/ssdfault.h"
#include "wire/ssdfmt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <unistd.h>

struct kvr_api_disk_s {
    kvr_dslot_t s;     /* where the record is */
    uint64_t off;      /* the record's offset in the file */
    uint64_t total;    /* bytes to read: header and padded body */
    uint64_t done;     /* read so far */
    kvr_put_txn_t txn; /* the reservation the body goes into */
    uint8_t *hdr;      /* the record's header (KVR_SSD_ALIGN, aligned) */
    uint64_t t0_us;    /* when it was asked for (the read latency histogram) */
};

static void disk_free(kvr_api_t *a, kvr_api_res_t *res)
{
    free(res->dk->hdr);
    free(res->dk);
    res->dk = NULL;
    a->disk_reads--;
}

/* The file, opened at the first read: the disk writer makes it, perhaps after this worker
 * started. O_DIRECT where the file system takes it, as the writer does. */
static int disk_fd(kvr_api_t *a)
{
    if (a->ssd_fd < 0 && a->cfg->ssd_path[0] != '\0') {
        a->ssd_fd = open(a->cfg->ssd_path, O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (a->ssd_fd < 0 && errno == EINVAL)
            a->ssd_fd = open(a->cfg->ssd_path, O_RDONLY | O_CLOEXEC);
    }
    return a->ssd_fd;
}

/* The LIVE disk slot of (ns, key): 1 with *s, 0 when the tier is off or does not hold it. */
static int disk_slot(kvr_api_t *a, uint16_t ns, const uint8_t *key, size_t klen, kvr_dslot_t *s)
{
    kvr_store_t *st = a->store;
    uint64_t h1, h2;
    uint32_t id;

    if (st->dx.sh == NULL)
        return 0;
    kvr_dindex_hash(kvr_store_ns_seed(st, ns), key, klen, &h1, &h2);
    return kvr_dindex_lookup(&st->dx, ns, h1, h2, (uint16_t)klen, s, &id) == 1;
}

int kvr_api_exists(kvr_api_t *a, uint16_t ns, const uint8_t *key, size_t klen, uint64_t *len)
{
    kvr_dslot_t s;

    if (kvr_store_exists(a->store, ns, key, klen, len))
        return 1;
    if (!disk_slot(a, ns, key, klen, &s))
        return 0;
    if (len != NULL)
        *len = s.length;
    return 1;
}

int kvr_api_release(kvr_api_t *a, uint16_t ns, const uint8_t *key, size_t klen, uint32_t *left)
{
    kvr_store_t *st = a->store;
    int rc = kvr_store_release(st, ns, key, klen, left);
    uint64_t h1, h2;

    if ((rc != KVR_OK && rc != KVR_ENOTFOUND) || (rc == KVR_OK && *left > 0) || st->dx.sh == NULL)
        return rc; /* an error, or references left: the disk copy stays with them */
    kvr_dindex_hash(kvr_store_ns_seed(st, ns), key, klen, &h1, &h2);
    if (kvr_dindex_kill(&st->dx, ns, h1, h2, (uint16_t)klen) == 1) {
        *left = 0;
        return KVR_OK;
    }
    return rc;
}

int kvr_api_disk_get(kvr_api_t *a, kvr_api_res_t *res, const uint8_t *key, size_t klen)
{
    kvr_store_t *st = a->store;
    struct kvr_api_disk_s *dk;
    kvr_dslot_t s;
    int rc;

    if (!disk_slot(a, res->ns, key, klen, &s))
        return 0;
    if (a->disk_reads >= KVR_API_DISK_READS_MAX || disk_fd(a) < 0) {
        kvr_stat_add(st->my_stats, KVR_ST_DISK_READ_BUSY, 1);
        kvr_api_error(res, 503, "Busy", "too many reads from the disk tier in this worker");
        res->hdr_name = "retry-after";
        res->hdr_value = "1";
        return 1;
    }
    if ((dk = calloc(1, sizeof(*dk))) == NULL || posix_memalign((void **)&dk->hdr, KVR_SSD_ALIGN, KVR_SSD_ALIGN) != 0) {
        free(dk);
        kvr_api_error(res, 503, "Busy", "out of memory for a read from the disk tier");
        return 1;
    }
    rc = kvr_store_put_begin(st, res->ns, s.pool, key, klen, s.length, s.canon, &dk->txn);
    if (rc != KVR_OK) {
        free(dk->hdr);
        free(dk);
        if (rc == KVR_PUT_DEDUP || rc == KVR_ECONFLICT)
            return 0; /* in RAM again meanwhile: the caller's 404 stands; the client retries */
        kvr_api_error(res, 507, "InsufficientStorage", "no room in RAM to read the block from the disk tier");
        return 1;
    }
    dk->txn.promote = 1; /* counted as a disk read, not a PUT */
    dk->s = s;
    dk->t0_us = kvr_clock_us();
    dk->off = KVR_SSD_SUPER_BYTES + (uint64_t)s.page * a->cfg->ssd_page_size + (uint64_t)s.off4k * KVR_SSD_ALIGN;
    dk->total = kvr_ssd_rec_span(klen, s.length);
    res->dk = dk;
    res->klen = (uint16_t)klen;
    memcpy(res->key, key, klen);
    a->disk_reads++;
    res->status = 0;
    return 1;
}

int kvr_api_disk_iov(kvr_api_t *a, kvr_api_res_t *res, struct iovec *iov, int max, uint64_t *off)
{
    struct kvr_api_disk_s *dk = res->dk;
    uint64_t from = dk->done, body_end = KVR_SSD_ALIGN + (uint64_t)res->klen + dk->s.length;
    int n = 0;

    *off = dk->off + from;
    if (from < KVR_SSD_ALIGN) {
        iov[n++] = (struct iovec){dk->hdr + from, KVR_SSD_ALIGN - from};
        from = KVR_SSD_ALIGN;
    }
    if (n < max && from < body_end) {
        int k = (int)kvr_store_txn_chain_iov(a->store, &dk->txn, from - KVR_SSD_ALIGN, iov + n, (size_t)(max - n));
        for (int i = 0; i < k; i++)
            from += iov[n + i].iov_len;
        n += k;
        /* the record's padding lands in the spare end of the last page: the reservation owns it */
        if (k > 0 && from == body_end)
            iov[n - 1].iov_len += dk->total - body_end;
    }
    return n;
}

/* The record is whole: checked, committed, pinned, or a miss. */
static void finish(kvr_api_t *a, kvr_api_res_t *res)
{
    struct kvr_api_disk_s *dk = res->dk;
    uint64_t in_page = (uint64_t)dk->s.off4k * KVR_SSD_ALIGN;
    static kvr_ssd_rec_t rec; /* 1.2 KiB, off the stack; a worker has one thread */
    struct iovec iov[64];
    kvr_ssd_sum_t *sum = kvr_ssd_sum_new();
    uint64_t from = 0;
    size_t n;
    int rc;
    int ok = sum != NULL &&
             kvr_ssd_rec_decode(dk->hdr, dk->s.version, in_page, a->cfg->ssd_page_size, &rec) == KVR_SSD_OK &&
             rec.key_len == res->klen && memcmp(rec.key, res->key, res->klen) == 0 && rec.length == dk->s.length &&
             !(rec.flags & KVR_SSD_REC_TOMBSTONE);

    while (ok && (n = kvr_store_txn_chain_iov(a->store, &dk->txn, from, iov, 64)) > 0)
        for (size_t i = 0; i < n; i++) {
            kvr_ssd_sum_update(sum, iov[i].iov_base, iov[i].iov_len);
            from += iov[i].iov_len;
        }
    ok = ok && kvr_ssd_sum_digest(sum) == rec.body_sum;
    kvr_ssd_sum_free(sum);
    if (!ok) {
        kvr_stat_add(a->store->my_stats, KVR_ST_DISK_READ_BAD, 1);
        if (!a->disk_warned++)
            kvr_warn("ssd: page %u offset %llu: the record is stale, torn or not this key's; answered as a miss "
                     "(logged once per worker)",
                     dk->s.page, (unsigned long long)in_page);
        kvr_store_put_abort(a->store, &dk->txn);
        disk_free(a, res);
        kvr_store_count_miss(a->store, res->ns); /* a GET the disk tier could not serve */
        kvr_api_error(res, 404, "NoSuchBlock", "no such block");
        return;
    }
    kvr_store_put_commit(a->store, &dk->txn); /* created, or another copy won: either way in RAM */
    kvr_stat_add(a->store->my_stats, KVR_ST_DISK_READS, 1);
    kvr_stat_add(a->store->my_stats, KVR_ST_DISK_READ_BYTES, dk->s.length);
    kvr_stat_hist(a->store->my_stats, KVR_ST_DISK_READ_HIST, kvr_clock_us() - dk->t0_us);
    disk_free(a, res);
    rc = kvr_store_get_counted(a->store, res->ns, res->key, res->klen, &res->ref, KVR_GET_COUNT_HIT);
    if (rc == KVR_EBUSY) { /* promoted, but this worker's pin table is full: as a RAM GET's 503 */
        kvr_api_error(res, 503, "Busy", "too many blocks in flight in this worker");
        res->hdr_name = "retry-after";
        res->hdr_value = "1";
        return;
    }
    if (rc != KVR_OK) {
        kvr_store_count_miss(a->store, res->ns); /* a GET the disk tier could not serve */
        kvr_api_error(res, 404, "NoSuchBlock", "no such block");
        return;
    }
    api_send_pinned(res);
}

int kvr_api_disk_step(kvr_api_t *a, kvr_api_res_t *res, int n)
{
    struct kvr_api_disk_s *dk = res->dk;

    n = (int)kvr_ssd_fault_read(n);
    if (n <= 0) { /* an I/O error, or the end of the file: a miss */
        kvr_stat_add(a->store->my_stats, KVR_ST_DISK_READ_ERRORS, 1);
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "ssd: a read of page %u failed: %s", dk->s.page,
                            n < 0 ? strerror(-n) : "end of file");
        kvr_store_put_abort(a->store, &dk->txn);
        disk_free(a, res);
        kvr_store_count_miss(a->store, res->ns); /* a GET the disk tier could not serve */
        kvr_api_error(res, 404, "NoSuchBlock", "no such block");
        return 0;
    }
    dk->done += (uint64_t)n;
    if (dk->done < dk->total)
        return 1;
    finish(a, res);
    return 0;
}

void kvr_api_disk_abort(kvr_api_t *a, kvr_api_res_t *res)
{
    if (res->dk == NULL)
        return;
    kvr_store_put_abort(a->store, &res->dk->txn);
    disk_free(a, res);
}

void kvr_api_disk_sync(kvr_api_t *a, kvr_api_res_t *res)
{
    struct iovec iov[64];
    uint64_t off;
    ssize_t r;

    while (res->dk != NULL) {
        int n = kvr_api_disk_iov(a, res, iov, 64, &off);
        do
            r = preadv(a->ssd_fd, iov, n, (off_t)off);
        while (r < 0 && errno == EINTR);
        if (kvr_api_disk_step(a, res, r < 0 ? -errno : (int)r) == 0)
            break;
    }
}

void kvr_api_disk_stats(kvr_api_t *a, kvr_json_t *j, int ns)
{
    const kvr_dindex_t *dx = &a->store->dx;

    if (a->store->dx.sh == NULL)
        return;
    api_json_field(j, "disk_blocks", ns < 0 ? kvr_dindex_live(dx) : kvr_dindex_ns_live(dx, (uint16_t)ns), 0);
    api_json_field(j, "disk_bytes", ns < 0 ? kvr_dindex_live_bytes(dx) : kvr_dindex_ns_bytes(dx, (uint16_t)ns), 0);
}
