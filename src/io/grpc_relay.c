/*
 * grpc_relay.c — dynamo.kvrelay.v1.KvEventRelay (docs/relay-contract.md) as a table of RPCs,
 * one entry per method at the end of this file. Every call is validated (marker, protocol
 * version, subscriber id: docs/relay-contract.md, "Transport and service"), streams are
 * admitted against --max-streams, then each method answers (GetRelayInfo) or streams:
 *   WatchKvPoolCatalog         the caller's pools (one per namespace and model; the admin's:
 *                              all), at once and on every revision change
 *   SubscribeKvPool            snapshot chunks from a publisher snapshot copy, then the
 *                              published deltas from the shared frame ring, heartbeats
 *   SubscribeServingReadiness  an empty, complete topology, repeated every interval
 *   SubscribeKvPoolLoad        one window per --load-window
 *   SubscribeServingLoad       the caller's pools with status UNAVAILABLE, one window per interval
 * A pool of another namespace than the caller's token ends PERMISSION_DENIED (docs/tenancy.md).
 * Shared relay state is reached only through core/relay.h.
 */
#include "io/grpc_int.h"

#include "base/clock.h"

#include "shm/stats.h"
#include "wire/cbi1.h"
#include "wire/relay_validate.h"

#include <stdio.h>

static_assert(KVR_ST_KVEV - KVR_ST_RELAY_OPENED == KVR_STREAM_TYPES, "streams opened: one slot per type");

#define DELTA_BATCH_MAX (64u << 10)   /* delta bytes taken from the ring per refill, at most */
#define LOAD_LAG_MAX    (16u * 4096u) /* queued load-window bytes at which a subscriber lags */

static void relay_stat(kvr_grpc_t *g, unsigned i, uint64_t v)
{
    kvr_stat_add(g->store->my_stats, KVR_ST_RELAY + i, v);
}

/* ------------------------------------------------------------------ messages */

static void relay_identity(kvr_grpc_t *g, Dynamo__Kvrelay__V1__RelayIdentity *r)
{
    dynamo__kvrelay__v1__relay_identity__init(r);
    r->drt_instance_id = 0;
    r->relay_incarnation = kvr_relay_incarnation(g->relay);
}

/* The pools this stream may see, in id order, into ids (room for KVR_POOLS_MAX): every pool the
 * publisher has taken on, or only its namespace's (gstream_t.scope). */
static uint32_t visible_pools(gstream_t *s, uint32_t *ids)
{
    kvr_grpc_t *g = s->conn->g;
    uint32_t n = kvr_relay_pools_ready(g->relay), k = 0;

    for (uint32_t i = 0; i < n && i < KVR_POOLS_MAX; i++) {
        kvr_pool_info_t pi;
        if (kvr_store_pool_info(g->store, i, &pi) == KVR_OK && (s->scope < 0 || pi.ns == (uint32_t)s->scope))
            ids[k++] = i;
    }
    return k;
}

/* A catalog descriptor's storage, one per pool (a catalog may list KVR_POOLS_MAX of them). */
typedef struct {
    kvr_relay_ident_t id;
    Dynamo__Kvrelay__V1__KvPoolDescriptor desc;
    Dynamo__Kvrelay__V1__DynamoEndpointId ep;
    Dynamo__Kvrelay__V1__ModelRegistration reg, *regs[1];
    Dynamo__Kvrelay__V1__ModelTarget target;
    Dynamo__Kvrelay__V1__BaseModelTarget base;
    Dynamo__Kvrelay__V1__KvQuerySemantics qs;
    Dynamo__Kvrelay__V1__WorkerRole roles[1];
    char ns[KVR_ENDPOINT_NS_MAX], comp[KVR_CFG_STR_MAX], epn[KVR_CFG_STR_MAX];
} catalog_pool_t;

