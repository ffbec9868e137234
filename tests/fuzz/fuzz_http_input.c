/*
 * libFuzzer driver for what a /kv/ request brings: the percent-encoded key, the
 * X-KV-Sequence-Hash value, and the JSON writer that echoes keys back. Checks invariants,
 * not only crashes: a decoded key respects its limits, and the JSON output never contains a
 * raw control character or an unescaped quote.
 */
#include "shm/segment.h"
#include "wire/json.h"
#include "wire/keys.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t key[KVR_KEY_MAX];
    size_t klen = 0;
    uint64_t v;
    char out[8 * KVR_KEY_MAX];
    kvr_json_t j;
    int rc = kvr_key_decode((const char *)data, size, key, sizeof(key), &klen);

    if (rc == KVR_KEY_OK) {
        if (klen < 1 || klen > KVR_KEY_MAX || memchr(key, 0, klen) != NULL)
            abort();
        kvr_json_init(&j, out, sizeof(out));
        kvr_json_str(&j, key, klen);
        if (j.overflow)
            abort(); /* 6 bytes per input byte at most, plus quotes */
        for (size_t i = 1; i + 1 < j.len; i++) {
            if ((unsigned char)out[i] < 0x20)
                abort();
            if (out[i] == '"' && out[i - 1] != '\\')
                abort();
        }
    }
    if (kvr_parse_u64((const char *)data, size, &v) == KVR_OK && size > 20)
        abort(); /* no accepted value is longer than 0x + 16 or 20 digits */
    return 0;
}
