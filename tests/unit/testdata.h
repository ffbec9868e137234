/*
 * testdata.h — helpers shared by the unit tests to load vectors from tests/data/
 * (tests run from the repository root). Header-only, all static inline.
 *
 * Formats: *.hex files are hex digits with optional whitespace and '#' comment lines;
 * *.txt files are whitespace-separated tokens, one vector per line, '#' comments.
 */
#ifndef KVR_TESTDATA_H
#define KVR_TESTDATA_H

#include <criterion/criterion.h>
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* SplitMix64: the tests' own reproducible source of hashes and choices (seeded per test). */
static inline uint64_t td_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Bytes of a .hex file (malloc'd; *len set). Fails the test when unreadable. */
static inline uint8_t *td_load_hex(const char *path, size_t *len)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s (run tests from the repo root)", path);
    size_t cap = 4096, n = 0;
    uint8_t *out = malloc(cap);
    int hi = -1, c, comment = 0;
    while ((c = fgetc(f)) != EOF) {
        if (c == '\n') {
            comment = 0;
            continue;
        }
        if (comment || isspace(c))
            continue;
        if (c == '#') {
            comment = 1;
            continue;
        }
        int v = isdigit(c) ? c - '0' : (tolower(c) - 'a' + 10);
        cr_assert(isxdigit(c), "bad hex digit '%c' in %s", c, path);
        if (hi < 0) {
            hi = v;
            continue;
        }
        if (n == cap)
            out = realloc(out, cap *= 2);
        out[n++] = (uint8_t)(hi << 4 | v);
        hi = -1;
    }
    fclose(f);
    cr_assert_eq(hi, -1, "odd number of hex digits in %s", path);
    *len = n;
    return out;
}

static inline FILE *td_open(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s (run tests from the repo root)", path);
    return f;
}

/* Next non-comment line split into tokens; returns the token count, 0 at EOF. */
static inline int td_next(FILE *f, char *line, size_t size, char **tok, int max)
{
    while (fgets(line, (int)size, f)) {
        char *save = NULL;
        int n = 0;
        if (line[0] == '#')
            continue;
        for (char *t = strtok_r(line, " \t\r\n", &save); t && n < max;
             t = strtok_r(NULL, " \t\r\n", &save))
            tok[n++] = t;
        if (n)
            return n;
    }
    return 0;
}

static inline uint64_t td_u64(const char *s)
{
    return strtoull(s, NULL, 0);
}

/* Parses hex text into out (returns the byte count). */
static inline size_t td_hex_str(const char *s, uint8_t *out, size_t cap)
{
    size_t n = 0;
    for (; s[0] && s[1] && n < cap; s += 2) {
        char b[3] = {s[0], s[1], 0};
        out[n++] = (uint8_t)strtoul(b, NULL, 16);
    }
    return n;
}

#endif
