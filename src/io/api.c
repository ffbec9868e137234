/*
 * api.c — the request layer's routing, its single-block handlers (/kv/<key>), the stats and
 * debug documents, probes and authentication, and the accounting of a finished request. The
 * batch endpoints are in api_batch.c; api.h has the design.
 */
#include "io/api_int.h"

#include "base/clock.h"
#include "base/log.h"
#include "io/metrics.h"
#include "wire/json.h"
#include "wire/keys.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <strings.h>

/* 0 is "any other status"; -1 ends the list. */

int kvr_api_init(kvr_api_t *a, const kvr_config_t *cfg, kvr_seg_t *seg, kvr_store_t *store, kvr_relay_t *relay)
{
    memset(a, 0, sizeof(*a));
    a->cfg = cfg;
    a->seg = seg;
    a->store = store;
    a->relay = relay;
    a->inflight_cap = (cfg->max_inflight_bytes ? cfg->max_inflight_bytes : cfg->memory / 4) /
                      (cfg->workers ? cfg->workers : 1);
    a->peer_cap = a->inflight_cap / 100 * cfg->peer_inflight_share;
    a->ssd_fd = -1;
    return kvr_api_auth_init(a);
}

static int memis(const char *p, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    return n == l && memcmp(p, lit, l) == 0;
}

unsigned kvr_api_method(const char *m, size_t n)
{
    if (memis(m, n, "GET"))
        return KVR_M_GET;
    if (memis(m, n, "PUT"))
        return KVR_M_PUT;
    if (memis(m, n, "HEAD"))
        return KVR_M_HEAD;
    if (memis(m, n, "DELETE"))
        return KVR_M_DELETE;
    if (memis(m, n, "POST"))
        return KVR_M_POST;
    return KVR_M_OTHER;
}

void kvr_api_res_reset(kvr_api_res_t *res)
{
    /* The key and inline buffers need no clearing: their lengths say what is valid. */
    memset(res, 0, offsetof(kvr_api_res_t, key));
    res->inline_len = 0;
}

/* ------------------------------------------------------------------ response builders */

void kvr_api_set_status(kvr_api_res_t *res, int status)
{
    static const struct {
        int status;
        const char *reason;
    } reasons[] = {{200, "OK"},
                   {201, "Created"},
                   {400, "Bad Request"},
                   {401, "Unauthorized"},
                   {403, "Forbidden"},
                   {404, "Not Found"},
                   {405, "Method Not Allowed"},
                   {409, "Conflict"},
                   {411, "Length Required"},
                   {413, "Payload Too Large"},
                   {431, "Request Header Fields Too Large"},
                   {500, "Internal Server Error"},
                   {501, "Not Implemented"},
                   {503, "Service Unavailable"},
                   {507, "Insufficient Storage"}};
    res->status = status;
    res->reason = "Unknown";
    for (size_t i = 0; i < KVR_ARRAY_SIZE(reasons); i++)
        if (reasons[i].status == status)
            res->reason = reasons[i].reason;
}

/* An inline JSON body built by the caller in j (over res->inline_buf). */
static void send_json(kvr_api_res_t *res, int status, kvr_json_t *j)
{
    res->body = KVR_API_BODY_INLINE;
    res->ctype = "application/json";
    if (j->overflow) {
        static const char msg[] = "{\"error\":\"Internal\",\"message\":\"response too large\"}";
        memcpy(res->inline_buf, msg, sizeof(msg) - 1);
        res->inline_len = sizeof(msg) - 1;
        status = 500;
    } else {
        res->inline_len = j->len;
    }
    res->length = res->inline_len;
    kvr_api_set_status(res, status);
}

void kvr_api_error(kvr_api_res_t *res, int status, const char *code, const char *msg)
{
    kvr_json_t j;

    kvr_json_init(&j, res->inline_buf, sizeof(res->inline_buf));
    kvr_json_raw(&j, "{");
    kvr_json_key(&j, "error", 1);
    kvr_json_str(&j, code, strlen(code));
    kvr_json_key(&j, "message", 0);
    kvr_json_str(&j, msg, strlen(msg));
    kvr_json_raw(&j, "}");
    send_json(res, status, &j);
}

