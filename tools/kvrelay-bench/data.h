/*
 * data.h — what is stored under each key and which key a request uses (data.c): block bytes
 * as a function of (key, size), their checksums, key names and key choice.
 */
#ifndef KVB_DATA_H
#define KVB_DATA_H

#include "kvb.h"

#include <stddef.h>
#include <stdint.h>

/* A block: its first bytes (a stamp of key and size) then a slice of the shared pool. */
typedef struct kvb_block {
    uint8_t stamp[16];
    size_t stamp_len;
    const uint8_t *rest;
    size_t rest_len;
} kvb_block_t;

int kvb_data_init(int cache_checksums);
size_t kvb_key_name(uint64_t k, char *out, size_t cap); /* raw key (RESP, memcache) */
size_t kvb_key_path(uint64_t k, char *out, size_t cap); /* percent-encoded (HTTP path) */
uint64_t kvb_key_size(uint64_t k);
void kvb_block(uint64_t k, kvb_block_t *b);
uint64_t kvb_block_checksum(uint64_t k); /* XXH3-64 of the block, cached per key */
uint64_t kvb_pick_key(uint64_t *rng);    /* --popularity over [0, keys) */
const char *kvb_prefix_enc(void);

#endif
