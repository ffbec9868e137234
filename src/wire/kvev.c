/* kvev.c — see kvev.h. The field orders are vLLM's (docs/kv-events.md names the version). */
#include "wire/kvev.h"

#include <string.h>

static const char *const medium_names[KVR_KVEV_MEDIUMS] = {"CPU", "DISK"};
#define MEDIUM (medium_names[m < KVR_KVEV_MEDIUMS ? m : 0])

int kvr_kvev_format(const char *s, kvr_kvev_format_t *out)
{
    if (strcmp(s, "vllm") == 0)
        *out = KVR_KVEV_VLLM;
    else if (strcmp(s, "vllm-map") == 0)
        *out = KVR_KVEV_VLLM_MAP;
    else if (strcmp(s, "rfc1527") == 0)
        *out = KVR_KVEV_RFC1527;
    else
        return KVR_EINVAL;
    return KVR_OK;
}

/* The packer's writer: records a failed append (out of memory) instead of losing it. */
static int enc_write(void *data, const char *buf, size_t len)
{
    kvr_kvev_enc_t *e = data;

    if (msgpack_sbuffer_write(&e->sb, buf, len) != 0)
        e->failed = 1;
    return 0;
}

static void stored_full(kvr_kvev_enc_t *e, uint64_t hash, kvr_kvev_medium_t m);

/* Encodes one BlockStored of a marker hash and keeps the bytes before and after its hash (a
 * uint64 is always 9 bytes in msgpack: 0xcf and the value), for medium m (the bytes before are
 * the same for every medium). Left empty if that fails. */
static void split_stored(kvr_kvev_enc_t *e, kvr_kvev_medium_t m)
{
    const uint64_t marker = 0xfedcba9876543210ull;
    const uint8_t *b;
    size_t n, at;

    msgpack_sbuffer_clear(&e->sb);
    e->failed = 0;
    stored_full(e, marker, m);
    b = (const uint8_t *)e->sb.data;
    n = e->sb.size;
    for (at = 0; !e->failed && b != NULL && at + 9 <= n; at++)
        if (b[at] == 0xcf && b[at + 1] == 0xfe && b[at + 8] == 0x10)
            break;
    if (!e->failed && b != NULL && at + 9 <= n && at <= sizeof(e->stored_pre) && n - at - 9 <= sizeof(e->stored_suf[m]) &&
        (m == KVR_KVEV_CPU || (at == e->stored_pre_len && memcmp(e->stored_pre, b, at) == 0))) {
        memcpy(e->stored_pre, b, at);
        e->stored_pre_len = at;
        memcpy(e->stored_suf[m], b + at + 9, n - at - 9);
        e->stored_suf_len[m] = n - at - 9;
    }
    msgpack_sbuffer_clear(&e->sb);
}

void kvr_kvev_enc_init(kvr_kvev_enc_t *e, kvr_kvev_format_t fmt, uint64_t block_size, const char *backend_id)
{
    memset(e, 0, sizeof(*e));
    e->fmt = fmt;
    e->block_size = block_size;
    e->backend_id = backend_id;
    e->ns = e->model = "";
    msgpack_sbuffer_init(&e->sb);
    msgpack_packer_init(&e->pk, e, enc_write);
    if (fmt != KVR_KVEV_RFC1527) /* the rfc1527 form names the batch's pool: no fixed bytes */
        for (int m = 0; m < KVR_KVEV_MEDIUMS; m++)
            split_stored(e, (kvr_kvev_medium_t)m);
}

void kvr_kvev_enc_destroy(kvr_kvev_enc_t *e)
{
    msgpack_sbuffer_destroy(&e->sb);
}

static void str(kvr_kvev_enc_t *e, const char *s)
{
    size_t n = strlen(s);

    msgpack_pack_str(&e->pk, n);
    msgpack_pack_str_body(&e->pk, s, n);
}

