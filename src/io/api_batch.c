/*
 * api_batch.c — the batch endpoints (docs/http-contract.md, "Batches"): POST /batch/exists,
 * /batch/delete and /batch/get, one key per line of a body of at most 1 MiB, and POST
 * /batch/lookup, one canonical hash per line (docs/kv-lookup.md). routing in api.c decides a
 * batch from its head; the transport collects the body and calls kvr_api_batch.
 */
#include "io/api_int.h"

#include "wire/json.h"
#include "wire/keys.h"
#include "wire/lookup.h"

#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------ batch keys */

/* Splits the body into keys; on a bad line answers 400 naming it and returns -1. */
static int batch_keys(kvr_api_res_t *res, const char *body, size_t len, size_t *starts, size_t *lens, size_t *count)
{
    char msg[96];
    size_t n = 0, i = 0;

    while (i < len) {
        const char *nl = memchr(body + i, '\n', len - i);
        size_t end = nl != NULL ? (size_t)(nl - body) : len, l = end - i;
        if (l > 0 && body[end - 1] == '\r')
            l--;
        if (n == KVR_API_BATCH_MAX_KEYS) {
            kvr_api_error(res, 413, "EntityTooLarge", "a batch holds at most 4096 keys");
            return -1;
        }
        if (l == 0) {
            snprintf(msg, sizeof(msg), "line %zu: empty key", n + 1);
            kvr_api_error(res, 400, "InvalidRequest", msg);
            return -1;
        }
        starts[n] = i;
        lens[n] = l;
        n++;
        i = end + 1;
    }
    *count = n;
    return 0;
}

/* ------------------------------------------------------------------ batch GET */

/* The framing (docs/http-contract.md, "Batches"): "KVRB", u32 LE key count, then per key in
 * the request's order a 16-byte record — u8 status (1 found, 0 not), 7 zero bytes, u64 LE
 * length — followed by the block's bytes when found. The records live here; the bytes are
 * the pinned blocks' spans in the segment, never copied. */
#define MULTI_PRE 8
#define MULTI_REC 16

struct kvr_api_multi_s {
    size_t count;
    uint32_t pins; /* counted in kvr_api_t.batch_pins */
    uint8_t pre[MULTI_PRE];
    struct {
        uint8_t rec[MULTI_REC];
        int hit;
        kvr_block_ref_t ref;
    } k[];
};

void kvr_api_multi_release(kvr_api_t *a, kvr_api_res_t *res)
{
    struct kvr_api_multi_s *m = res->multi;

    for (size_t i = 0; i < m->count; i++)
        if (m->k[i].hit)
            kvr_store_unpin_later(a->store, &m->k[i].ref);
    a->batch_pins -= m->pins;
    free(m);
    res->multi = NULL;
}

/* A batch GET that cannot be answered: its pins go at once, the error is sent instead. */
static void multi_fail(kvr_api_t *a, kvr_api_res_t *res, int status, const char *code, const char *msg)
{
    kvr_api_multi_release(a, res);
    kvr_api_error(res, status, code, msg);
    if (status == 503) {
        res->hdr_name = "retry-after";
        res->hdr_value = "1";
    }
}

/* The part of [*pos, *pos + len) from off on, as one iovec; advances *pos. */
static size_t multi_bytes(const uint8_t *p, uint64_t len, uint64_t *pos, uint64_t off, struct iovec *iov)
{
    uint64_t start = *pos, skip;

    *pos += len;
    if (off >= *pos)
        return 0;
    skip = off > start ? off - start : 0;
    iov->iov_base = (void *)(p + skip);
    iov->iov_len = len - skip;
    return 1;
}

/* The spans of the framed body from off on; stops at max (the transport asks again). */
size_t kvr_api_multi_iov(kvr_api_t *a, const struct kvr_api_multi_s *m, uint64_t off, struct iovec *iov, size_t max)
{
    uint64_t pos = 0;
    size_t n = 0;

    if (max == 0)
        return 0;
    n += multi_bytes(m->pre, MULTI_PRE, &pos, off, iov + n);
    for (size_t i = 0; i < m->count && n < max; i++) {
        uint64_t start, len = m->k[i].hit ? m->k[i].ref.length : 0;
        n += multi_bytes(m->k[i].rec, MULTI_REC, &pos, off, iov + n);
        start = pos;
        pos += len;
        if (len == 0 || off >= pos)
            continue;
        if (n == max)
            break;
        n += kvr_store_ref_iov(a->store, &m->k[i].ref, off > start ? off - start : 0, iov + n, max - n);
    }
    return n;
}

