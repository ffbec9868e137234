/*
 * kvev.h — the KV events' wire form: vLLM's EventBatch in msgpack (docs/kv-events.md).
 *
 * One encoder builds one batch at a time into its own growing buffer: begin (the count of
 * events), the events, end. Three forms of the events (the batch is the same array
 * [ts, events, data_parallel_rank] in all of them):
 *   KVR_KVEV_VLLM     vLLM's positional arrays tagged by their first element (array_like=True,
 *                     the form every router parses), e.g. ["BlockRemoved", [h...], "CPU"];
 *   KVR_KVEV_VLLM_MAP vLLM's maps tagged by "type" (since vLLM PR #42892);
 *   KVR_KVEV_RFC1527  maps with Mooncake RFC #1527's fields (event_type, seq_hashes,
 *                     backend_id, tenant_id, model_name) and the vLLM aliases type/block_hashes.
 * Hashes are unsigned 64-bit integers. Nothing here does I/O.
 */
#ifndef KVR_WIRE_KVEV_H
#define KVR_WIRE_KVEV_H

#include "common.h"

#include <msgpack.h>

typedef enum { KVR_KVEV_VLLM = 0,
               KVR_KVEV_VLLM_MAP = 1,
               KVR_KVEV_RFC1527 = 2 } kvr_kvev_format_t;

/* Where the block is held: vLLM's `medium` field. */
typedef enum { KVR_KVEV_CPU = 0, /* "CPU": the arena, host memory */
               KVR_KVEV_DISK = 1 /* "DISK": the disk tier */ } kvr_kvev_medium_t;
#define KVR_KVEV_MEDIUMS 2

typedef struct {
    kvr_kvev_format_t fmt;
    uint64_t block_size;                 /* tokens per block, written in every stored event */
    const char *backend_id, *ns, *model; /* the rfc1527 fields of the batches being built */
    msgpack_sbuffer sb;
    msgpack_packer pk;
    /* vLLM's forms of BlockStored around its one hash, encoded once at init per medium (len 0:
     * none) */
    uint8_t stored_pre[64], stored_suf[KVR_KVEV_MEDIUMS][96];
    size_t stored_pre_len, stored_suf_len[KVR_KVEV_MEDIUMS];
    int failed;    /* an append ran out of memory: the batch is lost (kvr_kvev_end says so) */
    size_t events; /* announced by begin, counted down by each event (asserted at end) */
} kvr_kvev_enc_t;

/* Parses "vllm" | "vllm-map" | "rfc1527". KVR_OK or KVR_EINVAL. */
int kvr_kvev_format(const char *s, kvr_kvev_format_t *out);

void kvr_kvev_enc_init(kvr_kvev_enc_t *e, kvr_kvev_format_t fmt, uint64_t block_size, const char *backend_id);
void kvr_kvev_enc_destroy(kvr_kvev_enc_t *e);

/* Starts a batch of `events` events for the pool (ns, model), timestamped ts (seconds since the
 * epoch); the buffer of the previous batch is reused. */
void kvr_kvev_begin(kvr_kvev_enc_t *e, double ts, size_t events, const char *ns, const char *model);
void kvr_kvev_stored(kvr_kvev_enc_t *e, uint64_t hash, kvr_kvev_medium_t m);
void kvr_kvev_removed(kvr_kvev_enc_t *e, const uint64_t *hashes, size_t n, kvr_kvev_medium_t m);
void kvr_kvev_cleared(kvr_kvev_enc_t *e);
/* Ends the batch. KVR_OK with the bytes in (*data, *len), valid until the next begin; KVR_ERR when
 * memory ran out or the events written were not the count announced. */
int kvr_kvev_end(kvr_kvev_enc_t *e, const uint8_t **data, size_t *len);

/*
 * A replay request as the ROUTER socket hands it over after the requester's identity frame:
 * an empty frame, the first seq wanted (8 bytes, big-endian), and optionally the topic (vLLM's
 * requests have none: the first pool's topic). Limits: 2 or 3 frames, the seq exactly 8
 * bytes, a topic of 1 to KVR_KVEV_TOPIC_MAX bytes. KVR_OK with *from and the topic (NULL, 0
 * when absent), or KVR_EINVAL.
 */
#define KVR_KVEV_TOPIC_MAX 1024
int kvr_kvev_parse_replay(size_t nframes, const uint8_t *const *frame, const size_t *len, uint64_t *from,
                          const uint8_t **topic, size_t *topic_len);

#endif
