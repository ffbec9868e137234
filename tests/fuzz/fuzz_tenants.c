/*
 * fuzz_tenants.c — libFuzzer driver for the tenants file's parser (src/core/tenants.c).
 *
 * Input: the file's bytes, as they are. Any crash is a finding, and so is a table that breaks
 * the parser's promises: "default" first, at most 1024 tokens and KVR_NS_MAX namespaces, every
 * token naming a namespace of the table, no digest twice, names of [A-Za-z0-9._-] of 1-32
 * bytes; a refusal always says "tenants: line N: ..." and never echoes a literal token.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "core/tenants.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void check_name(const char *s)
{
    size_t n = strlen(s);

    check(n >= 1 && n <= KVR_NS_NAME_MAX);
    for (size_t i = 0; i < n; i++)
        check((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '.' || s[i] == '_' || s[i] == '-');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvr_tenants_t t;
    char err[256];

    if (kvr_tenants_parse((const char *)data, size, &t, err, sizeof(err)) != KVR_OK) {
        check(strncmp(err, "tenants: line ", 14) == 0);
        return 0;
    }
    check(t.nns >= 1 && t.nns <= KVR_NS_MAX && t.ntokens <= KVR_TENANTS_TOKENS);
    check(strcmp(t.ns[0].name, "default") == 0);
    for (uint32_t i = 0; i < t.nns; i++) {
        check_name(t.ns[i].name);
        check(strlen(t.ns[i].model) <= KVR_MODEL_MAX);
        for (uint32_t j = 0; j < i; j++)
            check(strcmp(t.ns[i].name, t.ns[j].name) != 0);
    }
    for (uint32_t i = 0; i < t.ntokens; i++) {
        check(t.tok[i].ns < t.nns && t.tok[i].line >= 1);
        for (uint32_t j = 0; j < i; j++)
            check(memcmp(t.tok[i].digest, t.tok[j].digest, KVR_SHA256_LEN) != 0);
    }
    return 0;
}