/* A key of a batch GET that missed in RAM: when the disk tier holds it, its record is read
 * into a reservation at once, with blocking reads (kvr_api_disk_sync, as the h2o transport
 * reads a single GET), promoted and pinned into *ref. KVR_OK, KVR_ENOTFOUND (neither tier
 * serves it: counted as a miss), or the HTTP status the whole batch is to get instead (503 or
 * 507: the client fetches its keys one by one). docs/ssd-tier.md, "Reads and promotion". */
static int batch_disk(kvr_api_t *a, uint16_t ns, const uint8_t *key, size_t klen, kvr_block_ref_t *ref)
{
    static kvr_api_res_t r; /* 8 KiB, off the stack; a worker has one thread */

    memset(&r, 0, sizeof(r));
    r.ns = ns;
    if (kvr_api_disk_get(a, &r, key, klen) && r.dk != NULL)
        kvr_api_disk_sync(a, &r);
    else if (r.status == 0) { /* not on disk, or in RAM again meanwhile */
        if (kvr_store_get_counted(a->store, ns, key, klen, ref, KVR_GET_COUNT_HIT | KVR_GET_COUNT_MISS) == KVR_OK)
            return KVR_OK;
        return KVR_ENOTFOUND;
    }
    if (r.status == 200 && r.pinned) {
        *ref = r.ref;
        return KVR_OK;
    }
    return r.status == 404 ? KVR_ENOTFOUND : r.status; /* a 404 counted its miss */
}

/* Pins every found key and frames the answer; any failure releases them all. */
static void batch_get(kvr_api_t *a, const char *body, const size_t *starts, const size_t *lens, size_t count,
                      kvr_api_res_t *res)
{
    struct kvr_api_multi_s *m;
    uint8_t key[KVR_KEY_MAX];
    uint64_t total = 0, dlen = 0;
    char msg[96];

    if (count > KVR_API_BATCH_GET_MAX_KEYS) {
        kvr_api_error(res, 413, "EntityTooLarge", "a batch get holds at most 128 keys");
        return;
    }
    if (a->batch_pins + count > KVR_API_BATCH_GET_MAX_PINS) {
        kvr_api_error(res, 503, "Busy", "too many batch get blocks in flight in this worker; retry");
        res->hdr_name = "retry-after";
        res->hdr_value = "1";
        return;
    }
    m = calloc(1, sizeof(*m) + count * sizeof(m->k[0]));
    if (m == NULL) {
        kvr_api_error(res, 503, "Busy", "out of memory");
        return;
    }
    res->multi = m;
    m->count = count;
    memcpy(m->pre, "KVRB", 4);
    kvr_put_le32(m->pre + 4, (uint32_t)count);
    for (size_t i = 0; i < count; i++) {
        size_t klen = 0;
        int rc = kvr_key_decode(body + starts[i], lens[i], key, sizeof(key), &klen);
        if (rc != KVR_KEY_OK) {
            snprintf(msg, sizeof(msg), "line %zu: %s", i + 1, kvr_key_error(rc));
            multi_fail(a, res, 400, "InvalidRequest", msg);
            return;
        }
        /* a miss in RAM is counted once the disk tier misses too (api.c, handle_get); a block
         * on disk that would take the batch past its bound is refused before it is read */
        rc = kvr_store_get_counted(a->store, res->ns, key, klen, &m->k[i].ref, KVR_GET_COUNT_HIT);
        if (rc == KVR_ENOTFOUND && kvr_api_exists(a, res->ns, key, klen, &dlen) && total + dlen > a->cfg->max_block_size) {
            multi_fail(a, res, 413, "EntityTooLarge", "a batch get's blocks total more than --max-block-size");
            return;
        }
        if (rc == KVR_ENOTFOUND && (rc = batch_disk(a, res->ns, key, klen, &m->k[i].ref)) > KVR_OK) {
            multi_fail(a, res, rc, rc == 503 ? "Busy" : "InsufficientStorage",
                       "a block of the batch could not be read from the disk tier now; GET it alone");
            return;
        }
        if (rc == KVR_ENOTFOUND)
            continue; /* the record stays all zero: not found */
        if (rc != KVR_OK) {
            multi_fail(a, res, rc == KVR_EBUSY ? 503 : 500, rc == KVR_EBUSY ? "Busy" : "Internal",
                       rc == KVR_EBUSY ? "too many blocks in flight in this worker" : "store error");
            return;
        }
        m->k[i].hit = 1;
        m->pins++;
        a->batch_pins++;
        total += m->k[i].ref.length;
        m->k[i].rec[0] = 1;
        kvr_put_le64(m->k[i].rec + 8, m->k[i].ref.length);
        if (total > a->cfg->max_block_size) {
            multi_fail(a, res, 413, "EntityTooLarge", "a batch get's blocks total more than --max-block-size");
            return;
        }
    }
    res->body = KVR_API_BODY_BLOCK;
    res->length = MULTI_PRE + count * MULTI_REC + total;
    res->ctype = "application/x-kvrelay-batch";
    kvr_api_set_status(res, 200);
}

