/*
 * test_cbi1.c — CBI1 codec (docs/relay-contract.md §4): the golden frames D1, D2, S1, E1
 * (§7: the .hex files in tests/data/cbi1) byte for byte, decoding, one test per check of §4.2
 * in its order, and snapshot assembly (§4.3).
 */
#include <criterion/criterion.h>

#include "common.h"
#include "wire/ckf.h"
#include "core/kvhash.h"
#include "testdata.h"
#include "wire/cbi1.h"

#define SEED5EED 0x5EEDULL

static void expect_bytes(const uint8_t *got, size_t got_len, const char *path)
{
    size_t len;
    uint8_t *want = td_load_hex(path, &len);
    cr_assert_eq(got_len, len, "%s: length %zu, expected %zu", path, got_len, len);
    cr_assert_arr_eq(got, want, len, "%s differs", path);
    free(want);
}

/* Re-seals a frame after a test edits its body or header fields past the checksum. */
static void reseal(uint8_t *f, size_t len)
{
    kvr_put_le32(f + 44, (uint32_t)kvr_kvhash_xxh3(f + 48, len - 48, 0));
}

/* A valid empty delta (D2's parameters) to mutate. */
static size_t base_delta(uint8_t *buf, size_t cap, uint32_t n)
{
    kvr_cbi1_hdr_t h = {SEED5EED, 1024, 7, 1};
    kvr_ckf_image_t im[4] = {{1, 11}, {2, 22}, {3, 33}, {4, 44}};
    uint8_t *e = kvr_cbi1_encode_delta(buf, cap, &h, 0, im, n);
    cr_assert_not_null(e);
    return (size_t)(e - buf);
}

/* A valid one-chunk snapshot of 4 buckets to mutate. */
static size_t base_chunk(uint8_t *buf, size_t cap)
{
    kvr_cbi1_hdr_t h = {SEED5EED, 4, 7, 3};
    uint64_t w[4] = {1, 2, 3, 4};
    uint8_t *e = kvr_cbi1_encode_chunk(buf, cap, &h, w, 0);
    cr_assert_not_null(e);
    return (size_t)(e - buf);
}

static int dec(const uint8_t *b, size_t len, uint64_t bc)
{
    kvr_cbi1_frame_t f;
    return kvr_cbi1_decode(b, len, SEED5EED, bc, &f);
}

/* ---- golden frames (§7) ------------------------------------------------------------- */

Test(cbi1, golden_D1_delta)
{
    uint8_t buf[256];
    kvr_cbi1_hdr_t h = {SEED5EED, 1024, 7, 5};
    kvr_ckf_image_t im[2] = {{3, 0xAAAABBBBCCCCDDDDULL}, {1000, 42}};
    uint8_t *e = kvr_cbi1_encode_delta(buf, sizeof(buf), &h, 4, im, 2);
    cr_assert_not_null(e);
    expect_bytes(buf, (size_t)(e - buf), "tests/data/cbi1/D1.hex");
    cr_expect_eq(kvr_le32(buf + 44), 0x6146f64e);

    kvr_cbi1_frame_t f;
    cr_assert_eq(kvr_cbi1_decode(buf, (size_t)(e - buf), SEED5EED, 1024, &f), KVR_CBI1_OK);
    cr_expect_eq(f.flags, KVR_CBI1_FLAG_DELTA);
    cr_expect_eq(f.hdr.dc_id, 7);
    cr_expect_eq(f.hdr.epoch, 5);
    cr_expect_eq(f.base_epoch, 4);
    cr_assert_eq(f.image_count, 2);
    cr_expect_eq(kvr_cbi1_image(&f, 0).bucket, 3);
    cr_expect_eq(kvr_cbi1_image(&f, 0).value, 0xAAAABBBBCCCCDDDDULL);
    cr_expect_eq(kvr_cbi1_image(&f, 1).bucket, 1000);
    cr_expect_eq(kvr_cbi1_image(&f, 1).value, 42);
}

Test(cbi1, golden_D2_empty_delta)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 0);
    expect_bytes(buf, len, "tests/data/cbi1/D2.hex");
    cr_expect_eq(kvr_le32(buf + 44), 0x69c2a4f0);
    kvr_cbi1_frame_t f;
    cr_assert_eq(kvr_cbi1_decode(buf, len, SEED5EED, 1024, &f), KVR_CBI1_OK);
    cr_expect_eq(f.image_count, 0);
    cr_expect_eq(f.base_epoch, 0);
}