static void send_text(kvr_api_res_t *res, int status, const char *body)
{
    size_t n = strlen(body);
    memcpy(res->inline_buf, body, n);
    res->inline_len = n;
    res->length = n;
    res->body = KVR_API_BODY_INLINE;
    res->ctype = "text/plain";
    kvr_api_set_status(res, status);
}

static void send_405(kvr_api_res_t *res, const char *allow)
{
    kvr_api_error(res, 405, "MethodNotAllowed", "method not allowed for this resource");
    res->hdr_name = "allow";
    res->hdr_value = allow;
}

/* A body on the heap (freed by kvr_api_done). */
void kvr_api_send_heap(kvr_api_res_t *res, char *buf, size_t len, const char *ctype)
{
    res->heap = buf;
    res->body = KVR_API_BODY_HEAP;
    res->length = len;
    res->ctype = ctype;
    kvr_api_set_status(res, 200);
}

static void json_begin(kvr_json_t *j, kvr_api_res_t *res)
{
    kvr_json_init(j, res->inline_buf, sizeof(res->inline_buf));
    kvr_json_raw(j, "{");
}

/* ------------------------------------------------------------------ /kv/<key> */

static void handle_get_block(kvr_api_t *a, kvr_api_res_t *res, const uint8_t *key, size_t klen)
{
    /* a miss in RAM is counted once the disk tier misses too: a block read back from it is a
     * disk read (a promotion), not a miss */
    int rc = kvr_store_get_counted(a->store, res->ns, key, klen, &res->ref, KVR_GET_COUNT_HIT);

    if (rc == KVR_ENOTFOUND && kvr_api_disk_get(a, res, key, klen))
        return;
    if (rc == KVR_ENOTFOUND) {
        kvr_store_count_miss(a->store, res->ns);
        kvr_api_error(res, 404, "NoSuchBlock", "no such block");
        return;
    }
    if (rc == KVR_EBUSY) {
        kvr_api_error(res, 503, "Busy", "too many blocks in flight in this worker");
        res->hdr_name = "retry-after";
        res->hdr_value = "1";
        return;
    }
    if (rc != KVR_OK) {
        kvr_api_error(res, 500, "Internal", "store error");
        return;
    }
    api_send_pinned(res);
}

static void handle_head_block(kvr_api_t *a, kvr_api_res_t *res, const uint8_t *key, size_t klen)
{
    uint64_t len = 0;

    res->body = KVR_API_BODY_INLINE;
    res->head_only = 1;
    if (!kvr_api_exists(a, res->ns, key, klen, &len)) {
        kvr_api_set_status(res, 404);
        res->length = 0;
        return;
    }
    kvr_api_set_status(res, 200);
    res->length = len;
    res->ctype = "application/octet-stream";
}

/* The PUT's success document: {"hash":..,"bytes":..,"created":..}. */
static void put_answer(kvr_api_res_t *res, int created)
{
    kvr_json_t j;

    json_begin(&j, res);
    kvr_json_key(&j, "hash", 1);
    kvr_json_str(&j, res->key, res->klen);
    api_json_field(&j, "bytes", res->put_len, 0);
    kvr_json_key(&j, "created", 0);
    kvr_json_raw(&j, created ? "true}" : "false}");
    send_json(res, created ? 201 : 200, &j);
}

static void put_failed(kvr_api_res_t *res, int rc)
{
    switch (rc) {
    case KVR_ECONFLICT:
        kvr_api_error(res, 409, "Conflict", "a block of another length is stored under this key");
        return;
    case KVR_ENOSPACE:
        kvr_api_error(res, 507, "InsufficientStorage", "no room for the block even after eviction");
        return;
    case KVR_EQUOTA:
        kvr_api_error(res, 507, "InsufficientStorage",
                      "the block does not fit the namespace's memory quota even after evicting its own blocks");
        return;
    case KVR_EINVAL:
        kvr_api_error(res, 400, "InvalidRequest", "invalid key");
        return;
    default:
        kvr_api_error(res, 500, "Internal", "store error");
    }
}

