/*
 * fuzz_cbi1.c — libFuzzer driver for the CBI1 decoder, snapshot assembly and the consumer
 * mirror (docs/relay-contract.md).
 *
 * Input: one mode byte, then
 *   mode & 1 == 0  "frame":  byte 1 = options, rest = one CBI1 frame. The expected format
 *                  is taken from the frame's own header (so the fuzzer gets past the
 *                  format check); option bit 0 re-seals the checksum so body rules are
 *                  reachable. A decoded frame is re-encoded and must round-trip.
 *   mode & 1 == 1  "stream": bits 1-2 pick the mirror's bucket_count (2, 64, 1024 or 8192),
 *                  then records [kind][opts][base][seq][len lo][len hi][payload...] are
 *                  fed to one mirror; opts bit 0 re-seals the payload checksum, bit 1
 *                  alters the envelope's producer fields.
 * Any decoder accepting what it should not, or crashing, is a finding.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common.h"
#include "wire/cbi1.h"
#include "wire/mirror.h"

#define FZ_SEED 0x5EEDULL
#define FZ_DC   7ULL

static void reseal(uint8_t *f, size_t len)
{
    if (len >= KVR_CBI1_HEADER_LEN)
        kvr_put_le32(f + 44, (uint32_t)XXH3_64bits(f + 48, len - 48));
}

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void fuzz_frame(const uint8_t *data, size_t size)
{
    if (size < 1)
        return;
    uint8_t opts = data[0];
    data++, size--;
    uint8_t *f = malloc(size ? size : 1);
    memcpy(f, data, size);
    if (opts & 1)
        reseal(f, size);
    uint64_t seed = size >= 20 ? kvr_le64(f + 12) : FZ_SEED;
    uint64_t bc = size >= 28 ? kvr_le64(f + 20) : 1024;
    kvr_cbi1_frame_t fr;
    int rc = kvr_cbi1_decode(f, size, seed, bc, &fr);
    (void)kvr_cbi1_strerror(rc);
    if (rc == KVR_CBI1_OK) {
        check(size >= KVR_CBI1_HEADER_LEN && size <= KVR_CBI1_MAX_FRAME);
        check(fr.flags == KVR_CBI1_FLAG_DELTA || fr.flags == KVR_CBI1_FLAG_SNAPSHOT_CHUNK);
        if (fr.flags == KVR_CBI1_FLAG_DELTA) {
            /* round trip: the encoder reproduces the frame exactly */
            kvr_ckf_image_t *im = malloc((fr.image_count + 1) * sizeof(*im));
            for (uint32_t i = 0; i < fr.image_count; i++) {
                im[i] = kvr_cbi1_image(&fr, i);
                check(im[i].bucket < bc);
            }
            if (bc >= 2 && bc <= KVR_CBI1_MAX_BUCKET_COUNT && (bc & (bc - 1)) == 0 &&
                f[8] == 16 && f[9] == 4) {
                uint8_t *out = malloc(size);
                uint8_t *e = kvr_cbi1_encode_delta(out, size, &fr.hdr, fr.base_epoch, im,
                                                   fr.image_count);
                check(e == out + size && memcmp(out, f, size) == 0);
                free(out);
            }
            /* applying into a lane of bc words stays in bounds */
            if (bc <= 8192) {
                uint64_t *lane = calloc(bc ? bc : 1, 8);
                kvr_cbi1_apply_delta(&fr, lane);
                free(lane);
            }
            free(im);
        } else {
            check(fr.chunk_index < fr.chunk_count);
            check(fr.bucket_offset + fr.word_count <= bc);
            if (bc <= 8192) {
                uint64_t *lane = calloc(bc ? bc : 1, 8);
                kvr_cbi1_asm_t a;
                kvr_cbi1_asm_init(&a, lane, bc);
                rc = kvr_cbi1_asm_feed(&a, &fr);
                check(rc == KVR_CBI1_OK || rc == KVR_CBI1_COMPLETE ||
                      rc == KVR_CBI1_E_CHUNK_SEQUENCE || rc == KVR_CBI1_E_INCOMPLETE);
                if (rc == KVR_CBI1_COMPLETE)
                    check(fr.bucket_offset == 0 && fr.word_count == bc);
                free(lane);
            }
        }
    }
    free(f);
}

static void fuzz_stream(uint8_t mode, const uint8_t *data, size_t size)
{
    static const uint64_t bcs[4] = {2, 64, 1024, 8192};
    uint64_t bc = bcs[(mode >> 1) & 3];
    kvr_mirror_t m;
    if (kvr_mirror_init(&m, FZ_SEED, bc, FZ_DC) != KVR_OK)
        return;
    while (size >= 6) {
        kvr_mirror_update_t u;
        uint8_t opts = data[1];
        size_t len = (size_t)kvr_le16(data + 4);
        u.kind = data[0] % 5;
        u.base_sequence = data[2];
        u.sequence = data[3];
        data += 6, size -= 6;
        if (len > size)
            len = size;
        uint8_t *p = malloc(len ? len : 1);
        memcpy(p, data, len);
        data += len, size -= len;
        if (opts & 1)
            reseal(p, len);
        u.seed = FZ_SEED ^ (uint64_t)((opts >> 1) & 1);
        u.bucket_count = bc << ((opts >> 2) & 1);
        u.dc_id = FZ_DC + ((opts >> 3) & 1);
        u.payload = p;
        u.payload_len = len;
        kvr_mirror_state_t before = kvr_mirror_state(&m);
        uint64_t seq_before = m.sequence;
        int rc = kvr_mirror_apply(&m, &u);
        (void)kvr_mirror_strerror(rc);
        if (rc == KVR_MIRROR_OK) {
            check(before != KVR_MIRROR_FAILED);
            if (u.kind == KVR_FILTER_UPDATE_DELTA)
                check(before == KVR_MIRROR_LIVE && m.sequence == seq_before + 1 &&
                      u.sequence == u.base_sequence + 1);
            if (u.kind == KVR_FILTER_UPDATE_HEARTBEAT)
                check(len == 0 && m.sequence == seq_before);
        } else {
            check(kvr_mirror_state(&m) == KVR_MIRROR_FAILED);
            if (opts & 0x80)
                kvr_mirror_reset(&m); /* resubscribe */
        }
        for (uint64_t h = 0; h < 4; h++)
            (void)kvr_mirror_contains(&m, h * 0x9E3779B97F4A7C15ULL);
        free(p);
    }
    kvr_mirror_destroy(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        fuzz_stream(data[0], data + 1, size - 1);
    else
        fuzz_frame(data + 1, size - 1);
    return 0;
}