Test(cbi1, golden_S1_snapshot)
{
    uint8_t buf[128];
    kvr_cbi1_hdr_t h = {SEED5EED, 2, 9, 6};
    uint64_t w[2] = {0x0001abcd00001234ULL, 0};
    cr_assert_eq(kvr_cbi1_chunk_count(2), 1);
    cr_assert_eq(kvr_cbi1_chunk_size(2, 0), 80);
    uint8_t *e = kvr_cbi1_encode_chunk(buf, sizeof(buf), &h, w, 0);
    cr_assert_not_null(e);
    expect_bytes(buf, (size_t)(e - buf), "tests/data/cbi1/S1.hex");
    cr_expect_eq(kvr_le32(buf + 44), 0x37f2c09d);
    /* §3.1: a bucket word goes little-endian, bytes 34 12 00 00 cd ab 01 00 */
    const uint8_t le[8] = {0x34, 0x12, 0, 0, 0xcd, 0xab, 0x01, 0};
    cr_expect_arr_eq(buf + 64, le, 8);

    kvr_cbi1_frame_t f;
    cr_assert_eq(kvr_cbi1_decode(buf, 80, SEED5EED, 2, &f), KVR_CBI1_OK);
    cr_expect_eq(f.chunk_index, 0);
    cr_expect_eq(f.chunk_count, 1);
    cr_expect_eq(f.word_count, 2);
    uint64_t out[2] = {7, 7};
    kvr_cbi1_asm_t a;
    kvr_cbi1_asm_init(&a, out, 2);
    cr_assert_eq(kvr_cbi1_asm_feed(&a, &f), KVR_CBI1_COMPLETE);
    cr_expect_eq(a.epoch, 6);
    cr_expect_arr_eq(out, w, sizeof(w));
}

Test(cbi1, golden_E1_end_to_end)
{
    static uint64_t buckets[1024];
    kvr_ckf_t c;
    cr_assert_eq(kvr_ckf_init(&c, buckets, 1024, KVR_CKF_DEFAULT_SEED, 0, 1), KVR_OK);
    kvr_ckf_probe_t p = kvr_ckf_prepare(&c.addr, 0x7ee2cbedc694ab46ULL);
    cr_expect_eq(p.fp, 20428);
    cr_expect_eq(p.a, 748);
    cr_expect_eq(p.b, 322);
    cr_assert_eq(kvr_ckf_insert(&c, 0x7ee2cbedc694ab46ULL), KVR_OK);
    kvr_ckf_image_t im[4];
    size_t n = kvr_ckf_drain(&c, im);
    cr_assert_eq(n, 1);
    cr_expect_eq(im[0].bucket, 748);
    cr_expect_eq(im[0].value, 0x0000000000004fccULL);
    uint8_t buf[128];
    kvr_cbi1_hdr_t h = {KVR_CKF_DEFAULT_SEED, 1024, 3, 1};
    uint8_t *e = kvr_cbi1_encode_delta(buf, sizeof(buf), &h, 0, im, n);
    cr_assert_not_null(e);
    expect_bytes(buf, (size_t)(e - buf), "tests/data/cbi1/E1.hex");
    cr_expect_eq(kvr_le32(buf + 44), 0x0aad6fc3);
    cr_expect_eq(kvr_kvhash_xxh3(NULL, 0, 0), 0x2d06800538d394c2ULL);
    kvr_ckf_destroy(&c);
}

Test(cbi1, constants)
{
    cr_expect_eq(KVR_CBI1_MAX_FRAME, 4194368);
    cr_expect_eq(KVR_CBI1_MAX_DELTA_IMAGES, 349525);
    cr_expect_eq(kvr_cbi1_delta_size(349525), 4194360);
    cr_expect_eq(kvr_cbi1_chunk_count(524288), 1);
    cr_expect_eq(kvr_cbi1_chunk_size(524288, 0), 4194368);
    cr_expect_eq(kvr_cbi1_chunk_count(1 << 20), 2);
    cr_expect_eq(kvr_cbi1_chunk_count(1 << 24), 32);
    cr_expect_eq(kvr_cbi1_chunk_size(1 << 20, 2), 0);
}

