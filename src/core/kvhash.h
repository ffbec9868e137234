/*
 * kvhash.h — Dynamo's canonical KV block hashing (docs/relay-contract.md; vectors in tests/data/kvhash/).
 *
 * A router turns request tokens into block hashes, chains them into sequence hashes and
 * probes each pool's Cuckoo filter with the sequence hashes; the producer chains the
 * `tokens_hash` of each stored block the same way. Everything here is XXH3-64:
 *
 *   salt        = 1337 (+ xxh3(lora, 0)) (+ xxh3(cache_namespace, 1))   wrapping adds
 *   block[i]    = xxh3(LE u32 tokens of window i || LE u64 sorted mm hashes of block i, salt)
 *   seq[0]      = block[0]
 *   seq[i]      = xxh3(u64le(seq[i-1]) || u64le(block[i]), 1337)
 *
 * STANDARD windows are kv_block_size tokens long; EAGLE windows are one token longer and
 * overlap by one token. Only complete windows produce a block. Pure functions, no state.
 */
#ifndef KVR_KVHASH_H
#define KVR_KVHASH_H

#include <stddef.h>
#include <stdint.h>

#include "wire/relay.pb-c.h"

#define KVR_KVHASH_SEED       1337ULL /* XXH3_SEED: block-hash base salt */
#define KVR_KVHASH_CHAIN_SEED 1337ULL /* CHAIN_XXH3_SEED: sequence chaining */

/* Query hash formats: KvQueryHashFormat's values, as protoc-c generates them from relay.proto. */
typedef enum {
    KVR_KVHASH_STANDARD = DYNAMO__KVRELAY__V1__KV_QUERY_HASH_FORMAT__KV_QUERY_HASH_FORMAT_DYNAMO_STANDARD_V1,
    KVR_KVHASH_EAGLE = DYNAMO__KVRELAY__V1__KV_QUERY_HASH_FORMAT__KV_QUERY_HASH_FORMAT_DYNAMO_EAGLE_V1,
} kvr_kvhash_format_t;

/* Multimodal hashes attached to one block (any order; hashed sorted ascending). */
typedef struct kvr_kvhash_mm {
    size_t block;           /* block index i */
    const uint64_t *hashes; /* mm_hash values of that block */
    size_t n;
} kvr_kvhash_mm_t;

/* xxh3_64(data, seed): the primitive, exposed for callers and tests. */
uint64_t kvr_kvhash_xxh3(const void *data, size_t len, uint64_t seed);

/* The block-hash seed for an optional LoRA adapter name and cache namespace. Empty strings
 * (len 0) count as absent. For a LoRA request pass the canonical adapter name. */
uint64_t kvr_kvhash_salt(const char *lora, size_t lora_len, const char *ns, size_t ns_len);

/* Number of complete windows in n_tokens tokens; 0 when block_size is 0 or the format
 * is unknown. */
size_t kvr_kvhash_block_count(size_t n_tokens, uint32_t block_size, kvr_kvhash_format_t fmt);

/*
 * Block hashes of tokens[0..n_tokens) into out[0..max_out). mm (n_mm entries, may be NULL)
 * adds multimodal hashes to blocks; several entries for one block are merged. Returns the
 * number of complete blocks (which may exceed max_out: only max_out are written), or
 * (size_t)-1 when block_size is 0, fmt is unknown or memory for a large window ran out.
 */
size_t kvr_kvhash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                         kvr_kvhash_format_t fmt, uint64_t salt, const kvr_kvhash_mm_t *mm,
                         size_t n_mm, uint64_t *out, size_t max_out);

/* One chain step: xxh3(u64le(parent) || u64le(block), 1337). */
uint64_t kvr_kvhash_chain(uint64_t parent, uint64_t block);

/* Sequence hashes of n block hashes; out may alias blocks (in-place). */
void kvr_kvhash_seq(const uint64_t *blocks, size_t n, uint64_t *out);

#endif
