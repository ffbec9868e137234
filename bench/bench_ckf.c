/*
 * bench_ckf.c — micro-benchmarks of the Cuckoo filter and the CBI1 codec.
 *
 * Prints "name value unit" lines on stdout and nothing else:
 *   ckf_contains_mops            lookups/us, 50 % hits, filter of 1M entries, one core
 *   ckf_contains_batch_mops      the same through kvr_ckf_contains_many (prefetching)
 *   ckf_insert_mops              inserts/us into an empty filter up to 80 % load
 *   memcpy_gbps                  memcpy of the 16M-bucket (128 MiB) lane, same run
 *   cbi1_snapshot_encode_gbps    encoding that lane as 32 snapshot chunks
 *   cbi1_decode_apply_gbps       decoding the 32 chunks into a mirror (assembly)
 *   cbi1_delta_1000_us           encoding one 1000-image delta
 * Each figure is the best of a few repetitions; the whole run takes a few seconds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "wire/ckf.h"
#include "wire/cbi1.h"
#include "wire/mirror.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "bench_ckf: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    memset(p, 0, n); /* fault the pages in before timing */
    return p;
}

static volatile uint64_t sink;

static void bench_filter(void)
{
    const uint64_t n = 1000000;
    const uint64_t bc = kvr_ckf_bucket_count(n); /* 524288 buckets, 4 MiB */
    uint64_t *buckets = xmalloc(bc * 8);
    kvr_ckf_t c;
    if (kvr_ckf_init(&c, buckets, bc, KVR_CKF_DEFAULT_SEED, 0, 0) != KVR_OK)
        exit(1);

    /* inserts up to 80 % load */
    const uint64_t to80 = bc * 4 * 8 / 10;
    uint64_t *keys = xmalloc(to80 * 8), s = 1;
    for (uint64_t i = 0; i < to80; i++)
        keys[i] = rnd(&s);
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        kvr_ckf_clear(&c);
        double t0 = now();
        for (uint64_t i = 0; i < to80; i++)
            if (kvr_ckf_insert(&c, keys[i]) != KVR_OK)
                exit(1);
        double mops = (double)to80 / (now() - t0) / 1e6;
        best = mops > best ? mops : best;
    }
    printf("ckf_insert_mops %.1f Mops/s\n", best);

    /* a 1M-entry filter; probes: half members, half random */
    kvr_ckf_clear(&c);
    for (uint64_t i = 0; i < n; i++)
        kvr_ckf_insert(&c, keys[i]);
    const uint64_t q = 4000000;
    uint64_t *probes = xmalloc(q * 8);
    uint8_t *out = xmalloc(q);
    for (uint64_t i = 0; i < q; i++)
        probes[i] = (i & 1) ? keys[rnd(&s) % n] : rnd(&s);
    best = 0;
    for (int rep = 0; rep < 3; rep++) {
        uint64_t hits = 0;
        double t0 = now();
        for (uint64_t i = 0; i < q; i++)
            hits += (uint64_t)kvr_ckf_contains(&c, probes[i]);
        double mops = (double)q / (now() - t0) / 1e6;
        sink = hits;
        best = mops > best ? mops : best;
    }
    printf("ckf_contains_mops %.1f Mops/s\n", best);
    best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        kvr_ckf_contains_many(&c, probes, q, out);
        double mops = (double)q / (now() - t0) / 1e6;
        sink = out[q / 2];
        best = mops > best ? mops : best;
    }
    printf("ckf_contains_batch_mops %.1f Mops/s\n", best);
    kvr_ckf_destroy(&c);
    free(buckets);
    free(keys);
    free(probes);
    free(out);
}

static void bench_codec(void)
{
    const uint64_t bc = 1ULL << 24;
    const size_t lane = (size_t)bc * 8;
    const uint32_t chunks = kvr_cbi1_chunk_count(bc);
    uint64_t *words = xmalloc(lane), *copy = xmalloc(lane);
    uint64_t s = 3;
    for (uint64_t i = 0; i < bc; i++)
        words[i] = (i & 3) ? rnd(&s) : 0;
    size_t frame = kvr_cbi1_chunk_size(bc, 0);
    uint8_t *frames = xmalloc(frame * chunks);

    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        memcpy(copy, words, lane);
        double g = (double)lane / (now() - t0) / 1e9;
        sink = copy[bc / 2];
        best = g > best ? g : best;
    }
    printf("memcpy_gbps %.2f GB/s\n", best);

    kvr_cbi1_hdr_t h = {KVR_CKF_DEFAULT_SEED, bc, 7, 42};
    best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        for (uint32_t i = 0; i < chunks; i++)
            if (!kvr_cbi1_encode_chunk(frames + (size_t)i * frame, frame, &h, words, i))
                exit(1);
        double g = (double)lane / (now() - t0) / 1e9;
        best = g > best ? g : best;
    }
    printf("cbi1_snapshot_encode_gbps %.2f GB/s\n", best);

    kvr_mirror_t m;
    if (kvr_mirror_init(&m, h.seed, bc, h.dc_id) != KVR_OK)
        exit(1);
    memset(m.buckets, 0, lane);
    best = 0;
    for (int rep = 0; rep < 3; rep++) {
        kvr_mirror_reset(&m);
        double t0 = now();
        for (uint32_t i = 0; i < chunks; i++) {
            kvr_mirror_update_t u = {h.seed, bc, h.dc_id, 42, 42, KVR_FILTER_UPDATE_SNAPSHOT_CHUNK,
                                     frames + (size_t)i * frame, frame};
            if (kvr_mirror_apply(&m, &u) != KVR_MIRROR_OK)
                exit(1);
        }
        double g = (double)lane / (now() - t0) / 1e9;
        best = g > best ? g : best;
    }
    if (kvr_mirror_state(&m) != KVR_MIRROR_LIVE || memcmp(m.buckets, words, lane) != 0)
        exit(1);
    printf("cbi1_decode_apply_gbps %.2f GB/s\n", best);
    kvr_mirror_destroy(&m);

    /* one 1000-image delta */
    kvr_ckf_image_t im[1000];
    for (int i = 0; i < 1000; i++) {
        im[i].bucket = (uint32_t)(rnd(&s) & (bc - 1));
        im[i].value = rnd(&s);
    }
    uint8_t buf[kvr_cbi1_delta_size(1000)];
    const int reps = 20000;
    best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        for (int i = 0; i < reps; i++) {
            h.epoch = (uint64_t)i + 1;
            if (!kvr_cbi1_encode_delta(buf, sizeof(buf), &h, (uint64_t)i, im, 1000))
                exit(1);
        }
        double us = (now() - t0) / reps * 1e6;
        sink = buf[44];
        best = us < best ? us : best;
    }
    printf("cbi1_delta_1000_us %.2f us\n", best);
    free(words);
    free(copy);
    free(frames);
}

int main(void)
{
    bench_filter();
    bench_codec();
    return 0;
}
