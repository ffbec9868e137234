/*
 * ssdfmt.h — the disk tier's on-disk format: the file's superblock, page headers and block
 * record headers (docs/ssd-tier.md, "Layout"). Pure codecs: nothing here does I/O.
 *
 * The file is a superblock region (KVR_SSD_SUPER_BYTES) followed by npages pages of page_size
 * bytes. A page starts with a page header (KVR_SSD_ALIGN bytes) and holds records appended
 * back to back, each KVR_SSD_ALIGN-aligned: a record header (KVR_SSD_ALIGN bytes, with a copy of
 * the key), then the block's bytes exactly as the arena holds them (key, then payload), padded
 * to KVR_SSD_ALIGN. Every number is little-endian at a fixed offset. A sealed page also has a
 * summary right after its last record: one entry per record with everything its header says
 * but the checksum, so that a restart reads a page's index in one read instead of walking its
 * record headers one dependent read at a time.
 *
 * A record belongs to the page incarnation whose version it carries: recycling a page gives it
 * a new version, which invalidates every record left in it without touching them. Each header
 * ends with the XXH3-64 of the bytes before it, and a record header carries the XXH3-64 of its
 * body (key then payload), so a torn or flipped record is refused by the decoder or by the
 * body check, never served.
 */
#ifndef KVR_WIRE_SSDFMT_H
#define KVR_WIRE_SSDFMT_H

#include "common.h"

#define KVR_SSD_ALIGN        4096u      /* O_DIRECT's unit here: headers, offsets, lengths */
#define KVR_SSD_SUPER_BYTES  (1u << 20) /* before page 0: the superblock, then nothing */
#define KVR_SSD_LAYOUT       1u
#define KVR_SSD_PAGE_MIN     (1ull << 20)
#define KVR_SSD_PAGE_MAX     (1ull << 32) /* offsets in a page are 32-bit */
#define KVR_SSD_PAGES_MAX    (1ull << 24) /* page numbers: 2^24 pages of up to 4 GiB */
#define KVR_SSD_NS_NAME_MAX  32u          /* as a namespace name (shm/tenants_sh.h) */
#define KVR_SSD_MODEL_MAX    128u         /* as a model name (common.h) */
#define KVR_SSD_SUMENT_FIXED 64u          /* a summary entry's bytes before its names and key */
/* Record flags. A tombstone says its key was deleted at its sequence: it has no payload, and a
 * restart drops every record of that key written before it. */
#define KVR_SSD_REC_TOMBSTONE 1u
#define KVR_SSD_SUMENT_MAX    (KVR_SSD_SUMENT_FIXED + KVR_SSD_NS_NAME_MAX + KVR_SSD_MODEL_MAX + KVR_KEY_MAX)

typedef struct {
    uint32_t layout;    /* KVR_SSD_LAYOUT */
    uint64_t page_size; /* a multiple of KVR_SSD_ALIGN, KVR_SSD_PAGE_MIN..KVR_SSD_PAGE_MAX */
    uint64_t npages;
    uint64_t file_id; /* random at format: a segment's disk pointers name the file they are for */
    uint64_t created_ns;
} kvr_ssd_super_t;

typedef struct {
    uint64_t page;      /* its index: a header found at another page's place is refused */
    uint64_t version;   /* the page's incarnation: a global sequence, so versions order pages by age */
    uint64_t file_id;   /* the file's (superblock), so a page of another file is refused */
    uint64_t opened_ns; /* wall clock when this incarnation was opened */
    /* Filled when the page is sealed (full, or closed at a clean stop); 0 while open. */
    uint32_t sealed;
    uint32_t nrecords;
    uint64_t used;        /* bytes of records from the page's start, its header included */
    uint64_t summary_len; /* bytes of the summary, which starts at `used` (0: none written) */
    uint64_t summary_sum; /* XXH3-64 of the summary's bytes */
} kvr_ssd_page_t;

typedef struct {
    uint64_t version;  /* the page incarnation the record was written in */
    uint64_t seq;      /* a global write sequence: of two records of one key, the later wins */
    uint64_t khash;    /* XXH3-64 of the key bytes (unseeded) */
    uint64_t canon;    /* the canonical sequence hash the relay publishes */
    uint64_t length;   /* payload bytes */
    uint64_t body_sum; /* XXH3-64 of the body: key bytes, then payload */
    uint64_t written_ns;
    uint16_t key_len;                  /* 1..KVR_KEY_MAX */
    uint8_t ns_len;                    /* 1..KVR_SSD_NS_NAME_MAX */
    uint8_t model_len;                 /* 1..KVR_SSD_MODEL_MAX */
    uint32_t flags;                    /* KVR_SSD_REC_*: only known bits */
    char ns[KVR_SSD_NS_NAME_MAX + 1];  /* NUL-terminated */
    char model[KVR_SSD_MODEL_MAX + 1]; /* NUL-terminated */
    uint8_t key[KVR_KEY_MAX];          /* the key's bytes (also at the body's start) */
} kvr_ssd_rec_t;