static void describe_pool(kvr_grpc_t *g, uint32_t pool, uint64_t gen, catalog_pool_t *c)
{
    const kvr_config_t *cfg = g->cfg;
    kvr_pool_info_t slot;

    dynamo__kvrelay__v1__kv_pool_descriptor__init(&c->desc);
    dynamo__kvrelay__v1__dynamo_endpoint_id__init(&c->ep);
    dynamo__kvrelay__v1__model_registration__init(&c->reg);
    dynamo__kvrelay__v1__model_target__init(&c->target);
    dynamo__kvrelay__v1__base_model_target__init(&c->base);
    dynamo__kvrelay__v1__kv_query_semantics__init(&c->qs);
    kvr_relay_ident(g->relay, pool, gen, &c->id);
    if (kvr_store_pool_info(g->store, pool, &slot) != KVR_OK) /* listed: never */
        slot.ns_name = slot.model = "";
    if (kvr_relay_pool_endpoint(cfg, slot.ns_name, c->ns, c->comp, c->epn) != KVR_OK)
        c->ns[0] = c->comp[0] = c->epn[0] = '\0'; /* --endpoint was checked at the start: never */
    c->ep.namespace_ = c->ns;
    c->ep.component = c->comp;
    c->ep.endpoint = c->epn;
    c->base.base_model = (char *)slot.model;
    c->target.target_case = DYNAMO__KVRELAY__V1__MODEL_TARGET__TARGET_BASE;
    c->target.base = &c->base;
    c->reg.canonical_model_id = (char *)slot.model;
    c->reg.target = &c->target;
    c->regs[0] = &c->reg;
    c->qs.kv_block_size = (uint32_t)cfg->kv_block_size;
    c->qs.hash_format = !strcmp(cfg->hash_format, "eagle")
                          ? DYNAMO__KVRELAY__V1__KV_QUERY_HASH_FORMAT__KV_QUERY_HASH_FORMAT_DYNAMO_EAGLE_V1
                          : DYNAMO__KVRELAY__V1__KV_QUERY_HASH_FORMAT__KV_QUERY_HASH_FORMAT_DYNAMO_STANDARD_V1;
    c->roles[0] = DYNAMO__KVRELAY__V1__WORKER_ROLE__WORKER_ROLE_LEGACY;
    c->desc.producer = &c->id.producer;
    c->desc.serving_endpoint = &c->ep;
    c->desc.n_registrations = 1;
    c->desc.registrations = c->regs;
    c->desc.query_semantics = &c->qs;
    c->desc.n_pool_roles = 1;
    c->desc.pool_roles = c->roles;
}

/* What a catalog of this stream lists, to compare with what it sent (sent_view): the generation,
 * whether the publisher runs, and a bit per listed pool. Returns the number of pools, in ids. */
static uint32_t catalog_view(gstream_t *s, uint64_t view[2 + KVR_POOLS_MAX / 64], uint32_t *ids)
{
    kvr_grpc_t *g = s->conn->g;
    uint32_t n = 0;

    memset(view, 0, sizeof(s->sent_view));
    view[0] = kvr_relay_generation(g->relay);
    view[1] = kvr_seg_publisher_up(g->seg);
    if (view[0] != 0 && view[1])
        n = visible_pools(s, ids);
    for (uint32_t k = 0; k < n; k++)
        view[2 + ids[k] / 64] |= 1ull << (ids[k] % 64);
    return n;
}

static void emit_catalog(gstream_t *s)
{
    kvr_grpc_t *g = s->conn->g;
    /* The revision first, then what it covers (the generation, the pools taken on, whether
     * the publisher runs): every writer changes those before it bumps the revision, so what
     * we send is at least as new as the revision we send it under, and a later change shows as
     * a revision that tick_catalog has not sent. */
    uint64_t rev = kvr_relay_catalog_revision(g->relay);
    uint64_t view[2 + KVR_POOLS_MAX / 64];
    Dynamo__Kvrelay__V1__KvPoolCatalogUpdate up = DYNAMO__KVRELAY__V1__KV_POOL_CATALOG_UPDATE__INIT;
    Dynamo__Kvrelay__V1__RelayIdentity rel;
    Dynamo__Kvrelay__V1__KvPoolCatalogSnapshot snap = DYNAMO__KVRELAY__V1__KV_POOL_CATALOG_SNAPSHOT__INIT;
    Dynamo__Kvrelay__V1__KvPoolDescriptor *descs[KVR_POOLS_MAX];
    uint32_t ids[KVR_POOLS_MAX], n = catalog_view(s, view, ids);
    catalog_pool_t *c = NULL;

    relay_identity(g, &rel);
    up.protocol_version = KVR_RELAY_PROTOCOL_VERSION;
    up.relay = &rel;
    s->sent_revision = rev;
    up.revision = rev;
    up.snapshot = &snap;
    up.contract_marker = KVR_RELAY_CONTRACT_MARKER;
    memcpy(s->sent_view, view, sizeof(view));
    if (n > 0 && (c = malloc(n * sizeof(*c))) == NULL) {
        kvr_grpc_stream_end(s, KVR_GRPC_RESOURCE_EXHAUSTED, KVR_RELAY_REASON_INTERNAL, "out of memory");
        return;
    }
    for (uint32_t k = 0; c != NULL && k < n; k++) {
        describe_pool(g, ids[k], view[0], &c[k]);
        descs[k] = &c[k].desc;
    }
    snap.n_pools = c != NULL ? n : 0;
    snap.pools = descs;
    kvr_grpc_out_message(s, &up.base);
    free(c);
}