Test(cbi1, encoders_check_their_input)
{
    uint8_t buf[256];
    kvr_cbi1_hdr_t h = {SEED5EED, 1024, 7, 1};
    kvr_ckf_image_t bad = {1024, 1};
    uint64_t w[4] = {0};
    cr_expect_null(kvr_cbi1_encode_delta(buf, sizeof(buf), &h, 0, &bad, 1));
    cr_expect_null(kvr_cbi1_encode_delta(buf, 59, &h, 0, NULL, 0));
    cr_expect_null(kvr_cbi1_encode_delta(buf, sizeof(buf), &h, 0, NULL, 349526));
    kvr_cbi1_hdr_t h3 = {SEED5EED, 3, 7, 1};
    cr_expect_null(kvr_cbi1_encode_chunk(buf, sizeof(buf), &h3, w, 0));
    kvr_cbi1_hdr_t h4 = {SEED5EED, 4, 7, 1};
    cr_expect_null(kvr_cbi1_encode_chunk(buf, sizeof(buf), &h4, w, 1));
    cr_expect_null(kvr_cbi1_encode_chunk(buf, 95, &h4, w, 0));
    cr_expect_not_null(kvr_cbi1_encode_chunk(buf, 96, &h4, w, 0));
}

/* ---- §4.2, one test per check, in order ---------------------------------------------- */

Test(cbi1, rule01_truncated)
{
    uint8_t buf[128];
    base_delta(buf, sizeof(buf), 0);
    cr_expect_eq(dec(buf, 47, 1024), KVR_CBI1_E_TRUNCATED);
    cr_expect_eq(dec(buf, 0, 1024), KVR_CBI1_E_TRUNCATED);
}

Test(cbi1, rule02_frame_too_large)
{
    size_t len = KVR_CBI1_MAX_FRAME + 1;
    uint8_t *buf = calloc(1, len); /* zeros: would also fail magic, checked later */
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_TOO_LARGE);
    free(buf);
}

Test(cbi1, rule03_magic)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 1);
    buf[3] = '2';
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_MAGIC);
}

Test(cbi1, rule04_wire_version)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 1);
    kvr_put_le16(buf + 4, 2);
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_WIRE_VERSION);
}

Test(cbi1, rule05_checksum_before_format)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 1);
    buf[len - 1] ^= 1;
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_CHECKSUM);
    /* an appended byte (the reference's example) also fails here first */
    len = base_delta(buf, sizeof(buf), 0);
    buf[len] = 1;
    cr_expect_eq(dec(buf, len + 1, 1024), KVR_CBI1_E_CHECKSUM);
    /* a corrupted checksum field with a wrong format version is still a checksum error */
    len = base_delta(buf, sizeof(buf), 0);
    kvr_put_le16(buf + 10, 9);
    buf[44] ^= 0xFF;
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_CHECKSUM);
}

Test(cbi1, rule06a_format_version)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 1);
    kvr_put_le16(buf + 10, 2); /* header fields are outside the checksum */
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_FORMAT_VERSION);
}

Test(cbi1, rule06b_fingerprint_bits)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 1);
    buf[8] = 8;
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_FINGERPRINT_BITS);
}

Test(cbi1, rule06c_slots_per_bucket)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 1);
    buf[9] = 8;
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_SLOTS_PER_BUCKET);
}

Test(cbi1, rule06d_seed_mismatch)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 1);
    kvr_cbi1_frame_t f;
    cr_expect_eq(kvr_cbi1_decode(buf, len, SEED5EED ^ 1, 1024, &f), KVR_CBI1_E_SEED_MISMATCH);
}

Test(cbi1, rule06e_bucket_count_mismatch)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 1);
    cr_expect_eq(dec(buf, len, 2048), KVR_CBI1_E_BUCKETS_MISMATCH);
}

Test(cbi1, rule07_flags)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 1);
    const uint16_t bad[] = {0, 3, 0x8000, 0xFFFF};
    for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
        kvr_put_le16(buf + 6, bad[i]);
        cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_FLAGS, "flags %u", bad[i]);
    }
}

