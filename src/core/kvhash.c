/*
 * kvhash.c — canonical KV block and sequence hashes (docs/relay-contract.md; vectors in tests/data/kvhash/).
 *
 * Each window's bytes (LE u32 tokens, then the block's multimodal hashes as sorted LE u64)
 * are laid out in one buffer and hashed with one XXH3 call: a stack buffer covers windows
 * of up to ~1000 tokens, larger ones take a heap buffer for the duration of the call.
 * Bytes are built with the LE store helpers, so the result does not depend on host order.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <stdlib.h>

#include "common.h"
#include "core/kvhash.h"

uint64_t kvr_kvhash_xxh3(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

uint64_t kvr_kvhash_salt(const char *lora, size_t lora_len, const char *ns, size_t ns_len)
{
    uint64_t seed = KVR_KVHASH_SEED;
    if (lora && lora_len)
        seed += XXH3_64bits_withSeed(lora, lora_len, 0);
    if (ns && ns_len)
        seed += XXH3_64bits_withSeed(ns, ns_len, 1);
    return seed;
}

static size_t window_of(uint32_t block_size, kvr_kvhash_format_t fmt)
{
    if (block_size == 0)
        return 0;
    if (fmt == KVR_KVHASH_STANDARD)
        return block_size;
    if (fmt == KVR_KVHASH_EAGLE)
        return (size_t)block_size + 1;
    return 0;
}

size_t kvr_kvhash_block_count(size_t n_tokens, uint32_t block_size, kvr_kvhash_format_t fmt)
{
    size_t window = window_of(block_size, fmt);
    if (window == 0 || n_tokens < window)
        return 0;
    return (n_tokens - window) / block_size + 1;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Multimodal hashes of block i: how many, and (when dst) appended sorted to dst as LE. */
static size_t mm_count(const kvr_kvhash_mm_t *mm, size_t n_mm, size_t block)
{
    size_t n = 0;
    for (size_t j = 0; j < n_mm; j++)
        if (mm[j].block == block)
            n += mm[j].n;
    return n;
}

static void mm_put_sorted(const kvr_kvhash_mm_t *mm, size_t n_mm, size_t block, uint64_t *tmp,
                          uint8_t *dst)
{
    size_t n = 0;
    for (size_t j = 0; j < n_mm; j++)
        if (mm[j].block == block)
            for (size_t k = 0; k < mm[j].n; k++)
                tmp[n++] = mm[j].hashes[k];
    qsort(tmp, n, sizeof(*tmp), cmp_u64);
    for (size_t k = 0; k < n; k++)
        dst = kvr_put_le64(dst, tmp[k]);
}

size_t kvr_kvhash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                         kvr_kvhash_format_t fmt, uint64_t salt, const kvr_kvhash_mm_t *mm,
                         size_t n_mm, uint64_t *out, size_t max_out)
{
    size_t window = window_of(block_size, fmt);
    if (window == 0)
        return (size_t)-1;
    size_t n_blocks = kvr_kvhash_block_count(n_tokens, block_size, fmt);
    size_t todo = n_blocks < max_out ? n_blocks : max_out;
    if (!mm)
        n_mm = 0;

    size_t mm_max = 0;
    for (size_t i = 0; n_mm && i < todo; i++) {
        size_t c = mm_count(mm, n_mm, i);
        mm_max = c > mm_max ? c : mm_max;
    }

    uint8_t stack_buf[4096];
    uint64_t stack_tmp[64];
    uint8_t *buf = stack_buf;
    uint64_t *tmp = stack_tmp;
    size_t need = window * 4 + mm_max * 8;
    if (need > sizeof(stack_buf)) {
        buf = malloc(need);
        if (!buf)
            return (size_t)-1;
    }
    if (mm_max > KVR_ARRAY_SIZE(stack_tmp)) {
        tmp = malloc(mm_max * sizeof(*tmp));
        if (!tmp) {
            if (buf != stack_buf)
                free(buf);
            return (size_t)-1;
        }
    }

    for (size_t i = 0; i < todo; i++) {
        const uint32_t *w = tokens + i * block_size;
        uint8_t *p = buf;
        for (size_t t = 0; t < window; t++)
            p = kvr_put_le32(p, w[t]);
        size_t extra = n_mm ? mm_count(mm, n_mm, i) : 0;
        if (extra)
            mm_put_sorted(mm, n_mm, i, tmp, p);
        out[i] = XXH3_64bits_withSeed(buf, window * 4 + extra * 8, salt);
    }

    if (buf != stack_buf)
        free(buf);
    if (tmp != stack_tmp)
        free(tmp);
    return n_blocks;
}

uint64_t kvr_kvhash_chain(uint64_t parent, uint64_t block)
{
    uint8_t b[16];
    kvr_put_le64(b, parent);
    kvr_put_le64(b + 8, block);
    return XXH3_64bits_withSeed(b, sizeof(b), KVR_KVHASH_CHAIN_SEED);
}

void kvr_kvhash_seq(const uint64_t *blocks, size_t n, uint64_t *out)
{
    if (n == 0)
        return;
    uint64_t prev = blocks[0];
    out[0] = prev;
    for (size_t i = 1; i < n; i++) {
        prev = kvr_kvhash_chain(prev, blocks[i]);
        out[i] = prev;
    }
}