static void hashes(kvr_kvev_enc_t *e, const uint64_t *h, size_t n)
{
    msgpack_pack_array(&e->pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(&e->pk, h[i]);
}

void kvr_kvev_begin(kvr_kvev_enc_t *e, double ts, size_t events, const char *ns, const char *model)
{
    msgpack_sbuffer_clear(&e->sb);
    e->failed = 0;
    e->ns = ns;
    e->model = model;
    e->events = events;
    msgpack_pack_array(&e->pk, 3); /* EventBatch: ts, events, data_parallel_rank */
    msgpack_pack_double(&e->pk, ts);
    msgpack_pack_array(&e->pk, events);
}

/* The RFC #1527 envelope's fields common to every event: 4 pairs. */
static void envelope(kvr_kvev_enc_t *e, const char *event_type, const char *type)
{
    str(e, "event_type");
    str(e, event_type);
    str(e, "type");
    str(e, type);
    str(e, "backend_id");
    str(e, e->backend_id);
    str(e, "tenant_id");
    str(e, e->ns);
    str(e, "model_name");
    str(e, e->model);
}

/* The generic BlockStored of every form (the fast path below replays its vLLM forms). */
static void stored_full(kvr_kvev_enc_t *e, uint64_t hash, kvr_kvev_medium_t m)
{
    switch (e->fmt) {
    case KVR_KVEV_VLLM: /* tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name */
        msgpack_pack_array(&e->pk, 8);
        str(e, "BlockStored");
        hashes(e, &hash, 1);
        msgpack_pack_nil(&e->pk);
        msgpack_pack_array(&e->pk, 0);
        msgpack_pack_uint64(&e->pk, e->block_size);
        msgpack_pack_nil(&e->pk);
        str(e, MEDIUM);
        msgpack_pack_nil(&e->pk);
        return;
    case KVR_KVEV_VLLM_MAP:
        msgpack_pack_map(&e->pk, 8);
        str(e, "type");
        str(e, "BlockStored");
        str(e, "block_hashes");
        hashes(e, &hash, 1);
        str(e, "parent_block_hash");
        msgpack_pack_nil(&e->pk);
        str(e, "token_ids");
        msgpack_pack_array(&e->pk, 0);
        str(e, "block_size");
        msgpack_pack_uint64(&e->pk, e->block_size);
        str(e, "lora_id");
        msgpack_pack_nil(&e->pk);
        str(e, "medium");
        str(e, MEDIUM);
        str(e, "lora_name");
        msgpack_pack_nil(&e->pk);
        return;
    case KVR_KVEV_RFC1527:
        msgpack_pack_map(&e->pk, 9);
        envelope(e, "stored", "BlockStored");
        str(e, "seq_hashes");
        hashes(e, &hash, 1);
        str(e, "block_hashes");
        hashes(e, &hash, 1);
        str(e, "medium");
        str(e, MEDIUM);
        str(e, "block_size");
        msgpack_pack_uint64(&e->pk, e->block_size);
        return;
    }
}

void kvr_kvev_stored(kvr_kvev_enc_t *e, uint64_t hash, kvr_kvev_medium_t m)
{
    e->events--;
    if (m >= KVR_KVEV_MEDIUMS || e->stored_pre_len == 0 || e->stored_suf_len[m] == 0) {
        stored_full(e, hash, m);
        return;
    }
    /* a stored event of vLLM's forms is fixed but for its hash: the bytes before and after it
     * were encoded once (kvr_kvev_enc_init), three appends instead of a dozen */
    enc_write(e, (const char *)e->stored_pre, e->stored_pre_len);
    msgpack_pack_uint64(&e->pk, hash);
    enc_write(e, (const char *)e->stored_suf[m], e->stored_suf_len[m]);
}

void kvr_kvev_removed(kvr_kvev_enc_t *e, const uint64_t *h, size_t n, kvr_kvev_medium_t m)
{
    e->events--;
    switch (e->fmt) {
    case KVR_KVEV_VLLM: /* tag, block_hashes, medium */
        msgpack_pack_array(&e->pk, 3);
        str(e, "BlockRemoved");
        hashes(e, h, n);
        str(e, MEDIUM);
        return;
    case KVR_KVEV_VLLM_MAP:
        msgpack_pack_map(&e->pk, 3);
        str(e, "type");
        str(e, "BlockRemoved");
        str(e, "block_hashes");
        hashes(e, h, n);
        str(e, "medium");
        str(e, MEDIUM);
        return;
    case KVR_KVEV_RFC1527:
        msgpack_pack_map(&e->pk, 8);
        envelope(e, "removed", "BlockRemoved");
        str(e, "seq_hashes");
        hashes(e, h, n);
        str(e, "block_hashes");
        hashes(e, h, n);
        str(e, "medium");
        str(e, MEDIUM);
        return;
    }
}

void kvr_kvev_cleared(kvr_kvev_enc_t *e)
{
    e->events--;
    switch (e->fmt) {
    case KVR_KVEV_VLLM:
        msgpack_pack_array(&e->pk, 1);
        str(e, "AllBlocksCleared");
        return;
    case KVR_KVEV_VLLM_MAP:
        msgpack_pack_map(&e->pk, 1);
        str(e, "type");
        str(e, "AllBlocksCleared");
        return;
    case KVR_KVEV_RFC1527:
        msgpack_pack_map(&e->pk, 5);
        envelope(e, "cleared", "AllBlocksCleared");
        return;
    }
}

int kvr_kvev_end(kvr_kvev_enc_t *e, const uint8_t **data, size_t *len)
{
    msgpack_pack_int(&e->pk, 0); /* data_parallel_rank */
    if (e->failed || e->events != 0 || e->sb.data == NULL)
        return KVR_ERR;
    *data = (const uint8_t *)e->sb.data;
    *len = e->sb.size;
    return KVR_OK;
}

int kvr_kvev_parse_replay(size_t nframes, const uint8_t *const *frame, const size_t *len, uint64_t *from,
                          const uint8_t **topic, size_t *topic_len)
{
    uint64_t v = 0;

    if ((nframes != 2 && nframes != 3) || len[0] != 0 || len[1] != 8)
        return KVR_EINVAL;
    if (nframes == 3 && (len[2] == 0 || len[2] > KVR_KVEV_TOPIC_MAX))
        return KVR_EINVAL;
    for (int i = 0; i < 8; i++)
        v = v << 8 | frame[1][i];
    *from = v;
    *topic = nframes == 3 ? frame[2] : NULL;
    *topic_len = nframes == 3 ? len[2] : 0;
    return KVR_OK;
}
