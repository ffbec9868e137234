/*
 * data.c — what is stored under each key, and which key a request uses.
 *
 * Key k (0 <= k < --keys) is named "<prefix>-<k>". Its size is --size, or for a range a
 * uniform draw that is a fixed function of k, so a repeated PUT of k always has the same
 * size (a dedup hit, never a 409). Its bytes are a deterministic function of (name, size):
 * 16 stamp bytes (XXH3 of the name, then the size) followed by a slice of one pool of
 * xorshift bytes made once at start, at an offset chosen by the name. Any run of the tool,
 * on any machine, PUTs the same bytes for the same key and size; a PUT sends the pool slice
 * itself (writev), and a GET is verified by XXH3-64 over the body compared with the XXH3-64
 * of the block, computed once per key (during --preload, else at its first GET) and cached.
 * The derivation itself is in block.h, shared with bench/null_server.c.
 */
#include "data.h"
#include "block.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
#endif

static uint8_t *pool;
static size_t pool_len;
static uint64_t *cks;
static uint8_t *cks_ok;
static double *zcdf;
static char prefix_enc[1024];

const char *kvb_prefix_enc(void)
{
    return prefix_enc;
}

int kvb_data_init(int cache_checksums)
{
    char *o = prefix_enc;

    pool_len = kvb_pool_len(G.size_max);
    pool = aligned_alloc(4096, pool_len);
    if (pool == NULL)
        return -1;
    kvb_pool_fill(pool, pool_len);
    for (const char *p = G.prefix; *p && o < prefix_enc + sizeof(prefix_enc) - 4; p++) {
        unsigned char ch = (unsigned char)*p;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
            ch == '.' || ch == '_' || ch == '~') {
            *o++ = (char)ch;
        } else {
            static const char hex[] = "0123456789ABCDEF";
            *o++ = '%';
            *o++ = hex[ch >> 4];
            *o++ = hex[ch & 15];
        }
    }
    *o = '\0';
    if (cache_checksums && G.keys > 0) {
        cks = calloc(G.keys, sizeof(*cks));
        cks_ok = calloc(G.keys, 1);
        if (cks == NULL || cks_ok == NULL)
            return -1;
    }
    if (G.zipf && G.keys > 0) {
        double sum = 0;
        zcdf = malloc(G.keys * sizeof(double));
        if (zcdf == NULL)
            return -1;
        for (uint64_t i = 0; i < G.keys; i++) {
            sum += pow((double)(i + 1), -G.zipf_s);
            zcdf[i] = sum;
        }
        for (uint64_t i = 0; i < G.keys; i++)
            zcdf[i] /= sum;
        zcdf[G.keys - 1] = 1.0;
    }
    return 0;
}

size_t kvb_key_name(uint64_t k, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s-%llu", G.prefix, (unsigned long long)k);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n
                                       : cap - 1;
}

size_t kvb_key_path(uint64_t k, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s-%llu", prefix_enc, (unsigned long long)k);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n
                                       : cap - 1;
}

uint64_t kvb_key_size(uint64_t k)
{
    if (G.size_min == G.size_max)
        return G.size_min;
    return G.size_min + kvb_mix64(k ^ 0x73697a6573697a65ull) % (G.size_max - G.size_min + 1);
}

void kvb_block(uint64_t k, kvb_block_t *b)
{
    char name[1100];
    size_t n = kvb_key_name(k, name, sizeof(name));
    uint64_t size = kvb_key_size(k);
    size_t off = kvb_block_stamp(name, n, size, b->stamp);

    b->stamp_len = size < 16 ? (size_t)size : 16;
    b->rest = pool + off;
    b->rest_len = size > 16 ? (size_t)(size - 16) : 0;
}

uint64_t kvb_block_checksum(uint64_t k)
{
    kvb_block_t b;
    XXH3_state_t *st;
    uint64_t h;

    if (cks != NULL && k < G.keys && __atomic_load_n(&cks_ok[k], __ATOMIC_ACQUIRE))
        return cks[k];
    kvb_block(k, &b);
    st = XXH3_createState();
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, b.stamp, b.stamp_len);
    if (b.rest_len)
        XXH3_64bits_update(st, b.rest, b.rest_len);
    h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    if (cks != NULL && k < G.keys) {
        cks[k] = h;
        __atomic_store_n(&cks_ok[k], 1, __ATOMIC_RELEASE);
    }
    return h;
}

uint64_t kvb_pick_key(uint64_t *rng)
{
    uint64_t r = kvb_rand(rng);
    if (zcdf == NULL)
        return (uint64_t)(((unsigned __int128)r * G.keys) >> 64);
    {
        double u = (double)(r >> 11) * (1.0 / 9007199254740992.0);
        uint64_t lo = 0, hi = G.keys - 1;
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (zcdf[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        return lo;
    }
}
