/*
 * test_mirror.c — consumer replica (docs/relay-contract.md §5 and §6): a producer filter
 * published through CBI1 snapshot chunks and deltas is reproduced exactly, and every
 * out-of-sequence or mismatched frame is rejected.
 */
#include <criterion/criterion.h>

#include "common.h"
#include "wire/ckf.h"
#include "testdata.h"
#include "wire/cbi1.h"
#include "wire/mirror.h"

#define MSEED KVR_CKF_DEFAULT_SEED
#define MDC   0xD00DULL

/* A small producer: a filter with dirty tracking plus frame builders. */
typedef struct producer {
    uint64_t bc;
    uint64_t *buckets;
    kvr_ckf_t ckf;
    uint64_t seq;
    uint8_t *buf; /* one frame */
    size_t cap;
    kvr_ckf_image_t *images;
} producer_t;

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void producer_init(producer_t *p, uint64_t bc)
{
    p->bc = bc;
    p->buckets = calloc(bc, 8);
    cr_assert_eq(kvr_ckf_init(&p->ckf, p->buckets, bc, MSEED, 0, 1), KVR_OK);
    p->seq = 0;
    p->cap = KVR_CBI1_MAX_FRAME;
    p->buf = malloc(p->cap);
    p->images = malloc(bc * sizeof(*p->images));
}

static void producer_free(producer_t *p)
{
    kvr_ckf_destroy(&p->ckf);
    free(p->buckets);
    free(p->buf);
    free(p->images);
}

static kvr_mirror_update_t upd(const producer_t *p, int kind, uint64_t base, uint64_t seq,
                               size_t len)
{
    kvr_mirror_update_t u = {MSEED, p->bc, MDC, base, seq, kind, p->buf, len};
    return u;
}

/* Snapshot chunk i at the current sequence. */
static kvr_mirror_update_t chunk(producer_t *p, uint32_t i)
{
    kvr_cbi1_hdr_t h = {MSEED, p->bc, MDC, p->seq};
    uint8_t *e = kvr_cbi1_encode_chunk(p->buf, p->cap, &h, p->buckets, i);
    cr_assert_not_null(e);
    return upd(p, KVR_FILTER_UPDATE_SNAPSHOT_CHUNK, p->seq, p->seq, (size_t)(e - p->buf));
}

/* Drains the dirty set into the next delta seq -> seq + 1. */
static kvr_mirror_update_t delta(producer_t *p)
{
    size_t n = kvr_ckf_drain(&p->ckf, p->images);
    kvr_cbi1_hdr_t h = {MSEED, p->bc, MDC, p->seq + 1};
    uint8_t *e = kvr_cbi1_encode_delta(p->buf, p->cap, &h, p->seq, p->images, n);
    cr_assert_not_null(e);
    p->seq++;
    return upd(p, KVR_FILTER_UPDATE_DELTA, p->seq - 1, p->seq, (size_t)(e - p->buf));
}

static kvr_mirror_update_t heartbeat(const producer_t *p)
{
    return upd(p, KVR_FILTER_UPDATE_HEARTBEAT, p->seq, p->seq, 0);
}

/* Installs the producer's snapshot into m (all chunks). */
static void install(producer_t *p, kvr_mirror_t *m)
{
    uint32_t n = kvr_cbi1_chunk_count(p->bc);
    for (uint32_t i = 0; i < n; i++) {
        kvr_mirror_update_t u = chunk(p, i);
        cr_assert_eq(kvr_mirror_apply(m, &u), KVR_MIRROR_OK, "chunk %u", i);
        cr_assert_eq(kvr_mirror_state(m), i + 1 == n ? KVR_MIRROR_LIVE : KVR_MIRROR_ASSEMBLING);
    }
    cr_assert_eq(m->sequence, p->seq);
}

/* A LIVE mirror of a producer with some content, at sequence 3. */
static void live_pair(producer_t *p, kvr_mirror_t *m, uint64_t bc)
{
    producer_init(p, bc);
    cr_assert_eq(kvr_mirror_init(m, MSEED, bc, MDC), KVR_OK);
    uint64_t s = 1;
    for (int i = 0; i < 100; i++)
        kvr_ckf_insert(&p->ckf, rnd(&s));
    kvr_ckf_dirty_reset(&p->ckf);
    p->seq = 3;
    install(p, m);
}

