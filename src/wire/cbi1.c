/*
 * cbi1.c — CBI1 encoder, decoder and snapshot assembly (docs/relay-contract.md §4).
 *
 * The layout table is in cbi1.h. Bodies are checksummed with XXH3-64 (seed 0), low 32
 * bits stored at header offset 44; the decoder verifies it before any format field (check 5
 * of docs/relay-contract.md §4.2), so corrupted frames fail as Checksum whatever else they break.
 *
 * Bulk words (snapshot chunks) are copied with memcpy on little-endian hosts, where the
 * in-memory u64 array and its LE wire form are the same bytes; other hosts go word by
 * word through the LE helpers. Everything else uses the helpers of common.h.
 *
 * Checksums of multi-megabyte bodies dominate encode and decode: on x86-64 they go
 * through libxxhash's dispatching entry points, which pick the widest vector unit at run
 * time (AVX2 is about twice SSE2 here); the result is the same XXH3-64 value.
 */
#include <xxhash.h>
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h> /* libxxhash's runtime SSE2/AVX2/AVX-512 selection */
#define KVR_CBI1_XXH_DISPATCH 1
#endif
#endif

#include "common.h"
#include "wire/cbi1.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KVR_CBI1_LE_HOST 1
#else
#define KVR_CBI1_LE_HOST 0
#endif

static const struct {
    int status;
    const char *name;
    const char *ref;
} status_names[] = {
    {KVR_CBI1_OK, "KVR_CBI1_OK", "Ok"},
    {KVR_CBI1_COMPLETE, "KVR_CBI1_COMPLETE", "Ok"},
    {KVR_CBI1_E_TRUNCATED, "KVR_CBI1_E_TRUNCATED", "Truncated"},
    {KVR_CBI1_E_TOO_LARGE, "KVR_CBI1_E_TOO_LARGE", "FrameTooLarge"},
    {KVR_CBI1_E_MAGIC, "KVR_CBI1_E_MAGIC", "Magic"},
    {KVR_CBI1_E_WIRE_VERSION, "KVR_CBI1_E_WIRE_VERSION", "WireVersion"},
    {KVR_CBI1_E_CHECKSUM, "KVR_CBI1_E_CHECKSUM", "Checksum"},
    {KVR_CBI1_E_FORMAT_VERSION, "KVR_CBI1_E_FORMAT_VERSION", "Format"},
    {KVR_CBI1_E_FINGERPRINT_BITS, "KVR_CBI1_E_FINGERPRINT_BITS", "Format"},
    {KVR_CBI1_E_SLOTS_PER_BUCKET, "KVR_CBI1_E_SLOTS_PER_BUCKET", "Format"},
    {KVR_CBI1_E_SEED_MISMATCH, "KVR_CBI1_E_SEED_MISMATCH", "FormatMismatch"},
    {KVR_CBI1_E_BUCKETS_MISMATCH, "KVR_CBI1_E_BUCKETS_MISMATCH", "FormatMismatch"},
    {KVR_CBI1_E_FLAGS, "KVR_CBI1_E_FLAGS", "Flags"},
    {KVR_CBI1_E_DELTA_SHORT, "KVR_CBI1_E_DELTA_SHORT", "Malformed"},
    {KVR_CBI1_E_DELTA_IMAGE_COUNT, "KVR_CBI1_E_DELTA_IMAGE_COUNT", "DeltaImageCount"},
    {KVR_CBI1_E_DELTA_LENGTH, "KVR_CBI1_E_DELTA_LENGTH", "Malformed"},
    {KVR_CBI1_E_DELTA_BUCKET, "KVR_CBI1_E_DELTA_BUCKET", "Malformed"},
    {KVR_CBI1_E_CHUNK_SHORT, "KVR_CBI1_E_CHUNK_SHORT", "Malformed"},
    {KVR_CBI1_E_CHUNK_COUNT_ZERO, "KVR_CBI1_E_CHUNK_COUNT_ZERO", "Malformed"},
    {KVR_CBI1_E_CHUNK_INDEX, "KVR_CBI1_E_CHUNK_INDEX", "Malformed"},
    {KVR_CBI1_E_CHUNK_ALIGN, "KVR_CBI1_E_CHUNK_ALIGN", "Malformed"},
    {KVR_CBI1_E_CHUNK_WORD_COUNT, "KVR_CBI1_E_CHUNK_WORD_COUNT", "SnapshotChunkWordCount"},
    {KVR_CBI1_E_CHUNK_RANGE, "KVR_CBI1_E_CHUNK_RANGE", "Malformed"},
    {KVR_CBI1_E_CHUNK_SEQUENCE, "KVR_CBI1_E_CHUNK_SEQUENCE", "ChunkSequence"},
    {KVR_CBI1_E_INCOMPLETE, "KVR_CBI1_E_INCOMPLETE", "IncompleteCoverage"},
    {KVR_CBI1_E_ARG, "KVR_CBI1_E_ARG", "Argument"},
};

