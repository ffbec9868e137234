/*
 * tenants_table.h — the tenants table in the shared segment (shm/tenants_sh.h): the
 * supervisor publishes it, every worker (and the publisher) authenticates against a private
 * copy of it.
 *
 * Writer (the supervisor only): kvr_tenants_format at the creation of a segment,
 * kvr_tenants_attach at a warm re-attach, kvr_tenants_publish at start and at every reload.
 * Publication gives each namespace of the parsed table its id in the registry (an old name
 * keeps its id, a new one takes a free slot, a name no longer listed keeps its slot marked not
 * configured) and writes the token table inside a seqlock.
 *
 * Readers: a kvr_tenants_view_t, one per process, holds a copy of the table. Every
 * kvr_tenants_auth first refreshes it (kvr_tenants_view_refresh: one acquire load while the
 * table is unchanged; a whole copy when it moved). A copy the writer keeps interrupting is
 * given up after a few tries and the old one stays until the next call.
 *
 * Cost: kvr_tenants_auth hashes the presented token (SHA-256) and compares the digest with
 * every entry in constant time (up to 1026 comparisons of 32 bytes with a full table): with
 * many tokens that is of the order of a whole 16 KiB GET. A worker therefore keeps its last
 * answers, keyed by the presented bytes and the view's generation (io/api_auth.c).
 */
#ifndef KVR_CORE_TENANTS_TABLE_H
#define KVR_CORE_TENANTS_TABLE_H

#include "common.h"
#include "core/tenants.h"
#include "shm/tenants_sh.h"

/* ------------------------------------------------------------------ writer: the supervisor */

/* A new segment: the registry holds "default" (id 0) only, no token (open access). */
void kvr_tenants_format(kvr_seg_t *seg);

/* A re-attached segment: the registry is kept (ids survive the restart) and repaired: names
 * and models terminated, slots whose name is not a valid name freed, "default" in slot 0,
 * nothing configured until the next publication. Before any fork. */
void kvr_tenants_attach(kvr_seg_t *seg);

/*
 * Publishes t, plus the digest of --token (namespace "default"; NULL: none) and of
 * --admin-token (NULL: none). Returns KVR_OK and the table's generation (tables published on
 * this segment) in *gen, or KVR_EINVAL with the reason in err ("tenants: line N: ...") and
 * nothing changed: a new namespace when every slot is taken, or --token / --admin-token equal
 * to a token of the file or to each other.
 */
int kvr_tenants_publish(kvr_seg_t *seg, const kvr_tenants_t *t, const uint8_t *token_digest,
                        const uint8_t *admin_digest, uint64_t *gen, char *err, size_t errlen);

/* ------------------------------------------------------------------ readers: workers, publisher */

/* A private copy of the shared table. */
typedef struct {
    uint64_t seq;  /* the seqlock value it was copied at (even) */
    uint32_t ntok; /* entries of tok[], the admin token's included */
    uint32_t nuser;
    kvr_tok_sh_t tok[KVR_TENANTS_SH_TOKENS + 1]; /* the file's, --token's, then --admin-token's */
    kvr_ns_sh_t ns[KVR_NS_MAX];
} kvr_tenants_copy_t;

typedef struct {
    const kvr_tenants_sh_t *sh;
    int cur;                   /* buf[cur] is the copy in force; the other one is for the next */
    int valid;                 /* a copy was ever made: until then every token is refused */
    uint64_t stale;            /* refreshes that kept the old copy (the writer kept writing) */
    kvr_tenants_copy_t buf[2]; /* about 100 KiB: keep the view in static or heap memory */
} kvr_tenants_view_t;

/* Binds v to seg's table and makes the first copy. */
void kvr_tenants_view_init(kvr_tenants_view_t *v, const kvr_seg_t *seg);

/* Re-copies the table if it changed: 1 copied, 0 unchanged, -1 changing (old copy kept). */
int kvr_tenants_view_refresh(kvr_tenants_view_t *v);

/* The seqlock value of the copy in force (even; it moves with every publication). */
uint64_t kvr_tenants_view_generation(const kvr_tenants_view_t *v);

/*
 * 1 if bearer (n bytes, without "Bearer ") is a known token: *ns its namespace id, *admin 1
 * for the admin token (namespace "default"). 0 if not (then *ns = 0, *admin = 0). Refreshes
 * the view first. Constant time in the token's position: every entry is compared.
 */
int kvr_tenants_auth(kvr_tenants_view_t *v, const char *bearer, size_t n, uint16_t *ns, int *admin);

/* 1 when the table has no token but, perhaps, the admin one (no --token, no --tenants): every
 * request is served in "default" without a token, as before tenants existed. */
int kvr_tenants_open_access(const kvr_tenants_view_t *v);

/* The namespace id's name, or NULL for an id never used. */
const char *kvr_tenants_ns_name(const kvr_tenants_view_t *v, uint16_t ns);
/* 1 if the table in force lists it ("default" always). */
int kvr_tenants_ns_configured(const kvr_tenants_view_t *v, uint16_t ns);
/* memory= in bytes; 0: none. */
uint64_t kvr_tenants_ns_quota(const kvr_tenants_view_t *v, uint16_t ns);
/* ssd= in bytes; 0: none. */
uint64_t kvr_tenants_ns_ssd_quota(const kvr_tenants_view_t *v, uint16_t ns);
/* model=, or NULL: none. */
const char *kvr_tenants_ns_model(const kvr_tenants_view_t *v, uint16_t ns);
/* The id of name, or -1. */
int kvr_tenants_ns_find(const kvr_tenants_view_t *v, const char *name);

#endif
