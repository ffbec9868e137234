/*
 * api_int.h — what api.c (routing, single-block handlers, accounting) and api_batch.c (the
 * batch endpoints) share; nothing else includes it (api.h is the request layer's API).
 */
#ifndef KVR_IO_API_INT_H
#define KVR_IO_API_INT_H

#include "io/api.h"

#include "wire/json.h"

/* api_auth.c: the tenants view of this worker (lives as long as the worker); who is asking (sets res->ns and res->admin; 0
 * when the token is missing or unknown); a namespace's name (NULL: never used); whether
 * --tenants is on; whether the table in force lists a namespace. */
int kvr_api_auth_init(kvr_api_t *a);
int kvr_api_authorize(kvr_api_t *a, const kvr_api_req_t *rq, kvr_api_res_t *res);
const char *kvr_api_ns_name(kvr_api_t *a, uint16_t ns);
/* The namespace's model= of the tenants file, or NULL. */
const char *kvr_api_ns_model(kvr_api_t *a, uint16_t ns);
/* This worker's memory of namespace ns's default-model pool under the tenants table in force
 * (a reload may change model=): the pool, or -1; and its setter. */
int kvr_api_default_pool(kvr_api_t *a, uint16_t ns);
void kvr_api_default_pool_set(kvr_api_t *a, uint16_t ns, uint32_t pool);
/* The model of a request's relay pool (docs/tenancy.md, "Pools"): X-KV-Model, else namespace ns's
 * model=, else --model. Without X-KV-Model, the remembered default pool is returned (>= 0) when
 * there is one; otherwise -1 with the model in *m, *mlen (not NUL-terminated when a header). */
int kvr_api_request_model(kvr_api_t *a, const kvr_api_req_t *rq, uint16_t ns, const char **m, size_t *mlen);
uint64_t kvr_api_ns_quota(kvr_api_t *a, uint16_t ns);
int kvr_api_tenants_on(const kvr_api_t *a);
int kvr_api_ns_listed(kvr_api_t *a, uint16_t ns);

/* Sets the status and its reason phrase. */
void kvr_api_set_status(kvr_api_res_t *res, int status);

/* A 200 with a body on the heap, buf, which kvr_api_done frees. */
void kvr_api_send_heap(kvr_api_res_t *res, char *buf, size_t len, const char *ctype);

/* A batch GET's answer (api_batch.c): the spans of its framed body from off on, at most max;
 * and the release of its pins, once it is sent or abandoned. */
size_t kvr_api_multi_iov(kvr_api_t *a, const struct kvr_api_multi_s *m, uint64_t off, struct iovec *iov, size_t max);
void kvr_api_multi_release(kvr_api_t *a, kvr_api_res_t *res);

/* POST /batch/lookup's head (api_batch.c): its body bound and X-KV-Model, answered here; 0 when
 * the head passes, -1 after an error answer. */
int kvr_api_lookup_head(const kvr_api_req_t *rq, kvr_api_res_t *res);

/* "name":v, after a comma unless first. */
static inline void api_json_field(kvr_json_t *j, const char *name, uint64_t v, int first)
{
    kvr_json_key(j, name, first);
    kvr_json_u64(j, v);
}

/* A pinned block (res->ref) as the response: 200 with its bytes from the segment. */
static inline void api_send_pinned(kvr_api_res_t *res)
{
    res->pinned = 1;
    res->body = KVR_API_BODY_BLOCK;
    res->length = res->ref.length;
    res->ctype = "application/octet-stream";
    kvr_api_set_status(res, 200);
}

/* GET of a key that missed in RAM: 1 when the disk tier holds it and a read is set up (res->dk;
 * or an error answered, such as 503 when too many reads are in flight), 0 when it does not. */
int kvr_api_disk_get(kvr_api_t *a, kvr_api_res_t *res, const uint8_t *key, size_t klen);

/* A key in RAM or in the disk tier, answered without touching the disk (*len: the payload's
 * length; HEAD, /exists, batch exists). */
int kvr_api_exists(kvr_api_t *a, uint16_t ns, const uint8_t *key, size_t klen, uint64_t *len);
/* A DELETE: one reference less in RAM (kvr_store_release), and with the last one the disk
 * copy goes too, after the RAM copy (docs/concurrency.md, "The disk index"). KVR_OK when either
 * tier held the key (*left: references left), KVR_ENOTFOUND, or the store's error. */
int kvr_api_release(kvr_api_t *a, uint16_t ns, const uint8_t *key, size_t klen, uint32_t *left);

/* /kv/stats' disk tier fields (disk_blocks, disk_bytes), when the tier is on: of namespace ns, or
 * of all (ns < 0). */
void kvr_api_disk_stats(kvr_api_t *a, kvr_json_t *j, int ns);

#endif