Test(cbi1, rule08a_delta_body_short)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 0);
    reseal(buf, len - 1);
    cr_expect_eq(dec(buf, len - 1, 1024), KVR_CBI1_E_DELTA_SHORT);
    reseal(buf, 48);
    cr_expect_eq(dec(buf, 48, 1024), KVR_CBI1_E_DELTA_SHORT);
}

Test(cbi1, rule08b_delta_image_count)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 0);
    kvr_put_le32(buf + 56, 349526);
    reseal(buf, len);
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_DELTA_IMAGE_COUNT);
    kvr_put_le32(buf + 56, 0xFFFFFFFFu);
    reseal(buf, len);
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_DELTA_IMAGE_COUNT);
}

Test(cbi1, rule08c_delta_length)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 2);
    kvr_put_le32(buf + 56, 3); /* claims 3, carries 2 */
    reseal(buf, len);
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_DELTA_LENGTH);
    kvr_put_le32(buf + 56, 1); /* claims 1, carries 2 */
    reseal(buf, len);
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_DELTA_LENGTH);
}

Test(cbi1, rule08d_delta_bucket_range)
{
    uint8_t buf[128];
    size_t len = base_delta(buf, sizeof(buf), 2);
    kvr_put_le32(buf + 60 + 12, 1024); /* second image */
    reseal(buf, len);
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_E_DELTA_BUCKET);
    kvr_put_le32(buf + 60 + 12, 1023);
    reseal(buf, len);
    cr_expect_eq(dec(buf, len, 1024), KVR_CBI1_OK);
}

Test(cbi1, rule09a_chunk_body_short)
{
    uint8_t buf[128];
    base_chunk(buf, sizeof(buf));
    reseal(buf, 48 + 15);
    cr_expect_eq(dec(buf, 48 + 15, 4), KVR_CBI1_E_CHUNK_SHORT);
}

Test(cbi1, rule09b_chunk_count_zero)
{
    uint8_t buf[128];
    size_t len = base_chunk(buf, sizeof(buf));
    kvr_put_le32(buf + 52, 0);
    reseal(buf, len);
    cr_expect_eq(dec(buf, len, 4), KVR_CBI1_E_CHUNK_COUNT_ZERO);
}

Test(cbi1, rule09c_chunk_index)
{
    uint8_t buf[128];
    size_t len = base_chunk(buf, sizeof(buf));
    kvr_put_le32(buf + 48, 1); /* index 1 of 1 */
    reseal(buf, len);
    cr_expect_eq(dec(buf, len, 4), KVR_CBI1_E_CHUNK_INDEX);
}

Test(cbi1, rule09d_chunk_words_not_multiple_of_8)
{
    uint8_t buf[128];
    size_t len = base_chunk(buf, sizeof(buf));
    reseal(buf, len - 3);
    cr_expect_eq(dec(buf, len - 3, 4), KVR_CBI1_E_CHUNK_ALIGN);
}

Test(cbi1, rule09e_chunk_word_count)
{
    /* Unreachable through kvr_cbi1_decode (the frame cap bounds words to 524288), so the
     * body rule is exercised directly, as the reference test does. */
    size_t body_len = 16 + (KVR_CBI1_CHUNK_BUCKETS + 1) * 8;
    uint8_t *body = calloc(1, body_len);
    kvr_put_le32(body + 4, 1);
    kvr_cbi1_hdr_t h = {SEED5EED, 1ULL << 24, 7, 1};
    kvr_cbi1_frame_t f;
    cr_expect_eq(kvr_cbi1_decode_body(1, &h, body, body_len, &f), KVR_CBI1_E_CHUNK_WORD_COUNT);
    cr_expect_eq(kvr_cbi1_decode_body(1, &h, body, body_len - 8, &f), KVR_CBI1_OK);
    free(body);
}

Test(cbi1, rule09f_chunk_range)
{
    uint8_t buf[128];
    size_t len = base_chunk(buf, sizeof(buf));
    kvr_put_le64(buf + 56, 1); /* offset 1 + 4 words > 4 */
    reseal(buf, len);
    cr_expect_eq(dec(buf, len, 4), KVR_CBI1_E_CHUNK_RANGE);
    kvr_put_le64(buf + 56, UINT64_MAX - 1); /* no overflow */
    reseal(buf, len);
    cr_expect_eq(dec(buf, len, 4), KVR_CBI1_E_CHUNK_RANGE);
}

