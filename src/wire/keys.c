/* keys.c — see keys.h. */
#include "wire/keys.h"

#include <xxhash.h>

int kvr_key_decode(const char *in, size_t n, uint8_t *out, size_t cap, size_t *outlen)
{
    size_t o = 0;

    if (n == 0)
        return KVR_KEY_EMPTY;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)in[i];
        if (c == '%') {
            int hi, lo;
            if (i + 2 >= n)
                return KVR_KEY_BAD_ESCAPE;
            hi = kvr_hexval(in[i + 1]);
            lo = kvr_hexval(in[i + 2]);
            if (hi < 0 || lo < 0)
                return KVR_KEY_BAD_ESCAPE;
            c = (uint8_t)(hi << 4 | lo);
            i += 2;
        }
        if (c == 0)
            return KVR_KEY_NUL;
        if (o >= KVR_KEY_MAX || o >= cap)
            return KVR_KEY_TOO_LONG;
        out[o++] = c;
    }
    *outlen = o;
    return KVR_KEY_OK;
}

const char *kvr_key_error(int rc)
{
    switch (rc) {
    case KVR_KEY_EMPTY:
        return "empty key";
    case KVR_KEY_TOO_LONG:
        return "key longer than 1024 bytes after percent-decoding";
    case KVR_KEY_BAD_ESCAPE:
        return "malformed percent-encoding in key";
    case KVR_KEY_NUL:
        return "NUL byte in key";
    default:
        return "invalid key";
    }
}

int kvr_parse_u64(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    size_t i = 0;

    if (n == 0)
        return KVR_EINVAL;
    if (n > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        if (n - 2 > 16)
            return KVR_EINVAL;
        for (i = 2; i < n; i++) {
            int d = kvr_hexval(s[i]);
            if (d < 0)
                return KVR_EINVAL;
            v = v << 4 | (uint64_t)d;
        }
        *out = v;
        return KVR_OK;
    }
    if (n > 20) /* u64 max has 20 digits; longer (even with leading zeros) is refused */
        return KVR_EINVAL;
    for (; i < n; i++) {
        unsigned d;
        if (s[i] < '0' || s[i] > '9')
            return KVR_EINVAL;
        d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return KVR_EINVAL;
        v = v * 10 + d;
    }
    *out = v;
    return KVR_OK;
}

uint64_t kvr_key_canon(const void *key, size_t klen)
{
    const char *k = key;
    uint64_t v = 0;

    if (klen == 16) {
        size_t i;
        for (i = 0; i < 16; i++) {
            int d = kvr_hexval(k[i]);
            if (d < 0)
                break;
            v = v << 4 | (uint64_t)d;
        }
        if (i == 16)
            return v;
    }
    return XXH3_64bits(key, klen);
}

int kvr_model_valid(const char *model, size_t len)
{
    if (len == 0 || len > KVR_MODEL_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)model[i] <= 0x20 || (unsigned char)model[i] >= 0x7f)
            return 0;
    return 1;
}
