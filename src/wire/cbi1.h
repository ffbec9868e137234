/*
 * cbi1.h — "Cuckoo Bucket Images v1", the FilterUpdate.payload codec
 * (docs/relay-contract.md §4).
 *
 * Frame = 48-byte header + body, all integers little-endian:
 *
 *   off size field              off size field (snapshot chunk, flags 1)
 *     0   4  magic "CBI1"        48   4  chunk_index
 *     4   2  wire_version = 1    52   4  chunk_count = ceil(bucket_count / 524288)
 *     6   2  flags 1|2           56   8  bucket_offset = chunk_index * 524288
 *     8   1  fingerprint_bits 16 64  8k  k <= 524288 bucket words
 *     9   1  slots_per_bucket 4
 *    10   2  format_version = 1      (delta, flags 2)
 *    12   8  seed                48   8  base_epoch = FilterUpdate.base_sequence
 *    20   8  bucket_count        56   4  image_count n <= 349525
 *    28   8  dc_id               60 12n  n x (u32 bucket, u64 absolute new word)
 *    36   8  epoch = FilterUpdate.sequence
 *    44   4  low 32 bits of xxh3_64(body, seed 0)
 *
 * Encoders are pure functions writing into a caller buffer. The decoder never reads past len,
 * checks every declared count against its limit before using it, validates in the exact order
 * of docs/relay-contract.md §4.2 and reports each failure with its own status value; it does
 * not copy: the decoded frame points into the input. Snapshot assembly (§4.3 there) copies
 * chunk words into a caller-provided dense bucket array.
 */
#ifndef KVR_CBI1_H
#define KVR_CBI1_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "wire/ckf.h"

#define KVR_CBI1_MAGIC               "CBI1"
#define KVR_CBI1_WIRE_VERSION        1u
#define KVR_CBI1_HEADER_LEN          48u
#define KVR_CBI1_CHUNK_PREFIX        16u
#define KVR_CBI1_DELTA_PREFIX        12u
#define KVR_CBI1_IMAGE_LEN           12u
#define KVR_CBI1_CHUNK_BUCKETS       524288u /* 512 Ki */
#define KVR_CBI1_MAX_BUCKET_COUNT    (1ULL << 24)
#define KVR_CBI1_MAX_FRAME           (48u + 16u + KVR_CBI1_CHUNK_BUCKETS * 8u) /* 4194368 */
#define KVR_CBI1_MAX_DELTA_IMAGES    ((KVR_CBI1_MAX_FRAME - 48u - 12u) / 12u)  /* 349525 */
#define KVR_CBI1_FLAG_SNAPSHOT_CHUNK 1u
#define KVR_CBI1_FLAG_DELTA          2u
#define KVR_CBI1_FORMAT_VERSION      1u
#define KVR_CBI1_FINGERPRINT_BITS    16u
#define KVR_CBI1_SLOTS_PER_BUCKET    4u

/*
 * Status values. 0 is success, 1 "snapshot complete" (assembly only); every failure is
 * negative and distinct. The comment names the reference error (ImagesWireError) it
 * refines; kvr_cbi1_err_ref() returns that name.
 */