/* Status values are all distinct and named. */
Test(cbi1, statuses_distinct)
{
    for (int a = KVR_CBI1_E_ARG; a <= KVR_CBI1_COMPLETE; a++) {
        cr_expect_str_neq(kvr_cbi1_strerror(a), "KVR_CBI1_E_UNKNOWN");
        for (int b = a + 1; b <= KVR_CBI1_COMPLETE; b++)
            cr_expect_str_neq(kvr_cbi1_strerror(a), kvr_cbi1_strerror(b));
    }
    cr_expect_str_eq(kvr_cbi1_err_ref(KVR_CBI1_E_CHUNK_RANGE), "Malformed");
    cr_expect_str_eq(kvr_cbi1_err_ref(KVR_CBI1_E_DELTA_IMAGE_COUNT), "DeltaImageCount");
}

/* ---- §4.3 snapshot assembly ---------------------------------------------------------- */

typedef struct snapshot_fixture {
    uint64_t bc;
    uint64_t *words;
    uint8_t *frames[4];
    size_t lens[4];
    uint32_t n;
} snapshot_fixture_t;

static void make_snapshot(snapshot_fixture_t *s, uint64_t bc, uint64_t epoch)
{
    s->bc = bc;
    s->words = malloc(bc * 8);
    for (uint64_t i = 0; i < bc; i++)
        s->words[i] = i * 0x9E3779B97F4A7C15ULL;
    s->n = kvr_cbi1_chunk_count(bc);
    kvr_cbi1_hdr_t h = {SEED5EED, bc, 9, epoch};
    for (uint32_t i = 0; i < s->n; i++) {
        s->lens[i] = kvr_cbi1_chunk_size(bc, i);
        s->frames[i] = malloc(s->lens[i]);
        uint8_t *e = kvr_cbi1_encode_chunk(s->frames[i], s->lens[i], &h, s->words, i);
        cr_assert_eq(e, s->frames[i] + s->lens[i]);
    }
}

static void free_snapshot(snapshot_fixture_t *s)
{
    for (uint32_t i = 0; i < s->n; i++)
        free(s->frames[i]);
    free(s->words);
}

static kvr_cbi1_frame_t decoded(const snapshot_fixture_t *s, uint32_t i)
{
    kvr_cbi1_frame_t f;
    cr_assert_eq(kvr_cbi1_decode(s->frames[i], s->lens[i], SEED5EED, s->bc, &f), KVR_CBI1_OK);
    return f;
}

Test(cbi1, assembly_rebuilds_exact_lane)
{
    snapshot_fixture_t s;
    make_snapshot(&s, 1 << 21, 6);
    cr_assert_eq(s.n, 4);
    uint64_t *out = calloc(s.bc, 8);
    kvr_cbi1_asm_t a;
    kvr_cbi1_asm_init(&a, out, s.bc);
    for (uint32_t i = 0; i < 4; i++) {
        kvr_cbi1_frame_t f = decoded(&s, i);
        cr_expect_eq(f.bucket_offset, (uint64_t)i * 524288);
        cr_assert_eq(kvr_cbi1_asm_feed(&a, &f), i == 3 ? KVR_CBI1_COMPLETE : KVR_CBI1_OK);
    }
    cr_expect_eq(a.epoch, 6);
    cr_assert_arr_eq(out, s.words, s.bc * 8);
    free(out);
    free_snapshot(&s);
}

