/*
 * identity.c — BLAKE3 identity digests (docs/relay-contract.md, "Identity").
 *
 * Material is streamed into one BLAKE3 hasher, never built in a buffer: each framed
 * string is u32le(len) then its bytes, each integer goes through the LE helpers. Explicit
 * maps are validated, then visited in bytewise key order through a small index array
 * (at most 32 entries), so the caller's array is left untouched.
 */
#include <stdlib.h>

#include "blake3.h"
#include "common.h"
#include "wire/identity.h"

static const char TAG_CACHE_DEFAULT[] = "dynamo/indexer-cache-semantics/default/v1";
static const char TAG_CACHE_EXPLICIT[] = "dynamo/indexer-cache-semantics/explicit/v1";
static const char TAG_ROUTING_DEFAULT[] = "dynamo/indexer-routing-scope/default/v1";
static const char TAG_ROUTING_EXPLICIT[] = "dynamo/indexer-routing-scope/explicit/v1";
static const char TAG_DC[] = "dynamo/indexer-dc/v1";

kvr_bytes_t kvr_bytes_str(const char *s)
{
    kvr_bytes_t b = {s, s ? strlen(s) : 0};
    return b;
}

static void put_u32(blake3_hasher *h, uint32_t v)
{
    uint8_t b[4];
    kvr_put_le32(b, v);
    blake3_hasher_update(h, b, sizeof(b));
}

static void put_u16(blake3_hasher *h, uint16_t v)
{
    uint8_t b[2];
    kvr_put_le16(b, v);
    blake3_hasher_update(h, b, sizeof(b));
}

static void put_frame(blake3_hasher *h, const void *p, size_t len)
{
    put_u32(h, (uint32_t)len);
    blake3_hasher_update(h, p, len);
}

static int bytes_cmp(kvr_bytes_t a, kvr_bytes_t b)
{
    size_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c)
        return c;
    return (a.len > b.len) - (a.len < b.len);
}

/* Validates an explicit map and writes its key order into idx[0..n). */
static int explicit_order(const kvr_identity_kv_t *kv, size_t n, uint8_t *idx)
{
    if (n < 1 || n > KVR_IDENTITY_MAX_ENTRIES)
        return KVR_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (kv[i].key.len < 1 || kv[i].key.len > KVR_IDENTITY_MAX_KEY_LEN ||
            kv[i].value.len < 1 || kv[i].value.len > KVR_IDENTITY_MAX_VALUE_LEN)
            return KVR_EINVAL;
        /* insertion sort of indices by key */
        size_t j = i;
        while (j > 0 && bytes_cmp(kv[idx[j - 1]].key, kv[i].key) > 0) {
            idx[j] = idx[j - 1];
            j--;
        }
        if (j > 0 && bytes_cmp(kv[idx[j - 1]].key, kv[i].key) == 0)
            return KVR_EINVAL; /* duplicate key */
        idx[j] = (uint8_t)i;
    }
    return KVR_OK;
}

/* Starts the hash of an explicit map: validates kv[0..n) (KVR_EINVAL when it breaks the
 * limits or repeats a key), then writes the tag and the entries in key order. */
static int begin_explicit(blake3_hasher *h, const char *tag, size_t tag_len, const kvr_identity_kv_t *kv,
                          size_t n)
{
    uint8_t idx[KVR_IDENTITY_MAX_ENTRIES];

    if (explicit_order(kv, n, idx) != KVR_OK)
        return KVR_EINVAL;
    blake3_hasher_init(h);
    put_frame(h, tag, tag_len);
    put_u32(h, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        put_frame(h, kv[idx[i]].key.ptr, kv[idx[i]].key.len);
        put_frame(h, kv[idx[i]].value.ptr, kv[idx[i]].value.len);
    }
    return KVR_OK;
}

static void digest16(blake3_hasher *h, uint8_t out[16])
{
    blake3_hasher_finalize(h, out, KVR_IDENTITY_DIGEST_LEN);
}

void kvr_identity_cache_default(const kvr_bytes_t *strings, size_t n, uint32_t kv_block_size,
                                uint16_t hash_format_version, uint8_t out[16])
{
    blake3_hasher h;
    blake3_hasher_init(&h);
    put_frame(&h, TAG_CACHE_DEFAULT, sizeof(TAG_CACHE_DEFAULT) - 1);
    put_u32(&h, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        put_frame(&h, strings[i].ptr, strings[i].len);
    put_u32(&h, kv_block_size);
    put_u16(&h, hash_format_version);
    digest16(&h, out);
}

int kvr_identity_cache_explicit(const kvr_identity_kv_t *kv, size_t n, uint32_t kv_block_size,
                                uint16_t hash_format_version, uint8_t out[16])
{
    blake3_hasher h;
    if (begin_explicit(&h, TAG_CACHE_EXPLICIT, sizeof(TAG_CACHE_EXPLICIT) - 1, kv, n) != KVR_OK)
        return KVR_EINVAL;
    put_u32(&h, kv_block_size);
    put_u16(&h, hash_format_version);
    digest16(&h, out);
    return KVR_OK;
}

void kvr_identity_routing_default(kvr_bytes_t ns, kvr_bytes_t component, kvr_bytes_t endpoint,
                                  uint8_t out[16])
{
    blake3_hasher h;
    blake3_hasher_init(&h);
    put_frame(&h, TAG_ROUTING_DEFAULT, sizeof(TAG_ROUTING_DEFAULT) - 1);
    put_u32(&h, 3);
    put_frame(&h, ns.ptr, ns.len);
    put_frame(&h, component.ptr, component.len);
    put_frame(&h, endpoint.ptr, endpoint.len);
    digest16(&h, out);
}

int kvr_identity_routing_explicit(const kvr_identity_kv_t *kv, size_t n, uint8_t out[16])
{
    blake3_hasher h;
    if (begin_explicit(&h, TAG_ROUTING_EXPLICIT, sizeof(TAG_ROUTING_EXPLICIT) - 1, kv, n) != KVR_OK)
        return KVR_EINVAL;
    digest16(&h, out);
    return KVR_OK;
}

uint64_t kvr_identity_dc_id(kvr_bytes_t dc)
{
    blake3_hasher h;
    uint8_t out[8];
    blake3_hasher_init(&h);
    blake3_hasher_update(&h, TAG_DC, sizeof(TAG_DC) - 1);
    put_frame(&h, dc.ptr, dc.len);
    blake3_hasher_finalize(&h, out, sizeof(out));
    return kvr_le64(out);
}
