/*
 * mirror.c — consumer CKF replica fed by FilterUpdate frames (docs/relay-contract.md §6).
 *
 * Every frame is checked completely before anything is written: envelope identity, then
 * kind-specific sequencing (§5.1: chunks base == seq == N; deltas N -> N+1 on the
 * installed N; heartbeats N/N with an empty payload), then the CBI1 payload (§4.2
 * through kvr_cbi1_decode against the subscribed seed/bucket_count), then the
 * consumer checks of §6 (dc_id, epoch == sequence, base_epoch == base_sequence).
 * Chunks are assembled straight into the replica's bucket array, which stays hidden
 * until the snapshot completes; any failure moves to FAILED and hides it again.
 */
#include <stdlib.h>

#include "common.h"
#include "wire/mirror.h"

int kvr_mirror_init(kvr_mirror_t *m, uint64_t seed, uint64_t bucket_count, uint64_t dc_id)
{
    memset(m, 0, sizeof(*m));
    if (!kvr_ckf_valid_bucket_count(bucket_count))
        return KVR_EINVAL;
    m->buckets = calloc((size_t)bucket_count, sizeof(uint64_t));
    if (!m->buckets)
        return KVR_ERR;
    m->seed = seed;
    m->bucket_count = bucket_count;
    m->dc_id = dc_id;
    kvr_ckf_addr_init(&m->addr, seed, bucket_count);
    kvr_cbi1_asm_init(&m->assembly, m->buckets, bucket_count);
    m->state = KVR_MIRROR_EMPTY;
    return KVR_OK;
}

void kvr_mirror_destroy(kvr_mirror_t *m)
{
    free(m->buckets);
    m->buckets = NULL;
    m->state = KVR_MIRROR_FAILED;
}

void kvr_mirror_reset(kvr_mirror_t *m)
{
    kvr_cbi1_asm_reset(&m->assembly);
    m->state = KVR_MIRROR_EMPTY;
    m->sequence = 0;
    m->last_error = 0;
}

/* Decodes the payload and runs the consumer checks (docs/relay-contract.md §6) shared by
 * chunks and deltas. */
static int decode_checked(const kvr_mirror_t *m, const kvr_mirror_update_t *u,
                          uint16_t want_flags, kvr_cbi1_frame_t *f)
{
    int rc = kvr_cbi1_decode(u->payload, u->payload_len, m->seed, m->bucket_count, f);
    if (rc != KVR_CBI1_OK)
        return rc;
    if (f->flags != want_flags)
        return KVR_MIRROR_E_KIND_FLAGS;
    if (f->hdr.dc_id != m->dc_id)
        return KVR_MIRROR_E_DC_ID;
    if (f->hdr.epoch != u->sequence)
        return KVR_MIRROR_E_EPOCH;
    return KVR_MIRROR_OK;
}

static int apply_chunk(kvr_mirror_t *m, const kvr_mirror_update_t *u)
{
    if (m->state == KVR_MIRROR_LIVE)
        return KVR_MIRROR_E_CHUNK_AFTER_LIVE;
    if (u->base_sequence != u->sequence)
        return KVR_MIRROR_E_CHUNK_BASE;
    kvr_cbi1_frame_t f;
    int rc = decode_checked(m, u, KVR_CBI1_FLAG_SNAPSHOT_CHUNK, &f);
    if (rc != KVR_MIRROR_OK)
        return rc;
    rc = kvr_cbi1_asm_feed(&m->assembly, &f);
    if (rc == KVR_CBI1_OK) {
        m->state = KVR_MIRROR_ASSEMBLING;
        return KVR_MIRROR_OK;
    }
    if (rc == KVR_CBI1_COMPLETE) {
        m->state = KVR_MIRROR_LIVE;
        m->sequence = m->assembly.epoch;
        return KVR_MIRROR_OK;
    }
    return rc;
}