const char *kvr_cbi1_strerror(int status)
{
    for (size_t i = 0; i < KVR_ARRAY_SIZE(status_names); i++)
        if (status_names[i].status == status)
            return status_names[i].name;
    return "KVR_CBI1_E_UNKNOWN";
}

const char *kvr_cbi1_err_ref(int status)
{
    for (size_t i = 0; i < KVR_ARRAY_SIZE(status_names); i++)
        if (status_names[i].status == status)
            return status_names[i].ref;
    return "Unknown";
}

/* XXH3-64 of a body, seed 0. */
static inline uint64_t body_hash(const uint8_t *p, size_t n)
{
#ifdef KVR_CBI1_XXH_DISPATCH
    return XXH3_64bits_dispatch(p, n);
#else
    return XXH3_64bits(p, n);
#endif
}

static int valid_bucket_count(uint64_t bc)
{
    return bc >= 2 && bc <= KVR_CBI1_MAX_BUCKET_COUNT && (bc & (bc - 1)) == 0;
}

/* ---- encoding ------------------------------------------------------------------------ */

uint32_t kvr_cbi1_chunk_count(uint64_t bucket_count)
{
    return (uint32_t)((bucket_count + KVR_CBI1_CHUNK_BUCKETS - 1) / KVR_CBI1_CHUNK_BUCKETS);
}

static uint64_t chunk_words(uint64_t bucket_count, uint32_t chunk_index)
{
    uint64_t off = (uint64_t)chunk_index * KVR_CBI1_CHUNK_BUCKETS;
    if (off >= bucket_count)
        return 0;
    uint64_t k = bucket_count - off;
    return k < KVR_CBI1_CHUNK_BUCKETS ? k : KVR_CBI1_CHUNK_BUCKETS;
}

size_t kvr_cbi1_chunk_size(uint64_t bucket_count, uint32_t chunk_index)
{
    uint64_t k = chunk_words(bucket_count, chunk_index);
    return k ? KVR_CBI1_HEADER_LEN + KVR_CBI1_CHUNK_PREFIX + (size_t)k * 8 : 0;
}

static uint8_t *put_header(uint8_t *p, uint16_t flags, const kvr_cbi1_hdr_t *hdr)
{
    memcpy(p, KVR_CBI1_MAGIC, 4);
    p = kvr_put_le16(p + 4, KVR_CBI1_WIRE_VERSION);
    p = kvr_put_le16(p, flags);
    *p++ = KVR_CBI1_FINGERPRINT_BITS;
    *p++ = KVR_CBI1_SLOTS_PER_BUCKET;
    p = kvr_put_le16(p, KVR_CBI1_FORMAT_VERSION);
    p = kvr_put_le64(p, hdr->seed);
    p = kvr_put_le64(p, hdr->bucket_count);
    p = kvr_put_le64(p, hdr->dc_id);
    p = kvr_put_le64(p, hdr->epoch);
    return kvr_put_le32(p, 0); /* checksum, patched by finish() */
}

static uint8_t *finish(uint8_t *frame, uint8_t *end)
{
    size_t body = (size_t)(end - frame) - KVR_CBI1_HEADER_LEN;
    uint32_t c = (uint32_t)body_hash(frame + KVR_CBI1_HEADER_LEN, body);
    kvr_put_le32(frame + KVR_CBI1_HEADER_LEN - 4, c);
    return end;
}

uint8_t *kvr_cbi1_encode_chunk(uint8_t *dst, size_t cap, const kvr_cbi1_hdr_t *hdr,
                               const uint64_t *buckets, uint32_t chunk_index)
{
    if (!valid_bucket_count(hdr->bucket_count))
        return NULL;
    uint64_t k = chunk_words(hdr->bucket_count, chunk_index);
    if (k == 0 || cap < KVR_CBI1_HEADER_LEN + KVR_CBI1_CHUNK_PREFIX + k * 8)
        return NULL;
    uint64_t off = (uint64_t)chunk_index * KVR_CBI1_CHUNK_BUCKETS;
    uint8_t *p = put_header(dst, KVR_CBI1_FLAG_SNAPSHOT_CHUNK, hdr);
    p = kvr_put_le32(p, chunk_index);
    p = kvr_put_le32(p, kvr_cbi1_chunk_count(hdr->bucket_count));
    p = kvr_put_le64(p, off);
#if KVR_CBI1_LE_HOST
    memcpy(p, buckets + off, (size_t)k * 8);
    p += k * 8;
#else
    for (uint64_t i = 0; i < k; i++)
        p = kvr_put_le64(p, buckets[off + i]);
#endif
    return finish(dst, p);
}

