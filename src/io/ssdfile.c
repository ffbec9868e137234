/*
 * ssdfile.c — the disk tier's file (see ssdfile.h; the layout is wire/ssdfmt.h's, the reasons
 * docs/ssd-tier.md's).
 */
#include "io/ssdfile.h"

#include "io/ssdfault.h"

#include "base/clock.h"
#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

void *kvr_ssdf_buf(size_t n)
{
    void *p = NULL;

    return posix_memalign(&p, KVR_SSD_ALIGN, n) == 0 ? p : NULL;
}

/* A whole-length pread or pwrite, retried on EINTR and short transfers. */
static int full_io(int fd, int write, void *buf, size_t len, uint64_t off)
{
    size_t done = 0;

    while (done < len) {
        ssize_t n = write ? pwrite(fd, (uint8_t *)buf + done, len - done, (off_t)(off + done))
                          : pread(fd, (uint8_t *)buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO; /* past the end: the file was cut under us */
            return KVR_ERR;
        }
        done += (size_t)n;
    }
    return KVR_OK;
}

int kvr_ssdf_read(kvr_ssdf_t *f, void *buf, size_t len, uint64_t at)
{
    return full_io(f->fd, 0, buf, len, at);
}

static int open_file(kvr_ssdf_t *f, const char *path)
{
    f->direct = 1;
    f->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
    if (f->fd < 0 && errno == EINVAL) {
        f->direct = 0;
        f->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (f->fd >= 0)
            kvr_info("ssd: %s: the file system refuses O_DIRECT (tmpfs?): buffered I/O, through the page cache", path);
    }
    if (f->fd < 0) {
        kvr_error("ssd: cannot open %s: %s", path, strerror(errno));
        return KVR_ERR;
    }
    return KVR_OK;
}

static int format(kvr_ssdf_t *f, const char *path, uint8_t *blk)
{
    uint64_t total = kvr_ssdf_page_off(f, f->npages);
    kvr_ssd_super_t s = {.layout = KVR_SSD_LAYOUT, .page_size = f->page_size, .npages = f->npages, .created_ns = kvr_clock_wall_us() * 1000};
    int rc = posix_fallocate(f->fd, 0, (off_t)total);

    if (rc == EOPNOTSUPP || rc == EINVAL) {
        kvr_warn("ssd: %s: fallocate is not supported here: the file's space is not reserved ahead", path);
        rc = ftruncate(f->fd, (off_t)total) == 0 ? 0 : errno;
    }
    if (rc != 0) {
        kvr_error("ssd: cannot reserve %llu bytes for %s: %s", (unsigned long long)total, path, strerror(rc));
        return KVR_ERR;
    }
    while (s.file_id == 0)
        if (getrandom(&s.file_id, sizeof(s.file_id), 0) != (ssize_t)sizeof(s.file_id))
            return KVR_ERR;
    kvr_ssd_super_encode(&s, blk);
    if (full_io(f->fd, 1, blk, KVR_SSD_ALIGN, 0) != KVR_OK || fdatasync(f->fd) != 0) {
        kvr_error("ssd: cannot write the superblock of %s: %s", path, strerror(errno));
        return KVR_ERR;
    }
    f->file_id = s.file_id;
    kvr_info("ssd: %s formatted: %llu pages of %llu MiB", path, (unsigned long long)f->npages,
             (unsigned long long)(f->page_size >> 20));
    return KVR_OK;
}