typedef enum kvr_cbi1_status {
    KVR_CBI1_OK = 0,
    KVR_CBI1_COMPLETE = 1,              /* assembly: the last chunk arrived, coverage ok */
    KVR_CBI1_E_TRUNCATED = -1,          /* Truncated: len < 48 */
    KVR_CBI1_E_TOO_LARGE = -2,          /* FrameTooLarge: len > 4194368 */
    KVR_CBI1_E_MAGIC = -3,              /* Magic */
    KVR_CBI1_E_WIRE_VERSION = -4,       /* WireVersion */
    KVR_CBI1_E_CHECKSUM = -5,           /* Checksum */
    KVR_CBI1_E_FORMAT_VERSION = -6,     /* Format(Version) */
    KVR_CBI1_E_FINGERPRINT_BITS = -7,   /* Format(FingerprintBits) */
    KVR_CBI1_E_SLOTS_PER_BUCKET = -8,   /* Format(SlotsPerBucket) */
    KVR_CBI1_E_SEED_MISMATCH = -9,      /* Format(Mismatch): seed */
    KVR_CBI1_E_BUCKETS_MISMATCH = -10,  /* Format(Mismatch): bucket_count */
    KVR_CBI1_E_FLAGS = -11,             /* Flags */
    KVR_CBI1_E_DELTA_SHORT = -12,       /* Malformed: delta body < 12 */
    KVR_CBI1_E_DELTA_IMAGE_COUNT = -13, /* DeltaImageCount: count > 349525 */
    KVR_CBI1_E_DELTA_LENGTH = -14,      /* Malformed: body != 12 + 12 count */
    KVR_CBI1_E_DELTA_BUCKET = -15,      /* Malformed: image bucket >= bucket_count */
    KVR_CBI1_E_CHUNK_SHORT = -16,       /* Malformed: chunk body < 16 */
    KVR_CBI1_E_CHUNK_COUNT_ZERO = -17,  /* Malformed: chunk_count == 0 */
    KVR_CBI1_E_CHUNK_INDEX = -18,       /* Malformed: chunk_index >= chunk_count */
    KVR_CBI1_E_CHUNK_ALIGN = -19,       /* Malformed: words not a multiple of 8 bytes */
    KVR_CBI1_E_CHUNK_WORD_COUNT = -20,  /* SnapshotChunkWordCount: words > 524288 */
    KVR_CBI1_E_CHUNK_RANGE = -21,       /* Malformed: bucket_offset + words > bucket_count */
    KVR_CBI1_E_CHUNK_SEQUENCE = -22,    /* ChunkSequence (assembly) */
    KVR_CBI1_E_INCOMPLETE = -23,        /* IncompleteCoverage (assembly) */
    KVR_CBI1_E_ARG = -24,               /* caller error (bad arguments, buffer too small) */
} kvr_cbi1_status_t;

/* Stable symbol of a status ("KVR_CBI1_E_MAGIC"...), and the reference error it refines
 * ("Magic", "Malformed", "Format"...). Never NULL. */
const char *kvr_cbi1_strerror(int status);
const char *kvr_cbi1_err_ref(int status);

/* Header fields an encoder writes (wire/format constants are implied). */
typedef struct kvr_cbi1_hdr {
    uint64_t seed;
    uint64_t bucket_count;
    uint64_t dc_id;
    uint64_t epoch;
} kvr_cbi1_hdr_t;

/* A decoded frame; pointers refer into the decoded buffer. */
typedef struct kvr_cbi1_frame {
    uint16_t flags;
    kvr_cbi1_hdr_t hdr;
    /* snapshot chunk */
    uint32_t chunk_index;
    uint32_t chunk_count;
    uint64_t bucket_offset;
    uint32_t word_count;
    const uint8_t *words; /* word_count x u64 LE */
    /* delta */
    uint64_t base_epoch;
    uint32_t image_count;
    const uint8_t *images; /* image_count x (u32 LE bucket, u64 LE value) */
} kvr_cbi1_frame_t;

/* ---- encoding ------------------------------------------------------------------------ */

/* Chunks of a snapshot of bucket_count buckets: ceil(bucket_count / 524288). */
uint32_t kvr_cbi1_chunk_count(uint64_t bucket_count);
/* Encoded size of chunk i of such a snapshot (0 when i is out of range). */
size_t kvr_cbi1_chunk_size(uint64_t bucket_count, uint32_t chunk_index);
/* Encoded size of a delta with n images. */
static inline size_t kvr_cbi1_delta_size(size_t n)
{
    return KVR_CBI1_HEADER_LEN + KVR_CBI1_DELTA_PREFIX + n * KVR_CBI1_IMAGE_LEN;
}

/*
 * Encodes snapshot chunk chunk_index of buckets[0..hdr->bucket_count) (flags 1, epoch =
 * hdr->epoch) into dst[0..cap). Returns the end of the frame, or NULL when the arguments
 * are invalid or cap is too small (nothing useful written).
 */