uint8_t *kvr_cbi1_encode_delta(uint8_t *dst, size_t cap, const kvr_cbi1_hdr_t *hdr,
                               uint64_t base_epoch, const kvr_ckf_image_t *images, size_t n)
{
    if (!valid_bucket_count(hdr->bucket_count) || n > KVR_CBI1_MAX_DELTA_IMAGES ||
        cap < kvr_cbi1_delta_size(n))
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (images[i].bucket >= hdr->bucket_count)
            return NULL;
    uint8_t *p = put_header(dst, KVR_CBI1_FLAG_DELTA, hdr);
    p = kvr_put_le64(p, base_epoch);
    p = kvr_put_le32(p, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        p = kvr_put_le32(p, images[i].bucket);
        p = kvr_put_le64(p, images[i].value);
    }
    return finish(dst, p);
}

/* ---- decoding ------------------------------------------------------------------------ */

int kvr_cbi1_decode_body(uint16_t flags, const kvr_cbi1_hdr_t *hdr, const uint8_t *body,
                         size_t body_len, kvr_cbi1_frame_t *out)
{
    out->flags = flags;
    out->hdr = *hdr;
    if (flags == KVR_CBI1_FLAG_DELTA) {
        if (body_len < KVR_CBI1_DELTA_PREFIX)
            return KVR_CBI1_E_DELTA_SHORT;
        uint32_t count = kvr_le32(body + 8);
        if (count > KVR_CBI1_MAX_DELTA_IMAGES)
            return KVR_CBI1_E_DELTA_IMAGE_COUNT;
        if (body_len != KVR_CBI1_DELTA_PREFIX + (size_t)count * KVR_CBI1_IMAGE_LEN)
            return KVR_CBI1_E_DELTA_LENGTH;
        const uint8_t *im = body + KVR_CBI1_DELTA_PREFIX;
        for (uint32_t i = 0; i < count; i++)
            if (kvr_le32(im + (size_t)i * KVR_CBI1_IMAGE_LEN) >= hdr->bucket_count)
                return KVR_CBI1_E_DELTA_BUCKET;
        out->base_epoch = kvr_le64(body);
        out->image_count = count;
        out->images = im;
        return KVR_CBI1_OK;
    }
    if (flags == KVR_CBI1_FLAG_SNAPSHOT_CHUNK) {
        if (body_len < KVR_CBI1_CHUNK_PREFIX)
            return KVR_CBI1_E_CHUNK_SHORT;
        uint32_t index = kvr_le32(body);
        uint32_t count = kvr_le32(body + 4);
        if (count == 0)
            return KVR_CBI1_E_CHUNK_COUNT_ZERO;
        if (index >= count)
            return KVR_CBI1_E_CHUNK_INDEX;
        uint64_t offset = kvr_le64(body + 8);
        size_t wbytes = body_len - KVR_CBI1_CHUNK_PREFIX;
        if (wbytes % 8)
            return KVR_CBI1_E_CHUNK_ALIGN;
        size_t words = wbytes / 8;
        if (words > KVR_CBI1_CHUNK_BUCKETS)
            return KVR_CBI1_E_CHUNK_WORD_COUNT;
        if (offset > hdr->bucket_count || words > hdr->bucket_count - offset)
            return KVR_CBI1_E_CHUNK_RANGE;
        out->chunk_index = index;
        out->chunk_count = count;
        out->bucket_offset = offset;
        out->word_count = (uint32_t)words;
        out->words = body + KVR_CBI1_CHUNK_PREFIX;
        return KVR_CBI1_OK;
    }
    return KVR_CBI1_E_FLAGS;
}

