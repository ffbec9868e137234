/*
 * json.h — a tiny append-only JSON writer into a caller-sized buffer.
 *
 * Strings are escaped per RFC 8259 (quotes, backslash, control characters as \u00XX);
 * valid UTF-8 sequences pass through unchanged, and every byte that is not part of one is
 * written as \u00XX (keys are arbitrary bytes; the output must stay valid JSON).
 * On overflow the writer sets `overflow` and stops appending; check it before sending.
 */
#ifndef KVR_WIRE_JSON_H
#define KVR_WIRE_JSON_H

#include "common.h"

typedef struct {
    char *buf;
    size_t cap;
    size_t len;
    int overflow;
} kvr_json_t;

void kvr_json_init(kvr_json_t *j, char *buf, size_t cap);
void kvr_json_raw(kvr_json_t *j, const char *s);
void kvr_json_str(kvr_json_t *j, const void *s, size_t n);
void kvr_json_u64(kvr_json_t *j, uint64_t v);
/* ,"name": — the first field of an object passes first = 1 to omit the comma. */
void kvr_json_key(kvr_json_t *j, const char *name, int first);

#endif