int kvr_ssdf_open(kvr_ssdf_t *f, const char *path, uint64_t size, uint64_t page_size, int *formatted)
{
    uint8_t *blk;
    kvr_ssd_super_t s;
    struct stat sb;
    int rc;

    memset(f, 0, sizeof(*f));
    f->fd = -1;
    f->page_size = page_size;
    if (page_size < KVR_SSD_PAGE_MIN || page_size > KVR_SSD_PAGE_MAX || page_size % KVR_SSD_ALIGN != 0 ||
        size < KVR_SSD_SUPER_BYTES || (size - KVR_SSD_SUPER_BYTES) / page_size < 2 ||
        (size - KVR_SSD_SUPER_BYTES) / page_size > KVR_SSD_PAGES_MAX) {
        kvr_error("ssd: %s: a size of %llu bytes in pages of %llu bytes is not 2 to %llu pages", path,
                  (unsigned long long)size, (unsigned long long)page_size, (unsigned long long)KVR_SSD_PAGES_MAX);
        return KVR_EINVAL;
    }
    f->npages = (size - KVR_SSD_SUPER_BYTES) / page_size;
    if ((blk = kvr_ssdf_buf(KVR_SSD_ALIGN)) == NULL)
        return KVR_ERR;
    if (open_file(f, path) != KVR_OK) {
        free(blk);
        return KVR_ERR;
    }
    /* What is there: a file shorter than a block reads short and its rest stays zero, so a
     * small file of someone else's is refused too; only an empty or all-zero start is ours to
     * format. */
    memset(blk, 0, KVR_SSD_ALIGN);
    rc = fstat(f->fd, &sb) == 0 && pread(f->fd, blk, KVR_SSD_ALIGN, 0) >= 0 ? KVR_OK : KVR_ERR;
    if (rc == KVR_OK) {
        switch (kvr_ssd_super_decode(blk, &s)) {
        case KVR_SSD_EMPTY: /* new, or never formatted */
            rc = format(f, path, blk);
            if (formatted != NULL)
                *formatted = 1;
            break;
        case KVR_SSD_OK:
            if (s.page_size != page_size || s.npages != f->npages) {
                kvr_error("ssd: %s holds %llu pages of %llu bytes, not the %llu of %llu asked: give the size and page "
                          "size it was made with, or remove it",
                          path, (unsigned long long)s.npages, (unsigned long long)s.page_size,
                          (unsigned long long)f->npages, (unsigned long long)page_size);
                rc = KVR_EINVAL;
            } else if (sb.st_size < (off_t)kvr_ssdf_page_off(f, f->npages)) {
                kvr_error("ssd: %s is shorter than its superblock says (cut?)", path);
                rc = KVR_EINVAL;
            }
            f->file_id = s.file_id;
            if (formatted != NULL)
                *formatted = 0;
            break;
        default:
            kvr_error("ssd: %s is not a kvrelay disk tier file (its first block: %s); refusing to overwrite it", path,
                      kvr_ssd_strerror(kvr_ssd_super_decode(blk, &s)));
            rc = KVR_EINVAL;
        }
    } else {
        kvr_error("ssd: cannot read %s: %s", path, strerror(errno));
    }
    free(blk);
    if (rc != KVR_OK)
        kvr_ssdf_close(f);
    return rc;
}

void kvr_ssdf_close(kvr_ssdf_t *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
}

int kvr_ssdf_sync(kvr_ssdf_t *f)
{
    if (fdatasync(f->fd) == 0)
        return KVR_OK;
    kvr_error("ssd: fdatasync: %s", strerror(errno));
    return KVR_ERR;
}

int kvr_ssdf_page_write(kvr_ssdf_t *f, const kvr_ssd_page_t *pg)
{
    uint8_t *blk = kvr_ssdf_buf(KVR_SSD_ALIGN);
    int rc;

    if (blk == NULL)
        return KVR_ERR;
    kvr_ssd_page_encode(pg, blk);
    rc = full_io(f->fd, 1, blk, KVR_SSD_ALIGN, kvr_ssdf_page_off(f, pg->page));
    if (rc != KVR_OK)
        kvr_error("ssd: writing the header of page %llu: %s", (unsigned long long)pg->page, strerror(errno));
    free(blk);
    return rc;
}

