/*
 * fuzz_lookup.c — libFuzzer driver for the body parser of POST /batch/lookup (src/wire/lookup.c).
 *
 * Input: the body's bytes, as they are. Any crash is a finding, and so is an answer that breaks
 * the parser's promises, checked against a second, plain reading of the same bytes: on success,
 * as many hashes as lines (a last line end opens no line), each equal to what kvr_parse_u64 makes
 * of its line; on a refusal, the named line exists and is the first bad one (empty, not a u64 as
 * X-KV-Sequence-Hash, or the first past the limit). The limit is small here (16) so that the fuzzer
 * reaches it.
 */
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "wire/keys.h"
#include "wire/lookup.h"

#define MAX 16

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    uint64_t out[MAX];
    size_t count = 99, line = 99, n = 0, i = 0;
    int rc = kvr_lookup_parse(s, size, out, MAX, &count, &line);

    check(rc == KVR_LOOKUP_OK || rc == KVR_LOOKUP_TOO_MANY || rc == KVR_LOOKUP_EMPTY || rc == KVR_LOOKUP_BAD);
    /* the plain reading: line by line, stopping at the first problem */
    while (i < size) {
        size_t end = i, l;
        uint64_t v;
        while (end < size && s[end] != '\n')
            end++;
        l = end - i;
        if (l > 0 && s[i + l - 1] == '\r')
            l--;
        if (n == MAX) {
            check(rc == KVR_LOOKUP_TOO_MANY && line == n + 1);
            return 0;
        }
        if (l == 0) {
            check(rc == KVR_LOOKUP_EMPTY && line == n + 1);
            return 0;
        }
        if (kvr_parse_u64(s + i, l, &v) != KVR_OK) {
            check(rc == KVR_LOOKUP_BAD && line == n + 1);
            return 0;
        }
        check(l <= KVR_LOOKUP_MAX_LINE); /* the body bound assumes it */
        n++;
        i = end + 1;
        if (rc == KVR_LOOKUP_OK)
            check(out[n - 1] == v);
    }
    check(rc == KVR_LOOKUP_OK && count == n && line == 0);
    return 0;
}