int kvr_cbi1_decode(const uint8_t *buf, size_t len, uint64_t expect_seed,
                    uint64_t expect_bucket_count, kvr_cbi1_frame_t *out)
{
    memset(out, 0, sizeof(*out));
    if (len < KVR_CBI1_HEADER_LEN)
        return KVR_CBI1_E_TRUNCATED;
    if (len > KVR_CBI1_MAX_FRAME)
        return KVR_CBI1_E_TOO_LARGE;
    if (memcmp(buf, KVR_CBI1_MAGIC, 4) != 0)
        return KVR_CBI1_E_MAGIC;
    if (kvr_le16(buf + 4) != KVR_CBI1_WIRE_VERSION)
        return KVR_CBI1_E_WIRE_VERSION;
    const uint8_t *body = buf + KVR_CBI1_HEADER_LEN;
    size_t body_len = len - KVR_CBI1_HEADER_LEN;
    if ((uint32_t)body_hash(body, body_len) != kvr_le32(buf + 44))
        return KVR_CBI1_E_CHECKSUM;
    if (kvr_le16(buf + 10) != KVR_CBI1_FORMAT_VERSION)
        return KVR_CBI1_E_FORMAT_VERSION;
    if (buf[8] != KVR_CBI1_FINGERPRINT_BITS)
        return KVR_CBI1_E_FINGERPRINT_BITS;
    if (buf[9] != KVR_CBI1_SLOTS_PER_BUCKET)
        return KVR_CBI1_E_SLOTS_PER_BUCKET;
    kvr_cbi1_hdr_t hdr;
    hdr.seed = kvr_le64(buf + 12);
    hdr.bucket_count = kvr_le64(buf + 20);
    hdr.dc_id = kvr_le64(buf + 28);
    hdr.epoch = kvr_le64(buf + 36);
    if (hdr.seed != expect_seed)
        return KVR_CBI1_E_SEED_MISMATCH;
    if (hdr.bucket_count != expect_bucket_count)
        return KVR_CBI1_E_BUCKETS_MISMATCH;
    return kvr_cbi1_decode_body(kvr_le16(buf + 6), &hdr, body, body_len, out);
}

void kvr_cbi1_apply_delta(const kvr_cbi1_frame_t *f, uint64_t *buckets)
{
    const uint8_t *p = f->images;
    for (uint32_t i = 0; i < f->image_count; i++, p += KVR_CBI1_IMAGE_LEN)
        buckets[kvr_le32(p)] = kvr_le64(p + 4);
}

/* ---- snapshot assembly --------------------------------------------------------------- */

void kvr_cbi1_asm_init(kvr_cbi1_asm_t *a, uint64_t *words, uint64_t bucket_count)
{
    a->words = words;
    a->bucket_count = bucket_count;
    a->epoch = 0;
    kvr_cbi1_asm_reset(a);
}

void kvr_cbi1_asm_reset(kvr_cbi1_asm_t *a)
{
    a->next_bucket = 0;
    a->chunk_count = 0;
    a->next_chunk = 0;
}

int kvr_cbi1_asm_active(const kvr_cbi1_asm_t *a)
{
    return a->next_chunk != 0;
}

int kvr_cbi1_asm_feed(kvr_cbi1_asm_t *a, const kvr_cbi1_frame_t *f)
{
    if (f->flags != KVR_CBI1_FLAG_SNAPSHOT_CHUNK || f->chunk_count == 0 ||
        f->chunk_index >= f->chunk_count) {
        kvr_cbi1_asm_reset(a);
        return KVR_CBI1_E_CHUNK_SEQUENCE;
    }
    if (f->chunk_index == 0) {
        kvr_cbi1_asm_reset(a);
        a->epoch = f->hdr.epoch;
        a->chunk_count = f->chunk_count;
    }
    if (f->chunk_index != a->next_chunk || f->chunk_count != a->chunk_count ||
        f->hdr.epoch != a->epoch || f->hdr.bucket_count != a->bucket_count ||
        f->bucket_offset != a->next_bucket ||
        f->word_count > a->bucket_count - a->next_bucket) {
        kvr_cbi1_asm_reset(a);
        return KVR_CBI1_E_CHUNK_SEQUENCE;
    }
    uint64_t *dst = a->words + a->next_bucket;
#if KVR_CBI1_LE_HOST
    memcpy(dst, f->words, (size_t)f->word_count * 8);
#else
    for (uint32_t i = 0; i < f->word_count; i++)
        dst[i] = kvr_le64(f->words + (size_t)i * 8);
#endif
    a->next_bucket += f->word_count;
    a->next_chunk++;
    if (a->next_chunk != a->chunk_count)
        return KVR_CBI1_OK;
    uint64_t covered = a->next_bucket;
    kvr_cbi1_asm_reset(a);
    return covered == a->bucket_count ? KVR_CBI1_COMPLETE : KVR_CBI1_E_INCOMPLETE;
}
