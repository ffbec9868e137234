/*
 * fuzz_ssdfmt.c — libFuzzer driver for the disk tier's header decoders (src/wire/ssdfmt.c): the
 * bytes a restart reads back from a disk it cannot trust.
 *
 * Input: one mode byte, then a header's bytes (cut or zero-padded to KVR_SSD_ALIGN). Mode bits
 * 0-1 pick the decoder (superblock, page, record, summary entry); bit 2 rewrites the header's
 * checksum first, so that the fuzzer reaches the field checks behind it (a summary entry has
 * none: its bytes are decoded as they come). Any crash is a finding,
 * and so is an accepted header that does not encode back to the very same bytes: every byte of
 * a header is either a field or checked to be zero, so the accepted form is the only form.
 */
#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#include "common.h"
#include "wire/ssdfmt.h"

#define PAGE (64ull << 20)

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t in[KVR_SSD_ALIGN], again[KVR_SSD_ALIGN];
    static kvr_ssd_rec_t rec;
    unsigned mode;
    int rc;

    if (size < 1)
        return 0;
    mode = data[0];
    memset(in, 0, sizeof(in));
    memcpy(in, data + 1, size - 1 < sizeof(in) ? size - 1 : sizeof(in));
    if (mode & 4) {
        uint64_t s = XXH3_64bits(in, KVR_SSD_ALIGN - 8);
        for (int i = 0; i < 8; i++)
            in[KVR_SSD_ALIGN - 8 + i] = (uint8_t)(s >> (8 * i));
    }
    switch (mode & 3) {
    case 0: {
        kvr_ssd_super_t s;
        rc = kvr_ssd_super_decode(in, &s);
        if (rc == KVR_SSD_OK) {
            check(s.npages >= 1 && s.npages <= KVR_SSD_PAGES_MAX && s.page_size % KVR_SSD_ALIGN == 0);
            kvr_ssd_super_encode(&s, again);
            check(memcmp(in, again, KVR_SSD_ALIGN) == 0);
        }
        break;
    }
    case 1: {
        kvr_ssd_page_t p;
        rc = kvr_ssd_page_decode(in, get64(in + 8), get64(in + 24), PAGE, &p);
        if (rc == KVR_SSD_OK) {
            check(!p.sealed || (p.used <= PAGE && p.summary_len <= PAGE - p.used));
            kvr_ssd_page_encode(&p, again);
            check(memcmp(in, again, KVR_SSD_ALIGN) == 0);
        }
        break;
    }
    case 2: {
        uint64_t off = KVR_SSD_ALIGN * (uint64_t)(1 + (mode >> 3));
        rc = kvr_ssd_rec_decode(in, get64(in + 8), off, PAGE, &rec);
        check(rc != KVR_SSD_STALE); /* the version asked is the header's own */
        if (rc == KVR_SSD_OK) {
            check(rec.key_len >= 1 && rec.key_len <= KVR_KEY_MAX && off + kvr_ssd_rec_span(rec.key_len, rec.length) <= PAGE);
            check(strlen(rec.ns) == rec.ns_len && strlen(rec.model) == rec.model_len);
            check(XXH3_64bits(rec.key, rec.key_len) == rec.khash);
            kvr_ssd_rec_encode(&rec, again);
            check(memcmp(in, again, KVR_SSD_ALIGN) == 0);
        }
        break;
    }
    default: { /* a summary entry: the bytes as they are, no checksum to rewrite */
        uint64_t off;
        size_t n, avail = size - 1 < sizeof(in) ? size - 1 : sizeof(in);
        rc = kvr_ssd_sument_decode(in, avail, 5, PAGE, &rec, &off, &n);
        if (rc == KVR_SSD_OK) {
            check(n <= avail && n <= KVR_SSD_SUMENT_MAX && off >= KVR_SSD_ALIGN &&
                  off + kvr_ssd_rec_span(rec.key_len, rec.length) <= PAGE && rec.version == 5);
            check(XXH3_64bits(rec.key, rec.key_len) == rec.khash);
            check(kvr_ssd_sument_encode(&rec, off, again) == n && memcmp(in, again, n) == 0);
        }
        break;
    }
    }
    check(rc >= KVR_SSD_OK && rc <= KVR_SSD_STALE);
    return 0;
}