/* Sends a load window: KvPoolLoadUpdate and ServingLoadUpdate have the same header and pool
 * fields, set alike here (a macro: they are two message types); pools_ are the n_ visible
 * pools' entries (none before the first generation). */
#define SEND_WINDOW(up, s, rel, pools_, n_) \
    do { \
        (up).protocol_version = KVR_RELAY_PROTOCOL_VERSION; \
        (up).relay = (rel); \
        (up).window_sequence = (s)->window_seq++; \
        (up).observed_ms = kvr_clock_wall_us() / 1000; \
        (up).window_ms = (s)->conn->g->cfg->load_window_ms; \
        (up).contract_marker = KVR_RELAY_CONTRACT_MARKER; \
        (up).n_pools = (n_); \
        (up).pools = (pools_); \
        kvr_grpc_out_message((s), &(up).base); \
        relay_stat((s)->conn->g, KVR_RC_LOAD_WINDOWS, 1); \
    } while (0)

/* One visible pool's storage in a load window (either message type). */
typedef struct {
    kvr_relay_ident_t id;
    Dynamo__Kvrelay__V1__KvPoolLoadEntry load;
    Dynamo__Kvrelay__V1__PoolServingLoad serving;
} window_pool_t;

/* The stream's visible pools, each with its identity, in a heap array (the caller frees it);
 * *n their count. NULL with *n 0 when none is visible; NULL with *n 1 when out of memory. */
static window_pool_t *window_pools(gstream_t *s, uint64_t gen, uint32_t *n)
{
    uint32_t ids[KVR_POOLS_MAX];
    window_pool_t *w;

    *n = gen != 0 ? visible_pools(s, ids) : 0;
    if (*n == 0)
        return NULL;
    w = malloc(*n * sizeof(*w));
    if (w == NULL)
        return NULL;
    for (uint32_t k = 0; k < *n; k++) {
        kvr_relay_ident(s->conn->g->relay, ids[k], gen, &w[k].id);
        dynamo__kvrelay__v1__kv_pool_load_entry__init(&w[k].load);
        dynamo__kvrelay__v1__pool_serving_load__init(&w[k].serving);
        w[k].load.producer = w[k].serving.producer = &w[k].id.producer;
        w[k].load.kv_used_blocks = kvr_relay_pool_blocks(s->conn->g->relay, ids[k]);
    }
    return w;
}

static void emit_load(gstream_t *s)
{
    kvr_grpc_t *g = s->conn->g;
    uint64_t gen = kvr_relay_generation(g->relay);
    Dynamo__Kvrelay__V1__KvPoolLoadUpdate up = DYNAMO__KVRELAY__V1__KV_POOL_LOAD_UPDATE__INIT;
    Dynamo__Kvrelay__V1__KvPoolLoadEntry *es[KVR_POOLS_MAX];
    Dynamo__Kvrelay__V1__RelayIdentity rel;
    kvr_seg_status_t ss;
    uint32_t n;
    window_pool_t *w = window_pools(s, gen, &n);

    if (w == NULL && n > 0) {
        kvr_grpc_stream_end(s, KVR_GRPC_RESOURCE_EXHAUSTED, KVR_RELAY_REASON_INTERNAL, "out of memory");
        return;
    }
    relay_identity(g, &rel);
    kvr_seg_status(g->seg, &ss);
    for (uint32_t k = 0; k < n; k++) {
        w[k].load.total_kv_blocks = ss.max_blocks;
        w[k].load.kv_observed_ranks = 1;
        w[k].load.kv_expected_ranks = 1;
        es[k] = &w[k].load;
    }
    SEND_WINDOW(up, s, &rel, es, n);
    free(w);
}

