/* tenants.c — see tenants.h. Error messages never show a token, only its line. */
#include "core/tenants.h"

#include "core/config.h"
#include "wire/keys.h"

#include <openssl/sha.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define SHA256_PREFIX     "sha256:"
#define SHA256_PREFIX_LEN 7
#define QUOTE_MAX         40 /* bytes of a field shown in an error */

typedef struct {
    const char *p;
    size_t n;
} span_t;

/* One line being parsed: where errors go and which line they name. */
typedef struct {
    kvr_tenants_t *t;
    uint32_t line;
    char *err;
    size_t errlen;
} ctx_t;

void kvr_tenants_digest(const void *p, size_t n, uint8_t out[KVR_SHA256_LEN])
{
    SHA256(p, n, out);
}

void kvr_tenants_init(kvr_tenants_t *t)
{
    memset(t, 0, sizeof(*t));
    memcpy(t->ns[0].name, "default", sizeof("default"));
    t->nns = 1;
}

int kvr_tenants_find_ns(const kvr_tenants_t *t, const char *name)
{
    for (uint32_t i = 0; i < t->nns; i++)
        if (strcmp(t->ns[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int fail(const ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(const ctx_t *c, const char *fmt, ...)
{
    va_list ap;
    int k;

    if (c->errlen == 0)
        return KVR_EINVAL;
    k = snprintf(c->err, c->errlen, "tenants: line %u: ", c->line);
    if (k >= 0 && (size_t)k < c->errlen) {
        va_start(ap, fmt);
        vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return KVR_EINVAL;
}

/* A field for an error message: visible bytes as they are, others as \xNN, cut at QUOTE_MAX. */
static const char *quote(char *buf, size_t n, span_t f)
{
    size_t o = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < f.n && i < QUOTE_MAX && o + 8 < n; i++) {
        unsigned char ch = (unsigned char)f.p[i];
        if (ch >= 0x21 && ch <= 0x7e && ch != '"' && ch != '\\')
            buf[o++] = (char)ch;
        else
            o += (size_t)snprintf(buf + o, n - o, "\\x%02x", ch);
    }
    if (f.n > QUOTE_MAX && o + 4 < n)
        memcpy(buf + o, "...", 3), o += 3;
    buf[o] = '\0';
    return buf;
}

static int visible(unsigned char ch)
{
    return ch >= 0x21 && ch <= 0x7e;
}

static int ns_char(unsigned char ch)
{
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
           ch == '_' || ch == '-';
}

/* The namespace field: its index in the table, added if new. Returns the index or -1. */
static int namespace_of(ctx_t *c, span_t f)
{
    kvr_tenants_t *t = c->t;
    char q[QUOTE_MAX * 4 + 8], name[KVR_NS_NAME_MAX + 1];
    int i;

    for (size_t k = 0; k < f.n; k++)
        if (!ns_char((unsigned char)f.p[k])) {
            fail(c, "namespace \"%s\" has a character outside [A-Za-z0-9._-]", quote(q, sizeof(q), f));
            return -1;
        }
    if (f.n > KVR_NS_NAME_MAX) {
        fail(c, "namespace \"%s\" is %zu bytes, at most %d", quote(q, sizeof(q), f), f.n, KVR_NS_NAME_MAX);
        return -1;
    }
    memcpy(name, f.p, f.n);
    name[f.n] = '\0';
    if ((i = kvr_tenants_find_ns(t, name)) >= 0) {
        if (t->ns[i].line == 0)
            t->ns[i].line = c->line;
        return i;
    }
    if (t->nns >= KVR_NS_MAX) {
        fail(c, "namespace \"%s\" is one too many: at most %d namespaces besides \"default\"", name, KVR_NS_MAX - 1);
        return -1;
    }
    i = (int)t->nns++;
    memcpy(t->ns[i].name, name, f.n + 1);
    t->ns[i].line = c->line;
    return i;
}

/* The token field: its digest. */
static int token_of(ctx_t *c, span_t f, uint8_t d[KVR_SHA256_LEN])
{
    if (f.n >= SHA256_PREFIX_LEN && memcmp(f.p, SHA256_PREFIX, SHA256_PREFIX_LEN) == 0) {
        if (f.n != SHA256_PREFIX_LEN + 2 * KVR_SHA256_LEN)
            return fail(c, "a sha256: token needs exactly %d hex digits after \"sha256:\", found %zu characters",
                        2 * KVR_SHA256_LEN, f.n - SHA256_PREFIX_LEN);
        for (int i = 0; i < KVR_SHA256_LEN; i++) {
            int hi = kvr_hexval((unsigned char)f.p[SHA256_PREFIX_LEN + 2 * i]);
            int lo = kvr_hexval((unsigned char)f.p[SHA256_PREFIX_LEN + 2 * i + 1]);
            if (hi < 0 || lo < 0)
                return fail(c, "a sha256: token has a character that is not a hex digit");
            d[i] = (uint8_t)(hi << 4 | lo);
        }
        return KVR_OK;
    }
    if (f.n > KVR_TENANT_TOKEN_MAX)
        return fail(c, "the token is %zu bytes, at most %d (or give its sha256: form)", f.n, KVR_TENANT_TOKEN_MAX);
    kvr_tenants_digest(f.p, f.n, d);
    return KVR_OK;
}

/* A quota's SIZE (memory= or ssd=, named by key): a size above 0. */
static int size_of(ctx_t *c, const char *key, span_t v, uint64_t *q)
{
    char buf[KVR_TENANTS_LINE_MAX + 1], qb[QUOTE_MAX * 4 + 8];

    memcpy(buf, v.p, v.n);
    buf[v.n] = '\0';
    if (kvr_config_parse_size(buf, q) != KVR_OK)
        return fail(c, "%s=%s is not a size (like 512M, 8G, 1TiB)", key, quote(qb, sizeof(qb), v));
    if (*q == 0)
        return fail(c, "%s=0: a quota is above 0 (leave %s= out for none)", key, key);
    return KVR_OK;
}

/* A quota of this line, agreed with the one an earlier line gave the namespace (*line: where,
 * 0 never). */
static int quota_of(ctx_t *c, const kvr_tenant_ns_t *ns, const char *key, span_t v, uint64_t *quota, uint32_t *line)
{
    uint64_t q;

    if (v.p == NULL)
        return KVR_OK;
    if (size_of(c, key, v, &q) != KVR_OK)
        return KVR_EINVAL;
    if (*line != 0 && *quota != q)
        return fail(c, "namespace \"%s\" has %s= %llu bytes here but %llu bytes on line %u", ns->name, key,
                    (unsigned long long)q, (unsigned long long)*quota, *line);
    if (*line == 0)
        *quota = q, *line = c->line;
    return KVR_OK;
}

/* memory=, ssd= and model= of one line: checked, then agreed with earlier lines of the
 * namespace. */
static int options_of(ctx_t *c, kvr_tenant_ns_t *ns, const span_t *f, size_t nf)
{
    char qb[QUOTE_MAX * 4 + 8];
    span_t mem = {NULL, 0}, ssd = {NULL, 0}, model = {NULL, 0};

    for (size_t i = 0; i < nf; i++) {
        const char *eq = memchr(f[i].p, '=', f[i].n);
        size_t kl = eq ? (size_t)(eq - f[i].p) : 0;
        span_t *slot = NULL;
        if (eq == NULL)
            return fail(c, "field %zu is none of memory=SIZE, ssd=SIZE, model=NAME", i + 3);
        if (kl == 6 && memcmp(f[i].p, "memory", 6) == 0)
            slot = &mem;
        else if (kl == 3 && memcmp(f[i].p, "ssd", 3) == 0)
            slot = &ssd;
        else if (kl == 5 && memcmp(f[i].p, "model", 5) == 0)
            slot = &model;
        else
            return fail(c, "unknown key \"%s=\" (memory=, ssd= and model= are known)",
                        quote(qb, sizeof(qb), (span_t){f[i].p, kl}));
        if (slot->p != NULL)
            return fail(c, "%.*s= is given twice", (int)kl, f[i].p);
        *slot = (span_t){eq + 1, f[i].n - kl - 1};
    }
    if (quota_of(c, ns, "memory", mem, &ns->quota, &ns->quota_line) != KVR_OK ||
        quota_of(c, ns, "ssd", ssd, &ns->ssd_quota, &ns->ssd_line) != KVR_OK)
        return KVR_EINVAL;
    if (model.p != NULL) {
        if (!kvr_model_valid(model.p, model.n))
            return fail(c, "model=%s is not 1 to %d printable bytes without spaces", quote(qb, sizeof(qb), model),
                        KVR_MODEL_MAX);
        if (ns->model_line != 0 && (strlen(ns->model) != model.n || memcmp(ns->model, model.p, model.n) != 0))
            return fail(c, "namespace \"%s\" has model=%s here but model=%s on line %u", ns->name,
                        quote(qb, sizeof(qb), model), ns->model, ns->model_line);
        if (ns->model_line == 0) {
            memcpy(ns->model, model.p, model.n);
            ns->model[model.n] = '\0';
            ns->model_line = c->line;
        }
    }
    return KVR_OK;
}

/* Splits a line into fields, up to a comment. Returns the field count, or -1 after an error. */
static int split(ctx_t *c, const char *p, size_t n, span_t *f, size_t maxf)
{
    size_t i = 0, nf = 0;

    while (i < n) {
        size_t start;
        while (i < n && (p[i] == ' ' || p[i] == '\t'))
            i++;
        if (i == n || p[i] == '#')
            break;
        start = i;
        for (; i < n && p[i] != ' ' && p[i] != '\t'; i++)
            if (!visible((unsigned char)p[i]))
                return fail(c, "byte 0x%02x at column %zu is not visible ASCII (fields are separated by spaces and tabs)",
                            (unsigned char)p[i], i + 1),
                     -1;
        if (nf == maxf)
            return fail(c, "more than %zu fields (NAMESPACE TOKEN [memory=SIZE] [ssd=SIZE] [model=NAME])", maxf), -1;
        f[nf++] = (span_t){p + start, i - start};
    }
    return (int)nf;
}

static int parse_line(ctx_t *c, const char *p, size_t n)
{
    kvr_tenants_t *t = c->t;
    span_t f[5];
    uint8_t d[KVR_SHA256_LEN];
    int nf = split(c, p, n, f, KVR_ARRAY_SIZE(f)), ns;
    char q[QUOTE_MAX * 4 + 8];

    if (nf <= 0)
        return nf < 0 ? KVR_EINVAL : KVR_OK;
    if ((ns = namespace_of(c, f[0])) < 0)
        return KVR_EINVAL;
    if (nf < 2)
        return fail(c, "namespace \"%s\" has no token", quote(q, sizeof(q), f[0]));
    if (token_of(c, f[1], d) != KVR_OK || options_of(c, &t->ns[ns], f + 2, (size_t)nf - 2) != KVR_OK)
        return KVR_EINVAL;
    for (uint32_t i = 0; i < t->ntokens; i++)
        if (memcmp(t->tok[i].digest, d, KVR_SHA256_LEN) == 0)
            return fail(c, "the same token as line %u (each token names one namespace)", t->tok[i].line);
    if (t->ntokens >= KVR_TENANTS_TOKENS)
        return fail(c, "one token too many: at most %d", KVR_TENANTS_TOKENS);
    memcpy(t->tok[t->ntokens].digest, d, KVR_SHA256_LEN);
    t->tok[t->ntokens].ns = (uint16_t)ns;
    t->tok[t->ntokens].line = c->line;
    t->ntokens++;
    return KVR_OK;
}

int kvr_tenants_parse(const char *text, size_t len, kvr_tenants_t *t, char *err, size_t errlen)
{
    ctx_t c = {t, 0, err, errlen};
    size_t pos = 0;

    kvr_tenants_init(t);
    if (errlen > 0)
        err[0] = '\0';
    if (len > KVR_TENANTS_FILE_MAX) {
        c.line = 1;
        for (size_t i = 0; i < KVR_TENANTS_FILE_MAX; i++)
            c.line += text[i] == '\n';
        return fail(&c, "the file is longer than 1 MiB (%u bytes)", KVR_TENANTS_FILE_MAX);
    }
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len, n = end - pos;
        c.line++;
        if (n > 0 && text[end - 1] == '\r')
            n--;
        if (n > KVR_TENANTS_LINE_MAX)
            return fail(&c, "the line is %zu bytes, at most %d", n, KVR_TENANTS_LINE_MAX);
        if (parse_line(&c, text + pos, n) != KVR_OK)
            return KVR_EINVAL;
        pos = end + 1;
    }
    return KVR_OK;
}