Test(cbi1, assembly_chunk_sequence)
{
    snapshot_fixture_t s, other;
    make_snapshot(&s, 1 << 21, 6);
    make_snapshot(&other, 1 << 21, 7); /* another epoch */
    uint64_t *out = calloc(s.bc, 8);
    kvr_cbi1_asm_t a;
    kvr_cbi1_asm_init(&a, out, s.bc);
    kvr_cbi1_frame_t f0 = decoded(&s, 0), f1 = decoded(&s, 1), f2 = decoded(&s, 2);

    /* starts with a chunk other than 0 */
    cr_expect_eq(kvr_cbi1_asm_feed(&a, &f1), KVR_CBI1_E_CHUNK_SEQUENCE);
    /* skipped chunk */
    cr_assert_eq(kvr_cbi1_asm_feed(&a, &f0), KVR_CBI1_OK);
    cr_expect_eq(kvr_cbi1_asm_feed(&a, &f2), KVR_CBI1_E_CHUNK_SEQUENCE);
    cr_expect(!kvr_cbi1_asm_active(&a), "reset after a violation");
    /* repeated chunk */
    cr_assert_eq(kvr_cbi1_asm_feed(&a, &f0), KVR_CBI1_OK);
    cr_assert_eq(kvr_cbi1_asm_feed(&a, &f1), KVR_CBI1_OK);
    cr_expect_eq(kvr_cbi1_asm_feed(&a, &f1), KVR_CBI1_E_CHUNK_SEQUENCE);
    /* other epoch */
    cr_assert_eq(kvr_cbi1_asm_feed(&a, &f0), KVR_CBI1_OK);
    kvr_cbi1_frame_t g1 = decoded(&other, 1);
    cr_expect_eq(kvr_cbi1_asm_feed(&a, &g1), KVR_CBI1_E_CHUNK_SEQUENCE);
    /* other chunk_count */
    cr_assert_eq(kvr_cbi1_asm_feed(&a, &f0), KVR_CBI1_OK);
    kvr_cbi1_frame_t bad = f1;
    bad.chunk_count = 5;
    cr_expect_eq(kvr_cbi1_asm_feed(&a, &bad), KVR_CBI1_E_CHUNK_SEQUENCE);
    /* wrong offset */
    cr_assert_eq(kvr_cbi1_asm_feed(&a, &f0), KVR_CBI1_OK);
    bad = f1;
    bad.bucket_offset += 8;
    cr_expect_eq(kvr_cbi1_asm_feed(&a, &bad), KVR_CBI1_E_CHUNK_SEQUENCE);
    /* a chunk 0 that does not start at bucket 0 */
    bad = f0;
    bad.bucket_offset = 8;
    cr_expect_eq(kvr_cbi1_asm_feed(&a, &bad), KVR_CBI1_E_CHUNK_SEQUENCE);
    /* a delta during assembly */
    cr_assert_eq(kvr_cbi1_asm_feed(&a, &f0), KVR_CBI1_OK);
    uint8_t dbuf[128];
    kvr_cbi1_hdr_t h = {SEED5EED, s.bc, 9, 7};
    uint8_t *e = kvr_cbi1_encode_delta(dbuf, sizeof(dbuf), &h, 6, NULL, 0);
    kvr_cbi1_frame_t d;
    cr_assert_eq(kvr_cbi1_decode(dbuf, (size_t)(e - dbuf), SEED5EED, s.bc, &d), KVR_CBI1_OK);
    cr_expect_eq(kvr_cbi1_asm_feed(&a, &d), KVR_CBI1_E_CHUNK_SEQUENCE);
    /* chunk 0 restarts an assembly in progress */
    cr_assert_eq(kvr_cbi1_asm_feed(&a, &f0), KVR_CBI1_OK);
    cr_assert_eq(kvr_cbi1_asm_feed(&a, &f0), KVR_CBI1_OK);
    cr_assert_eq(kvr_cbi1_asm_feed(&a, &f1), KVR_CBI1_OK);
    free(out);
    free_snapshot(&s);
    free_snapshot(&other);
}

Test(cbi1, assembly_incomplete_coverage)
{
    /* one chunk of 512 words claiming to be the whole 1024-bucket lane */
    static uint8_t buf[48 + 16 + 1024 * 8];
    static uint64_t words[1024];
    kvr_cbi1_hdr_t h = {SEED5EED, 1024, 9, 1};
    cr_assert_not_null(kvr_cbi1_encode_chunk(buf, sizeof(buf), &h, words, 0));
    size_t len = 48 + 16 + 512 * 8; /* keep only the first 512 words */
    reseal(buf, len);
    kvr_cbi1_frame_t f;
    cr_assert_eq(kvr_cbi1_decode(buf, len, SEED5EED, 1024, &f), KVR_CBI1_OK);
    cr_assert_eq(f.word_count, 512);
    uint64_t out[1024];
    kvr_cbi1_asm_t a;
    kvr_cbi1_asm_init(&a, out, 1024);
    cr_expect_eq(kvr_cbi1_asm_feed(&a, &f), KVR_CBI1_E_INCOMPLETE);
    cr_expect(!kvr_cbi1_asm_active(&a));
}
