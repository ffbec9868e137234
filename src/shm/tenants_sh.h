/*
 * tenants_sh.h — the tenants table in the shared segment (at hdr->off_tenants): the namespace
 * registry and the token table the workers authenticate against.
 *
 * One writer, the supervisor (core/tenants_table.c, kvr_tenants_publish), at start and at every
 * reload of --tenants; readers are the workers and the publisher, who copy the whole table into
 * private memory when `generation` moved (kvr_tenants_view_refresh). `generation` is a seqlock:
 * odd while the supervisor writes, even when the table is whole (docs/concurrency.md, "The
 * tenants table").
 *
 * The registry keeps a namespace's id for the life of the segment: a name once given a slot
 * keeps it across reloads and warm restarts (`in_use` stays set); a name the current table no
 * longer lists is only marked not `configured`. Slot 0 is always "default".
 *
 * Tokens are stored only as SHA-256 digests. tok[] holds the tokens of --tenants and the one of
 * --token/--token-file (namespace "default"); the --admin-token digest is kept apart.
 */
#ifndef KVR_SHM_TENANTS_SH_H
#define KVR_SHM_TENANTS_SH_H

#include "common.h"

#define KVR_NS_NAME_MAX       32                       /* bytes of a namespace name */
#define KVR_TENANT_TOKEN_MAX  256                      /* bytes of a literal token in the tenants file */
#define KVR_TENANTS_TOKENS    1024                     /* tokens a tenants file may hold */
#define KVR_TENANTS_SH_TOKENS (KVR_TENANTS_TOKENS + 1) /* ... and the one of --token */
#define KVR_SHA256_LEN        32

#define KVR_TOK_ADMIN 1u /* flags: the token is the admin token */

/* One namespace slot; its index is the namespace id. */
typedef struct {
    char name[KVR_NS_NAME_MAX + 1]; /* NUL-terminated; "" for a slot never used */
    uint8_t in_use;                 /* the slot holds a name: kept for the segment's life */
    uint8_t configured;             /* the current table names it */
    uint8_t pad0_[5];
    uint64_t quota;                /* memory= in bytes; 0: none */
    char model[KVR_MODEL_MAX + 1]; /* model=; "" none */
    uint8_t pad_[7];
    uint64_t ssd_quota; /* ssd= in bytes; 0: none */
} kvr_ns_sh_t;
static_assert(sizeof(kvr_ns_sh_t) == 192, "namespace slot layout");

typedef struct {
    uint8_t digest[KVR_SHA256_LEN]; /* SHA-256 of the bearer token */
    uint16_t ns;                    /* namespace id (a slot of ns[]) */
    uint16_t flags;                 /* KVR_TOK_* */
    uint32_t pad_;
} kvr_tok_sh_t;
static_assert(sizeof(kvr_tok_sh_t) == 40, "token entry layout");

typedef struct {
    uint64_t generation; /* seqlock: odd while the supervisor writes; + 2 per publication */
    uint32_t ntokens;    /* entries of tok[] in use */
    uint32_t has_admin;  /* admin[] holds the --admin-token digest */
    uint8_t admin[KVR_SHA256_LEN];
    uint8_t pad_[16];
    kvr_ns_sh_t ns[KVR_NS_MAX];
    kvr_tok_sh_t tok[KVR_TENANTS_SH_TOKENS];
} kvr_tenants_sh_t;
static_assert(sizeof(kvr_tenants_sh_t) % 8 == 0, "tenants table layout");
static_assert(KVR_NS_MAX <= 65535, "namespace ids are 16 bits");

#endif
