/*
 * test_identity.c — BLAKE3 identity digests and DcId (docs/relay-contract.md), golden
 * vectors from tests/data/identity/vectors.txt, plus explicit-map rules.
 */
#include <criterion/criterion.h>

#include "common.h"
#include "testdata.h"
#include "wire/identity.h"

static void expect_digest(const uint8_t got[16], const char *hex, const char *what)
{
    uint8_t want[16];
    cr_assert_eq(td_hex_str(hex, want, 16), 16);
    cr_expect_arr_eq(got, want, 16, "%s", what);
}

Test(identity, golden_vectors)
{
    FILE *f = td_open("tests/data/identity/vectors.txt");
    char line[512], *tok[8];
    int n, checked = 0;
    while ((n = td_next(f, line, sizeof(line), tok, 8)) > 0) {
        uint8_t d[16];
        if (strcmp(tok[0], "cache") == 0) {
            cr_assert_eq(n, 5);
            kvr_bytes_t sp = kvr_bytes_str(tok[1]);
            kvr_identity_cache_default(&sp, 1, (uint32_t)td_u64(tok[2]),
                                       (uint16_t)td_u64(tok[3]), d);
            expect_digest(d, tok[4], "cache semantics");
        } else if (strcmp(tok[0], "routing") == 0) {
            cr_assert_eq(n, 5);
            kvr_identity_routing_default(kvr_bytes_str(tok[1]), kvr_bytes_str(tok[2]),
                                         kvr_bytes_str(tok[3]), d);
            expect_digest(d, tok[4], "routing scope");
        } else {
            cr_assert_str_eq(tok[0], "dc");
            cr_expect_eq(kvr_identity_dc_id(kvr_bytes_str(tok[1])), td_u64(tok[2]), "DcId %s",
                         tok[1]);
        }
        checked++;
    }
    fclose(f);
    cr_assert_eq(checked, 5);
}

/* kvrelay's defaults (profile): model "kvrelay", block size 16, standard; endpoint
 * kvrelay/store/kv; DC "default". Only stability and distinctness are checked here. */
Test(identity, defaults_are_distinct)
{
    uint8_t std[16], eagle[16], bs32[16], r1[16], r2[16];
    kvr_bytes_t model = kvr_bytes_str("kvrelay");
    kvr_identity_cache_default(&model, 1, 16, KVR_IDENTITY_HASH_STANDARD, std);
    kvr_identity_cache_default(&model, 1, 16, KVR_IDENTITY_HASH_EAGLE, eagle);
    kvr_identity_cache_default(&model, 1, 32, KVR_IDENTITY_HASH_STANDARD, bs32);
    cr_expect_arr_neq(std, eagle, 16);
    cr_expect_arr_neq(std, bs32, 16);
    kvr_identity_routing_default(kvr_bytes_str("kvrelay"), kvr_bytes_str("store"),
                                 kvr_bytes_str("kv"), r1);
    /* framing keeps ("kvrelay","store","kv") apart from ("kvrelays","tore","kv") */
    kvr_identity_routing_default(kvr_bytes_str("kvrelays"), kvr_bytes_str("tore"),
                                 kvr_bytes_str("kv"), r2);
    cr_expect_arr_neq(r1, r2, 16);
    cr_expect_neq(kvr_identity_dc_id(kvr_bytes_str("default")),
                  kvr_identity_dc_id(kvr_bytes_str("defaul")));
}

Test(identity, explicit_maps)
{
    kvr_identity_kv_t a[2] = {{kvr_bytes_str("model"), kvr_bytes_str("x")},
                              {kvr_bytes_str("lora"), kvr_bytes_str("y")}};
    kvr_identity_kv_t b[2] = {a[1], a[0]};
    uint8_t da[16], db[16], dd[16];
    cr_assert_eq(kvr_identity_cache_explicit(a, 2, 16, 1, da), KVR_OK);
    cr_assert_eq(kvr_identity_cache_explicit(b, 2, 16, 1, db), KVR_OK);
    cr_expect_arr_eq(da, db, 16, "key order, not input order");
    kvr_bytes_t m = kvr_bytes_str("x");
    kvr_identity_cache_default(&m, 1, 16, 1, dd);
    cr_expect_arr_neq(da, dd, 16, "explicit and default tags differ");
    cr_assert_eq(kvr_identity_routing_explicit(a, 2, da), KVR_OK);
    cr_assert_eq(kvr_identity_routing_explicit(b, 2, db), KVR_OK);
    cr_expect_arr_eq(da, db, 16);

    /* limits: 1..32 entries, key 1..128 bytes, value 1..1024 bytes, unique keys */
    char key[130], val[1026];
    memset(key, 'k', sizeof(key));
    memset(val, 'v', sizeof(val));
    kvr_identity_kv_t one = {{key, 128}, {val, 1024}};
    cr_expect_eq(kvr_identity_routing_explicit(&one, 1, da), KVR_OK);
    one.key.len = 129;
    cr_expect_eq(kvr_identity_routing_explicit(&one, 1, da), KVR_EINVAL);
    one.key.len = 128;
    one.value.len = 1025;
    cr_expect_eq(kvr_identity_routing_explicit(&one, 1, da), KVR_EINVAL);
    one.value.len = 0;
    cr_expect_eq(kvr_identity_routing_explicit(&one, 1, da), KVR_EINVAL);
    cr_expect_eq(kvr_identity_routing_explicit(&one, 0, da), KVR_EINVAL);
    kvr_identity_kv_t dup[2] = {a[0], a[0]};
    cr_expect_eq(kvr_identity_cache_explicit(dup, 2, 16, 1, da), KVR_EINVAL);
    static kvr_identity_kv_t many[33];
    static char names[33][4];
    for (int i = 0; i < 33; i++) {
        snprintf(names[i], sizeof(names[i]), "%02d", i);
        many[i].key = kvr_bytes_str(names[i]);
        many[i].value = kvr_bytes_str("v");
    }
    cr_expect_eq(kvr_identity_routing_explicit(many, 32, da), KVR_OK);
    cr_expect_eq(kvr_identity_routing_explicit(many, 33, da), KVR_EINVAL);
}