static int apply_delta(kvr_mirror_t *m, const kvr_mirror_update_t *u)
{
    if (m->state == KVR_MIRROR_EMPTY)
        return KVR_MIRROR_E_DELTA_NO_SNAPSHOT;
    if (m->state == KVR_MIRROR_ASSEMBLING)
        return KVR_MIRROR_E_DELTA_ASSEMBLING;
    if (u->base_sequence < m->sequence)
        return KVR_MIRROR_E_REPEAT;
    if (u->base_sequence > m->sequence)
        return KVR_MIRROR_E_GAP;
    if (u->base_sequence == UINT64_MAX || u->sequence != u->base_sequence + 1)
        return KVR_MIRROR_E_DELTA_SEQUENCE;
    kvr_cbi1_frame_t f;
    int rc = decode_checked(m, u, KVR_CBI1_FLAG_DELTA, &f);
    if (rc != KVR_MIRROR_OK)
        return rc;
    if (f.base_epoch != u->base_sequence)
        return KVR_MIRROR_E_BASE_EPOCH;
    kvr_cbi1_apply_delta(&f, m->buckets);
    m->sequence = u->sequence;
    return KVR_MIRROR_OK;
}

static int apply_heartbeat(const kvr_mirror_t *m, const kvr_mirror_update_t *u)
{
    if (u->payload_len != 0)
        return KVR_MIRROR_E_HEARTBEAT_PAYLOAD;
    if (m->state != KVR_MIRROR_LIVE)
        return KVR_MIRROR_E_HEARTBEAT_EARLY;
    if (u->base_sequence != u->sequence || u->sequence != m->sequence)
        return KVR_MIRROR_E_HEARTBEAT_SEQUENCE;
    return KVR_MIRROR_OK;
}

int kvr_mirror_apply(kvr_mirror_t *m, const kvr_mirror_update_t *u)
{
    if (m->state == KVR_MIRROR_FAILED)
        return KVR_MIRROR_E_FAILED;
    int rc;
    if (u->seed != m->seed || u->bucket_count != m->bucket_count || u->dc_id != m->dc_id)
        rc = KVR_MIRROR_E_PRODUCER;
    else if (u->kind == KVR_FILTER_UPDATE_SNAPSHOT_CHUNK)
        rc = apply_chunk(m, u);
    else if (u->kind == KVR_FILTER_UPDATE_DELTA)
        rc = apply_delta(m, u);
    else if (u->kind == KVR_FILTER_UPDATE_HEARTBEAT)
        rc = apply_heartbeat(m, u);
    else
        rc = KVR_MIRROR_E_KIND;
    if (rc != KVR_MIRROR_OK) {
        kvr_cbi1_asm_reset(&m->assembly);
        m->state = KVR_MIRROR_FAILED;
        m->last_error = rc;
    }
    return rc;
}

int kvr_mirror_contains(const kvr_mirror_t *m, uint64_t h)
{
    if (m->state != KVR_MIRROR_LIVE)
        return 0;
    return kvr_ckf_lookup(m->buckets, &m->addr, h);
}

const char *kvr_mirror_strerror(int status)
{
    static const char *const names[] = {
        "KVR_MIRROR_E_FAILED",
        "KVR_MIRROR_E_PRODUCER",
        "KVR_MIRROR_E_KIND",
        "KVR_MIRROR_E_KIND_FLAGS",
        "KVR_MIRROR_E_DC_ID",
        "KVR_MIRROR_E_EPOCH",
        "KVR_MIRROR_E_BASE_EPOCH",
        "KVR_MIRROR_E_CHUNK_BASE",
        "KVR_MIRROR_E_CHUNK_AFTER_LIVE",
        "KVR_MIRROR_E_DELTA_NO_SNAPSHOT",
        "KVR_MIRROR_E_DELTA_ASSEMBLING",
        "KVR_MIRROR_E_GAP",
        "KVR_MIRROR_E_REPEAT",
        "KVR_MIRROR_E_DELTA_SEQUENCE",
        "KVR_MIRROR_E_HEARTBEAT_PAYLOAD",
        "KVR_MIRROR_E_HEARTBEAT_EARLY",
        "KVR_MIRROR_E_HEARTBEAT_SEQUENCE",
    };
    if (status == KVR_MIRROR_OK)
        return "KVR_MIRROR_OK";
    if (status <= KVR_MIRROR_E_FAILED && status > KVR_MIRROR_E_FAILED - (int)KVR_ARRAY_SIZE(names))
        return names[KVR_MIRROR_E_FAILED - status];
    return kvr_cbi1_strerror(status);
}
