/*
 * lookup.h — the body of POST /batch/lookup (docs/kv-lookup.md): canonical sequence hashes, one
 * per line. A pure parser, so that it can be fuzzed (tests/fuzz/fuzz_lookup.c).
 *
 * Lines end with "\n" or "\r\n"; a last line without its end is a line too, and a body that ends
 * with its line end has no empty line after it (so "" holds 0 hashes and "1\n" one). Every line
 * is parsed exactly as an X-KV-Sequence-Hash value (kvr_parse_u64: a u64 in decimal or 0x hex,
 * nothing else: no sign, no space, no empty line). The longest valid line has 20 characters
 * (u64 max in decimal), so a body of KVR_LOOKUP_MAX_HASHES lines is at most KVR_LOOKUP_MAX_BODY
 * bytes.
 */
#ifndef KVR_WIRE_LOOKUP_H
#define KVR_WIRE_LOOKUP_H

#include "common.h"

#define KVR_LOOKUP_MAX_HASHES 4096
#define KVR_LOOKUP_MAX_LINE   20                                                  /* characters of the longest valid hash: 18446744073709551615 */
#define KVR_LOOKUP_MAX_BODY   (KVR_LOOKUP_MAX_HASHES * (KVR_LOOKUP_MAX_LINE + 2)) /* each with CRLF: 90,112 */

enum {
    KVR_LOOKUP_OK = 0,
    KVR_LOOKUP_TOO_MANY = -1, /* more than max lines */
    KVR_LOOKUP_EMPTY = -2,    /* line *line is empty */
    KVR_LOOKUP_BAD = -3,      /* line *line is not a u64 in decimal or 0x hex */
};

/*
 * Parses body[0..len) into out[0..max): KVR_LOOKUP_OK with *count hashes, or an error with *line
 * the 1-based line it is about (for TOO_MANY, the first line past max). Lines are taken in order,
 * so the first problem wins: a bad line 3 of 5,000 is BAD, not TOO_MANY.
 */
int kvr_lookup_parse(const char *body, size_t len, uint64_t *out, size_t max, size_t *count, size_t *line);

/* What went wrong, in words, for an error of kvr_lookup_parse. */
const char *kvr_lookup_error(int rc);

#endif