int kvr_ssdf_page_seal_begin(kvr_ssdf_t *f, kvr_ssd_page_t *pg, const uint8_t *summary, size_t len)
{
    size_t io = (len + KVR_SSD_ALIGN - 1) & ~(size_t)(KVR_SSD_ALIGN - 1);
    uint8_t *buf;
    int rc = KVR_OK;

    if (pg->used < KVR_SSD_ALIGN || pg->used % KVR_SSD_ALIGN != 0 || pg->used > f->page_size ||
        io > f->page_size - pg->used)
        return KVR_EINVAL;
    if (io > 0) {
        if ((buf = kvr_ssdf_buf(io)) == NULL)
            return KVR_ERR;
        memcpy(buf, summary, len);
        memset(buf + len, 0, io - len);
        rc = full_io(f->fd, 1, buf, io, kvr_ssdf_page_off(f, pg->page) + pg->used);
        free(buf);
        if (rc != KVR_OK) {
            kvr_error("ssd: writing the summary of page %llu: %s", (unsigned long long)pg->page, strerror(errno));
            return KVR_ERR;
        }
    }
    pg->summary_len = len;
    pg->summary_sum = len > 0 ? kvr_ssd_sum(summary, len) : 0;
    return KVR_OK;
}

int kvr_ssdf_page_seal_end(kvr_ssdf_t *f, kvr_ssd_page_t *pg)
{
    pg->sealed = 1;
    return kvr_ssdf_page_write(f, pg);
}

int kvr_ssdf_page_seal(kvr_ssdf_t *f, kvr_ssd_page_t *pg, const uint8_t *summary, size_t len)
{
    int rc = kvr_ssdf_page_seal_begin(f, pg, summary, len);

    if (rc != KVR_OK)
        return rc;
    if (kvr_ssdf_sync(f) != KVR_OK) /* the records and the summary are down before the seal says so */
        return KVR_ERR;
    return kvr_ssdf_page_seal_end(f, pg);
}

int kvr_ssdf_rec_read(kvr_ssdf_t *f, uint64_t p, uint64_t version, uint64_t off, kvr_ssd_rec_t *rec)
{
    uint8_t *blk = kvr_ssdf_buf(KVR_SSD_ALIGN);
    int rc;

    if (blk == NULL)
        return KVR_ERR;
    rc = full_io(f->fd, 0, blk, KVR_SSD_ALIGN, kvr_ssdf_page_off(f, p) + off);
    if (rc == KVR_OK)
        rc = kvr_ssd_rec_decode(blk, version, off, f->page_size, rec);
    else
        kvr_error("ssd: reading a record header of page %llu: %s", (unsigned long long)p, strerror(errno));
    free(blk);
    return rc;
}

/* pwritev of all of iov at `at`, IOV_MAX pieces at a time. KVR_OK, or KVR_ERR with errno. */
static int writev_all(int fd, struct iovec *iov, int n, uint64_t at)
{
    while (n > 0) {
        int k = n < IOV_MAX ? n : IOV_MAX;
        size_t want = 0;
        ssize_t w;
        for (int i = 0; i < k; i++)
            want += iov[i].iov_len;
        do
            w = pwritev(fd, iov, k, (off_t)at);
        while (w < 0 && errno == EINTR);
        w = kvr_ssd_fault_write(w, want);
        if (w != (ssize_t)want) {
            if (w >= 0)
                errno = ENOSPC; /* a short write: the device is full, or was cut */
            return KVR_ERR;
        }
        at += want;
        iov += k;
        n -= k;
    }
    return KVR_OK;
}

void kvr_ssdf_wr_free(kvr_ssdf_wr_t *w)
{
    free(w->iov);
    free(w->tail);
    free(w->hdr);
    memset(w, 0, sizeof(*w));
}

