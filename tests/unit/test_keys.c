/* Unit tests of the request decoders (src/wire/keys.c): percent-decoded keys, sequence-hash values. */
#include "wire/json.h"
#include "wire/keys.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <xxhash.h>

static int dec(const char *in, char *out, size_t *n)
{
    return kvr_key_decode(in, strlen(in), (uint8_t *)out, KVR_KEY_MAX, n);
}

Test(keys, percent_decoding_as_the_reference_driver_encodes)
{
    char out[KVR_KEY_MAX];
    size_t n;

    cr_assert_eq(dec("meta-llama%2FLlama-3%40000000ff%400%4000010203", out, &n), KVR_KEY_OK);
    cr_assert_eq(n, strlen("meta-llama/Llama-3@000000ff@0@00010203"));
    cr_assert_eq(memcmp(out, "meta-llama/Llama-3@000000ff@0@00010203", n), 0);
    cr_assert_eq(dec("a%20b%2Bc%3Dd+e", out, &n), KVR_KEY_OK);
    cr_assert_eq(memcmp(out, "a b+c=d+e", n), 0, "'+' is not a space in a path");
    cr_assert_eq(dec("raw/slash", out, &n), KVR_KEY_OK);
    cr_assert_eq(n, 9);
    cr_assert_eq(dec("%e2%82%ac", out, &n), KVR_KEY_OK);
    cr_assert_eq(n, 3);
}

Test(keys, each_limit_has_its_error)
{
    char out[KVR_KEY_MAX];
    char big[3 * KVR_KEY_MAX + 8];
    size_t n;

    cr_assert_eq(dec("", out, &n), KVR_KEY_EMPTY);
    cr_assert_eq(dec("%", out, &n), KVR_KEY_BAD_ESCAPE);
    cr_assert_eq(dec("a%4", out, &n), KVR_KEY_BAD_ESCAPE);
    cr_assert_eq(dec("a%zz", out, &n), KVR_KEY_BAD_ESCAPE);
    cr_assert_eq(dec("a%00b", out, &n), KVR_KEY_NUL);
    memset(big, 'k', KVR_KEY_MAX);
    big[KVR_KEY_MAX] = '\0';
    cr_assert_eq(dec(big, out, &n), KVR_KEY_OK);
    cr_assert_eq(n, KVR_KEY_MAX);
    big[KVR_KEY_MAX] = 'k';
    big[KVR_KEY_MAX + 1] = '\0';
    cr_assert_eq(dec(big, out, &n), KVR_KEY_TOO_LONG);
    /* 1024 decoded bytes from 3072 encoded ones is fine; 1025 is not */
    for (int i = 0; i < KVR_KEY_MAX; i++)
        memcpy(big + 3 * i, "%41", 3);
    big[3 * KVR_KEY_MAX] = '\0';
    cr_assert_eq(dec(big, out, &n), KVR_KEY_OK);
    memcpy(big + 3 * KVR_KEY_MAX, "%41", 4);
    cr_assert_eq(dec(big, out, &n), KVR_KEY_TOO_LONG);
    cr_assert_str_eq(kvr_key_error(KVR_KEY_NUL), "NUL byte in key");
}

Test(keys, sequence_hash_values)
{
    uint64_t v;

    cr_assert_eq(kvr_parse_u64("12345", 5, &v), KVR_OK);
    cr_assert_eq(v, 12345);
    cr_assert_eq(kvr_parse_u64("0x7ee2cbedc694ab46", 18, &v), KVR_OK);
    cr_assert_eq(v, 0x7ee2cbedc694ab46ull);
    cr_assert_eq(kvr_parse_u64("18446744073709551615", 20, &v), KVR_OK);
    cr_assert_eq(v, UINT64_MAX);
    cr_assert_eq(kvr_parse_u64("18446744073709551616", 20, &v), KVR_EINVAL, "overflow");
    cr_assert_eq(kvr_parse_u64("0x10000000000000000", 19, &v), KVR_EINVAL, "17 hex digits");
    cr_assert_eq(kvr_parse_u64("000000000000000000001", 21, &v), KVR_EINVAL, "21 decimal digits");
    cr_assert_eq(kvr_parse_u64("", 0, &v), KVR_EINVAL);
    cr_assert_eq(kvr_parse_u64("0x", 2, &v), KVR_EINVAL);
    cr_assert_eq(kvr_parse_u64("-1", 2, &v), KVR_EINVAL);
    cr_assert_eq(kvr_parse_u64(" 1", 2, &v), KVR_EINVAL);
    cr_assert_eq(kvr_parse_u64("0xg1", 4, &v), KVR_EINVAL);
}

Test(keys, default_canonical_hash)
{
    cr_assert_eq(kvr_key_canon("00000000000000ff", 16), 0xff);
    cr_assert_eq(kvr_key_canon("DEADBEEFcafebabe", 16), 0xdeadbeefcafebabeull);
    cr_assert_eq(kvr_key_canon("0000000000000g00", 16), XXH3_64bits("0000000000000g00", 16));
    cr_assert_eq(kvr_key_canon("00000000000000ff0", 17), XXH3_64bits("00000000000000ff0", 17));
    cr_assert_eq(kvr_key_canon("abc", 3), XXH3_64bits("abc", 3));
}
