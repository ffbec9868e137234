/* tenants_table.c — see tenants_table.h; the protocol is in docs/concurrency.md, "The tenants
 * table". */
#include "core/tenants_table.h"

#include "base/atomics.h"
#include "base/barrier.h"
#include "base/dassert.h"
#include "shm/segment.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <string.h>

#define REFRESH_TRIES 64 /* copies a refresh attempts while the writer keeps writing */

static kvr_tenants_sh_t *table_of(const kvr_seg_t *seg)
{
    return kvr_seg_at(seg, seg->hdr->off_tenants);
}

static void set_default(kvr_ns_sh_t *slot)
{
    memset(slot->name, 0, sizeof(slot->name));
    memcpy(slot->name, "default", sizeof("default"));
    slot->in_use = 1;
    slot->configured = 1;
}

/* A registry name: 1-32 bytes of [A-Za-z0-9._-], as the parser admits. */
static int valid_name(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > KVR_NS_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return 0;
    }
    return 1;
}

void kvr_tenants_format(kvr_seg_t *seg)
{
    kvr_tenants_sh_t *sh = table_of(seg);

    KVR_DASSERT(seg->slot < 0 || kvr_seg_am_supervisor(seg));
    memset(sh, 0, sizeof(*sh));
    set_default(&sh->ns[KVR_NS_DEFAULT]);
}

void kvr_tenants_attach(kvr_seg_t *seg)
{
    kvr_tenants_sh_t *sh = table_of(seg);
    /* relaxed: before any fork, no other process maps the segment (the file lock keeps the
     * previous run's out) */
    uint64_t g = kvr_atomic_load_relaxed(&sh->generation);

    KVR_DASSERT(seg->slot < 0 || kvr_seg_am_supervisor(seg));
    if (g & 1) /* the last run's supervisor died inside a publication; the next one rewrites it all */
        kvr_atomic_store_relaxed(&sh->generation, g + 1);
    for (int i = 0; i < KVR_NS_MAX; i++) {
        kvr_ns_sh_t *s = &sh->ns[i];
        s->name[KVR_NS_NAME_MAX] = '\0';
        s->model[KVR_MODEL_MAX] = '\0';
        s->configured = 0;
        if (s->in_use && !valid_name(s->name))
            memset(s, 0, sizeof(*s));
        s->in_use = s->in_use ? 1 : 0;
    }
    set_default(&sh->ns[KVR_NS_DEFAULT]);
    if (sh->ntokens > KVR_TENANTS_SH_TOKENS)
        sh->ntokens = 0;
}

/* The registry slot of every namespace of t: an old name keeps its id, a new one takes the
 * lowest free slot. KVR_EINVAL when none is left. */
static int assign_ids(const kvr_tenants_sh_t *sh, const kvr_tenants_t *t, uint16_t *id, char *err, size_t errlen)
{
    uint8_t taken[KVR_NS_MAX];

    for (int j = 0; j < KVR_NS_MAX; j++)
        taken[j] = sh->ns[j].in_use;
    for (uint32_t i = 0; i < t->nns; i++) {
        int found = -1;
        for (int j = 0; j < KVR_NS_MAX && found < 0; j++)
            if (sh->ns[j].in_use && strcmp(sh->ns[j].name, t->ns[i].name) == 0)
                found = j;
        for (int j = 1; j < KVR_NS_MAX && found < 0; j++)
            if (!taken[j])
                found = j;
        if (found < 0) {
            snprintf(err, errlen,
                     "tenants: line %u: namespace \"%s\" is new, but all %d namespace ids are taken (a removed "
                     "namespace keeps its id until the segment is reset)",
                     t->ns[i].line, t->ns[i].name, KVR_NS_MAX - 1);
            return KVR_EINVAL;
        }
        taken[found] = 1;
        id[i] = (uint16_t)found;
    }
    return KVR_OK;
}

/* --token and --admin-token: neither a token of the file nor each other. */
static int check_extra(const kvr_tenants_t *t, const uint8_t *token, const uint8_t *admin, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < t->ntokens; i++) {
        const char *which = token && !memcmp(token, t->tok[i].digest, KVR_SHA256_LEN) ? "--token"
                          : admin && !memcmp(admin, t->tok[i].digest, KVR_SHA256_LEN) ? "--admin-token"
                                                                                      : NULL;
        if (which != NULL) {
            snprintf(err, errlen, "tenants: line %u: the same token as %s", t->tok[i].line, which);
            return KVR_EINVAL;
        }
    }
    if (token && admin && !memcmp(token, admin, KVR_SHA256_LEN)) {
        snprintf(err, errlen, "tenants: --admin-token is the same token as --token");
        return KVR_EINVAL;
    }
    return KVR_OK;
}

/* The registry and the token table, written inside the seqlock (plain stores: the readers'
 * copies are validated by the generation around them). */