static void emit_serving_load(gstream_t *s)
{
    kvr_grpc_t *g = s->conn->g;
    uint64_t gen = kvr_relay_generation(g->relay);
    Dynamo__Kvrelay__V1__ServingLoadUpdate up = DYNAMO__KVRELAY__V1__SERVING_LOAD_UPDATE__INIT;
    Dynamo__Kvrelay__V1__PoolServingLoad *ps[KVR_POOLS_MAX];
    Dynamo__Kvrelay__V1__LoadView lv = DYNAMO__KVRELAY__V1__LOAD_VIEW__INIT;
    Dynamo__Kvrelay__V1__TokenLoadStats tok = DYNAMO__KVRELAY__V1__TOKEN_LOAD_STATS__INIT;
    Dynamo__Kvrelay__V1__PoolDeploymentStatus dep = DYNAMO__KVRELAY__V1__POOL_DEPLOYMENT_STATUS__INIT;
    Dynamo__Kvrelay__V1__RelayIdentity rel;
    uint32_t n;
    window_pool_t *w = window_pools(s, gen, &n);

    if (w == NULL && n > 0) {
        kvr_grpc_stream_end(s, KVR_GRPC_RESOURCE_EXHAUSTED, KVR_RELAY_REASON_INTERNAL, "out of memory");
        return;
    }
    relay_identity(g, &rel);
    lv.tokens = &tok; /* no gauges: UNAVAILABLE */
    lv.status = DYNAMO__KVRELAY__V1__DATA_STATUS__DATA_STATUS_UNAVAILABLE;
    for (uint32_t k = 0; k < n; k++) {
        w[k].serving.load = &lv;
        w[k].serving.deployment = &dep;
        ps[k] = &w[k].serving;
    }
    SEND_WINDOW(up, s, &rel, ps, n);
    free(w);
}

static void emit_readiness(gstream_t *s)
{
    kvr_grpc_t *g = s->conn->g;
    Dynamo__Kvrelay__V1__ServingReadinessUpdate up = DYNAMO__KVRELAY__V1__SERVING_READINESS_UPDATE__INIT;
    Dynamo__Kvrelay__V1__RelayIdentity rel;

    relay_identity(g, &rel);
    up.protocol_version = KVR_RELAY_PROTOCOL_VERSION;
    up.relay = &rel;
    up.revision = 1; /* kvrelay serves no models: the topology never changes */
    up.contract_marker = KVR_RELAY_CONTRACT_MARKER;
    kvr_grpc_out_message(s, &up.base);
}

static void emit_heartbeat(gstream_t *s)
{
    uint8_t buf[KVR_RELAY_ENVELOPE_MAX], *payload;
    size_t len = kvr_relay_filter_update(s->conn->g->relay, s->pool, s->generation, s->last_seq, s->last_seq,
                                         DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_HEARTBEAT, 0,
                                         buf, sizeof(buf), &payload);
    if (len == 0 || kvr_grpc_out_reserve(s, len) != KVR_OK)
        return;
    memcpy(s->out + s->out_len, buf, len);
    s->out_len += len;
    s->last_send_ms = kvr_clock_ms();
    relay_stat(s->conn->g, KVR_RC_HEARTBEATS, 1);
}

/* ------------------------------------------------------------------ pool streams */

static void pool_fail(gstream_t *s, int reason, const char *msg)
{
    if (reason == KVR_RELAY_REASON_SUBSCRIBER_LAGGED)
        relay_stat(s->conn->g, KVR_RC_LAGGED, 1);
    kvr_grpc_stream_end(s, kvr_relay_reason_grpc(reason), reason, msg);
}

static void pool_release(gstream_t *s)
{
    if (s->sub >= 0) {
        kvr_relay_sub_close(s->conn->g->relay, s->sub);
        s->sub = -1;
    }
}