/* The relay pool of a PUT (docs/tenancy.md, "Pools"): (its namespace, X-KV-Model, else the
 * namespace's model=, else --model). -1 after an error answer. */
static int put_pool(kvr_api_t *a, const kvr_api_req_t *rq, kvr_api_res_t *res)
{
    const char *m;
    size_t mlen;
    int pool;

    if ((pool = kvr_api_request_model(a, rq, res->ns, &m, &mlen)) >= 0)
        return pool;
    pool = kvr_store_pool(a->store, res->ns, kvr_api_ns_name(a, res->ns), m, mlen, (uint32_t)a->cfg->max_pools_per_ns);
    if (pool >= 0 && rq->model == NULL)
        kvr_api_default_pool_set(a, res->ns, (uint32_t)pool);
    if (pool >= 0)
        return pool;
    if (pool == KVR_EINVAL)
        kvr_api_error(res, 400, "InvalidRequest", "X-KV-Model must be 1 to 128 printable bytes without spaces");
    else if (pool == KVR_ENOSPACE)
        kvr_api_error(res, 507, "InsufficientStorage",
                      "a new model would make one relay pool more than --max-pools allows");
    else if (pool == KVR_EQUOTA)
        kvr_api_error(res, 507, "InsufficientStorage",
                      "a new model would make the namespace one relay pool more than --max-pools-per-namespace allows");
    else
        kvr_api_error(res, 500, "Internal", "store error");
    return -1;
}

static void handle_put_block(kvr_api_t *a, const kvr_api_req_t *rq, kvr_api_res_t *res, const uint8_t *key,
                             size_t klen)
{
    uint64_t canon;
    int rc, pool;

    if (rq->seq_hash != NULL) {
        if (kvr_parse_u64(rq->seq_hash, rq->seq_hash_len, &canon) != KVR_OK) {
            kvr_api_error(res, 400, "InvalidRequest", "X-KV-Sequence-Hash must be a u64 in decimal or 0x hex");
            return;
        }
    } else {
        canon = kvr_store_default_canon(key, klen);
    }
    if (rq->body_len > a->cfg->max_block_size) {
        kvr_api_error(res, 413, "EntityTooLarge",
                      "block larger than max_block_size (--max-block-size, at most what --memory holds)");
        return;
    }
    if (rq->length_unknown) {
        res->put = KVR_API_PUT_DEFERRED;
        return;
    }
    /* One reservation always goes ahead, so a block larger than the share is never stuck. */
    if (!rq->buffered && a->inflight > 0 && a->inflight + rq->body_len > a->inflight_cap) {
        res->put = KVR_API_PUT_WAIT;
        return;
    }
    /* Nor may one peer address hold more than its share, past its own first reservation: a
     * client that trickles many bodies cannot starve the others (docs/dataplane.md). */
    if (!rq->buffered && !kvr_api_peer_fits(a, rq->peer_held, rq->body_len)) {
        res->put = KVR_API_PUT_WAIT;
        return;
    }
    if ((pool = put_pool(a, rq, res)) < 0)
        return;
    memcpy(res->key, key, klen);
    res->klen = (uint16_t)klen;
    res->put_len = rq->body_len;
    rc = kvr_store_put_begin(a->store, res->ns, (uint32_t)pool, key, klen, rq->body_len, canon, &res->txn);
    if (rc == KVR_OK) {
        res->put = KVR_API_PUT_RESERVED; /* answered by kvr_api_put_end */
        a->inflight += rq->body_len;
        kvr_stat_add(a->store->my_stats, KVR_ST_PUT_RESERVATIONS, 1); /* levels: put_end takes them back */
        kvr_stat_add(a->store->my_stats, KVR_ST_PUT_RESERVED_BYTES, rq->body_len);
        return;
    }
    if (rc == KVR_PUT_DEDUP) {
        res->put = KVR_API_PUT_DEDUP;
        put_answer(res, 0); /* sent once the body is consumed */
        return;
    }
    put_failed(res, rc);
}

