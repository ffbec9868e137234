/*
 * utf8.h — the one UTF-8 validator: strict RFC 3629 (no overlong forms, no surrogates
 * U+D800..U+DFFF, nothing above U+10FFFF, no truncated sequence).
 *
 * Used by the JSON writers (wire/json.c, base/log.c: invalid bytes are escaped so the output
 * stays valid JSON) and by the relay's subscriber_id check (wire/relay_validate.c).
 */
#ifndef KVR_BASE_UTF8_H
#define KVR_BASE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length (1..4) of the valid UTF-8 sequence starting at s, which has `left` >= 1 bytes;
 * 0 when s does not start one. An ASCII byte (control characters included) is 1. */
size_t kvr_utf8_seq(const uint8_t *s, size_t left);

/* 1 when s[0..len) is entirely valid UTF-8 (len 0 included), else 0. */
int kvr_utf8_valid(const uint8_t *s, size_t len);

#endif