/* One snapshot chunk into the stream's output; the last one starts the deltas. */
static void pool_snapshot_chunk(gstream_t *s)
{
    kvr_grpc_t *g = s->conn->g;
    size_t cap = kvr_relay_chunk_msg_max(g->relay), len;

    if (kvr_grpc_out_reserve(s, cap) != KVR_OK) {
        pool_fail(s, KVR_RELAY_REASON_INTERNAL, "out of memory");
        return;
    }
    len = kvr_relay_sub_chunk(g->relay, s->sub, s->next_chunk, s->out + s->out_len, cap);
    if (len == 0) {
        pool_fail(s, KVR_RELAY_REASON_INTERNAL, "snapshot encoding failed");
        return;
    }
    s->out_len += len;
    relay_stat(g, KVR_RC_FRAMES, 1);
    relay_stat(g, KVR_RC_BYTES, len);
    if (++s->next_chunk == s->chunk_count) {
        s->phase = PH_DELTAS;
        s->last_seq = s->snap_seq;
    }
    s->last_send_ms = kvr_clock_ms();
}

/* Published frames from the ring into the stream's output, up to `budget` queued bytes. */
static void pool_deltas(gstream_t *s, size_t budget)
{
    kvr_grpc_t *g = s->conn->g;

    if (budget > DELTA_BATCH_MAX)
        budget = DELTA_BATCH_MAX;
    while (budget > 0 && s->out_len - s->out_off < budget) {
        uint64_t seq;
        ssize_t n;
        if (kvr_grpc_out_reserve(s, KVR_CBI1_MAX_FRAME + KVR_RELAY_ENVELOPE_MAX) != KVR_OK)
            return;
        n = kvr_relay_sub_next_frame(g->relay, s->sub, s->out + s->out_len, s->out_cap - s->out_len, &seq);
        if (n == 0)
            break;
        if (n < 0) {
            pool_release(s);
            pool_fail(s, KVR_RELAY_REASON_SUBSCRIBER_LAGGED, "subscriber lagged behind the publication");
            return;
        }
        s->out_len += (size_t)n;
        s->last_seq = seq;
        s->last_send_ms = kvr_clock_ms();
        relay_stat(g, KVR_RC_FRAMES, 1);
        relay_stat(g, KVR_RC_BYTES, (uint64_t)n);
    }
}

/*
 * Moves a pool stream forward: admission, snapshot chunks, deltas. Deltas leave the shared
 * ring only as far as `budget` (what HTTP/2 flow control lets us send right now): frames a
 * subscriber has not taken stay in the ring, where the publisher counts them against the
 * 16-frame / 16 MiB bound (docs/relay-contract.md, "A pool stream") — a buffer here would
 * hide a slow reader from that count.
 * budget 0 only checks the subscription's state.
 */
static void pool_refill(gstream_t *s, size_t budget)
{
    kvr_relay_sub_view_t v;
    kvr_relay_poll_t st;

    if (s->sub < 0)
        return;
    st = kvr_relay_sub_poll(s->conn->g->relay, s->sub, &v);
    if (st == KVR_SUBP_CLOSED) {
        int reason = v.reason;
        pool_release(s);
        pool_fail(s, reason ? reason : KVR_RELAY_REASON_PUBLICATION_UNAVAILABLE,
                  reason == KVR_RELAY_REASON_SUBSCRIBER_LAGGED  ? "subscriber lagged behind the publication"
                  : reason == KVR_RELAY_REASON_PRODUCER_CHANGED ? "the expected producer is no longer active"
                                                                : "publication unavailable");
        return;
    }
    if (st == KVR_SUBP_RETIRED) {
        pool_release(s);
        pool_fail(s, KVR_RELAY_REASON_PUBLICATION_UNAVAILABLE, "the producer generation was retired");
        return;
    }
    if (s->phase == PH_WAIT_ADMIT) {
        if (st != KVR_SUBP_LIVE)
            return;
        s->snap_seq = v.snap_seq;
        s->chunk_count = v.chunk_count;
        s->next_chunk = 0;
        s->phase = PH_SNAPSHOT;
        s->progress_ms = kvr_clock_ms();
    }
    if (s->phase == PH_SNAPSHOT)
        pool_snapshot_chunk(s);
    else if (s->phase == PH_DELTAS)
        pool_deltas(s, budget);
}

/* ------------------------------------------------------------------ calls */

/* Validation (docs/relay-contract.md, "Transport and service") and, for a stream, its admission permit. 0: the call has ended; else
 * *req is the decoded request (the caller frees it). */