static void write_table(kvr_tenants_sh_t *sh, const kvr_tenants_t *t, const uint16_t *id, const uint8_t *token,
                        const uint8_t *admin)
{
    uint32_t n = 0;

    for (int j = 1; j < KVR_NS_MAX; j++)
        sh->ns[j].configured = 0;
    sh->ns[KVR_NS_DEFAULT].quota = sh->ns[KVR_NS_DEFAULT].ssd_quota = 0;
    sh->ns[KVR_NS_DEFAULT].model[0] = '\0';
    for (uint32_t i = 0; i < t->nns; i++) {
        kvr_ns_sh_t *s = &sh->ns[id[i]];
        if (!s->in_use) {
            memset(s->name, 0, sizeof(s->name));
            memcpy(s->name, t->ns[i].name, strlen(t->ns[i].name));
            s->in_use = 1;
        }
        s->configured = 1;
        s->quota = t->ns[i].quota;
        s->ssd_quota = t->ns[i].ssd_quota;
        memset(s->model, 0, sizeof(s->model));
        memcpy(s->model, t->ns[i].model, strlen(t->ns[i].model));
    }
    for (int j = 0; j < KVR_NS_MAX; j++)
        if (sh->ns[j].in_use && !sh->ns[j].configured) {
            sh->ns[j].quota = sh->ns[j].ssd_quota = 0; /* removed: its name and id stay, nothing else */
            sh->ns[j].model[0] = '\0';
        }
    for (uint32_t i = 0; i < t->ntokens; i++, n++) {
        memcpy(sh->tok[n].digest, t->tok[i].digest, KVR_SHA256_LEN);
        sh->tok[n].ns = id[t->tok[i].ns];
        sh->tok[n].flags = 0;
    }
    if (token != NULL) {
        memcpy(sh->tok[n].digest, token, KVR_SHA256_LEN);
        sh->tok[n].ns = KVR_NS_DEFAULT;
        sh->tok[n++].flags = 0;
    }
    /* relaxed: inside the seqlock, as the rest (the readers load them relaxed too) */
    kvr_atomic_store_relaxed(&sh->ntokens, n);
    kvr_atomic_store_relaxed(&sh->has_admin, admin != NULL ? 1u : 0u);
    memset(sh->admin, 0, sizeof(sh->admin));
    if (admin != NULL)
        memcpy(sh->admin, admin, KVR_SHA256_LEN);
}

int kvr_tenants_publish(kvr_seg_t *seg, const kvr_tenants_t *t, const uint8_t *token_digest,
                        const uint8_t *admin_digest, uint64_t *gen, char *err, size_t errlen)
{
    kvr_tenants_sh_t *sh = table_of(seg);
    uint16_t id[KVR_NS_MAX];
    uint64_t g;

    /* single writer: the supervisor (or the process that formats, before it claims a slot) */
    KVR_DASSERT(seg->slot < 0 || kvr_seg_am_supervisor(seg));
    if (assign_ids(sh, t, id, err, errlen) != KVR_OK || check_extra(t, token_digest, admin_digest, err, errlen) != KVR_OK)
        return KVR_EINVAL;
    g = kvr_atomic_load_relaxed(&sh->generation); /* our own last store: nobody else writes it */
    /* Odd: a reader that loads it retries; relaxed, ordered before the table's stores by the
     * release fence below. */
    kvr_atomic_store_relaxed(&sh->generation, g + 1);
    /* Release fence: the odd value is ordered before every store of the table, so a reader
     * whose copy saw any of them (its acquire fence after the copy) re-reads a changed
     * generation. */
    kvr_atomic_fence_release();
    write_table(sh, t, id, token_digest, admin_digest);
    /* Release: pairs with the readers' acquire load; a reader that sees g + 2 sees the table. */
    kvr_atomic_store_release(&sh->generation, g + 2);
    *gen = (g + 2) / 2;
    return KVR_OK;
}

/* ------------------------------------------------------------------ readers */

/* One attempt at copying the table into c. 1 done, 0 unchanged since have, -1 try again. */
static int copy_once(const kvr_tenants_sh_t *sh, kvr_tenants_copy_t *c, uint64_t have, int valid)
{
    /* Acquire: pairs with the writer's release store of the even value; the table it wrote
     * before it is visible to the copy below. */
    uint64_t g1 = kvr_atomic_load_acquire(&sh->generation), g2;
    uint32_t n, admin;
    int ok = 1;

    if (valid && g1 == have)
        return 0;
    if (g1 & 1)
        return -1;
    /* Relaxed: validated by the generation re-check below, as the rest of the copy. */
    n = kvr_atomic_load_relaxed(&sh->ntokens);
    admin = kvr_atomic_load_relaxed(&sh->has_admin);
    if (n > KVR_TENANTS_SH_TOKENS)
        return -1;
    memcpy(c->tok, sh->tok, n * sizeof(kvr_tok_sh_t));
    memcpy(c->ns, sh->ns, sizeof(c->ns));
    memset(&c->tok[n], 0, sizeof(c->tok[n]));
    memcpy(c->tok[n].digest, sh->admin, KVR_SHA256_LEN);
    /* Acquire fence: orders the copy before the re-check (an acquire load would order only
     * what follows it); pairs with the writer's release fence after its odd store. */
    kvr_atomic_fence_acquire();
    g2 = kvr_atomic_load_relaxed(&sh->generation); /* relaxed: ordered by the fence above */
    if (g1 != g2)
        return -1;
    for (uint32_t i = 0; i < n; i++)
        ok &= c->tok[i].ns < KVR_NS_MAX;
    if (!ok)
        return -1;
    for (int j = 0; j < KVR_NS_MAX; j++) {
        c->ns[j].name[KVR_NS_NAME_MAX] = '\0';
        c->ns[j].model[KVR_MODEL_MAX] = '\0';
    }
    c->tok[n].ns = KVR_NS_DEFAULT;
    c->tok[n].flags = KVR_TOK_ADMIN;
    c->nuser = n;
    c->ntok = n + (admin ? 1 : 0);
    c->seq = g1;
    return 1;
}