int kvr_api_put_fits(const kvr_api_t *a, uint64_t len)
{
    return a->inflight == 0 || a->inflight + len <= a->inflight_cap;
}

int kvr_api_peer_fits(const kvr_api_t *a, uint64_t held, uint64_t len)
{
    return held == 0 || held + len <= a->peer_cap;
}

size_t kvr_api_txn_iov(kvr_api_t *a, const kvr_api_res_t *res, uint64_t off, struct iovec *iov, size_t max)
{
    return kvr_store_txn_iov(a->store, &res->txn, off, iov, max);
}

void kvr_api_put_write(kvr_api_t *a, kvr_api_res_t *res, uint64_t off, const void *data, uint64_t len)
{
    if (len > 0)
        (void)kvr_store_put_write(a->store, &res->txn, off, data, len);
}

void kvr_api_put_end(kvr_api_t *a, kvr_api_res_t *res, int ok)
{
    uint32_t left;
    int rc;

    if (res->put == KVR_API_PUT_RESERVED) {
        res->put = KVR_API_PUT_NONE;
        a->inflight -= res->put_len;
        kvr_stat_sub(a->store->my_stats, KVR_ST_PUT_RESERVATIONS, 1);
        kvr_stat_sub(a->store->my_stats, KVR_ST_PUT_RESERVED_BYTES, res->put_len);
        if (!ok) {
            kvr_store_put_abort(a->store, &res->txn);
            return;
        }
        rc = kvr_store_put_commit(a->store, &res->txn);
        if (rc == KVR_PUT_CREATED || rc == KVR_PUT_DEDUP)
            put_answer(res, rc == KVR_PUT_CREATED);
        else
            put_failed(res, rc);
    } else if (res->put == KVR_API_PUT_DEDUP) {
        res->put = KVR_API_PUT_NONE;
        if (!ok) /* the reference the head took goes again: as if the PUT never came */
            (void)kvr_store_release(a->store, res->ns, res->key, res->klen, &left);
    } else {
        res->put = KVR_API_PUT_NONE; /* DEFERRED, WAIT: nothing was taken */
    }
}

static void handle_delete_block(kvr_api_t *a, kvr_api_res_t *res, const uint8_t *key, size_t klen)
{
    kvr_json_t j;
    uint32_t left = 0;
    int rc = kvr_api_release(a, res->ns, key, klen, &left);

    if (rc == KVR_ENOTFOUND) {
        kvr_api_error(res, 404, "NoSuchBlock", "no such block");
        return;
    }
    if (rc != KVR_OK) {
        kvr_api_error(res, 500, "Internal", "store error");
        return;
    }
    json_begin(&j, res);
    kvr_json_key(&j, "hash", 1);
    kvr_json_str(&j, key, klen);
    api_json_field(&j, "refs", left, 0);
    kvr_json_raw(&j, "}");
    send_json(res, 200, &j);
}

static void handle_exists(kvr_api_t *a, kvr_api_res_t *res, const uint8_t *key, size_t klen)
{
    kvr_json_t j;
    int e = kvr_api_exists(a, res->ns, key, klen, NULL);

    json_begin(&j, res);
    kvr_json_key(&j, "hash", 1);
    kvr_json_str(&j, key, klen);
    kvr_json_key(&j, "exists", 0);
    kvr_json_raw(&j, e ? "true}" : "false}");
    send_json(res, 200, &j);
}

/* ------------------------------------------------------------------ stats and debug documents */

/* The fields of kvr_store_stats_t a document shows, by name and offset, in its order. */
typedef struct {
    const char *name;
    size_t off;
} store_field_t;

#define STORE_FIELD(f) \
    { \
#f, offsetof(kvr_store_stats_t, f) \
    }

static const store_field_t stats_fields[] = {
    STORE_FIELD(unique_blocks), STORE_FIELD(total_refs), STORE_FIELD(resident_bytes), STORE_FIELD(logical_bytes),
    STORE_FIELD(dedup_savings_bytes), STORE_FIELD(dedup_hits), STORE_FIELD(get_hits), STORE_FIELD(get_misses),
    STORE_FIELD(capacity_bytes), STORE_FIELD(evictions), STORE_FIELD(evicted_bytes), STORE_FIELD(put_new),
    STORE_FIELD(put_conflicts), STORE_FIELD(deletes)};