static int relay_begin(gstream_t *s, const uint8_t *msg, size_t len, int stream_type, ProtobufCMessage **req)
{
    kvr_grpc_t *g = s->conn->g;
    kvr_relay_verdict_t v;

    *req = NULL;
    v = kvr_relay_validate_request((kvr_relay_rpc_t)s->method->rpc, msg, len, req);
    if (v.grpc_status != KVR_GRPC_OK) {
        if (*req != NULL)
            protobuf_c_message_free_unpacked(*req, NULL);
        kvr_grpc_stream_end(s, v.grpc_status, v.reason, v.message);
        return 0;
    }
    if (stream_type >= 0) {
        if (!kvr_relay_admit(g->relay, stream_type, g->store->slot, (uint32_t)g->cfg->max_streams)) {
            protobuf_c_message_free_unpacked(*req, NULL);
            relay_stat(g, KVR_RC_REJECTED, 1);
            kvr_grpc_stream_end(s, KVR_GRPC_RESOURCE_EXHAUSTED, KVR_RELAY_REASON_RESOURCE_LIMIT,
                                "Relay stream limit reached");
            return 0;
        }
        s->admitted = stream_type;
        relay_stat(g, KVR_RC_STREAMS_OPENED, 1);
        kvr_stat_add(g->store->my_stats, KVR_ST_RELAY_OPENED + (unsigned)stream_type, 1);
    }
    return 1;
}

static void call_relay_info(gstream_t *s, const uint8_t *msg, size_t len)
{
    Dynamo__Kvrelay__V1__RelayInfo info = DYNAMO__KVRELAY__V1__RELAY_INFO__INIT;
    Dynamo__Kvrelay__V1__RelayIdentity rel;
    ProtobufCMessage *req;

    if (!relay_begin(s, msg, len, -1, &req))
        return;
    relay_identity(s->conn->g, &rel);
    info.protocol_version = KVR_RELAY_PROTOCOL_VERSION;
    info.relay = &rel;
    info.contract_marker = KVR_RELAY_CONTRACT_MARKER;
    kvr_grpc_out_message(s, &info.base);
    kvr_grpc_send_headers(s);
    kvr_grpc_stream_end(s, KVR_GRPC_OK, 0, NULL);
    protobuf_c_message_free_unpacked(req, NULL);
}

/* A stream that answers at once with its first message, then every interval_ms. */
static void start_periodic(gstream_t *s, const uint8_t *msg, size_t len, int stream_type,
                           void (*emit)(gstream_t *), uint64_t interval_ms)
{
    ProtobufCMessage *req;

    if (!relay_begin(s, msg, len, stream_type, &req))
        return;
    emit(s);
    s->phase = PH_PERIODIC;
    s->next_emit_ms = kvr_clock_ms() + interval_ms;
    kvr_grpc_send_headers(s);
    protobuf_c_message_free_unpacked(req, NULL);
}

static void call_catalog(gstream_t *s, const uint8_t *msg, size_t len)
{
    start_periodic(s, msg, len, KVR_STREAM_CATALOG, emit_catalog, 0); /* then on every revision change */
}

static void call_readiness(gstream_t *s, const uint8_t *msg, size_t len)
{
    start_periodic(s, msg, len, KVR_STREAM_READINESS, emit_readiness, s->conn->g->cfg->readiness_heartbeat_ms);
}

static void call_load(gstream_t *s, const uint8_t *msg, size_t len)
{
    start_periodic(s, msg, len, KVR_STREAM_LOAD, emit_load, s->conn->g->cfg->load_window_ms);
}

static void call_serving_load(gstream_t *s, const uint8_t *msg, size_t len)
{
    start_periodic(s, msg, len, KVR_STREAM_SERVING_LOAD, emit_serving_load, s->conn->g->cfg->load_window_ms);
}

/* The expected producer must be the active generation's; then a subscriber slot, whose
 * admission by the publisher (pool_refill) sends the first chunk with the headers. */