uint8_t *kvr_cbi1_encode_chunk(uint8_t *dst, size_t cap, const kvr_cbi1_hdr_t *hdr,
                               const uint64_t *buckets, uint32_t chunk_index);

/*
 * Encodes a delta base_epoch -> hdr->epoch with n absolute images into dst[0..cap).
 * Returns the end of the frame, or NULL when n > 349525, an image is out of range or cap
 * is too small.
 */
uint8_t *kvr_cbi1_encode_delta(uint8_t *dst, size_t cap, const kvr_cbi1_hdr_t *hdr,
                               uint64_t base_epoch, const kvr_ckf_image_t *images, size_t n);

/* ---- decoding ------------------------------------------------------------------------ */

/*
 * Decodes and validates buf[0..len) against the expected format (seed, bucket_count from the
 * ProducerIdentity), in the order of docs/relay-contract.md §4.2. Returns KVR_CBI1_OK and
 * fills *out, or the first failing rule's status. dc_id and epoch are returned, not checked
 * (that is the consumer's job, §6 there).
 */
int kvr_cbi1_decode(const uint8_t *buf, size_t len, uint64_t expect_seed,
                    uint64_t expect_bucket_count, kvr_cbi1_frame_t *out);

/*
 * Checks 7-9 of docs/relay-contract.md §4.2 alone: validates a body of the given flags under
 * hdr (whose bucket_count is already checked) and fills *out. kvr_cbi1_decode() calls it;
 * exposed so that rules the 4194368-byte frame cap makes unreachable (chunk word count) stay
 * testable.
 */
int kvr_cbi1_decode_body(uint16_t flags, const kvr_cbi1_hdr_t *hdr, const uint8_t *body,
                         size_t body_len, kvr_cbi1_frame_t *out);

/* Image i of a decoded delta (i < image_count). */
static inline kvr_ckf_image_t kvr_cbi1_image(const kvr_cbi1_frame_t *f, uint32_t i)
{
    const uint8_t *p = f->images + (size_t)i * KVR_CBI1_IMAGE_LEN;
    kvr_ckf_image_t im;
    im.bucket = kvr_le32(p);
    im.value = kvr_le64(p + 4);
    return im;
}

/* Writes a decoded delta's images into a dense bucket array (already range-checked). */
void kvr_cbi1_apply_delta(const kvr_cbi1_frame_t *f, uint64_t *buckets);

/* ---- snapshot assembly (docs/relay-contract.md §4.3) --------------------------------- */

typedef struct kvr_cbi1_asm {
    uint64_t *words;       /* caller's dense array of bucket_count words (the target) */
    uint64_t bucket_count; /* expected bucket_count */
    uint64_t epoch;        /* fixed by chunk 0 */
    uint64_t next_bucket;
    uint32_t chunk_count; /* fixed by chunk 0 */
    uint32_t next_chunk;
} kvr_cbi1_asm_t;

/* Starts an empty assembly into words[0..bucket_count). After KVR_CBI1_COMPLETE,
 * a->epoch holds the snapshot's epoch until the next chunk 0. */
void kvr_cbi1_asm_init(kvr_cbi1_asm_t *a, uint64_t *words, uint64_t bucket_count);
void kvr_cbi1_asm_reset(kvr_cbi1_asm_t *a);
/* 1 while chunks after chunk 0 are expected. */
int kvr_cbi1_asm_active(const kvr_cbi1_asm_t *a);

/*
 * Absorbs one decoded frame. Returns KVR_CBI1_OK (more chunks expected), KVR_CBI1_COMPLETE
 * (words[] now holds the whole snapshot at a->epoch), KVR_CBI1_E_CHUNK_SEQUENCE (a delta, a
 * chunk out of order or with another chunk_count/epoch/bucket_count/offset; the assembly
 * is reset) or KVR_CBI1_E_INCOMPLETE (the last chunk left buckets uncovered; reset).
 */
int kvr_cbi1_asm_feed(kvr_cbi1_asm_t *a, const kvr_cbi1_frame_t *f);

#endif