/* ------------------------------------------------------------------ lookup by canonical hash */

int kvr_api_lookup_head(const kvr_api_req_t *rq, kvr_api_res_t *res)
{
    if (rq->body_len > KVR_LOOKUP_MAX_BODY) {
        kvr_api_error(res, 413, "EntityTooLarge",
                      "a lookup body is at most 90112 bytes (4096 hashes of at most 20 characters, each with CRLF)");
        return -1;
    }
    if (rq->model != NULL && !kvr_model_valid(rq->model, rq->model_len)) {
        kvr_api_error(res, 400, "InvalidRequest", "X-KV-Model must be 1 to 128 printable bytes without spaces");
        return -1;
    }
    return 0;
}

/* Closes the JSON answer in out and sends it (500 when it did not fit). */
static void json_send(kvr_api_res_t *res, kvr_json_t *j, char *out)
{
    kvr_json_raw(j, "}");
    if (j->overflow) {
        free(out);
        kvr_api_error(res, 500, "Internal", "response too large");
        return;
    }
    kvr_api_send_heap(res, out, j->len, "application/json");
}

/* The pool a PUT of this request would land in (api.c, put_pool: X-KV-Model, else the namespace's
 * model=, else --model), found, never made: -1 when it does not exist, which holds nothing. */
static int lookup_pool(kvr_api_t *a, const kvr_api_req_t *rq, const kvr_api_res_t *res)
{
    const char *m;
    size_t mlen;
    int pool;

    if ((pool = kvr_api_request_model(a, rq, res->ns, &m, &mlen)) >= 0)
        return pool;
    pool = kvr_store_pool_find(a->store, res->ns, m, mlen);
    if (pool >= 0 && rq->model == NULL)
        kvr_api_default_pool_set(a, res->ns, (uint32_t)pool);
    return pool >= 0 ? pool : -1;
}

/* {"count":N,"held":[true,false,...],"prefix":P}: per hash, whether the pool holds a resident
 * block with that canonical hash; P the consecutive held hashes from the first. */
