/*
 * block.h — how kvrelay-bench derives a block's bytes from its key name and size, in one place,
 * for data.c and for servers that must answer with exactly those bytes without storing them
 * (bench/null_server.c). Header-only: it needs nothing but <xxhash.h>.
 *
 * A block of `size` bytes under `name` is:
 *   bytes 0..7    XXH3-64(name, KVB_NAME_SEED), little-endian
 *   bytes 8..15   size ^ KVB_SIZE_MIX, little-endian
 *   bytes 16..    the pool from offset KVB_BLOCK_OFF(name hash) + 16
 * (a block shorter than 16 bytes is the first `size` stamp bytes). The pool is one xorshift64
 * stream from a fixed seed, so its first n bytes are the same whatever its length: a pool of
 * at least size + KVB_POOL_SLACK + 16 bytes serves every key of that size.
 */
#ifndef KVB_BLOCK_H
#define KVB_BLOCK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY
#endif
#include <xxhash.h>

#define KVB_POOL_SLACK 65536u
#define KVB_NAME_SEED  0x6b76722d62656e63ull
#define KVB_POOL_SEED  0x6b7672656c617921ull
#define KVB_SIZE_MIX   0x6b76726c79626e63ull

/* The pool length needed for blocks up to max_size bytes (a multiple of 4096). */
static inline size_t kvb_pool_len(uint64_t max_size)
{
    size_t n = (size_t)max_size + KVB_POOL_SLACK + 16;
    return (n + 4095) & ~(size_t)4095;
}

/* Fills len bytes (a multiple of 8) with the pool's xorshift64 stream. */
static inline void kvb_pool_fill(uint8_t *pool, size_t len)
{
    uint64_t s = KVB_POOL_SEED;
    for (size_t i = 0; i < len / 8; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        memcpy(pool + i * 8, &s, 8);
    }
}

static inline void kvb_le64_store(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* The 16 stamp bytes of (name, size); returns the offset into the pool of byte 16 onwards. */
static inline size_t kvb_block_stamp(const char *name, size_t n, uint64_t size, uint8_t stamp[16])
{
    uint64_t h = XXH3_64bits_withSeed(name, n, KVB_NAME_SEED);
    kvb_le64_store(stamp, h);
    kvb_le64_store(stamp + 8, size ^ KVB_SIZE_MIX);
    return (size_t)((h >> 32) % KVB_POOL_SLACK) + 16;
}

#endif