int kvr_tenants_view_refresh(kvr_tenants_view_t *v)
{
    kvr_tenants_copy_t *next = &v->buf[v->cur ^ 1];
    uint64_t have = v->buf[v->cur].seq;

    for (int i = 0; i < REFRESH_TRIES; i++) {
        int rc = copy_once(v->sh, next, have, v->valid);
        if (rc == 0)
            return 0;
        if (rc == 1) {
            v->cur ^= 1;
            v->valid = 1;
            return 1;
        }
        kvr_cpu_relax();
    }
    v->stale++;
    return -1;
}

void kvr_tenants_view_init(kvr_tenants_view_t *v, const kvr_seg_t *seg)
{
    memset(v, 0, sizeof(*v));
    v->sh = table_of(seg);
    kvr_tenants_view_refresh(v);
}

uint64_t kvr_tenants_view_generation(const kvr_tenants_view_t *v)
{
    return v->valid ? v->buf[v->cur].seq : 0;
}

int kvr_tenants_auth(kvr_tenants_view_t *v, const char *bearer, size_t n, uint16_t *ns, int *admin)
{
    const kvr_tenants_copy_t *c;
    uint8_t d[KVR_SHA256_LEN];
    uint32_t found = 0, id = 0, flags = 0;

    kvr_tenants_view_refresh(v);
    c = &v->buf[v->cur];
    kvr_tenants_digest(bearer, n, d);
    /* Every entry, no early exit; the match (digests are unique) is selected by a mask. */
    for (uint32_t i = 0; i < c->ntok; i++) {
        uint32_t eq = (uint32_t)(CRYPTO_memcmp(d, c->tok[i].digest, KVR_SHA256_LEN) == 0);
        uint32_t m = 0u - eq;
        found |= eq;
        id |= c->tok[i].ns & m;
        flags |= c->tok[i].flags & m;
    }
    found &= (uint32_t)v->valid;
    *ns = (uint16_t)(id & (0u - found));
    *admin = (int)((flags & (0u - found) & KVR_TOK_ADMIN) != 0);
    return (int)found;
}

int kvr_tenants_open_access(const kvr_tenants_view_t *v)
{
    return v->valid && v->buf[v->cur].nuser == 0;
}

static const kvr_ns_sh_t *slot_of(const kvr_tenants_view_t *v, uint16_t ns)
{
    if (!v->valid || ns >= KVR_NS_MAX || !v->buf[v->cur].ns[ns].in_use)
        return NULL;
    return &v->buf[v->cur].ns[ns];
}

const char *kvr_tenants_ns_name(const kvr_tenants_view_t *v, uint16_t ns)
{
    const kvr_ns_sh_t *s = slot_of(v, ns);
    return s ? s->name : NULL;
}

int kvr_tenants_ns_configured(const kvr_tenants_view_t *v, uint16_t ns)
{
    const kvr_ns_sh_t *s = slot_of(v, ns);
    return s != NULL && s->configured;
}

uint64_t kvr_tenants_ns_quota(const kvr_tenants_view_t *v, uint16_t ns)
{
    const kvr_ns_sh_t *s = slot_of(v, ns);
    return s ? s->quota : 0;
}

uint64_t kvr_tenants_ns_ssd_quota(const kvr_tenants_view_t *v, uint16_t ns)
{
    const kvr_ns_sh_t *s = slot_of(v, ns);
    return s ? s->ssd_quota : 0;
}

const char *kvr_tenants_ns_model(const kvr_tenants_view_t *v, uint16_t ns)
{
    const kvr_ns_sh_t *s = slot_of(v, ns);
    return s && s->model[0] ? s->model : NULL;
}

int kvr_tenants_ns_find(const kvr_tenants_view_t *v, const char *name)
{
    for (uint16_t j = 0; j < KVR_NS_MAX; j++) {
        const kvr_ns_sh_t *s = slot_of(v, j);
        if (s != NULL && strcmp(s->name, name) == 0)
            return j;
    }
    return -1;
}
