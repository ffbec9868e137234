/*
 * test_kvhash.c — canonical block and sequence hashes (docs/relay-contract.md); every
 * vector is read from tests/data/kvhash/vectors.txt.
 */
#include <criterion/criterion.h>

#include "core/kvhash.h"
#include "testdata.h"

#define KVHASH_VECTORS "tests/data/kvhash/vectors.txt"

static const char *opt(const char *s)
{
    return strcmp(s, "-") == 0 ? NULL : s;
}

static uint64_t salt_of(const char *lora, const char *ns)
{
    return kvr_kvhash_salt(lora, lora ? strlen(lora) : 0, ns, ns ? strlen(ns) : 0);
}

Test(kvhash, golden_vectors)
{
    FILE *f = td_open(KVHASH_VECTORS);
    char line[1024], *tok[32];
    int n, checked = 0;
    while ((n = td_next(f, line, sizeof(line), tok, 32)) > 0) {
        if (strcmp(tok[0], "xxh3") == 0) {
            uint8_t in[64];
            size_t len = strcmp(tok[1], "-") == 0 ? 0 : td_hex_str(tok[1], in, sizeof(in));
            cr_expect_eq(kvr_kvhash_xxh3(in, len, td_u64(tok[2])), td_u64(tok[3]), "xxh3 %s",
                         tok[1]);
        } else if (strcmp(tok[0], "salt") == 0) {
            cr_expect_eq(salt_of(opt(tok[1]), opt(tok[2])), td_u64(tok[3]), "salt %s %s",
                         tok[1], tok[2]);
        } else if (strcmp(tok[0], "chain") == 0) {
            uint64_t in[8], out[8];
            int k = 0, eq = 1;
            while (eq < n && strcmp(tok[eq], "=") != 0)
                eq++;
            for (int i = 1; i < eq; i++)
                in[k++] = td_u64(tok[i]);
            cr_assert_eq(n - eq - 1, k);
            kvr_kvhash_seq(in, (size_t)k, out);
            for (int i = 0; i < k; i++)
                cr_expect_eq(out[i], td_u64(tok[eq + 1 + i]), "chain[%d]", i);
        } else {
            int is_seq = strcmp(tok[0], "seq") == 0;
            cr_assert(is_seq || strcmp(tok[0], "block") == 0, "unknown vector kind %s", tok[0]);
            kvr_kvhash_format_t fmt =
                strcmp(tok[1], "eagle") == 0 ? KVR_KVHASH_EAGLE : KVR_KVHASH_STANDARD;
            uint32_t bs = (uint32_t)td_u64(tok[2]);
            size_t nt = (size_t)td_u64(tok[3]);
            uint32_t tokens[64];
            for (size_t i = 0; i < nt; i++)
                tokens[i] = (uint32_t)i;
            kvr_kvhash_mm_t mm;
            uint64_t mm_hash = 0;
            size_t n_mm = 0;
            if (opt(tok[6])) {
                char *colon = strchr(tok[6], ':');
                cr_assert_not_null(colon);
                mm.block = (size_t)strtoull(tok[6], NULL, 0);
                mm_hash = td_u64(colon + 1);
                mm.hashes = &mm_hash;
                mm.n = 1;
                n_mm = 1;
            }
            uint64_t out[16];
            size_t nb = kvr_kvhash_blocks(tokens, nt, bs, fmt, salt_of(opt(tok[4]), opt(tok[5])),
                                          n_mm ? &mm : NULL, n_mm, out, 16);
            cr_assert_eq(nb, (size_t)(n - 7), "%s: block count", line);
            if (is_seq)
                kvr_kvhash_seq(out, nb, out);
            for (size_t i = 0; i < nb; i++)
                cr_expect_eq(out[i], td_u64(tok[7 + i]), "%s %s bs %u [%zu]: %016lx", tok[0],
                             tok[1], bs, i, (unsigned long)out[i]);
        }
        checked++;
    }
    fclose(f);
    cr_assert_geq(checked, 14);
}