static void expect_fail(kvr_mirror_t *m, const kvr_mirror_update_t *u, int want)
{
    int rc = kvr_mirror_apply(m, u);
    cr_expect_eq(rc, want, "got %s, want %s", kvr_mirror_strerror(rc), kvr_mirror_strerror(want));
    cr_expect_eq(kvr_mirror_state(m), KVR_MIRROR_FAILED);
    cr_expect_eq(m->last_error, want);
    cr_expect(!kvr_mirror_contains(m, 0), "a failed replica answers nothing");
    /* FAILED is sticky until reset */
    kvr_mirror_update_t hb = *u;
    cr_expect_eq(kvr_mirror_apply(m, &hb), KVR_MIRROR_E_FAILED);
}

Test(mirror, golden_S1_installs)
{
    size_t len;
    uint8_t *s1 = td_load_hex("tests/data/cbi1/S1.hex", &len);
    kvr_mirror_t m;
    cr_assert_eq(kvr_mirror_init(&m, 0x5EED, 2, 9), KVR_OK);
    kvr_mirror_update_t u = {0x5EED, 2, 9, 6, 6, KVR_FILTER_UPDATE_SNAPSHOT_CHUNK, s1, len};
    cr_assert_eq(kvr_mirror_apply(&m, &u), KVR_MIRROR_OK);
    cr_assert_eq(kvr_mirror_state(&m), KVR_MIRROR_LIVE);
    cr_expect_eq(m.sequence, 6);
    cr_expect_eq(m.buckets[0], 0x0001abcd00001234ULL);
    cr_expect_eq(m.buckets[1], 0);
    /* D1/D2 are for another format: rejected by the decoder's format check */
    size_t dlen;
    uint8_t *d2 = td_load_hex("tests/data/cbi1/D2.hex", &dlen);
    kvr_mirror_update_t d = {0x5EED, 2, 9, 6, 7, KVR_FILTER_UPDATE_DELTA, d2, dlen};
    cr_expect_eq(kvr_mirror_apply(&m, &d), KVR_CBI1_E_BUCKETS_MISMATCH);
    kvr_mirror_destroy(&m);
    free(s1);
    free(d2);
}

Test(mirror, golden_E1_applies)
{
    size_t len;
    uint8_t *e1 = td_load_hex("tests/data/cbi1/E1.hex", &len);
    static uint64_t empty[1024];
    uint8_t snap[48 + 16 + 1024 * 8];
    kvr_cbi1_hdr_t h = {KVR_CKF_DEFAULT_SEED, 1024, 3, 0};
    uint8_t *e = kvr_cbi1_encode_chunk(snap, sizeof(snap), &h, empty, 0);
    kvr_mirror_t m;
    cr_assert_eq(kvr_mirror_init(&m, KVR_CKF_DEFAULT_SEED, 1024, 3), KVR_OK);
    kvr_mirror_update_t s = {KVR_CKF_DEFAULT_SEED, 1024, 3, 0, 0,
                             KVR_FILTER_UPDATE_SNAPSHOT_CHUNK, snap, (size_t)(e - snap)};
    cr_assert_eq(kvr_mirror_apply(&m, &s), KVR_MIRROR_OK);
    cr_expect(!kvr_mirror_contains(&m, 0x7ee2cbedc694ab46ULL));
    kvr_mirror_update_t d = {KVR_CKF_DEFAULT_SEED, 1024, 3, 0, 1, KVR_FILTER_UPDATE_DELTA, e1, len};
    cr_assert_eq(kvr_mirror_apply(&m, &d), KVR_MIRROR_OK);
    cr_expect(kvr_mirror_contains(&m, 0x7ee2cbedc694ab46ULL));
    cr_expect_eq(m.buckets[748], 0x4fcc);
    cr_expect_eq(m.sequence, 1);
    kvr_mirror_destroy(&m);
    free(e1);
}

