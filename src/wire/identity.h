/*
 * identity.h — Dynamo pool identity derivation (docs/relay-contract.md, "Identity").
 *
 * PoolId = (identity_version 1, IndexerDomainId, DcId). The two 16-byte digests of the
 * IndexerDomainId and the u64 DcId are BLAKE3 over length-framed material:
 *
 *   frame(b)              = u32le(len(b)) || b
 *   cache (default)       = frame("dynamo/indexer-cache-semantics/default/v1") || u32le(n)
 *                           || frame(s_1..s_n) || u32le(kv_block_size) || u16le(hash_fmt)
 *   cache (explicit)      = frame(".../explicit/v1") || u32le(n) || (frame(k) || frame(v))*
 *                           in key order || u32le(kv_block_size) || u16le(hash_fmt)
 *   routing (default)     = frame("dynamo/indexer-routing-scope/default/v1") || u32le(3)
 *                           || frame(namespace) || frame(component) || frame(endpoint)
 *   routing (explicit)    = frame(".../explicit/v1") || u32le(n) || (frame(k) || frame(v))*
 *   digest                = BLAKE3(material)[0..16]
 *   DcId                  = u64le(BLAKE3("dynamo/indexer-dc/v1" || u32le(len) || dc)[0..8])
 *
 * hash_fmt is the hash-format identity version: STANDARD 1, EAGLE 2. Explicit maps hold
 * 1..32 entries with keys of 1..128 bytes and values of 1..1024 bytes, sorted bytewise by
 * key (duplicates rejected). BLAKE3 is the official C implementation shipped by Debian.
 */
#ifndef KVR_IDENTITY_H
#define KVR_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

#define KVR_IDENTITY_DIGEST_LEN    16
#define KVR_IDENTITY_POOL_VERSION  1
#define KVR_IDENTITY_MAX_ENTRIES   32
#define KVR_IDENTITY_MAX_KEY_LEN   128
#define KVR_IDENTITY_MAX_VALUE_LEN 1024
#define KVR_IDENTITY_HASH_STANDARD 1 /* hash-format identity versions */
#define KVR_IDENTITY_HASH_EAGLE    2

/* A byte string (UTF-8 text in practice); not NUL-terminated. */
typedef struct kvr_bytes {
    const char *ptr;
    size_t len;
} kvr_bytes_t;

/* One entry of an explicit identity map. */
typedef struct kvr_identity_kv {
    kvr_bytes_t key;
    kvr_bytes_t value;
} kvr_identity_kv_t;

/* Cache-semantics digest, default source: the default strings are [model source_path]. */
void kvr_identity_cache_default(const kvr_bytes_t *strings, size_t n, uint32_t kv_block_size,
                                uint16_t hash_format_version, uint8_t out[16]);

/* Cache-semantics digest, explicit source (entries in any order). KVR_OK, or KVR_EINVAL
 * when the map breaks the limits or repeats a key. */
int kvr_identity_cache_explicit(const kvr_identity_kv_t *kv, size_t n, uint32_t kv_block_size,
                                uint16_t hash_format_version, uint8_t out[16]);

/* Routing-scope digest, default source, from the endpoint ns/component/endpoint. */
void kvr_identity_routing_default(kvr_bytes_t ns, kvr_bytes_t component, kvr_bytes_t endpoint,
                                  uint8_t out[16]);

/* Routing-scope digest, explicit source. KVR_OK or KVR_EINVAL as above. */
int kvr_identity_routing_explicit(const kvr_identity_kv_t *kv, size_t n, uint8_t out[16]);

/* DcId of the --dc-id string. */
uint64_t kvr_identity_dc_id(kvr_bytes_t dc);

/* Convenience: a kvr_bytes_t over a NUL-terminated string. */
kvr_bytes_t kvr_bytes_str(const char *s);

#endif