static const store_field_t check_fields[] = {
    STORE_FIELD(unique_blocks), STORE_FIELD(total_refs), STORE_FIELD(resident_bytes), STORE_FIELD(logical_bytes),
    STORE_FIELD(pinned_blocks), STORE_FIELD(zombie_blocks), STORE_FIELD(reserved_blocks)};

static void json_store_fields(kvr_json_t *j, const kvr_store_stats_t *st, const store_field_t *f, size_t n, int first)
{
    uint64_t v;

    for (size_t i = 0; i < n; i++) {
        memcpy(&v, (const char *)st + f[i].off, sizeof(v));
        api_json_field(j, f[i].name, v, first && i == 0);
    }
}

/* The same document restricted to the caller's namespace, named in "namespace"; its capacity
 * is the namespace's quota when it has one. */
static void ns_stats(kvr_api_t *a, uint16_t ns, kvr_store_stats_t *s)
{
    kvr_store_ns_stats_t n;
    uint64_t quota = kvr_api_ns_quota(a, ns);

    kvr_store_stats(a->store, s); /* capacity, and every field not split by namespace */
    kvr_store_ns_stats(a->store, ns, &n);
    s->unique_blocks = n.blocks;
    s->total_refs = n.refs;
    s->resident_bytes = n.resident_bytes;
    s->logical_bytes = n.logical_bytes;
    s->dedup_savings_bytes = n.logical_bytes > n.resident_bytes ? n.logical_bytes - n.resident_bytes : 0;
    s->dedup_hits = n.put_dedup;
    s->get_hits = n.get_hits;
    s->get_misses = n.get_misses;
    s->evictions = n.evictions;
    s->evicted_bytes = n.evicted_bytes;
    s->put_new = n.put_new;
    s->put_conflicts = n.put_conflicts;
    s->deletes = n.deletes;
    if (quota != 0 && quota < s->capacity_bytes)
        s->capacity_bytes = quota;
}

static void handle_stats(kvr_api_t *a, kvr_api_res_t *res)
{
    kvr_json_t j;
    kvr_store_stats_t s;
    int scoped = kvr_api_tenants_on(a) && !res->admin;

    if (scoped)
        ns_stats(a, res->ns, &s);
    else
        kvr_store_stats(a->store, &s);
    json_begin(&j, res);
    json_store_fields(&j, &s, stats_fields, KVR_ARRAY_SIZE(stats_fields), 1);
    if (scoped) {
        const char *name = kvr_api_ns_name(a, res->ns);
        kvr_json_key(&j, "namespace", 0);
        kvr_json_str(&j, name != NULL ? name : "", name != NULL ? strlen(name) : 0);
    }
    api_json_field(&j, "max_block_size", a->cfg->max_block_size, 0); /* effective: clamped to the arena */
    kvr_api_disk_stats(a, &j, scoped ? (int)res->ns : -1);           /* a tenant sees its own disk blocks only */
    kvr_json_raw(&j, "}");
    send_json(res, 200, &j);
}

static void handle_debug_store(kvr_api_t *a, kvr_api_res_t *res)
{
    kvr_json_t j;
    kvr_store_stats_t scan;
    int ok = kvr_store_check(a->store, &scan) == KVR_OK;

    json_begin(&j, res);
    kvr_json_key(&j, "ok", 1);
    kvr_json_raw(&j, ok ? "true" : "false");
    json_store_fields(&j, &scan, check_fields, KVR_ARRAY_SIZE(check_fields), 0);
    kvr_json_raw(&j, "}");
    send_json(res, ok ? 200 : 500, &j);
}