/* Upstream properties: EAGLE windows overlap by one token; only complete windows count. */
Test(kvhash, eagle_windows_overlap)
{
    uint32_t t[6] = {0, 1, 2, 3, 4, 5};
    uint64_t e[4], w0, w1;
    cr_assert_eq(kvr_kvhash_blocks(t, 6, 2, KVR_KVHASH_EAGLE, 1337, NULL, 0, e, 4), 2);
    cr_assert_eq(kvr_kvhash_blocks(t, 3, 3, KVR_KVHASH_STANDARD, 1337, NULL, 0, &w0, 1), 1);
    cr_assert_eq(kvr_kvhash_blocks(t + 2, 3, 3, KVR_KVHASH_STANDARD, 1337, NULL, 0, &w1, 1), 1);
    cr_expect_eq(e[0], w0);
    cr_expect_eq(e[1], w1);
    cr_expect_eq(kvr_kvhash_blocks(t, 6, 2, KVR_KVHASH_STANDARD, 1337, NULL, 0, e, 4), 3);
}

Test(kvhash, complete_windows_only)
{
    static uint32_t t[200];
    const uint32_t sizes[] = {11, 32, 64};
    for (size_t i = 0; i < 3; i++) {
        uint32_t bs = sizes[i];
        cr_expect_eq(kvr_kvhash_block_count(bs, bs, KVR_KVHASH_STANDARD), 1);
        cr_expect_eq(kvr_kvhash_block_count(bs + 1, bs, KVR_KVHASH_STANDARD), 1);
        cr_expect_eq(kvr_kvhash_block_count(2 * bs + 1, bs, KVR_KVHASH_STANDARD), 2);
        uint64_t out[4];
        cr_expect_eq(kvr_kvhash_blocks(t, 2 * bs + 1, bs, KVR_KVHASH_STANDARD, 1337, NULL, 0,
                                       out, 4),
                     2);
    }
    cr_expect_eq(kvr_kvhash_block_count(3, 4, KVR_KVHASH_STANDARD), 0);
    cr_expect_eq(kvr_kvhash_block_count(4, 4, KVR_KVHASH_EAGLE), 0);
    cr_expect_eq(kvr_kvhash_block_count(5, 4, KVR_KVHASH_EAGLE), 1);
    cr_expect_eq(kvr_kvhash_blocks(t, 8, 0, KVR_KVHASH_STANDARD, 1337, NULL, 0, NULL, 0),
                 (size_t)-1);
}

/* Multimodal hashes are hashed sorted, whatever order (or split) the caller gives. */
Test(kvhash, multimodal_sorted)
{
    uint32_t t[4] = {0, 1, 2, 3};
    uint64_t a_h[3] = {3, 1, 2}, b_h[1] = {2}, c_h[2] = {3, 1};
    kvr_kvhash_mm_t a = {1, a_h, 3}, parts[2] = {{1, b_h, 1}, {1, c_h, 2}};
    uint64_t x[2], y[2], z[2];
    kvr_kvhash_blocks(t, 4, 2, KVR_KVHASH_STANDARD, 1337, &a, 1, x, 2);
    kvr_kvhash_blocks(t, 4, 2, KVR_KVHASH_STANDARD, 1337, parts, 2, y, 2);
    kvr_kvhash_blocks(t, 4, 2, KVR_KVHASH_STANDARD, 1337, NULL, 0, z, 2);
    cr_expect_eq(x[0], z[0]);
    cr_expect_eq(x[1], y[1]);
    cr_expect_neq(x[1], z[1]);
    /* the same bytes hashed directly: LE tokens 2,3 then LE 1,2,3 */
    uint8_t buf[8 + 24] = {2, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                           2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0};
    cr_expect_eq(x[1], kvr_kvhash_xxh3(buf, sizeof(buf), 1337));
}

/* Large windows go through the heap buffer and must hash like one call over the bytes. */
Test(kvhash, large_window)
{
    enum { BS = 3000 };
    static uint32_t t[BS];
    static uint8_t bytes[BS * 4];
    for (uint32_t i = 0; i < BS; i++) {
        t[i] = i * 2654435761u;
        bytes[4 * i] = (uint8_t)t[i];
        bytes[4 * i + 1] = (uint8_t)(t[i] >> 8);
        bytes[4 * i + 2] = (uint8_t)(t[i] >> 16);
        bytes[4 * i + 3] = (uint8_t)(t[i] >> 24);
    }
    uint64_t out;
    cr_assert_eq(kvr_kvhash_blocks(t, BS, BS, KVR_KVHASH_STANDARD, 99, NULL, 0, &out, 1), 1);
    cr_expect_eq(out, kvr_kvhash_xxh3(bytes, sizeof(bytes), 99));
}