/* Results of the decoders: what was wrong, for the counters and the one log line. */
enum { KVR_SSD_OK = 0,
       KVR_SSD_EMPTY = 1,     /* all zero: never written */
       KVR_SSD_BAD_MAGIC = 2, /* not this kind of header (or another format) */
       KVR_SSD_BAD_SUM = 3,   /* torn or flipped */
       KVR_SSD_BAD_FIELD = 4, /* checksum fine, a field out of its bounds */
       KVR_SSD_STALE = 5 };   /* a record of an earlier incarnation of its page */

/* Bytes a record of this key and payload takes in a page, header included. */
static inline uint64_t kvr_ssd_rec_span(size_t key_len, uint64_t length)
{
    return KVR_SSD_ALIGN + (((uint64_t)key_len + length + KVR_SSD_ALIGN - 1) & ~(uint64_t)(KVR_SSD_ALIGN - 1));
}

/* Encoders fill exactly KVR_SSD_ALIGN bytes at out (zeroes where nothing is written). */
void kvr_ssd_super_encode(const kvr_ssd_super_t *s, uint8_t *out);
void kvr_ssd_page_encode(const kvr_ssd_page_t *p, uint8_t *out);
/* r's key, ns and model are copied by their lengths; body_sum must be set by the caller. */
void kvr_ssd_rec_encode(const kvr_ssd_rec_t *r, uint8_t *out);

/*
 * Decoders read exactly KVR_SSD_ALIGN bytes at in and return KVR_SSD_OK with *out filled, or
 * one of the errors above. The superblock: layout, page size and count within bounds. A page
 * header: its own index `page` and the file's id must match; a sealed page's records and the
 * summary after them must fit in page_size. A record header: lengths within bounds, the names
 * printable without NUL, the key's hash equal to khash, the record inside the page from `off`
 * (its offset, KVR_SSD_ALIGN-aligned, past the page header), and its version equal to the
 * page's (else KVR_SSD_STALE, checked last).
 */
int kvr_ssd_super_decode(const uint8_t *in, kvr_ssd_super_t *out);
int kvr_ssd_page_decode(const uint8_t *in, uint64_t page, uint64_t file_id, uint64_t page_size, kvr_ssd_page_t *out);
int kvr_ssd_rec_decode(const uint8_t *in, uint64_t page_version, uint64_t off, uint64_t page_size,
                       kvr_ssd_rec_t *out);

/*
 * The summary: one entry per record of the page, in offset order, back to back. An entry is the
 * record's offset and span in KVR_SSD_ALIGN units, then its header's fields, names and key:
 * KVR_SSD_SUMENT_FIXED bytes plus the names' and the key's lengths. kvr_ssd_sument_encode writes
 * the entry of r (a record at offset off of its page) and returns its size. kvr_ssd_sument_decode
 * reads one from in (avail bytes there) with the bounds of a record header, the record inside a
 * page of page_size and its span matching its lengths; r->version is set to version (the
 * page's: an entry has none of its own). KVR_SSD_OK with *off and *size, or KVR_SSD_BAD_FIELD.
 */
size_t kvr_ssd_sument_encode(const kvr_ssd_rec_t *r, uint64_t off, uint8_t *out);
int kvr_ssd_sument_decode(const uint8_t *in, size_t avail, uint64_t version, uint64_t page_size, kvr_ssd_rec_t *r,
                          uint64_t *off, size_t *size);

/* The XXH3-64 of a body given in pieces (the arena's runs): state in, state out. */
typedef struct kvr_ssd_sum_s kvr_ssd_sum_t;
kvr_ssd_sum_t *kvr_ssd_sum_new(void);
void kvr_ssd_sum_reset(kvr_ssd_sum_t *s);
void kvr_ssd_sum_update(kvr_ssd_sum_t *s, const void *p, size_t n);
uint64_t kvr_ssd_sum_digest(const kvr_ssd_sum_t *s);
void kvr_ssd_sum_free(kvr_ssd_sum_t *s);
/* The same in one piece. */
uint64_t kvr_ssd_sum(const void *p, size_t n);

const char *kvr_ssd_strerror(int rc);

#endif
