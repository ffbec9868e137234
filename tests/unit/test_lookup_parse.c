/* The body parser of POST /batch/lookup (wire/lookup.c): lines, line ends, the limit, and every
 * line parsed as X-KV-Sequence-Hash is. */
#include "wire/lookup.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t out[KVR_LOOKUP_MAX_HASHES + 1];

static int parse(const char *body, size_t *count, size_t *line)
{
    return kvr_lookup_parse(body, strlen(body), out, KVR_LOOKUP_MAX_HASHES, count, line);
}

Test(lookup_parse, lines_and_line_ends)
{
    size_t n, line;

    cr_assert_eq(parse("", &n, &line), KVR_LOOKUP_OK);
    cr_assert_eq(n, 0, "an empty body holds no hash");
    cr_assert_eq(parse("1\n", &n, &line), KVR_LOOKUP_OK);
    cr_assert_eq(n, 1, "the last line end opens no line");
    cr_assert_eq(parse("1\r\n0x2A\n18446744073709551615\r\n0XfFfFfFfFfFfFfFfF", &n, &line), KVR_LOOKUP_OK);
    cr_assert_eq(n, 4);
    cr_assert_eq(out[0], 1);
    cr_assert_eq(out[1], 42);
    cr_assert_eq(out[2], UINT64_MAX);
    cr_assert_eq(out[3], UINT64_MAX);
}

Test(lookup_parse, a_bad_line_is_named)
{
    static const struct {
        const char *body;
        int rc;
        size_t line;
    } cases[] = {
        {"\n", KVR_LOOKUP_EMPTY, 1},
        {"1\n\n2", KVR_LOOKUP_EMPTY, 2},
        {"1\r\n\r\n", KVR_LOOKUP_EMPTY, 2},
        {"1\n2\nx", KVR_LOOKUP_BAD, 3},
        {"1\n 2", KVR_LOOKUP_BAD, 2},                 /* no space: exactly as the header parser */
        {"1\n2 ", KVR_LOOKUP_BAD, 2},                 /* nor after */
        {"-1", KVR_LOOKUP_BAD, 1},                    /* no sign */
        {"18446744073709551616", KVR_LOOKUP_BAD, 1},  /* u64 max + 1 */
        {"000000000000000000001", KVR_LOOKUP_BAD, 1}, /* 21 digits, even with zeros */
        {"0x10000000000000000", KVR_LOOKUP_BAD, 1},   /* 17 hex digits */
        {"0x", KVR_LOOKUP_BAD, 1},
        {"1\r\r\n", KVR_LOOKUP_BAD, 1}, /* one CR belongs to the line end, not two */
    };
    size_t n, line;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = parse(cases[i].body, &n, &line);
        cr_assert_eq(rc, cases[i].rc, "case %zu: %d", i, rc);
        cr_assert_eq(line, cases[i].line, "case %zu: line %zu", i, line);
        cr_assert_str_neq(kvr_lookup_error(rc), "ok");
    }
}

Test(lookup_parse, at_most_max_hashes)
{
    size_t cap = (KVR_LOOKUP_MAX_HASHES + 1) * (KVR_LOOKUP_MAX_LINE + 2) + 1, len = 0, n, line;
    char *body = malloc(cap);

    /* the longest valid lines with CRLF: exactly the body bound */
    for (int i = 0; i < KVR_LOOKUP_MAX_HASHES; i++)
        len += (size_t)snprintf(body + len, cap - len, "%020llu\r\n", 18446744073709551615ull - (unsigned)i);
    cr_assert_eq(len, KVR_LOOKUP_MAX_BODY);
    cr_assert_eq(kvr_lookup_parse(body, len, out, KVR_LOOKUP_MAX_HASHES, &n, &line), KVR_LOOKUP_OK);
    cr_assert_eq(n, KVR_LOOKUP_MAX_HASHES);
    cr_assert_eq(out[4095], 18446744073709551615ull - 4095);
    len += (size_t)snprintf(body + len, cap - len, "7");
    cr_assert_eq(kvr_lookup_parse(body, len, out, KVR_LOOKUP_MAX_HASHES, &n, &line), KVR_LOOKUP_TOO_MANY);
    cr_assert_eq(line, KVR_LOOKUP_MAX_HASHES + 1);
    free(body);
}