/* Multi-chunk snapshot, then deltas and heartbeats: the replica equals the producer. */
Test(mirror, follows_producer, .timeout = 60)
{
    producer_t p;
    kvr_mirror_t m;
    const uint64_t bc = 1ULL << 20; /* two chunks */
    producer_init(&p, bc);
    cr_assert_eq(kvr_mirror_init(&m, MSEED, bc, MDC), KVR_OK);
    uint64_t s = 7, r = 7;
    for (int i = 0; i < 200000; i++)
        cr_assert_eq(kvr_ckf_insert(&p.ckf, rnd(&s)), KVR_OK);
    kvr_ckf_dirty_reset(&p.ckf);
    p.seq = 41;
    cr_expect(!kvr_mirror_contains(&m, 1));
    install(&p, &m);
    cr_assert_arr_eq(m.buckets, p.buckets, bc * 8);
    size_t removed = 0;
    for (int round = 0; round < 50; round++) {
        for (int k = 0; k < 500; k++) {
            if (k % 4 == 3) {
                cr_assert_eq(kvr_ckf_remove(&p.ckf, rnd(&r)), KVR_OK);
                removed++;
            } else {
                cr_assert_eq(kvr_ckf_insert(&p.ckf, rnd(&s)), KVR_OK);
            }
        }
        kvr_mirror_update_t u = delta(&p);
        cr_assert_eq(kvr_mirror_apply(&m, &u), KVR_MIRROR_OK);
        if (round % 10 == 0) {
            kvr_mirror_update_t hb = heartbeat(&p);
            cr_assert_eq(kvr_mirror_apply(&m, &hb), KVR_MIRROR_OK);
        }
    }
    cr_assert_eq(m.sequence, 91);
    cr_assert_arr_eq(m.buckets, p.buckets, bc * 8);
    uint64_t s2 = 7;
    for (size_t i = 0; i < removed; i++)
        rnd(&s2);
    for (int i = 0; i < 10000; i++)
        cr_assert(kvr_mirror_contains(&m, rnd(&s2)));
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_gap)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_ckf_insert(&p.ckf, 5);
    kvr_mirror_update_t u = delta(&p); /* 3 -> 4, never delivered */
    kvr_ckf_insert(&p.ckf, 6);
    u = delta(&p); /* 4 -> 5 */
    expect_fail(&m, &u, KVR_MIRROR_E_GAP);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_repeat)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_ckf_insert(&p.ckf, 5);
    kvr_mirror_update_t u = delta(&p);
    cr_assert_eq(kvr_mirror_apply(&m, &u), KVR_MIRROR_OK);
    expect_fail(&m, &u, KVR_MIRROR_E_REPEAT);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_delta_sequence_not_base_plus_one)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_mirror_update_t u = delta(&p);
    u.sequence = u.base_sequence + 2;
    expect_fail(&m, &u, KVR_MIRROR_E_DELTA_SEQUENCE);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_wrong_dc_id)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    /* envelope producer dc_id differs from the subscribed one */
    kvr_mirror_update_t u = delta(&p);
    u.dc_id ^= 1;
    expect_fail(&m, &u, KVR_MIRROR_E_PRODUCER);
    /* envelope right, CBI1 header dc_id wrong */
    kvr_mirror_reset(&m);
    p.seq = 3;
    install(&p, &m);
    kvr_cbi1_hdr_t h = {MSEED, p.bc, MDC + 1, 4};
    uint8_t *e = kvr_cbi1_encode_delta(p.buf, p.cap, &h, 3, NULL, 0);
    u = upd(&p, KVR_FILTER_UPDATE_DELTA, 3, 4, (size_t)(e - p.buf));
    expect_fail(&m, &u, KVR_MIRROR_E_DC_ID);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_wrong_seed)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_mirror_update_t u = delta(&p);
    u.seed ^= 1;
    expect_fail(&m, &u, KVR_MIRROR_E_PRODUCER);
    kvr_mirror_reset(&m);
    p.seq = 3;
    install(&p, &m);
    kvr_cbi1_hdr_t h = {MSEED ^ 1, p.bc, MDC, 4};
    uint8_t *e = kvr_cbi1_encode_delta(p.buf, p.cap, &h, 3, NULL, 0);
    u = upd(&p, KVR_FILTER_UPDATE_DELTA, 3, 4, (size_t)(e - p.buf));
    expect_fail(&m, &u, KVR_CBI1_E_SEED_MISMATCH);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_wrong_bucket_count)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_mirror_update_t u = delta(&p);
    u.bucket_count = 2048;
    expect_fail(&m, &u, KVR_MIRROR_E_PRODUCER);
    kvr_mirror_reset(&m);
    p.seq = 3;
    install(&p, &m);
    kvr_cbi1_hdr_t h = {MSEED, 2048, MDC, 4};
    uint8_t *e = kvr_cbi1_encode_delta(p.buf, p.cap, &h, 3, NULL, 0);
    u = upd(&p, KVR_FILTER_UPDATE_DELTA, 3, 4, (size_t)(e - p.buf));
    expect_fail(&m, &u, KVR_CBI1_E_BUCKETS_MISMATCH);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_delta_during_assembly)
{
    producer_t p;
    kvr_mirror_t m;
    producer_init(&p, 1ULL << 20);
    cr_assert_eq(kvr_mirror_init(&m, MSEED, p.bc, MDC), KVR_OK);
    kvr_mirror_update_t u = chunk(&p, 0);
    cr_assert_eq(kvr_mirror_apply(&m, &u), KVR_MIRROR_OK);
    cr_assert_eq(kvr_mirror_state(&m), KVR_MIRROR_ASSEMBLING);
    cr_expect(!kvr_mirror_contains(&m, 1), "not exposed during assembly");
    u = delta(&p);
    expect_fail(&m, &u, KVR_MIRROR_E_DELTA_ASSEMBLING);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_delta_before_snapshot)
{
    producer_t p;
    kvr_mirror_t m;
    producer_init(&p, 1024);
    cr_assert_eq(kvr_mirror_init(&m, MSEED, p.bc, MDC), KVR_OK);
    kvr_mirror_update_t u = delta(&p);
    expect_fail(&m, &u, KVR_MIRROR_E_DELTA_NO_SNAPSHOT);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_heartbeat_with_payload)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_mirror_update_t u = heartbeat(&p);
    u.payload_len = 1;
    expect_fail(&m, &u, KVR_MIRROR_E_HEARTBEAT_PAYLOAD);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_heartbeat_before_snapshot)
{
    producer_t p;
    kvr_mirror_t m;
    producer_init(&p, 1ULL << 20);
    cr_assert_eq(kvr_mirror_init(&m, MSEED, p.bc, MDC), KVR_OK);
    kvr_mirror_update_t u = heartbeat(&p);
    expect_fail(&m, &u, KVR_MIRROR_E_HEARTBEAT_EARLY);
    /* nor between chunks */
    kvr_mirror_reset(&m);
    u = chunk(&p, 0);
    cr_assert_eq(kvr_mirror_apply(&m, &u), KVR_MIRROR_OK);
    u = heartbeat(&p);
    expect_fail(&m, &u, KVR_MIRROR_E_HEARTBEAT_EARLY);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_heartbeat_off_sequence)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_mirror_update_t u = heartbeat(&p);
    u.sequence++;
    u.base_sequence++;
    expect_fail(&m, &u, KVR_MIRROR_E_HEARTBEAT_SEQUENCE);
    kvr_mirror_reset(&m);
    p.seq = 3;
    install(&p, &m);
    u = heartbeat(&p);
    u.base_sequence--;
    expect_fail(&m, &u, KVR_MIRROR_E_HEARTBEAT_SEQUENCE);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_epoch_not_sequence)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_cbi1_hdr_t h = {MSEED, p.bc, MDC, 5}; /* header epoch 5, envelope 3 -> 4 */
    uint8_t *e = kvr_cbi1_encode_delta(p.buf, p.cap, &h, 3, NULL, 0);
    kvr_mirror_update_t u = upd(&p, KVR_FILTER_UPDATE_DELTA, 3, 4, (size_t)(e - p.buf));
    expect_fail(&m, &u, KVR_MIRROR_E_EPOCH);
    /* and for a snapshot chunk */
    kvr_mirror_reset(&m);
    p.seq = 9;
    u = chunk(&p, 0);
    u.sequence = u.base_sequence = 10;
    expect_fail(&m, &u, KVR_MIRROR_E_EPOCH);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_base_epoch_not_base_sequence)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_cbi1_hdr_t h = {MSEED, p.bc, MDC, 4};
    uint8_t *e = kvr_cbi1_encode_delta(p.buf, p.cap, &h, 2, NULL, 0); /* base_epoch 2 */
    kvr_mirror_update_t u = upd(&p, KVR_FILTER_UPDATE_DELTA, 3, 4, (size_t)(e - p.buf));
    expect_fail(&m, &u, KVR_MIRROR_E_BASE_EPOCH);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_chunk_with_base_not_sequence)
{
    producer_t p;
    kvr_mirror_t m;
    producer_init(&p, 1024);
    cr_assert_eq(kvr_mirror_init(&m, MSEED, p.bc, MDC), KVR_OK);
    kvr_mirror_update_t u = chunk(&p, 0);
    u.base_sequence = 1;
    expect_fail(&m, &u, KVR_MIRROR_E_CHUNK_BASE);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_chunk_after_install)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_mirror_update_t u = chunk(&p, 0);
    expect_fail(&m, &u, KVR_MIRROR_E_CHUNK_AFTER_LIVE);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_unknown_kind_and_kind_flag_mismatch)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_mirror_update_t u = delta(&p);
    u.kind = 4;
    expect_fail(&m, &u, KVR_MIRROR_E_KIND);
    kvr_mirror_reset(&m);
    p.seq = 4;
    install(&p, &m);
    u = heartbeat(&p);
    u.kind = KVR_FILTER_UPDATE_UNSPECIFIED;
    expect_fail(&m, &u, KVR_MIRROR_E_KIND);
    /* a snapshot payload sent as a DELTA */
    kvr_mirror_reset(&m);
    install(&p, &m);
    kvr_cbi1_hdr_t h = {MSEED, p.bc, MDC, 5};
    uint8_t *e = kvr_cbi1_encode_chunk(p.buf, p.cap, &h, p.buckets, 0);
    u = upd(&p, KVR_FILTER_UPDATE_DELTA, 4, 5, (size_t)(e - p.buf));
    expect_fail(&m, &u, KVR_MIRROR_E_KIND_FLAGS);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, rejects_corrupt_payload_and_chunk_disorder)
{
    producer_t p;
    kvr_mirror_t m;
    live_pair(&p, &m, 1024);
    kvr_ckf_insert(&p.ckf, 77);
    kvr_mirror_update_t u = delta(&p);
    p.buf[u.payload_len - 1] ^= 1;
    uint64_t before = m.buckets[0];
    expect_fail(&m, &u, KVR_CBI1_E_CHECKSUM);
    cr_expect_eq(m.buckets[0], before);
    producer_free(&p);
    kvr_mirror_destroy(&m);

    producer_init(&p, 1ULL << 21);
    cr_assert_eq(kvr_mirror_init(&m, MSEED, p.bc, MDC), KVR_OK);
    u = chunk(&p, 1);
    expect_fail(&m, &u, KVR_CBI1_E_CHUNK_SEQUENCE);
    producer_free(&p);
    kvr_mirror_destroy(&m);
}

Test(mirror, init_and_strerror)
{
    kvr_mirror_t m;
    cr_expect_eq(kvr_mirror_init(&m, 1, 3, 0), KVR_EINVAL);
    cr_expect_eq(kvr_mirror_init(&m, 1, 1ULL << 25, 0), KVR_EINVAL);
    cr_expect_str_eq(kvr_mirror_strerror(KVR_MIRROR_E_GAP), "KVR_MIRROR_E_GAP");
    cr_expect_str_eq(kvr_mirror_strerror(KVR_MIRROR_E_HEARTBEAT_SEQUENCE),
                     "KVR_MIRROR_E_HEARTBEAT_SEQUENCE");
    cr_expect_str_eq(kvr_mirror_strerror(KVR_CBI1_E_MAGIC), "KVR_CBI1_E_MAGIC");
    cr_expect_str_eq(kvr_mirror_strerror(KVR_MIRROR_OK), "KVR_MIRROR_OK");
}
