/*
 * api_auth.c — who is asking: the bearer token decides the request's namespace and whether it
 * may see the admin surfaces (docs/tenancy.md).
 *
 * The table is the supervisor's (core/tenants_table.h); this worker reads it through its view,
 * refreshed with one acquire load per request while the table is unchanged. Hashing a token
 * and comparing the digest with every entry costs about as much as a small GET, so the worker
 * keeps its last answers in a small direct-mapped cache: the slot is chosen by a hash of the
 * presented bytes (the caller's own input), and the cached token is compared in constant time
 * over its whole buffer, so a hit or miss says nothing about another caller's token. An entry
 * is good for the generation of the table it was answered under.
 */
#include "io/api_int.h"

#include "core/tenants_table.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <xxhash.h>

/* Answers kept per worker, direct-mapped by the token's XXH3: a power of two. An answer not
 * kept costs a SHA-256 and a constant-time scan of the token table, about 22 us with 1,024
 * tokens (bench/bench_auth.c), against about 0.25 us for one kept; 256 entries (69 KiB) keep a
 * fleet's worth of tokens. */
#define AUTH_CACHE 256

struct kvr_api_auth_s {
    kvr_tenants_view_t view;
    int tenants; /* --tenants is set: the admin surfaces need the admin token */
    struct {
        uint64_t gen; /* the view's generation it was answered under; 0: empty */
        uint16_t len, ns;
        uint8_t admin;
        char tok[KVR_TENANT_TOKEN_MAX];
    } c[AUTH_CACHE];
    /* each namespace's default-model pool, as resolved under the view's generation + 1 (0: not
     * yet): a PUT without X-KV-Model skips the pool table's search (io/api.c, put_pool) */
    struct {
        uint64_t gen;
        uint32_t pool;
    } dpool[KVR_NS_MAX];
};

int kvr_api_auth_init(kvr_api_t *a)
{
    a->auth = calloc(1, sizeof(*a->auth));
    if (a->auth == NULL)
        return KVR_ERR;
    kvr_tenants_view_init(&a->auth->view, a->seg);
    a->auth->tenants = a->cfg->tenants[0] != '\0';
    return KVR_OK;
}

/* The presented token in the cache: 1 with *ns and *admin set, 0 when not there. */
static int cache_get(struct kvr_api_auth_s *au, uint64_t gen, const char *tok, size_t n, uint16_t *ns, int *admin)
{
    char pad[KVR_TENANT_TOKEN_MAX];
    unsigned k = (unsigned)XXH3_64bits(tok, n) & (AUTH_CACHE - 1);

    if (n > sizeof(pad) || au->c[k].gen != gen || au->c[k].len != n)
        return 0;
    memset(pad, 0, sizeof(pad));
    memcpy(pad, tok, n);
    if (CRYPTO_memcmp(pad, au->c[k].tok, sizeof(pad)) != 0)
        return 0;
    *ns = au->c[k].ns;
    *admin = au->c[k].admin;
    return 1;
}

static void cache_put(struct kvr_api_auth_s *au, uint64_t gen, const char *tok, size_t n, uint16_t ns, int admin)
{
    unsigned k = (unsigned)XXH3_64bits(tok, n) & (AUTH_CACHE - 1);

    if (n > sizeof(au->c[k].tok))
        return; /* not cached: such a token pays the hash every time */
    memset(au->c[k].tok, 0, sizeof(au->c[k].tok));
    memcpy(au->c[k].tok, tok, n);
    au->c[k].len = (uint16_t)n;
    au->c[k].ns = ns;
    au->c[k].admin = (uint8_t)admin;
    au->c[k].gen = gen;
}

int kvr_api_authorize(kvr_api_t *a, const kvr_api_req_t *rq, kvr_api_res_t *res)
{
    struct kvr_api_auth_s *au = a->auth;
    const char *tok;
    uint16_t ns = KVR_NS_DEFAULT;
    int admin = 0, ok;
    uint64_t gen;
    size_t n;

    res->ns = KVR_NS_DEFAULT;
    res->admin = 0;
    (void)kvr_tenants_view_refresh(&au->view);
    /* No token configured and no --tenants: everyone, as before tenants existed. A tenants
     * file without a token (an empty Secret) opens nothing. */
    if (!au->tenants && kvr_tenants_open_access(&au->view)) {
        res->admin = 1;
        return 1;
    }
    if (rq->auth == NULL || rq->auth_len < 7 || strncasecmp(rq->auth, "Bearer ", 7) != 0)
        return 0;
    tok = rq->auth + 7;
    n = rq->auth_len - 7;
    gen = kvr_tenants_view_generation(&au->view) + 1; /* + 1: an even generation 0 is never "empty" */
    ok = cache_get(au, gen, tok, n, &ns, &admin);
    if (!ok) {
        ok = kvr_tenants_auth(&au->view, tok, n, &ns, &admin);
        /* kvr_tenants_auth refreshes the view: an answer of a newer table is not filed under
         * the older generation's name */
        if (ok && gen == kvr_tenants_view_generation(&au->view) + 1)
            cache_put(au, gen, tok, n, ns, admin);
    }
    if (!ok)
        return 0;
    res->ns = ns;
    res->admin = (uint8_t)(admin || !au->tenants); /* without --tenants the token holder is the operator */
    return 1;
}

const char *kvr_api_ns_name(kvr_api_t *a, uint16_t ns)
{
    return kvr_tenants_ns_name(&a->auth->view, ns);
}

int kvr_api_default_pool(kvr_api_t *a, uint16_t ns)
{
    struct kvr_api_auth_s *au = a->auth;

    return au->dpool[ns].gen == kvr_tenants_view_generation(&au->view) + 1 ? (int)au->dpool[ns].pool : -1;
}

void kvr_api_default_pool_set(kvr_api_t *a, uint16_t ns, uint32_t pool)
{
    struct kvr_api_auth_s *au = a->auth;

    au->dpool[ns].gen = kvr_tenants_view_generation(&au->view) + 1;
    au->dpool[ns].pool = pool;
}

int kvr_api_request_model(kvr_api_t *a, const kvr_api_req_t *rq, uint16_t ns, const char **m, size_t *mlen)
{
    int pool;

    *m = rq->model;
    *mlen = rq->model_len;
    if (*m != NULL)
        return -1;
    if ((pool = kvr_api_default_pool(a, ns)) >= 0)
        return pool;
    if ((*m = kvr_api_ns_model(a, ns)) == NULL)
        *m = a->cfg->model;
    *mlen = strlen(*m);
    return -1;
}

const char *kvr_api_ns_model(kvr_api_t *a, uint16_t ns)
{
    return kvr_tenants_ns_model(&a->auth->view, ns);
}

uint64_t kvr_api_ns_quota(kvr_api_t *a, uint16_t ns)
{
    return kvr_tenants_ns_quota(&a->auth->view, ns);
}

int kvr_api_tenants_on(const kvr_api_t *a)
{
    return a->auth->tenants;
}

int kvr_api_ns_listed(kvr_api_t *a, uint16_t ns)
{
    return kvr_tenants_ns_configured(&a->auth->view, ns);
}
