/*
 * ssdfile.h — the disk tier's file: open or format it, append records, read them back
 * (docs/ssd-tier.md); io/ssdscan.h reads it all at start. The layout is wire/ssdfmt.h's.
 *
 * The file is opened O_DIRECT where the file system takes it, and with buffered I/O where it
 * does not (tmpfs), which kvr_ssdf_open logs. Every offset and length given to the kernel is a
 * multiple of KVR_SSD_ALIGN, and every buffer is aligned to it, so both modes take the same
 * calls. The calls here are synchronous (pread/pwritev): the start-up scan, the tests, and the
 * one writer's appends use them; a worker's reads go through its ring instead
 * (kvr_ssdf_rec_offset gives where).
 */
#ifndef KVR_IO_SSDFILE_H
#define KVR_IO_SSDFILE_H

#include "common.h"
#include "wire/ssdfmt.h"

#include <sys/uio.h>

typedef struct {
    int fd;
    int direct; /* opened O_DIRECT */
    uint64_t page_size, npages, file_id;
} kvr_ssdf_t;

/*
 * Opens path, creating and formatting it when it is new (or all zero): fallocate of the whole
 * size, the superblock written and synced. An existing file must carry a valid superblock with
 * the same geometry: a file that is not a kvrelay disk file, or one made with another size or
 * page size, is refused (logged, KVR_EINVAL), never overwritten. size is rounded down to whole
 * pages after the superblock region; fewer than 2 pages is KVR_EINVAL. *formatted (optional)
 * says whether it was formatted now. KVR_OK, KVR_EINVAL or KVR_ERR (logged).
 */
int kvr_ssdf_open(kvr_ssdf_t *f, const char *path, uint64_t size, uint64_t page_size, int *formatted);
void kvr_ssdf_close(kvr_ssdf_t *f);

/* Where page p starts in the file. */
static inline uint64_t kvr_ssdf_page_off(const kvr_ssdf_t *f, uint64_t p)
{
    return KVR_SSD_SUPER_BYTES + p * f->page_size;
}

/* Writes page p's header (open: sealed 0). KVR_OK or KVR_ERR (logged). */
int kvr_ssdf_page_write(kvr_ssdf_t *f, const kvr_ssd_page_t *pg);

/*
 * Seals a page whose records end at pg->used (pg->nrecords of them): writes the summary (len
 * bytes of entries, kvr_ssd_sument_encode, in offset order; len 0: none) at pg->used, syncs the
 * file, then writes the header with sealed 1 and the summary's length and checksum, which it
 * sets in *pg. KVR_OK, KVR_EINVAL (the summary does not fit in the page), or KVR_ERR (logged).
 */
int kvr_ssdf_page_seal(kvr_ssdf_t *f, kvr_ssd_page_t *pg, const uint8_t *summary, size_t len);
/* The same in two steps, for a writer that syncs on its own ring: _begin writes the summary and
 * sets its length and checksum in *pg (KVR_OK, KVR_EINVAL, KVR_ERR); once a sync that started
 * after it has completed, _end writes the header with sealed 1 (KVR_OK or KVR_ERR, logged). */
int kvr_ssdf_page_seal_begin(kvr_ssdf_t *f, kvr_ssd_page_t *pg, const uint8_t *summary, size_t len);
int kvr_ssdf_page_seal_end(kvr_ssdf_t *f, kvr_ssd_page_t *pg);

/*
 * Appends a record at offset off of page p: its header, then the body given as iovecs whose
 * bases are KVR_SSD_ALIGN-aligned and whose lengths are multiples of it except the last
 * (padded here from a bounce buffer when needed, so pass the arena's runs as they are). The
 * body is key then payload, rec->key_len + rec->length bytes. rec->body_sum is computed here.
 * pwritev, IOV_MAX pieces at a time. KVR_OK, KVR_EINVAL (does not fit in the page), or KVR_ERR (an I/O
 * error or a short write, logged).
 */
int kvr_ssdf_rec_write(kvr_ssdf_t *f, uint64_t p, uint64_t off, kvr_ssd_rec_t *rec, const struct iovec *body,
                       int nbody);

/* The same in steps, for a writer that puts its writes on a ring: kvr_ssdf_rec_prep checks,
 * sums and encodes as above and says what to write (w: the pieces, header first, and where;
 * kvr_ssdf_wr_free it after the write), without writing; kvr_ssdf_wr_sync writes it here;
 * kvr_ssdf_wr_failed logs a failed write of it (errno err), at most a line a second. */
typedef struct {
    struct iovec *iov;
    int niov;
    uint8_t *hdr, *tail; /* the header's block, and the last piece's padded copy (or NULL) */
    uint64_t at, len;    /* the file offset, and the bytes (the record's span) */
} kvr_ssdf_wr_t;
int kvr_ssdf_rec_prep(kvr_ssdf_t *f, uint64_t p, uint64_t off, kvr_ssd_rec_t *rec, const struct iovec *body, int nbody,
                      kvr_ssdf_wr_t *w);
int kvr_ssdf_wr_sync(kvr_ssdf_t *f, kvr_ssdf_wr_t *w);
void kvr_ssdf_wr_failed(const kvr_ssdf_wr_t *w, int err);
void kvr_ssdf_wr_free(kvr_ssdf_wr_t *w);

/*
 * Reads a record's body (key then payload) into buf (KVR_SSD_ALIGN-aligned, at least
 * kvr_ssd_rec_span - KVR_SSD_ALIGN bytes) and checks its checksum against rec->body_sum.
 * KVR_OK, KVR_EINVAL (checksum mismatch: torn or corrupted), KVR_ERR (I/O error or short read).
 */
int kvr_ssdf_body_read(kvr_ssdf_t *f, uint64_t p, uint64_t off, const kvr_ssd_rec_t *rec, void *buf);

/* Reads and decodes the record header at offset off of page p against the page's version:
 * KVR_SSD_* (KVR_SSD_OK with *rec), or KVR_ERR on an I/O error. */
int kvr_ssdf_rec_read(kvr_ssdf_t *f, uint64_t p, uint64_t version, uint64_t off, kvr_ssd_rec_t *rec);

/* A KVR_SSD_ALIGN-aligned buffer of n bytes (free() it), or NULL. */
void *kvr_ssdf_buf(size_t n);
/* len bytes at file offset at, all of them (EINTR and short reads retried; EOF is EIO):
 * KVR_OK, or KVR_ERR with errno. O_DIRECT: buf, len and at aligned to KVR_SSD_ALIGN. */
int kvr_ssdf_read(kvr_ssdf_t *f, void *buf, size_t len, uint64_t at);

/* fdatasync. KVR_OK or KVR_ERR (logged). */
int kvr_ssdf_sync(kvr_ssdf_t *f);

#endif