static void pool_open(gstream_t *s, const Dynamo__Kvrelay__V1__SubscribeKvPoolRequest *rq)
{
    kvr_grpc_t *g = s->conn->g;
    uint64_t gen = kvr_relay_generation(g->relay);
    int pool = kvr_relay_pool_find(g->relay, rq->expected_producer->pool_id);
    kvr_pool_info_t slot;
    kvr_relay_ident_t id;

    if (pool >= 0 && kvr_store_pool_info(g->store, (uint32_t)pool, &slot) != KVR_OK)
        pool = -1; /* taken on by the publisher, so in the table: never */
    /* A namespace's token is told the same for any pool not its own, another namespace's or
     * none at all, so that it cannot learn which pools other namespaces have. */
    if (s->scope >= 0 && (pool < 0 || slot.ns != (uint32_t)s->scope)) {
        kvr_grpc_stream_end(s, KVR_GRPC_PERMISSION_DENIED, 0, "not a pool of this token's namespace");
        return;
    }
    if (pool < 0) {
        kvr_grpc_stream_end(s, KVR_GRPC_NOT_FOUND, KVR_RELAY_REASON_POOL_NOT_FOUND, "unknown pool");
        return;
    }
    kvr_relay_ident(g->relay, (uint32_t)pool, gen, &id);
    if (gen == 0 || !kvr_seg_publisher_up(g->seg)) {
        kvr_grpc_stream_end(s, KVR_GRPC_UNAVAILABLE, KVR_RELAY_REASON_PUBLICATION_UNAVAILABLE,
                            "no publisher is running");
        return;
    }
    if (!kvr_relay_producer_equal(rq->expected_producer, &id.producer)) {
        kvr_grpc_stream_end(s, KVR_GRPC_FAILED_PRECONDITION, KVR_RELAY_REASON_PRODUCER_CHANGED,
                            "the expected producer is not the active generation");
        return;
    }
    s->generation = gen;
    s->pool = (uint32_t)pool;
    s->sub = kvr_relay_sub_open(g->relay, g->store->slot, gen, s->pool);
    if (s->sub < 0) {
        kvr_grpc_stream_end(s, KVR_GRPC_RESOURCE_EXHAUSTED, KVR_RELAY_REASON_RESOURCE_LIMIT,
                            "no subscriber slot free");
        return;
    }
    s->phase = PH_WAIT_ADMIT;
    s->progress_ms = kvr_clock_ms();
    /* Headers go out once the first chunk is ready (a refusal stays Trailers-Only). */
}

static void call_pool(gstream_t *s, const uint8_t *msg, size_t len)
{
    ProtobufCMessage *req;

    if (!relay_begin(s, msg, len, KVR_STREAM_POOL, &req))
        return;
    pool_open(s, (const Dynamo__Kvrelay__V1__SubscribeKvPoolRequest *)req);
    protobuf_c_message_free_unpacked(req, NULL);
}

/* ------------------------------------------------------------------ streams' periodic work */

static void tick_pool(gstream_t *s, uint64_t t)
{
    kvr_grpc_t *g = s->conn->g;
    int pending;

    if (s->phase == PH_SNAPSHOT || s->phase == PH_WAIT_ADMIT) {
        if (t - s->progress_ms > g->cfg->snapshot_progress_timeout_ms) {
            pool_release(s);
            pool_fail(s, KVR_RELAY_REASON_SNAPSHOT_PROGRESS_TIMEOUT, "snapshot made no progress");
        }
        return;
    }
    if (s->phase != PH_DELTAS)
        return;
    pool_refill(s, 0); /* state only: closed, lagged, generation retired */
    pending = s->sub >= 0 && kvr_relay_sub_pending(g->relay, s->sub);
    if (s->end_status < 0 && !pending && s->out_off >= s->out_len && t - s->last_send_ms >= g->cfg->pool_heartbeat_ms)
        emit_heartbeat(s);
    if (s->out_off < s->out_len || pending || s->end_status >= 0)
        kvr_grpc_stream_kick(s);
}

/* The publisher published or admitted: a waiting subscriber may have its snapshot, a
 * deferred one new deltas. */
static void wake_pool(gstream_t *s)
{
    if (s->phase == PH_WAIT_ADMIT) {
        pool_refill(s, 0);
        if (s->phase != PH_WAIT_ADMIT || s->end_status >= 0)
            kvr_grpc_stream_kick(s);
    } else if (s->deferred) {
        kvr_grpc_stream_kick(s);
    }
}

