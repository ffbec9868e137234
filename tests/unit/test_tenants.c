/*
 * Unit tests of the tenants file's parser (src/core/tenants.c): the good forms (comments,
 * tabs, CRLF, the sha256: form equal to the literal one, two tokens for one namespace, memory=
 * and model=), and one test per limit and per kind of error, each naming its line.
 */
#include "core/tenants.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvr_tenants_t tab;
static char err[512];

static int parse(const char *text)
{
    return kvr_tenants_parse(text, strlen(text), &tab, err, sizeof(err));
}

/* Parsing fails with an error that contains want. */
static void refused(const char *text, const char *want)
{
    cr_assert_eq(parse(text), KVR_EINVAL, "accepted: %s", text);
    cr_assert(strstr(err, want) != NULL, "error \"%s\" lacks \"%s\"", err, want);
    cr_assert(strncmp(err, "tenants: line ", 14) == 0, "the error names its line: %s", err);
}

static void hex_of(const char *tok, char out[65])
{
    uint8_t d[32];

    kvr_tenants_digest(tok, strlen(tok), d);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

Test(tenants_parse, empty_and_comments_only)
{
    cr_assert_eq(parse(""), KVR_OK);
    cr_assert_eq(tab.ntokens, 0);
    cr_assert_eq(tab.nns, 1);
    cr_assert_str_eq(tab.ns[0].name, "default");
    cr_assert_eq(parse("# a comment\n\n   \t\n# another\n"), KVR_OK);
    cr_assert_eq(tab.ntokens, 0);
}

Test(tenants_parse, entries_with_comments_tabs_and_options)
{
    const char *text = "# tenants\n"
                       "team-a\tsecret-a memory=2G model=llama-3-8b # trailing comment\n"
                       "\n"
                       "  team_b.x   secret-b\r\n"
                       "team-a secret-a2 memory=2GiB\n"
                       "default tok#with#hash\n";

    cr_assert_eq(parse(text), KVR_OK, "%s", err);
    cr_assert_eq(tab.nns, 3);
    cr_assert_eq(tab.ntokens, 4);
    cr_assert_str_eq(tab.ns[1].name, "team-a");
    cr_assert_eq(tab.ns[1].quota, 2ull << 30);
    cr_assert_str_eq(tab.ns[1].model, "llama-3-8b");
    cr_assert_eq(tab.ns[1].line, 2);
    cr_assert_str_eq(tab.ns[2].name, "team_b.x");
    cr_assert_eq(tab.ns[2].quota, 0, "no memory=: no quota");
    cr_assert_str_eq(tab.ns[2].model, "");
    cr_assert_eq(tab.tok[0].ns, 1);
    cr_assert_eq(tab.tok[1].ns, 2);
    cr_assert_eq(tab.tok[1].line, 4);
    cr_assert_eq(tab.tok[2].ns, 1, "rotation: a second token for team-a");
    cr_assert_eq(tab.tok[3].ns, 0, "\"default\" may be named");

    uint8_t d[32];
    kvr_tenants_digest("secret-b", 8, d);
    cr_assert_eq(memcmp(tab.tok[1].digest, d, 32), 0, "the CR is not part of the token");
    kvr_tenants_digest("tok#with#hash", 13, d);
    cr_assert_eq(memcmp(tab.tok[3].digest, d, 32), 0, "a # inside a token is the token's");
}

Test(tenants_parse, sha256_form_equals_literal_form)
{
    char hex[65], line[200], upper[65];
    uint8_t lit[32];

    hex_of("s3cr3t", hex);
    snprintf(line, sizeof(line), "a sha256:%s\n", hex);
    cr_assert_eq(parse("a s3cr3t\n"), KVR_OK);
    memcpy(lit, tab.tok[0].digest, 32);
    cr_assert_eq(parse(line), KVR_OK, "%s", err);
    cr_assert_eq(memcmp(lit, tab.tok[0].digest, 32), 0);
    for (int i = 0; i < 65; i++)
        upper[i] = (char)(hex[i] >= 'a' && hex[i] <= 'f' ? hex[i] - 32 : hex[i]);
    snprintf(line, sizeof(line), "a sha256:%s\n", upper);
    cr_assert_eq(parse(line), KVR_OK, "either case");
    cr_assert_eq(memcmp(lit, tab.tok[0].digest, 32), 0);
    /* the two forms of one token are the same token */
    snprintf(line, sizeof(line), "a s3cr3t\nb sha256:%s\n", hex);
    refused(line, "line 2: the same token as line 1");
}

Test(tenants_parse, bad_namespace)
{
    refused("ok tok\nbad/ns tok2\n", "line 2: namespace \"bad/ns\" has a character outside [A-Za-z0-9._-]");
    refused("a\xc3\xa9 tok\n", "line 1: byte 0xc3 at column 2 is not visible ASCII");
    refused("abcdefghijabcdefghijabcdefghijabc tok\n", "line 1: namespace \"abcdefghijabcdefghijabcdefghijabc\" is 33 bytes, at most 32");
    cr_assert_eq(parse("abcdefghijabcdefghijabcdefghijab tok\n"), KVR_OK, "32 bytes is fine");
}

Test(tenants_parse, missing_token)
{
    refused("\n\nlonely   # no token\n", "line 3: namespace \"lonely\" has no token");
}

Test(tenants_parse, bad_tokens)
{
    char big[400];

    memset(big, 0, sizeof(big));
    memcpy(big, "a ", 2);
    memset(big + 2, 'x', 257);
    refused(big, "line 1: the token is 257 bytes, at most 256");
    big[2 + 256] = '\0';
    cr_assert_eq(parse(big), KVR_OK, "256 bytes is fine");
    refused("a sha256:abcd\n", "line 1: a sha256: token needs exactly 64 hex digits");
    refused("a sha256:\n", "exactly 64 hex digits after \"sha256:\", found 0");
    refused("a sha256:zz00000000000000000000000000000000000000000000000000000000000000\n",
            "line 1: a sha256: token has a character that is not a hex digit");
    refused("a tok\x7f\n", "byte 0x7f");
    refused("a tok\x01x\n", "byte 0x01");
}

Test(tenants_parse, errors_never_show_the_token)
{
    refused("a topsecret bogus\n", "line 1: field 3 is none of memory=SIZE, ssd=SIZE, model=NAME");
    cr_assert(strstr(err, "topsecret") == NULL);
    refused("a topsecret\nb topsecret\n", "line 2: the same token as line 1");
    cr_assert(strstr(err, "topsecret") == NULL);
}

Test(tenants_parse, options)
{
    refused("a t color=red\n", "line 1: unknown key \"color=\" (memory=, ssd= and model= are known)");
    refused("a t ssd=\n", "line 1: ssd= is not a size");
    refused("a t ssd=2X\n", "ssd=2X is not a size");
    refused("a t ssd=0\n", "ssd=0: a quota is above 0 (leave ssd= out for none)");
    refused("a t ssd=1G ssd=1G\n", "line 1: ssd= is given twice");
    refused("a t memory=\n", "line 1: memory= is not a size");
    refused("a t memory=12Q\n", "memory=12Q is not a size");
    refused("a t memory=-1\n", "memory=-1 is not a size");
    refused("a t memory=0\n", "memory=0: a quota is above 0");
    refused("a t memory=1G memory=1G\n", "line 1: memory= is given twice");
    refused("a t model=x model=x\n", "model= is given twice");
    refused("a t model=\n", "line 1: model= is not 1 to 128 printable bytes without spaces");
    char line[300];
    memset(line, 0, sizeof(line));
    strcpy(line, "a t model=");
    memset(line + strlen(line), 'm', 129);
    refused(line, "is not 1 to 128 printable bytes without spaces");
    refused("a t memory=1G ssd=1G model=x extra=1\n", "more than 5 fields");
    cr_assert_eq(parse("a t model=org/Model-7B:v1 memory=512K\n"), KVR_OK, "%s", err);
    cr_assert_eq(tab.ns[1].quota, 512 << 10);
    cr_assert_eq(tab.ns[1].ssd_quota, 0, "no ssd=: none");
    cr_assert_str_eq(tab.ns[1].model, "org/Model-7B:v1");
    cr_assert_eq(parse("a t ssd=2T memory=1G model=m\n"), KVR_OK, "%s", err);
    cr_assert_eq(tab.ns[1].ssd_quota, 2ull << 40);
    cr_assert_eq(tab.ns[1].quota, 1ull << 30);
}

Test(tenants_parse, options_of_one_namespace_agree)
{
    cr_assert_eq(parse("a t1 memory=1G\na t2 memory=1024M model=m\na t3\na t4 model=m\n"), KVR_OK, "%s", err);
    cr_assert_eq(tab.ns[1].quota, 1ull << 30);
    refused("a t1 memory=1G\n\na t2 memory=2G\n",
            "line 3: namespace \"a\" has memory= 2147483648 bytes here but 1073741824 bytes on line 1");
    refused("a t1 model=x\nb t2\na t3 model=y\n", "line 3: namespace \"a\" has model=y here but model=x on line 1");
    cr_assert_eq(parse("a t1 ssd=1G\na t2\na t3 ssd=1024M\n"), KVR_OK, "%s", err);
    cr_assert_eq(tab.ns[1].ssd_quota, 1ull << 30);
    refused("a t1 ssd=1G\na t2 ssd=2G\n", "line 2: namespace \"a\" has ssd= 2147483648 bytes here but 1073741824 bytes on line 1");
}

Test(tenants_parse, line_limit)
{
    char *text = malloc(2100);
    size_t n;

    strcpy(text, "a t1\n");
    n = strlen(text);
    memcpy(text + n, "b t2 #", 6);
    memset(text + n + 6, 'c', 1024 - 6);
    text[n + 1024] = '\0';
    cr_assert_eq(parse(text), KVR_OK, "1024 bytes is fine: %s", err);
    strcat(text, "c\n");
    refused(text, "line 2: the line is 1025 bytes, at most 1024");
    free(text);
}

Test(tenants_parse, file_limit)
{
    size_t n = KVR_TENANTS_FILE_MAX + 1, i = 0;
    char *text = malloc(n + 1);
    int line = 0;

    /* lines of "# .....\n", 64 bytes each: byte 1 MiB is on line 16385 */
    while (i < n) {
        size_t k = n - i < 64 ? n - i : 64;
        memset(text + i, '#', k);
        if (k == 64)
            text[i + 63] = '\n';
        i += k;
        line++;
    }
    text[n] = '\0';
    cr_assert_eq(kvr_tenants_parse(text, n - 1, &tab, err, sizeof(err)), KVR_OK, "1 MiB is fine: %s", err);
    cr_assert_eq(kvr_tenants_parse(text, n, &tab, err, sizeof(err)), KVR_EINVAL);
    cr_assert(strstr(err, "tenants: line 16385: the file is longer than 1 MiB (1048576 bytes)") != NULL, "%s", err);
    free(text);
}

Test(tenants_parse, token_limit)
{
    size_t cap = 1100 * 24;
    char *text = malloc(cap), *p = text;

    for (int i = 0; i < KVR_TENANTS_TOKENS; i++)
        p += sprintf(p, "ns%d tok-%d\n", i % 8, i);
    cr_assert_eq(parse(text), KVR_OK, "1024 tokens is fine: %s", err);
    cr_assert_eq(tab.ntokens, KVR_TENANTS_TOKENS);
    sprintf(p, "ns0 tok-one-more\n");
    refused(text, "line 1025: one token too many: at most 1024");
    free(text);
}

Test(tenants_parse, namespace_limit)
{
    char text[64 * 24], *p = text;

    for (int i = 1; i < KVR_NS_MAX; i++)
        p += sprintf(p, "ns%d tok-%d\n", i, i);
    p += sprintf(p, "default tok-default\n");
    cr_assert_eq(parse(text), KVR_OK, "63 besides \"default\" is fine: %s", err);
    cr_assert_eq(tab.nns, KVR_NS_MAX);
    sprintf(p, "one-more tok-x\n");
    refused(text, "line 65: namespace \"one-more\" is one too many: at most 63 namespaces besides \"default\"");
}

Test(tenants_parse, duplicate_token)
{
    refused("a t1\nb t2\n\nc t1\n", "line 4: the same token as line 1");
    refused("a t1\na t1\n", "line 2: the same token as line 1");
}

Test(tenants_parse, no_final_newline_and_crlf)
{
    cr_assert_eq(parse("a t1\r\nb t2"), KVR_OK, "%s", err);
    cr_assert_eq(tab.ntokens, 2);
    cr_assert_eq(tab.tok[1].line, 2);
}
