/* tenants_file.c — see tenants_file.h. */
#include "core/tenants_file.h"

#include "base/log.h"
#include "core/tenants_table.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads path into a heap buffer: at most KVR_TENANTS_FILE_MAX + 1 bytes, so that the parser
 * sees a file too large as one. Returns the buffer (caller frees) or NULL with err set. */
static char *read_file(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    char *buf;
    size_t n = 0, got;

    if (f == NULL) {
        snprintf(err, errlen, "tenants: cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    buf = malloc(KVR_TENANTS_FILE_MAX + 1);
    if (buf == NULL) {
        fclose(f);
        snprintf(err, errlen, "tenants: out of memory reading %s", path);
        return NULL;
    }
    while (n < KVR_TENANTS_FILE_MAX + 1 && (got = fread(buf + n, 1, KVR_TENANTS_FILE_MAX + 1 - n, f)) > 0)
        n += got;
    if (ferror(f)) {
        snprintf(err, errlen, "tenants: cannot read %s: %s", path, strerror(errno));
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* Stats the file (for the change poll), then reads and parses it into *t. */
static int load(kvr_tenants_src_t *s, kvr_tenants_t *t, char *err, size_t errlen)
{
    size_t len = 0;
    char *text;
    int rc;

    /* stat before the read: a change made during the read moves the stat again */
    s->seen_ok = stat(s->path, &s->seen) == 0;
    if ((text = read_file(s->path, &len, err, errlen)) == NULL)
        return KVR_EINVAL;
    rc = kvr_tenants_parse(text, len, t, err, errlen);
    free(text);
    return rc;
}

int kvr_tenants_src_init(kvr_tenants_src_t *s, const kvr_config_t *cfg, char *err, size_t errlen)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->path, sizeof(s->path), "%s", cfg->tenants);
    if ((s->table = malloc(sizeof(*s->table))) == NULL) {
        snprintf(err, errlen, "tenants: out of memory");
        return KVR_EINVAL;
    }
    if (cfg->token[0] != '\0') {
        s->has_token = 1;
        kvr_tenants_digest(cfg->token, strlen(cfg->token), s->token);
    }
    if (cfg->admin_token[0] != '\0') {
        s->has_admin = 1;
        kvr_tenants_digest(cfg->admin_token, strlen(cfg->admin_token), s->admin);
    }
    if (s->path[0] == '\0') {
        kvr_tenants_init(s->table);
        return KVR_OK;
    }
    return load(s, s->table, err, errlen);
}

static int publish(kvr_tenants_src_t *s, kvr_seg_t *seg, const kvr_tenants_t *t, uint64_t *gen, char *err,
                   size_t errlen)
{
    return kvr_tenants_publish(seg, t, s->has_token ? s->token : NULL, s->has_admin ? s->admin : NULL, gen, err,
                               errlen);
}

int kvr_tenants_src_publish(kvr_tenants_src_t *s, kvr_seg_t *seg, char *err, size_t errlen)
{
    uint64_t gen;

    if (publish(s, seg, s->table, &gen, err, errlen) != KVR_OK)
        return KVR_EINVAL;
    kvr_info("tenants: %u tokens, %u namespaces (generation %llu)%s%s%s", s->table->ntokens + (unsigned)s->has_token,
             s->table->nns, (unsigned long long)gen, s->path[0] ? " from " : "", s->path,
             s->has_admin ? ", admin token set" : "");
    return KVR_OK;
}

/* "tenants: line 3: x" -> "line 3: x": the refusal's own prefix says tenants already. */
static const char *unprefixed(const char *err)
{
    return strncmp(err, "tenants: ", 9) == 0 ? err + 9 : err;
}

void kvr_tenants_src_reload(kvr_tenants_src_t *s, kvr_seg_t *seg, const char *why)
{
    kvr_tenants_t *t;
    char err[512];
    uint64_t gen;

    if (s->path[0] == '\0') {
        kvr_info("%s: nothing to reload (no --tenants)", why);
        return;
    }
    kvr_info("tenants: %s: reading %s", why, s->path);
    if ((t = malloc(sizeof(*t))) == NULL) {
        kvr_error("tenants: reload refused: out of memory; the previous table stays in force");
        return;
    }
    if (load(s, t, err, sizeof(err)) != KVR_OK || publish(s, seg, t, &gen, err, sizeof(err)) != KVR_OK) {
        kvr_error("tenants: reload refused: %s; the previous table stays in force", unprefixed(err));
        free(t);
        return;
    }
    free(s->table);
    s->table = t;
    kvr_info("tenants: reloaded: %u tokens, %u namespaces (generation %llu)", t->ntokens + (unsigned)s->has_token,
             t->nns, (unsigned long long)gen);
}

static int same_stat(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

int kvr_tenants_src_poll(kvr_tenants_src_t *s, kvr_seg_t *seg, uint64_t now_ms)
{
    struct stat st;
    int ok;

    if (s->path[0] == '\0' || now_ms < s->next_poll_ms)
        return 0;
    s->next_poll_ms = now_ms + KVR_TENANTS_POLL_MS;
    ok = stat(s->path, &st) == 0;
    if (!ok) {
        if (s->seen_ok)
            kvr_warn("tenants: %s: %s; the table in force stays until it is back", s->path, strerror(errno));
        s->seen_ok = 0;
        return 0;
    }
    if (s->seen_ok && same_stat(&st, &s->seen))
        return 0;
    kvr_tenants_src_reload(s, seg, "the file changed");
    return 1;
}

void kvr_tenants_src_free(kvr_tenants_src_t *s)
{
    free(s->table);
    s->table = NULL;
}