/* A new revision is sent only when what this stream lists changed: a revision moved by another
 * namespace's pool is taken without a message, so a watcher learns nothing of other namespaces
 * from when catalogs come (the contract lets a watcher skip revisions). */
static void tick_catalog(gstream_t *s, uint64_t t)
{
    uint64_t rev = kvr_relay_catalog_revision(s->conn->g->relay), view[2 + KVR_POOLS_MAX / 64];
    uint32_t ids[KVR_POOLS_MAX];

    if (rev == s->sent_revision)
        return;
    catalog_view(s, view, ids); /* after the revision: the catalog rule of emit_catalog */
    if (memcmp(view, s->sent_view, sizeof(view)) == 0) {
        s->sent_revision = rev;
        return;
    }
    emit_catalog(s);
    kvr_grpc_stream_kick(s);
}

static void tick_readiness(gstream_t *s, uint64_t t)
{
    if (t >= s->next_emit_ms) {
        emit_readiness(s);
        s->next_emit_ms = t + s->conn->g->cfg->readiness_heartbeat_ms;
        kvr_grpc_stream_kick(s);
    }
}

static void tick_load(gstream_t *s, uint64_t t)
{
    kvr_grpc_t *g = s->conn->g;

    if (t < s->next_emit_ms)
        return;
    /* a subscriber that does not drain its windows lags: the stream ends SUBSCRIBER_LAGGED, as a
     * pool stream does past its bound (docs/relay-contract.md, "A pool stream") */
    if (s->out_len - s->out_off > LOAD_LAG_MAX) {
        relay_stat(g, KVR_RC_LAGGED, 1);
        kvr_grpc_stream_end(s, KVR_GRPC_RESOURCE_EXHAUSTED, KVR_RELAY_REASON_SUBSCRIBER_LAGGED,
                            "load subscriber lagged");
    } else if (s->method->rpc == KVR_RELAY_RPC_SUBSCRIBE_KV_POOL_LOAD)
        emit_load(s);
    else
        emit_serving_load(s);
    s->next_emit_ms = t + g->cfg->load_window_ms;
    kvr_grpc_stream_kick(s);
}

/* The stream is freed: its subscriber slot and its admission permit go back. */
static void relay_done(gstream_t *s)
{
    kvr_grpc_t *g = s->conn->g;

    pool_release(s);
    if (s->admitted >= 0) {
        kvr_relay_release(g->relay, s->admitted, g->store->slot);
        s->admitted = -1;
    }
}

/* One entry of the table: the method's path, its kvr_relay_rpc_t and the handlers beyond the
 * ones every relay method has. */
/* clang-format off */ /* a table aligned by hand */
#define RELAY_METHOD(id, name, ...)                                                                  \
    [KVR_RELAY_RPC_##id] = {.path = "/dynamo.kvrelay.v1.KvEventRelay/" name, .rpc = KVR_RELAY_RPC_##id, \
                            .done = relay_done, __VA_ARGS__}
/* clang-format on */

/* Indexed by kvr_relay_rpc_t (tests/unit/test_grpc_relay.c checks it against wire/). */
const kvr_grpc_method_t kvr_grpc_relay_methods[] = {
    RELAY_METHOD(GET_RELAY_INFO, "GetRelayInfo", .call = call_relay_info),
    RELAY_METHOD(WATCH_KV_POOL_CATALOG, "WatchKvPoolCatalog", .call = call_catalog, .tick = tick_catalog),
    RELAY_METHOD(SUBSCRIBE_KV_POOL, "SubscribeKvPool", .call = call_pool, .tick = tick_pool, .refill = pool_refill,
                 .wake = wake_pool, .cancel = pool_release),
    RELAY_METHOD(SUBSCRIBE_SERVING_READINESS, "SubscribeServingReadiness", .call = call_readiness,
                 .tick = tick_readiness),
    RELAY_METHOD(SUBSCRIBE_KV_POOL_LOAD, "SubscribeKvPoolLoad", .call = call_load, .tick = tick_load),
    RELAY_METHOD(SUBSCRIBE_SERVING_LOAD, "SubscribeServingLoad", .call = call_serving_load, .tick = tick_load),
};
const size_t kvr_grpc_relay_nmethods = KVR_ARRAY_SIZE(kvr_grpc_relay_methods);