int kvr_ssdf_rec_prep(kvr_ssdf_t *f, uint64_t p, uint64_t off, kvr_ssd_rec_t *rec, const struct iovec *body, int nbody,
                      kvr_ssdf_wr_t *w)
{
    uint64_t len = (uint64_t)rec->key_len + rec->length, span = kvr_ssd_rec_span(rec->key_len, rec->length), got = 0;
    kvr_ssd_sum_t *sum = NULL;
    int rc = KVR_EINVAL;

    memset(w, 0, sizeof(*w));
    if (off < KVR_SSD_ALIGN || off % KVR_SSD_ALIGN != 0 || off > f->page_size || span > f->page_size - off || nbody < 1)
        return KVR_EINVAL;
    if ((w->iov = malloc(sizeof(*w->iov) * ((size_t)nbody + 2))) == NULL || (w->hdr = kvr_ssdf_buf(KVR_SSD_ALIGN)) == NULL ||
        (sum = kvr_ssd_sum_new()) == NULL) {
        rc = KVR_ERR;
        goto out;
    }
    w->iov[w->niov++] = (struct iovec){w->hdr, KVR_SSD_ALIGN};
    for (int i = 0; i < nbody && got < len; i++) {
        size_t take = body[i].iov_len < len - got ? body[i].iov_len : (size_t)(len - got);
        size_t whole = take & ~(size_t)(KVR_SSD_ALIGN - 1);
        kvr_ssd_sum_update(sum, body[i].iov_base, take);
        got += take;
        if (whole > 0)
            w->iov[w->niov++] = (struct iovec){body[i].iov_base, whole};
        if (whole < take) { /* the last piece's tail, padded from a bounce buffer */
            if (got < len)
                goto out; /* an unaligned piece before the end: not the arena's runs */
            if ((w->tail = kvr_ssdf_buf(KVR_SSD_ALIGN)) == NULL) {
                rc = KVR_ERR;
                goto out;
            }
            memset(w->tail, 0, KVR_SSD_ALIGN);
            memcpy(w->tail, (uint8_t *)body[i].iov_base + whole, take - whole);
            w->iov[w->niov++] = (struct iovec){w->tail, KVR_SSD_ALIGN};
        }
    }
    if (got < len)
        goto out;
    rec->body_sum = kvr_ssd_sum_digest(sum);
    kvr_ssd_rec_encode(rec, w->hdr);
    w->at = kvr_ssdf_page_off(f, p) + off;
    w->len = span;
    rc = KVR_OK;
out:
    kvr_ssd_sum_free(sum);
    if (rc != KVR_OK)
        kvr_ssdf_wr_free(w);
    return rc;
}

int kvr_ssdf_wr_sync(kvr_ssdf_t *f, kvr_ssdf_wr_t *w)
{
    int rc = writev_all(f->fd, w->iov, w->niov, w->at), err = errno;

    if (rc != KVR_OK) {
        kvr_ssdf_wr_failed(w, err);
        errno = err; /* the caller's to read */
    }
    return rc;
}

void kvr_ssdf_wr_failed(const kvr_ssdf_wr_t *w, int err)
{
    /* a failing device fails every write: one line a second */
    KVR_LOG_RATELIMITED(KVR_LOG_ERROR, "ssd: writing a record at file offset %llu: %s", (unsigned long long)w->at,
                        strerror(err));
}

int kvr_ssdf_rec_write(kvr_ssdf_t *f, uint64_t p, uint64_t off, kvr_ssd_rec_t *rec, const struct iovec *body,
                       int nbody)
{
    kvr_ssdf_wr_t w;
    int rc = kvr_ssdf_rec_prep(f, p, off, rec, body, nbody, &w);

    if (rc != KVR_OK)
        return rc;
    rc = kvr_ssdf_wr_sync(f, &w);
    kvr_ssdf_wr_free(&w);
    return rc;
}

int kvr_ssdf_body_read(kvr_ssdf_t *f, uint64_t p, uint64_t off, const kvr_ssd_rec_t *rec, void *buf)
{
    uint64_t span = kvr_ssd_rec_span(rec->key_len, rec->length) - KVR_SSD_ALIGN;

    if (full_io(f->fd, 0, buf, span, kvr_ssdf_page_off(f, p) + off + KVR_SSD_ALIGN) != KVR_OK) {
        kvr_error("ssd: reading a record body at page %llu offset %llu: %s", (unsigned long long)p,
                  (unsigned long long)off, strerror(errno));
        return KVR_ERR;
    }
    return kvr_ssd_sum(buf, (size_t)rec->key_len + rec->length) == rec->body_sum ? KVR_OK : KVR_EINVAL;
}