static void batch_lookup(kvr_api_t *a, const kvr_api_req_t *rq, const char *body, size_t len, kvr_api_res_t *res)
{
    static uint64_t hashes[KVR_LOOKUP_MAX_HASHES];
    static uint8_t held[KVR_LOOKUP_MAX_HASHES];
    size_t count = 0, line = 0, prefix = 0, cap;
    int rc = kvr_lookup_parse(body, len, hashes, KVR_LOOKUP_MAX_HASHES, &count, &line);
    int pool;
    char *out, msg[160];
    kvr_json_t j;

    if (rc == KVR_LOOKUP_TOO_MANY) {
        kvr_api_error(res, 413, "EntityTooLarge", "a lookup holds at most 4096 hashes");
        return;
    }
    if (rc != KVR_LOOKUP_OK) {
        snprintf(msg, sizeof(msg), "line %zu: %s", line, kvr_lookup_error(rc));
        kvr_api_error(res, 400, "InvalidRequest", msg);
        return;
    }
    pool = lookup_pool(a, rq, res);
    if (pool >= 0)
        prefix = kvr_store_lookup_hashes(a->store, (uint32_t)pool, hashes, count, held);
    else
        memset(held, 0, count);
    cap = 64 + count * 6;
    if ((out = malloc(cap)) == NULL) {
        kvr_api_error(res, 503, "Busy", "out of memory");
        return;
    }
    kvr_json_init(&j, out, cap);
    kvr_json_raw(&j, "{");
    api_json_field(&j, "count", count, 1);
    kvr_json_raw(&j, ",\"held\":[");
    for (size_t k = 0; k < count; k++)
        kvr_json_raw(&j, held[k] ? (k > 0 ? ",true" : "true") : (k > 0 ? ",false" : "false"));
    kvr_json_raw(&j, "]");
    api_json_field(&j, "prefix", prefix, 0);
    json_send(res, &j, out);
}

/* ------------------------------------------------------------------ batch answers */

/* exists: {"count":N,"prefix":P,"exists":[...]} — prefix is the number of consecutive hits
 * from the first key, what a prefix-cache lookup wants. delete: {"count":N,"refs":[...]} with
 * the references left, null for a key that was not there. */
void kvr_api_batch(kvr_api_t *a, const kvr_api_req_t *rq, const char *body, size_t len, kvr_api_res_t *res)
{
    static size_t starts[KVR_API_BATCH_MAX_KEYS], lens[KVR_API_BATCH_MAX_KEYS];
    int is_delete = rq->path_len > 7 && memcmp(rq->path + rq->path_len - 7, "/delete", 7) == 0;
    int is_get = rq->path_len > 4 && memcmp(rq->path + rq->path_len - 4, "/get", 4) == 0;
    size_t count = 0, prefix = 0, cap;
    uint8_t key[KVR_KEY_MAX];
    char *out, msg[96];
    kvr_json_t j;

    res->put = KVR_API_PUT_NONE;
    if (rq->path_len > 7 && memcmp(rq->path + rq->path_len - 7, "/lookup", 7) == 0) {
        batch_lookup(a, rq, body, len, res);
        return;
    }
    if (batch_keys(res, body, len, starts, lens, &count) < 0)
        return;
    if (is_get) {
        batch_get(a, body, starts, lens, count, res);
        return;
    }
    cap = 64 + count * 12;
    out = malloc(cap);
    if (out == NULL) {
        kvr_api_error(res, 503, "Busy", "out of memory");
        return;
    }
    kvr_json_init(&j, out, cap);
    kvr_json_raw(&j, "{");
    api_json_field(&j, "count", count, 1);
    kvr_json_raw(&j, is_delete ? ",\"refs\":[" : ",\"exists\":[");
    for (size_t k = 0; k < count; k++) {
        size_t klen = 0;
        int rc = kvr_key_decode(body + starts[k], lens[k], key, sizeof(key), &klen);
        if (rc != KVR_KEY_OK) {
            free(out);
            snprintf(msg, sizeof(msg), "line %zu: %s", k + 1, kvr_key_error(rc));
            kvr_api_error(res, 400, "InvalidRequest", msg);
            return;
        }
        if (k > 0)
            kvr_json_raw(&j, ",");
        if (is_delete) {
            uint32_t left = 0;
            if (kvr_api_release(a, res->ns, key, klen, &left) == KVR_OK)
                kvr_json_u64(&j, left);
            else
                kvr_json_raw(&j, "null");
        } else {
            int e = kvr_api_exists(a, res->ns, key, klen, NULL);
            prefix += e && prefix == k;
            kvr_json_raw(&j, e ? "true" : "false");
        }
    }
    kvr_json_raw(&j, "]");
    if (!is_delete)
        api_json_field(&j, "prefix", prefix, 0);
    json_send(res, &j, out);
}
