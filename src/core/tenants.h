/*
 * tenants.h — the tenants file's parser (--tenants): text in, table out. Pure: no I/O, no
 * shared memory; the caller reads the file and publishes the table (core/tenants_table.h).
 *
 * One entry per line, fields separated by spaces or tabs:
 *
 *     NAMESPACE TOKEN [memory=SIZE] [ssd=SIZE] [model=NAME]
 *
 * `#` at the start of a field starts a comment that runs to the end of the line (a `#` inside
 * a token is part of it); blank lines are ignored; a CR before the newline is dropped.
 * NAMESPACE is 1-32 bytes of [A-Za-z0-9._-]. TOKEN is the literal bearer token (1-256 bytes of
 * visible ASCII, not starting with "sha256:") or "sha256:" and the 64 hex digits of its SHA-256.
 * SIZE is read by the configuration's size parser (kvr_config_parse_size), above 0. NAME is
 * 1-128 bytes of visible ASCII. memory= caps the namespace's bytes in RAM, ssd= on the disk
 * tier. One namespace may have several tokens (rotation); memory=, ssd= and model= given for it
 * on several lines must agree.
 *
 * Limits: the file at most 1 MiB, a line at most 1024 bytes, at most 1024 tokens, at most
 * KVR_NS_MAX - 1 namespaces besides "default"; the same token twice (equal digests) is refused.
 * Every error names its line: `tenants: line 7: namespace "a|b" has a character outside
 * [A-Za-z0-9._-]`.
 */
#ifndef KVR_CORE_TENANTS_H
#define KVR_CORE_TENANTS_H

#include "common.h"
#include "shm/tenants_sh.h"

#define KVR_TENANTS_FILE_MAX (1u << 20) /* bytes */
#define KVR_TENANTS_LINE_MAX 1024       /* bytes, without the newline */

/* A namespace of a parsed table. ns[0] is always "default", whether the file names it or not. */
typedef struct {
    char name[KVR_NS_NAME_MAX + 1];
    char model[KVR_MODEL_MAX + 1];   /* "" none */
    uint64_t quota;                  /* memory=: bytes; 0 none */
    uint64_t ssd_quota;              /* ssd=: bytes; 0 none */
    uint32_t line;                   /* first line naming it (0: "default", not in the file) */
    uint32_t quota_line, model_line; /* where memory= / model= was first given (0: never) */
    uint32_t ssd_line;               /* where ssd= was */
} kvr_tenant_ns_t;

typedef struct {
    uint8_t digest[KVR_SHA256_LEN];
    uint16_t ns; /* index into kvr_tenants_t.ns (not yet a segment id) */
    uint32_t line;
} kvr_tenant_tok_t;

typedef struct {
    uint32_t ntokens;
    uint32_t nns; /* >= 1: ns[0] is "default" */
    kvr_tenant_tok_t tok[KVR_TENANTS_TOKENS];
    kvr_tenant_ns_t ns[KVR_NS_MAX];
} kvr_tenants_t;

/* A table with only "default" and no token. */
void kvr_tenants_init(kvr_tenants_t *t);

/*
 * Parses len bytes of text into *t (initialised here). Returns KVR_OK, or KVR_EINVAL with the
 * error ("tenants: line N: ...") in err.
 */
int kvr_tenants_parse(const char *text, size_t len, kvr_tenants_t *t, char *err, size_t errlen);

/* SHA-256 of n bytes. */
void kvr_tenants_digest(const void *p, size_t n, uint8_t out[KVR_SHA256_LEN]);

/* The namespace index of name in t, or -1. */
int kvr_tenants_find_ns(const kvr_tenants_t *t, const char *name);

#endif
