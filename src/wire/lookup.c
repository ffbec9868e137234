/* lookup.c — see lookup.h. */
#include "wire/lookup.h"

#include "wire/keys.h"

#include <string.h>

int kvr_lookup_parse(const char *body, size_t len, uint64_t *out, size_t max, size_t *count, size_t *line)
{
    size_t n = 0, i = 0;

    *count = 0;
    *line = 0;
    while (i < len) {
        const char *nl = memchr(body + i, '\n', len - i);
        size_t end = nl != NULL ? (size_t)(nl - body) : len, l = end - i;
        if (l > 0 && body[end - 1] == '\r')
            l--;
        *line = n + 1;
        if (n == max)
            return KVR_LOOKUP_TOO_MANY;
        if (l == 0)
            return KVR_LOOKUP_EMPTY;
        if (kvr_parse_u64(body + i, l, &out[n]) != KVR_OK)
            return KVR_LOOKUP_BAD;
        n++;
        i = end + 1;
    }
    *count = n;
    *line = 0;
    return KVR_LOOKUP_OK;
}

const char *kvr_lookup_error(int rc)
{
    switch (rc) {
    case KVR_LOOKUP_TOO_MANY:
        return "more hashes than a lookup holds";
    case KVR_LOOKUP_EMPTY:
        return "empty line";
    case KVR_LOOKUP_BAD:
        return "not a sequence hash (a u64 in decimal or 0x hex, as X-KV-Sequence-Hash)";
    default:
        return "ok";
    }
}