static void handle_debug_relay(kvr_api_t *a, kvr_api_res_t *res)
{
    kvr_json_t j;
    kvr_relay_status_t st;
    uint64_t head, tail;

    kvr_relay_status(a->seg, &st);
    json_begin(&j, res);
    api_json_field(&j, "generation", st.generation, 1);
    api_json_field(&j, "published_seq", st.published_seq, 0);
    api_json_field(&j, "catalog_revision", st.catalog_revision, 0);
    api_json_field(&j, "bucket_count", st.bucket_count, 0);
    api_json_field(&j, "seed", st.seed, 0);
    api_json_field(&j, "dc_id", st.dc_id, 0);
    api_json_field(&j, "incarnation", st.incarnation, 0);
    api_json_field(&j, "publisher_pid", st.publisher_pid, 0);
    api_json_field(&j, "live_pool_subscribers", st.live_subscribers, 0);
    api_json_field(&j, "pools", st.pools, 0);
    kvr_store_log_positions(a->store, &head, &tail);
    api_json_field(&j, "log_head", head, 0);
    api_json_field(&j, "log_tail", tail, 0);
    kvr_json_raw(&j, "}");
    send_json(res, 200, &j);
}

/* Pool 0's working filter, (default, --model) on a new segment, as bucket_count little-endian
 * u64 words (x86: as stored). */
static void handle_debug_filter(kvr_api_t *a, kvr_api_res_t *res)
{
    uint64_t buckets = kvr_relay_buckets(a->relay);
    size_t len = buckets * 8;
    uint8_t *copy = malloc(len ? len : 1);

    if (copy == NULL) {
        kvr_api_error(res, 503, "Busy", "out of memory");
        return;
    }
    for (uint64_t i = 0; i < buckets; i++)
        kvr_put_le64(copy + i * 8, kvr_relay_filter_word(a->relay, 0, i));
    kvr_api_send_heap(res, (char *)copy, len, "application/octet-stream");
}

static void handle_metrics(kvr_api_t *a, kvr_api_res_t *res)
{
    const char *names[KVR_NS_MAX];
    uint64_t quota[KVR_NS_MAX];
    size_t len = 0;
    char *text;

    for (uint16_t ns = 0; ns < KVR_NS_MAX; ns++) {
        names[ns] = kvr_api_ns_listed(a, ns) ? kvr_api_ns_name(a, ns) : NULL;
        quota[ns] = kvr_api_ns_quota(a, ns);
    }
    text = kvr_metrics_render(a->seg, a->store, names, quota, &len);

    if (text == NULL) {
        kvr_api_error(res, 503, "Busy", "out of memory");
        return;
    }
    kvr_api_send_heap(res, text, len, "text/plain; version=0.0.4; charset=utf-8");
}

/* ------------------------------------------------------------------ probes and authentication */

/* Ready: not draining, every expected process serving, and none whose heartbeat is late (the
 * supervisor's mark in the segment, so that the answer is the same whichever worker gives it).
 * Writes the answer's body, which names the first reason it is not ready, into buf. */
static int ready(kvr_api_t *a, char *buf, size_t cap)
{
    kvr_seg_status_t st;

    kvr_seg_status(a->seg, &st);
    if (st.draining || a->draining)
        snprintf(buf, cap, "not ready: draining\n");
    else if (st.late != 0)
        snprintf(buf, cap, "not ready: heartbeat late in process slots 0x%llx\n", (unsigned long long)st.late);
    else if (st.workers_running < st.workers_expected)
        snprintf(buf, cap, "not ready: %u of %u workers serving\n", st.workers_running, st.workers_expected);
    else if (st.publisher_running < st.publisher_expected)
        snprintf(buf, cap, "not ready: the publisher is not serving\n");
    else
        return snprintf(buf, cap, "ready\n") > 0;
    return 0;
}

/* ------------------------------------------------------------------ routing */

static int get_or_head(unsigned m)
{
    return m == KVR_M_GET || m == KVR_M_HEAD;
}

/* POST /batch/...: decided from the head; the body is collected and given to kvr_api_batch
 * (api_batch.c). */
