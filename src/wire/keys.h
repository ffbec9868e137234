/*
 * keys.h — decoding what arrives in a /kv/ request line and its headers (pure functions).
 *
 * Keys: the path segment after /kv/ is percent-decoded (clients send quote(key, safe='')).
 * '+' stays '+' (a path, not a form). A '%' not followed by two hex digits is an error.
 * The decoded key must be 1..1024 bytes with no NUL (docs/http-contract.md §2).
 *
 * X-KV-Sequence-Hash: a u64 in decimal or 0x-prefixed hex, nothing else (no sign, no
 * spaces inside, no overflow).
 *
 * Canonical hash: what a PUT without X-KV-Sequence-Hash publishes in the relay's filter. The
 * HTTP API (io/api.c, through the store) and the consumer tool kvrelay-watch must agree on it,
 * so it lives here once.
 */
#ifndef KVR_WIRE_KEYS_H
#define KVR_WIRE_KEYS_H

#include "common.h"

/* The value of one hex digit (either case), or -1. */
static inline int kvr_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

enum {
    KVR_KEY_OK = 0,
    KVR_KEY_EMPTY = -1,
    KVR_KEY_TOO_LONG = -2,
    KVR_KEY_BAD_ESCAPE = -3,
    KVR_KEY_NUL = -4,
};

/*
 * Decodes in[0..n) into out (capacity cap, at least KVR_KEY_MAX). Returns KVR_KEY_OK with
 * *outlen set, or one of the KVR_KEY_* errors. Never writes past cap.
 */
int kvr_key_decode(const char *in, size_t n, uint8_t *out, size_t cap, size_t *outlen);

/* Human-readable reason for a KVR_KEY_* error. */
const char *kvr_key_error(int rc);

/* Parses a sequence hash header value. Returns KVR_OK or KVR_EINVAL. */
int kvr_parse_u64(const char *s, size_t n, uint64_t *out);

/* Canonical hash of a decoded key when the PUT carries none (docs/http-contract.md §3.2): a
 * key of exactly 16 hex digits (either case) is that number, any other key its XXH3-64. */
uint64_t kvr_key_canon(const void *key, size_t klen);

/* A model name (X-KV-Model, model= of the tenants file, --model): 1..KVR_MODEL_MAX bytes
 * (common.h) of printable ASCII without a space. */
int kvr_model_valid(const char *model, size_t len);

#endif
