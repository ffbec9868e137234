/*
 * tenants_file.h — the supervisor's side of --tenants: reads and parses the file, publishes it
 * with the --token and --admin-token digests (core/tenants_table.h), and reloads it on SIGHUP
 * and when the file changes.
 *
 * Changes are found by stat(2) of the path every 500 ms (device, inode, size, modification
 * time). stat follows symlinks, so a Kubernetes Secret update, which swaps a symlink to a new
 * directory, is seen too. A reload that fails (unreadable, malformed, no namespace id left)
 * is logged and the table in force stays.
 */
#ifndef KVR_CORE_TENANTS_FILE_H
#define KVR_CORE_TENANTS_FILE_H

#include "core/config.h"
#include "core/tenants.h"

#include <sys/stat.h>

#define KVR_TENANTS_POLL_MS 500

typedef struct {
    char path[KVR_CFG_STR_MAX]; /* "" without --tenants */
    int has_token, has_admin;
    uint8_t token[KVR_SHA256_LEN]; /* --token / --token-file: namespace "default" */
    uint8_t admin[KVR_SHA256_LEN]; /* --admin-token */
    kvr_tenants_t *table;          /* the file as last parsed (heap) */
    struct stat seen;              /* the file's stat when it was last read */
    int seen_ok;                   /* seen is valid (0: stat failed at the last poll) */
    uint64_t next_poll_ms;
} kvr_tenants_src_t;

/* Reads and parses the file of cfg (if any) and hashes the tokens. Returns KVR_OK, or KVR_EINVAL
 * with the reason in err ("tenants: line N: ..."). Before the segment exists. */
int kvr_tenants_src_init(kvr_tenants_src_t *s, const kvr_config_t *cfg, char *err, size_t errlen);

/* Publishes the parsed table into seg (the first publication of the run). KVR_OK or KVR_EINVAL. */
int kvr_tenants_src_publish(kvr_tenants_src_t *s, kvr_seg_t *seg, char *err, size_t errlen);

/* Reads the file again and publishes it, or logs why not; `why` names the cause in the log. */
void kvr_tenants_src_reload(kvr_tenants_src_t *s, kvr_seg_t *seg, const char *why);

/* Every KVR_TENANTS_POLL_MS: reloads when the file's stat changed. 1 when it tried (the
 * table may have changed), else 0. */
int kvr_tenants_src_poll(kvr_tenants_src_t *s, kvr_seg_t *seg, uint64_t now_ms);

void kvr_tenants_src_free(kvr_tenants_src_t *s);

#endif