static void route_batch(kvr_api_t *a, const kvr_api_req_t *rq, kvr_api_res_t *res)
{
    if (rq->method != KVR_M_POST) {
        send_405(res, "POST");
        return;
    }
    if (rq->length_unknown) {
        kvr_api_error(res, 411, "InvalidRequest", "a batch needs a Content-Length");
        return;
    }
    if (memis(rq->path, rq->path_len, "/batch/lookup") && kvr_api_lookup_head(rq, res) < 0)
        return; /* its own bounds (api_batch.c) */
    if (rq->body_len > KVR_API_BATCH_MAX_BODY) {
        kvr_api_error(res, 413, "EntityTooLarge", "a batch body is at most 1 MiB");
        return;
    }
    res->put = KVR_API_BODY_WANTED;
}

/* Everything outside /kv/; returns 0 when the path is not one of them. */
static int route_other(kvr_api_t *a, const kvr_api_req_t *rq, kvr_api_res_t *res)
{
    const char *p = rq->path;
    size_t n = rq->path_len;

    if (memis(p, n, "/batch/exists") || memis(p, n, "/batch/delete") || memis(p, n, "/batch/get") ||
        memis(p, n, "/batch/lookup")) {
        route_batch(a, rq, res);
        return 1;
    }
    if ((memis(p, n, "/metrics") || (n >= 7 && memcmp(p, "/debug/", 7) == 0)) && !res->admin) {
        kvr_api_error(res, 403, "Forbidden", "the admin token is needed here");
        return 1;
    }
    if (memis(p, n, "/metrics")) {
        if (!get_or_head(rq->method))
            send_405(res, "GET, HEAD");
        else
            handle_metrics(a, res);
        return 1;
    }
    if (memis(p, n, "/debug/store")) {
        if (rq->method != KVR_M_GET)
            send_405(res, "GET");
        else
            handle_debug_store(a, res);
        return 1;
    }
    if (memis(p, n, "/debug/relay") || memis(p, n, "/debug/filter")) {
        if (rq->method != KVR_M_GET)
            send_405(res, "GET");
        else if (!kvr_relay_present(a->relay))
            kvr_api_error(res, 404, "NotFound", "the relay is not configured");
        else if (p[7] == 'r')
            handle_debug_relay(a, res);
        else
            handle_debug_filter(a, res);
        return 1;
    }
    return 0;
}

static void route_kv(kvr_api_t *a, const kvr_api_req_t *rq, kvr_api_res_t *res)
{
    const char *p = rq->path + 4;
    size_t n = rq->path_len - 4, klen = 0;
    uint8_t key[KVR_KEY_MAX];
    int rc;

    if (memis(p, n, "stats")) {
        if (!get_or_head(rq->method))
            send_405(res, "GET, HEAD");
        else
            handle_stats(a, res);
        return;
    }
    if (n >= 7 && memcmp(p + n - 7, "/exists", 7) == 0) { /* the rest is the key */
        if (!get_or_head(rq->method)) {
            send_405(res, "GET, HEAD");
            return;
        }
        rc = kvr_key_decode(p, n - 7, key, sizeof(key), &klen);
        if (rc != KVR_KEY_OK)
            kvr_api_error(res, 400, "InvalidRequest", kvr_key_error(rc));
        else
            handle_exists(a, res, key, klen);
        return;
    }
    if (rq->method == KVR_M_OTHER || rq->method == KVR_M_POST) {
        send_405(res, "GET, HEAD, PUT, DELETE");
        return;
    }
    rc = kvr_key_decode(p, n, key, sizeof(key), &klen);
    if (rc != KVR_KEY_OK) {
        kvr_api_error(res, 400, "InvalidRequest", kvr_key_error(rc));
        return;
    }
    switch (rq->method) {
    case KVR_M_GET:
        handle_get_block(a, res, key, klen);
        break;
    case KVR_M_HEAD:
        handle_head_block(a, res, key, klen);
        break;
    case KVR_M_PUT:
        handle_put_block(a, rq, res, key, klen);
        break;
    default:
        handle_delete_block(a, res, key, klen);
    }
}

void kvr_api_handle(kvr_api_t *a, const kvr_api_req_t *rq, kvr_api_res_t *res)
{
    const char *p = rq->path;
    size_t n = rq->path_len;

    if (rq->head_bytes > KVR_API_MAX_HEAD) {
        kvr_api_error(res, 431, "InvalidRequest", "request headers larger than 16 KiB");
        res->close = 1;
    } else if (memis(p, n, "/healthz")) {
        send_text(res, 200, "ok\n");
    } else if (memis(p, n, "/readyz")) {
        char why[96];
        int ok = ready(a, why, sizeof(why));
        send_text(res, ok ? 200 : 503, why);
    } else if (!kvr_api_authorize(a, rq, res)) {
        kvr_api_error(res, 401, "Unauthorized", "missing or invalid bearer token");
        res->hdr_name = "www-authenticate";
        res->hdr_value = "Bearer";
    } else if (route_other(a, rq, res)) {
        /* done */
    } else if (n < 4 || memcmp(p, "/kv/", 4) != 0) {
        kvr_api_error(res, 404, "NotFound", "no such resource");
    } else {
        route_kv(a, rq, res);
    }
    /* A PUT answered from its head leaves a body on the connection: it is consumed after the
     * answer (keep-alive) when it is no larger than a block may be, except for a client without
     * a valid token, which gets nothing more of this connection. */
    if ((rq->method == KVR_M_PUT || rq->method == KVR_M_POST) && (rq->body_len > 0 || rq->length_unknown) &&
        res->put == KVR_API_PUT_NONE) {
        if (res->status == 401 || res->status == 413 || rq->length_unknown)
            res->close = 1;
        else
            res->drain = 1;
    }
    if (rq->method == KVR_M_HEAD)
        res->head_only = 1;
}

/* ------------------------------------------------------------------ sending and accounting */

const char *kvr_api_body_bytes(const kvr_api_res_t *res)
{
    return res->body == KVR_API_BODY_HEAP ? res->heap : res->inline_buf;
}

size_t kvr_api_block_iov(kvr_api_t *a, const kvr_api_res_t *res, uint64_t off, struct iovec *iov, size_t max)
{
    if (res->multi != NULL)
        return kvr_api_multi_iov(a, res->multi, off, iov, max);
    return kvr_store_ref_iov(a->store, &res->ref, off, iov, max);
}

static unsigned status_index(int status)
{
    for (unsigned i = 0; i < KVR_HTTP_STATUSES - 2; i++)
        if (kvr_http_status_codes[i] == status)
            return i;
    return KVR_HTTP_STATUSES - 2; /* other */
}

void kvr_api_done(kvr_api_t *a, kvr_api_res_t *res, unsigned method, uint64_t start_us, uint64_t bytes_in,
                  uint64_t bytes_out)
{
    kvr_stats_block_t *b = a->store->my_stats;
    uint64_t us = kvr_clock_us() - start_us;

    double secs = (double)us / 1e6;
    unsigned base, k;

    if (method >= KVR_HTTP_METHODS)
        method = KVR_M_OTHER;
    base = KVR_ST_HTTP_HIST + method * (KVR_HTTP_BUCKETS + 2);

    if (res->put != KVR_API_PUT_NONE)
        kvr_api_put_end(a, res, 0);
    if (res->dk != NULL)
        kvr_api_disk_abort(a, res);
    if (res->pinned) {
        kvr_store_unpin_later(a->store, &res->ref); /* the worker's loop flushes */
        res->pinned = 0;
    }
    if (res->multi != NULL)
        kvr_api_multi_release(a, res);
    free(res->heap);
    res->heap = NULL;
    kvr_stat_add(b, KVR_ST_HTTP_REQ + method * KVR_HTTP_STATUSES + status_index(res->status), 1);
    for (k = 0; k < KVR_HTTP_BUCKETS && secs > kvr_http_bucket_bounds[k]; k++)
        ;
    if (k < KVR_HTTP_BUCKETS)
        kvr_stat_add(b, base + k, 1);
    kvr_stat_add(b, base + KVR_HTTP_BUCKETS, us);
    kvr_stat_add(b, base + KVR_HTTP_BUCKETS + 1, 1);
    kvr_stat_add(b, KVR_ST_HTTP_BYTES_OUT, bytes_out);
    kvr_stat_add(b, KVR_ST_HTTP_BYTES_IN, bytes_in);
}
