/* grpc.c — see grpc.h for what is served. */
#define H2O_USE_LIBUV 0
#include "io/grpc.h"

#include "core/log.h"
#include "io/uring.h"
#include "shm/stats.h"
#include "wire/cbi1.h"
#include "wire/health.pb-c.h"
#include "wire/relay_validate.h"

#include <errno.h>
#include <h2o.h>
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RBUF_SIZE       (256u << 10)
#define WBUF_TARGET     (1u << 20)     /* nghttp2 output gathered per send */
#define MAX_MESSAGE     (8u << 20)     /* §2.7 */
#define DELTA_BATCH_MAX (64u << 10)    /* delta bytes taken from the ring per refill, at most */
#define KICK_COALESCE_MS 1      /* deltas reach streams at most this often: fewer, fuller sends */
#define PING_INTERVAL_MS 20000
#define PING_TIMEOUT_MS  10000
#define RPC_HEALTH_CHECK 100
#define RPC_HEALTH_WATCH 101

#define RC_FRAMES KVR_RC_FRAMES
#define RC_BYTES KVR_RC_BYTES
#define RC_HEARTBEATS KVR_RC_HEARTBEATS
#define RC_LAGGED KVR_RC_LAGGED
#define RC_REJECTED KVR_RC_REJECTED
#define RC_LOAD_WINDOWS KVR_RC_LOAD_WINDOWS
#define RC_STREAMS_OPENED KVR_RC_STREAMS_OPENED

typedef struct gconn_s gconn_t;

enum { PH_NONE, PH_WAIT_ADMIT, PH_SNAPSHOT, PH_DELTAS, PH_PERIODIC, PH_ENDING };

typedef struct gstream_s {
    struct gstream_s *next, *prev;
    gconn_t *conn;
    int32_t id;
    char path[160];
    int path_len;
    int grpc_ct;      /* content-type is application/grpc* */
    int compressed;   /* a request message had the compressed flag */
    int rpc;
    uint8_t *req;
    size_t req_len, req_cap;
    int too_big;

    int responded;    /* headers submitted */
    int admitted;     /* stream type holding a permit, or -1 */
    int phase;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    int deferred;
    int end_status;   /* >= 0: end with these trailers once out is drained */
    int end_reason;
    const char *end_msg;

    /* pool streams */
    int sub;
    uint64_t generation;
    uint32_t next_chunk, chunk_count;
    uint64_t snap_seq;
    uint64_t last_seq;     /* last sequence sent (for heartbeats) */
    uint64_t last_send_ms; /* for heartbeats and progress */
    uint64_t progress_ms;
    /* periodic streams */
    uint64_t next_emit_ms;
    uint64_t sent_revision;
    uint64_t window_seq;
} gstream_t;

struct gconn_s {
    gconn_t *next, *prev;
    kvr_grpc_t *g;
    int fd;
    nghttp2_session *session;
    gstream_t streams; /* list head */
    uint8_t *rbuf;
    kvr_uring_op_t rop, wop;
    int reading, writing, closing, dead;
    uint8_t *wbuf;      /* in flight */
    size_t wlen, woff, wcap;
    uint8_t *pbuf;      /* gathering */
    size_t plen, pcap;
    uint64_t last_ping_ms, ping_sent_ms;
    int ping_outstanding;
};

struct kvr_grpc_s {
    const kvr_config_t *cfg;
    kvr_seg_t *seg;
    kvr_store_t *store;
    kvr_relay_t *relay;
    h2o_evloop_t *loop;
    kvr_uring_t uring;
    h2o_socket_t *uring_sock, *wake_sock;
    int listen_fd, wake_fd;
    kvr_uring_op_t accept_op;
    int accepting;
    gconn_t conns;
    unsigned nconns;
    int draining;
    nghttp2_session_callbacks *cbs;
    h2o_timeout_t kick_timeout;
    h2o_timeout_entry_t kick_entry;
    uint64_t last_kick_ms;
    int detached; /* no socket I/O: output is discarded (fuzzing) */
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void conn_pump(gconn_t *c);
static void conn_close(gconn_t *c);
static void stream_refill(gstream_t *s, size_t budget);

static void relay_stat(kvr_grpc_t *g, unsigned i, uint64_t v)
{
    kvr_stat_add(g->store->my_stats, KVR_ST_RELAY + i, v);
}

/* ------------------------------------------------------------------ output buffers */

/* Grows a realloc'd buffer to hold at least `need` bytes (doubling from `first`). */
static int buf_grow(uint8_t **buf, size_t *cap, size_t need, size_t first)
{
    size_t c = *cap ? *cap : first;
    uint8_t *n;

    if (need <= *cap)
        return KVR_OK;
    while (c < need)
        c *= 2;
    n = realloc(*buf, c);
    if (n == NULL)
        return KVR_ERR;
    *buf = n;
    *cap = c;
    return KVR_OK;
}

static int out_reserve(gstream_t *s, size_t add)
{
    if (s->out_off > 0 && s->out_off == s->out_len) {
        s->out_off = s->out_len = 0;
    }
    return buf_grow(&s->out, &s->out_cap, s->out_len + add, 4096);
}

/* Appends one packed protobuf message with its gRPC prefix. */
static int out_message(gstream_t *s, const ProtobufCMessage *m)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    if (out_reserve(s, len + KVR_GRPC_PREFIX) != KVR_OK)
        return KVR_ERR;
    s->out[s->out_len] = 0;
    kvr_put_be32(s->out + s->out_len + 1, (uint32_t)len);
    protobuf_c_message_pack(m, s->out + s->out_len + KVR_GRPC_PREFIX);
    s->out_len += len + KVR_GRPC_PREFIX;
    return KVR_OK;
}

/* ------------------------------------------------------------------ responses */

#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NO_COPY_NAME}

static ssize_t data_read_cb(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                            uint32_t *data_flags, nghttp2_data_source *source, void *user_data);

static void submit_headers(gstream_t *s)
{
    nghttp2_nv hdrs[] = {NV(":status", "200"), NV("content-type", "application/grpc")};
    nghttp2_data_provider prd;

    if (s->responded)
        return;
    prd.source.ptr = s;
    prd.read_callback = data_read_cb;
    s->responded = 1;
    nghttp2_submit_response(s->conn->session, s->id, hdrs, 2, &prd);
}

/* Ends the call: Trailers-Only before any response, else trailers after the queued data. */
static void stream_end(gstream_t *s, int status, int reason, const char *msg)
{
    if (s->end_status >= 0)
        return;
    s->end_status = status;
    s->end_reason = reason;
    s->end_msg = msg;
    s->phase = PH_ENDING;
    if (!s->responded) {
        char code[12];
        nghttp2_nv hdrs[6];
        size_t n = 0;
        snprintf(code, sizeof(code), "%d", status);
        hdrs[n++] = (nghttp2_nv)NV(":status", "200");
        hdrs[n++] = (nghttp2_nv)NV("content-type", "application/grpc");
        hdrs[n] = (nghttp2_nv)NV("grpc-status", code);
        hdrs[n].flags = NGHTTP2_NV_FLAG_NO_COPY_NAME; /* value copied: it lives on our stack */
        n++;
        if (msg != NULL)
            hdrs[n++] = (nghttp2_nv)NV("grpc-message", msg);
        if (reason > 0)
            hdrs[n++] = (nghttp2_nv)NV(KVR_RELAY_REASON_TRAILER, kvr_relay_reason_name(reason));
        s->responded = 1;
        nghttp2_submit_response(s->conn->session, s->id, hdrs, n, NULL);
        return;
    }
    if (s->deferred) {
        s->deferred = 0;
        nghttp2_session_resume_data(s->conn->session, s->id);
    }
}

static void submit_trailers(gstream_t *s)
{
    char code[12];
    nghttp2_nv t[3];
    size_t n = 0;

    snprintf(code, sizeof(code), "%d", s->end_status);
    t[n] = (nghttp2_nv)NV("grpc-status", code);
    n++;
    if (s->end_msg != NULL)
        t[n++] = (nghttp2_nv)NV("grpc-message", s->end_msg);
    if (s->end_reason > 0)
        t[n++] = (nghttp2_nv)NV(KVR_RELAY_REASON_TRAILER, kvr_relay_reason_name(s->end_reason));
    nghttp2_submit_trailer(s->conn->session, s->id, t, n);
}

/*
 * nghttp2 asks what the stream has to send. The bytes are not copied here: with
 * NGHTTP2_DATA_FLAG_NO_COPY, send_data_cb writes the DATA frame straight from the
 * stream's buffer into the connection's output, one copy instead of two.
 */
static ssize_t data_read_cb(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                            uint32_t *data_flags, nghttp2_data_source *source, void *user_data)
{
    gstream_t *s = source->ptr;
    size_t n;

    if (s->out_off >= s->out_len && s->end_status < 0)
        stream_refill(s, length); /* only what can go out now: the rest stays queued in the ring */
    if (s->out_off < s->out_len) {
        n = s->out_len - s->out_off;
        if (n > length)
            n = length;
        *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
        if (s->end_status >= 0 && s->out_off + n == s->out_len) {
            *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
            submit_trailers(s);
        }
        s->progress_ms = now_ms();
        return (ssize_t)n;
    }
    if (s->end_status >= 0) {
        *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        submit_trailers(s);
        return 0;
    }
    s->deferred = 1;
    return NGHTTP2_ERR_DEFERRED;
}

static int pbuf_reserve(gconn_t *c, size_t add);

static int send_data_cb(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                        nghttp2_data_source *source, void *user_data)
{
    gconn_t *c = user_data;
    gstream_t *s = source->ptr;
    size_t pad = frame->data.padlen;

    if (pbuf_reserve(c, 9 + pad + length) != KVR_OK)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    memcpy(c->pbuf + c->plen, framehd, 9);
    c->plen += 9;
    if (pad > 0)
        c->pbuf[c->plen++] = (uint8_t)(pad - 1);
    memcpy(c->pbuf + c->plen, s->out + s->out_off, length);
    c->plen += length;
    s->out_off += length;
    if (pad > 1) {
        memset(c->pbuf + c->plen, 0, pad - 1);
        c->plen += pad - 1;
    }
    return 0;
}

/* Lets DATA frames be as large as the peer allows (up to 256 KiB): fewer frames per chunk. */
static ssize_t read_length_cb(nghttp2_session *session, uint8_t frame_type, int32_t stream_id,
                              int32_t session_window, int32_t stream_window, uint32_t max_frame, void *user_data)
{
    ssize_t n = session_window < stream_window ? session_window : stream_window;
    if ((ssize_t)max_frame < n)
        n = (ssize_t)max_frame;
    if (n > 256 * 1024)
        n = 256 * 1024;
    return n > 0 ? n : 1;
}

/* New output for a stream: make nghttp2 ask for it. */
static void stream_kick(gstream_t *s)
{
    if (!s->responded)
        submit_headers(s);
    else if (s->deferred) {
        s->deferred = 0;
        nghttp2_session_resume_data(s->conn->session, s->id);
    }
}

/* ------------------------------------------------------------------ messages */

static void relay_identity(kvr_grpc_t *g, Dynamo__Kvrelay__V1__RelayIdentity *r)
{
    dynamo__kvrelay__v1__relay_identity__init(r);
    r->drt_instance_id = 0;
    r->relay_incarnation = kvr_relay_incarnation(g->relay);
}

static void emit_catalog(gstream_t *s)
{
    kvr_grpc_t *g = s->conn->g;
    const kvr_config_t *cfg = g->cfg;
    uint64_t gen = kvr_relay_generation(g->relay);
    Dynamo__Kvrelay__V1__KvPoolCatalogUpdate up = DYNAMO__KVRELAY__V1__KV_POOL_CATALOG_UPDATE__INIT;
    Dynamo__Kvrelay__V1__RelayIdentity rel;
    Dynamo__Kvrelay__V1__KvPoolCatalogSnapshot snap = DYNAMO__KVRELAY__V1__KV_POOL_CATALOG_SNAPSHOT__INIT;
    Dynamo__Kvrelay__V1__KvPoolDescriptor desc = DYNAMO__KVRELAY__V1__KV_POOL_DESCRIPTOR__INIT, *descs[1];
    Dynamo__Kvrelay__V1__DynamoEndpointId ep = DYNAMO__KVRELAY__V1__DYNAMO_ENDPOINT_ID__INIT;
    Dynamo__Kvrelay__V1__ModelRegistration reg = DYNAMO__KVRELAY__V1__MODEL_REGISTRATION__INIT, *regs[1];
    Dynamo__Kvrelay__V1__ModelTarget target = DYNAMO__KVRELAY__V1__MODEL_TARGET__INIT;
    Dynamo__Kvrelay__V1__BaseModelTarget base = DYNAMO__KVRELAY__V1__BASE_MODEL_TARGET__INIT;
    Dynamo__Kvrelay__V1__KvQuerySemantics qs = DYNAMO__KVRELAY__V1__KV_QUERY_SEMANTICS__INIT;
    Dynamo__Kvrelay__V1__WorkerRole roles[1] = {DYNAMO__KVRELAY__V1__WORKER_ROLE__WORKER_ROLE_LEGACY};
    kvr_relay_ident_t id;
    char ns[KVR_CFG_STR_MAX], comp[KVR_CFG_STR_MAX], epn[KVR_CFG_STR_MAX];

    sscanf(cfg->endpoint, "%511[^/]/%511[^/]/%511s", ns, comp, epn);
    relay_identity(g, &rel);
    up.protocol_version = KVR_RELAY_PROTOCOL_VERSION;
    up.relay = &rel;
    s->sent_revision = kvr_relay_catalog_revision(g->relay);
    up.revision = s->sent_revision;
    up.snapshot = &snap;
    up.contract_marker = KVR_RELAY_CONTRACT_MARKER;
    if (gen != 0 && atomic_load(&g->seg->hdr->ctl.publisher_running)) {
        kvr_relay_ident(g->relay, gen, &id);
        ep.namespace_ = ns;
        ep.component = comp;
        ep.endpoint = epn;
        base.base_model = (char *)cfg->model;
        target.target_case = DYNAMO__KVRELAY__V1__MODEL_TARGET__TARGET_BASE;
        target.base = &base;
        reg.canonical_model_id = (char *)cfg->model;
        reg.target = &target;
        regs[0] = &reg;
        qs.kv_block_size = (uint32_t)cfg->kv_block_size;
        qs.hash_format = !strcmp(cfg->hash_format, "eagle")
                             ? DYNAMO__KVRELAY__V1__KV_QUERY_HASH_FORMAT__KV_QUERY_HASH_FORMAT_DYNAMO_EAGLE_V1
                             : DYNAMO__KVRELAY__V1__KV_QUERY_HASH_FORMAT__KV_QUERY_HASH_FORMAT_DYNAMO_STANDARD_V1;
        desc.producer = &id.producer;
        desc.serving_endpoint = &ep;
        desc.n_registrations = 1;
        desc.registrations = regs;
        desc.query_semantics = &qs;
        desc.n_pool_roles = 1;
        desc.pool_roles = roles;
        descs[0] = &desc;
        snap.n_pools = 1;
        snap.pools = descs;
    }
    out_message(s, &up.base);
}

static void emit_load(gstream_t *s)
{
    kvr_grpc_t *g = s->conn->g;
    uint64_t gen = kvr_relay_generation(g->relay);
    Dynamo__Kvrelay__V1__KvPoolLoadUpdate up = DYNAMO__KVRELAY__V1__KV_POOL_LOAD_UPDATE__INIT;
    Dynamo__Kvrelay__V1__KvPoolLoadEntry e = DYNAMO__KVRELAY__V1__KV_POOL_LOAD_ENTRY__INIT, *es[1];
    Dynamo__Kvrelay__V1__RelayIdentity rel;
    kvr_relay_ident_t id;
    kvr_store_stats_t st;

    relay_identity(g, &rel);
    up.protocol_version = KVR_RELAY_PROTOCOL_VERSION;
    up.relay = &rel;
    up.window_sequence = s->window_seq++;
    up.observed_ms = kvr_relay_wall_us() / 1000;
    up.window_ms = g->cfg->load_window_ms;
    up.contract_marker = KVR_RELAY_CONTRACT_MARKER;
    if (gen != 0) {
        kvr_store_stats(g->store, &st);
        kvr_relay_ident(g->relay, gen, &id);
        e.producer = &id.producer;
        e.kv_used_blocks = st.unique_blocks;
        e.total_kv_blocks = g->seg->hdr->max_blocks;
        e.kv_observed_ranks = 1;
        e.kv_expected_ranks = 1;
        es[0] = &e;
        up.n_pools = 1;
        up.pools = es;
    }
    out_message(s, &up.base);
    relay_stat(g, RC_LOAD_WINDOWS, 1);
}

static void emit_serving_load(gstream_t *s)
{
    kvr_grpc_t *g = s->conn->g;
    uint64_t gen = kvr_relay_generation(g->relay);
    Dynamo__Kvrelay__V1__ServingLoadUpdate up = DYNAMO__KVRELAY__V1__SERVING_LOAD_UPDATE__INIT;
    Dynamo__Kvrelay__V1__PoolServingLoad p = DYNAMO__KVRELAY__V1__POOL_SERVING_LOAD__INIT, *ps[1];
    Dynamo__Kvrelay__V1__LoadView lv = DYNAMO__KVRELAY__V1__LOAD_VIEW__INIT;
    Dynamo__Kvrelay__V1__TokenLoadStats tok = DYNAMO__KVRELAY__V1__TOKEN_LOAD_STATS__INIT;
    Dynamo__Kvrelay__V1__PoolDeploymentStatus dep = DYNAMO__KVRELAY__V1__POOL_DEPLOYMENT_STATUS__INIT;
    Dynamo__Kvrelay__V1__RelayIdentity rel;
    kvr_relay_ident_t id;

    relay_identity(g, &rel);
    up.protocol_version = KVR_RELAY_PROTOCOL_VERSION;
    up.relay = &rel;
    up.window_sequence = s->window_seq++;
    up.observed_ms = kvr_relay_wall_us() / 1000;
    up.window_ms = g->cfg->load_window_ms;
    up.contract_marker = KVR_RELAY_CONTRACT_MARKER;
    if (gen != 0) {
        kvr_relay_ident(g->relay, gen, &id);
        lv.tokens = &tok; /* no gauges: UNAVAILABLE */
        lv.status = DYNAMO__KVRELAY__V1__DATA_STATUS__DATA_STATUS_UNAVAILABLE;
        p.producer = &id.producer;
        p.load = &lv;
        p.deployment = &dep;
        ps[0] = &p;
        up.n_pools = 1;
        up.pools = ps;
    }
    out_message(s, &up.base);
    relay_stat(g, RC_LOAD_WINDOWS, 1);
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
    out_message(s, &up.base);
}

static void emit_heartbeat(gstream_t *s)
{
    uint8_t buf[KVR_RELAY_ENVELOPE_MAX], *payload;
    size_t len = kvr_relay_filter_update(s->conn->g->relay, s->generation, s->last_seq, s->last_seq,
                                         DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_HEARTBEAT, 0,
                                         buf, sizeof(buf), &payload);
    if (len == 0 || out_reserve(s, len) != KVR_OK)
        return;
    memcpy(s->out + s->out_len, buf, len);
    s->out_len += len;
    s->last_send_ms = now_ms();
    relay_stat(s->conn->g, RC_HEARTBEATS, 1);
}

/* ------------------------------------------------------------------ pool streams */

static void pool_fail(gstream_t *s, int reason, const char *msg)
{
    if (reason == KVR_RELAY_REASON_SUBSCRIBER_LAGGED)
        relay_stat(s->conn->g, RC_LAGGED, 1);
    stream_end(s, kvr_relay_reason_grpc(reason), reason, msg);
}

static void pool_release(gstream_t *s)
{
    if (s->sub >= 0) {
        kvr_relay_sub_close(s->conn->g->relay, s->sub);
        s->sub = -1;
    }
}

/*
 * Moves a pool stream forward: admission, snapshot chunks, deltas. Deltas leave the shared
 * ring only as far as `budget` (what HTTP/2 flow control lets us send right now): frames a
 * subscriber has not taken stay in the ring, where the publisher counts them against the
 * 16-frame / 16 MiB bound (§1.7) — a buffer here would hide a slow reader from that count.
 * budget 0 only checks the subscription's state.
 */
static void pool_refill(gstream_t *s, size_t budget)
{
    kvr_grpc_t *g = s->conn->g;
    kvr_relay_t *r = g->relay;
    kvr_relay_sub_view_t v;
    kvr_relay_poll_t st;

    if (s->sub < 0)
        return;
    st = kvr_relay_sub_poll(r, s->sub, &v);
    if (st == KVR_SUBP_CLOSED) {
        int reason = v.reason;
        pool_release(s);
        pool_fail(s, reason ? reason : KVR_RELAY_REASON_PUBLICATION_UNAVAILABLE,
                  reason == KVR_RELAY_REASON_SUBSCRIBER_LAGGED ? "subscriber lagged behind the publication"
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
        s->progress_ms = now_ms();
    }
    if (s->phase == PH_SNAPSHOT) {
        size_t cap = kvr_relay_chunk_msg_max(r), len;
        if (out_reserve(s, cap) != KVR_OK) {
            pool_fail(s, KVR_RELAY_REASON_INTERNAL, "out of memory");
            return;
        }
        len = kvr_relay_sub_chunk(r, s->sub, s->next_chunk, s->out + s->out_len, cap);
        if (len == 0) {
            pool_fail(s, KVR_RELAY_REASON_INTERNAL, "snapshot encoding failed");
            return;
        }
        s->out_len += len;
        relay_stat(g, RC_FRAMES, 1);
        relay_stat(g, RC_BYTES, len);
        if (++s->next_chunk == s->chunk_count) {
            s->phase = PH_DELTAS;
            s->last_seq = s->snap_seq;
        }
        s->last_send_ms = now_ms();
        return;
    }
    if (s->phase == PH_DELTAS) {
        if (budget > DELTA_BATCH_MAX)
            budget = DELTA_BATCH_MAX;
        while (budget > 0 && s->out_len - s->out_off < budget) {
            uint64_t seq;
            ssize_t n;
            if (out_reserve(s, KVR_CBI1_MAX_FRAME + KVR_RELAY_ENVELOPE_MAX) != KVR_OK)
                return;
            n = kvr_relay_sub_next_frame(r, s->sub, s->out + s->out_len, s->out_cap - s->out_len, &seq);
            if (n == 0)
                break;
            if (n < 0) {
                pool_release(s);
                pool_fail(s, KVR_RELAY_REASON_SUBSCRIBER_LAGGED, "subscriber lagged behind the publication");
                return;
            }
            s->out_len += (size_t)n;
            s->last_seq = seq;
            s->last_send_ms = now_ms();
            relay_stat(g, RC_FRAMES, 1);
            relay_stat(g, RC_BYTES, (uint64_t)n);
        }
    }
}

static void stream_refill(gstream_t *s, size_t budget)
{
    if (s->rpc == KVR_RELAY_RPC_SUBSCRIBE_KV_POOL)
        pool_refill(s, budget);
}

/* ------------------------------------------------------------------ dispatch */

static int stream_type_of(int rpc)
{
    switch (rpc) {
    case KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG:
        return KVR_STREAM_CATALOG;
    case KVR_RELAY_RPC_SUBSCRIBE_KV_POOL:
        return KVR_STREAM_POOL;
    case KVR_RELAY_RPC_SUBSCRIBE_SERVING_READINESS:
        return KVR_STREAM_READINESS;
    case KVR_RELAY_RPC_SUBSCRIBE_KV_POOL_LOAD:
        return KVR_STREAM_LOAD;
    case KVR_RELAY_RPC_SUBSCRIBE_SERVING_LOAD:
        return KVR_STREAM_SERVING_LOAD;
    default:
        return -1;
    }
}

static void dispatch_health(gstream_t *s, const uint8_t *msg, size_t len)
{
    kvr_grpc_t *g = s->conn->g;
    Grpc__Health__V1__HealthCheckRequest *rq = grpc__health__v1__health_check_request__unpack(NULL, len, msg);
    Grpc__Health__V1__HealthCheckResponse rs = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;

    if (rq == NULL) {
        stream_end(s, KVR_GRPC_INTERNAL, 0, "malformed HealthCheckRequest");
        return;
    }
    if (s->rpc == RPC_HEALTH_WATCH) {
        grpc__health__v1__health_check_request__free_unpacked(rq, NULL);
        stream_end(s, 12 /* UNIMPLEMENTED */, 0, "Watch is not implemented");
        return;
    }
    if (rq->service[0] != '\0' && strcmp(rq->service, "dynamo.kvrelay.v1.KvEventRelay") != 0) {
        grpc__health__v1__health_check_request__free_unpacked(rq, NULL);
        stream_end(s, KVR_GRPC_NOT_FOUND, 0, "unknown service");
        return;
    }
    grpc__health__v1__health_check_request__free_unpacked(rq, NULL);
    rs.status = g->draining ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                            : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    out_message(s, &rs.base);
    submit_headers(s);
    stream_end(s, KVR_GRPC_OK, 0, NULL);
}

/* A stream that answers at once with its first message, then every interval_ms. */
static void start_periodic(gstream_t *s, void (*emit)(gstream_t *), uint64_t interval_ms)
{
    emit(s);
    s->phase = PH_PERIODIC;
    s->next_emit_ms = now_ms() + interval_ms;
    submit_headers(s);
}

static void dispatch(gstream_t *s)
{
    kvr_grpc_t *g = s->conn->g;
    const uint8_t *msg;
    size_t mlen;
    kvr_relay_verdict_t v;
    ProtobufCMessage *req = NULL;
    int type;

    if (!s->grpc_ct) {
        stream_end(s, KVR_GRPC_INTERNAL, 0, "content-type must be application/grpc");
        return;
    }
    if (s->too_big) {
        stream_end(s, KVR_GRPC_RESOURCE_EXHAUSTED, 0, "request message larger than the maximum");
        return;
    }
    if (s->req_len < KVR_GRPC_PREFIX || kvr_be32(s->req + 1) != s->req_len - KVR_GRPC_PREFIX) {
        stream_end(s, KVR_GRPC_INTERNAL, 0, "expected exactly one request message");
        return;
    }
    if (s->req[0] != 0) {
        stream_end(s, 12 /* UNIMPLEMENTED */, 0, "compressed requests are not supported");
        return;
    }
    msg = s->req + KVR_GRPC_PREFIX;
    mlen = s->req_len - KVR_GRPC_PREFIX;
    if (s->rpc == RPC_HEALTH_CHECK || s->rpc == RPC_HEALTH_WATCH) {
        dispatch_health(s, msg, mlen);
        return;
    }
    if (s->rpc < 0) {
        stream_end(s, 12 /* UNIMPLEMENTED */, 0, "unknown method");
        return;
    }
    v = kvr_relay_validate_request((kvr_relay_rpc_t)s->rpc, msg, mlen, &req);
    if (v.grpc_status != KVR_GRPC_OK) {
        if (req != NULL)
            protobuf_c_message_free_unpacked(req, NULL);
        stream_end(s, v.grpc_status, v.reason, v.message);
        return;
    }
    type = stream_type_of(s->rpc);
    if (type >= 0) {
        if (!kvr_relay_admit(g->relay, type, g->store->slot, (uint32_t)g->cfg->max_streams)) {
            protobuf_c_message_free_unpacked(req, NULL);
            relay_stat(g, RC_REJECTED, 1);
            stream_end(s, KVR_GRPC_RESOURCE_EXHAUSTED, KVR_RELAY_REASON_RESOURCE_LIMIT,
                       "Relay stream limit reached");
            return;
        }
        s->admitted = type;
        relay_stat(g, RC_STREAMS_OPENED, 1);
    }
    switch (s->rpc) {
    case KVR_RELAY_RPC_GET_RELAY_INFO: {
        Dynamo__Kvrelay__V1__RelayInfo info = DYNAMO__KVRELAY__V1__RELAY_INFO__INIT;
        Dynamo__Kvrelay__V1__RelayIdentity rel;
        relay_identity(g, &rel);
        info.protocol_version = KVR_RELAY_PROTOCOL_VERSION;
        info.relay = &rel;
        info.contract_marker = KVR_RELAY_CONTRACT_MARKER;
        out_message(s, &info.base);
        submit_headers(s);
        stream_end(s, KVR_GRPC_OK, 0, NULL);
        break;
    }
    case KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG: /* then on every revision change */
        start_periodic(s, emit_catalog, 0);
        break;
    case KVR_RELAY_RPC_SUBSCRIBE_SERVING_READINESS:
        start_periodic(s, emit_readiness, g->cfg->readiness_heartbeat_ms);
        break;
    case KVR_RELAY_RPC_SUBSCRIBE_KV_POOL_LOAD:
        start_periodic(s, emit_load, g->cfg->load_window_ms);
        break;
    case KVR_RELAY_RPC_SUBSCRIBE_SERVING_LOAD:
        start_periodic(s, emit_serving_load, g->cfg->load_window_ms);
        break;
    case KVR_RELAY_RPC_SUBSCRIBE_KV_POOL: {
        Dynamo__Kvrelay__V1__SubscribeKvPoolRequest *rq = (void *)req;
        uint64_t gen = kvr_relay_generation(g->relay);
        kvr_relay_ident_t id;
        kvr_relay_ident(g->relay, gen, &id);
        if (!kvr_relay_pool_matches(g->relay, rq->expected_producer->pool_id)) {
            stream_end(s, KVR_GRPC_NOT_FOUND, KVR_RELAY_REASON_POOL_NOT_FOUND, "unknown pool");
            break;
        }
        if (gen == 0 || !atomic_load(&g->seg->hdr->ctl.publisher_running)) {
            stream_end(s, KVR_GRPC_UNAVAILABLE, KVR_RELAY_REASON_PUBLICATION_UNAVAILABLE, "no publisher is running");
            break;
        }
        if (!kvr_relay_producer_equal(rq->expected_producer, &id.producer)) {
            stream_end(s, KVR_GRPC_FAILED_PRECONDITION, KVR_RELAY_REASON_PRODUCER_CHANGED,
                       "the expected producer is not the active generation");
            break;
        }
        s->generation = gen;
        s->sub = kvr_relay_sub_open(g->relay, g->store->slot, gen);
        if (s->sub < 0) {
            stream_end(s, KVR_GRPC_RESOURCE_EXHAUSTED, KVR_RELAY_REASON_RESOURCE_LIMIT, "no subscriber slot free");
            break;
        }
        s->phase = PH_WAIT_ADMIT;
        s->progress_ms = now_ms();
        /* Headers go out once the first chunk is ready (a refusal stays Trailers-Only). */
        break;
    }
    default:
        stream_end(s, 12, 0, "unknown method");
    }
    protobuf_c_message_free_unpacked(req, NULL);
}

/* ------------------------------------------------------------------ nghttp2 callbacks */

static gstream_t *stream_new(gconn_t *c, int32_t id)
{
    gstream_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->conn = c;
    s->id = id;
    s->rpc = -1;
    s->admitted = -1;
    s->sub = -1;
    s->end_status = -1;
    s->next = c->streams.next;
    s->prev = &c->streams;
    c->streams.next->prev = s;
    c->streams.next = s;
    return s;
}

static void stream_free(gstream_t *s)
{
    kvr_grpc_t *g = s->conn->g;
    pool_release(s);
    if (s->admitted >= 0)
        kvr_relay_release(g->relay, s->admitted, g->store->slot);
    s->prev->next = s->next;
    s->next->prev = s->prev;
    free(s->req);
    free(s->out);
    free(s);
}

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    gconn_t *c = user_data;
    gstream_t *s;

    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    s = stream_new(c, frame->hd.stream_id);
    if (s == NULL)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    nghttp2_session_set_stream_user_data(session, frame->hd.stream_id, s);
    return 0;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data)
{
    gstream_t *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);

    if (s == NULL || frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (namelen == 5 && memcmp(name, ":path", 5) == 0 && valuelen < sizeof(s->path)) {
        memcpy(s->path, value, valuelen);
        s->path[valuelen] = '\0';
        s->path_len = (int)valuelen;
    } else if (namelen == 12 && memcmp(name, "content-type", 12) == 0) {
        s->grpc_ct = valuelen >= 16 && memcmp(value, "application/grpc", 16) == 0;
    }
    return 0;
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                         void *user_data)
{
    gstream_t *s = nghttp2_session_get_stream_user_data(session, stream_id);

    if (s == NULL || s->too_big)
        return 0;
    if (s->req_len + len > MAX_MESSAGE + KVR_GRPC_PREFIX) {
        s->too_big = 1;
        return 0;
    }
    if (buf_grow(&s->req, &s->req_cap, s->req_len + len, 256) != KVR_OK)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    memcpy(s->req + s->req_len, data, len);
    s->req_len += len;
    return 0;
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    gconn_t *c = user_data;
    gstream_t *s;

    if (frame->hd.type == NGHTTP2_PING && (frame->hd.flags & NGHTTP2_FLAG_ACK)) {
        c->ping_outstanding = 0;
        return 0;
    }
    if ((frame->hd.type != NGHTTP2_DATA && frame->hd.type != NGHTTP2_HEADERS) ||
        !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (s == NULL || s->end_status >= 0 || s->phase != PH_NONE)
        return 0;
    if (c->g->draining) {
        stream_end(s, KVR_GRPC_UNAVAILABLE, KVR_RELAY_REASON_PUBLICATION_UNAVAILABLE, "server shutting down");
        return 0;
    }
    if (!strcmp(s->path, "/grpc.health.v1.Health/Check"))
        s->rpc = RPC_HEALTH_CHECK;
    else if (!strcmp(s->path, "/grpc.health.v1.Health/Watch"))
        s->rpc = RPC_HEALTH_WATCH;
    else
        s->rpc = kvr_relay_rpc_from_path(s->path, (size_t)s->path_len);
    dispatch(s);
    return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data)
{
    gstream_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
    if (s != NULL) {
        nghttp2_session_set_stream_user_data(session, stream_id, NULL);
        stream_free(s);
    }
    return 0;
}

/* ------------------------------------------------------------------ connections */

static void on_recv(kvr_uring_op_t *op, int res);
static void on_send(kvr_uring_op_t *op, int res);

static void conn_maybe_free(gconn_t *c)
{
    if (!c->dead || c->reading || c->writing)
        return;
    while (c->streams.next != &c->streams)
        stream_free(c->streams.next); /* nghttp2_session_del does not call on_stream_close */
    nghttp2_session_del(c->session);
    if (c->fd >= 0)
        close(c->fd);
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->g->nconns--;
    free(c->rbuf);
    free(c->wbuf);
    free(c->pbuf);
    free(c);
}

/* Marks the connection dead; it is freed (conn_maybe_free) only at points where nothing
 * refers to it any more: the end of an I/O completion, or the tick. */
static void conn_close(gconn_t *c)
{
    if (c->dead)
        return;
    c->dead = 1;
    /* Outstanding recv/send complete (with 0 or an error) once the socket is shut down. */
    if (c->fd >= 0)
        shutdown(c->fd, SHUT_RDWR);
}

static void conn_read(gconn_t *c)
{
    if (c->reading || c->dead || c->g->detached)
        return;
    if (kvr_uring_recv(&c->g->uring, c->fd, c->rbuf, RBUF_SIZE, &c->rop) == KVR_OK)
        c->reading = 1;
    else
        conn_close(c);
}

static int pbuf_reserve(gconn_t *c, size_t add)
{
    return buf_grow(&c->pbuf, &c->pcap, c->plen + add, 65536);
}

/* Gathers nghttp2's output and sends it, one send in flight per connection. DATA frames
 * arrive through send_data_cb during nghttp2_session_mem_send, in order. */
static void conn_pump(gconn_t *c)
{
    if (c->dead || c->writing)
        return;
    while (c->plen < WBUF_TARGET) {
        const uint8_t *data;
        size_t before = c->plen;
        ssize_t n = nghttp2_session_mem_send(c->session, &data);
        if (n < 0) {
            conn_close(c);
            return;
        }
        if (n == 0) {
            if (c->plen == before)
                break;
            continue;
        }
        if (pbuf_reserve(c, (size_t)n) != KVR_OK) {
            conn_close(c);
            return;
        }
        memcpy(c->pbuf + c->plen, data, (size_t)n); /* the pointer dies at the next call */
        c->plen += (size_t)n;
    }
    if (c->g->detached) { /* nowhere to send: drop it, as a peer that reads everything */
        c->plen = 0;
        return;
    }
    if (c->plen == 0) {
        if (!nghttp2_session_want_read(c->session) && !nghttp2_session_want_write(c->session))
            conn_close(c);
        return;
    }
    { /* swap buffers: the gathered one goes out, the sent one gathers next */
        uint8_t *tb = c->wbuf;
        size_t tc = c->wcap;
        c->wbuf = c->pbuf;
        c->wcap = c->pcap;
        c->wlen = c->plen;
        c->woff = 0;
        c->pbuf = tb;
        c->pcap = tc;
        c->plen = 0;
    }
    if (kvr_uring_send(&c->g->uring, c->fd, c->wbuf, c->wlen, &c->wop) == KVR_OK)
        c->writing = 1;
    else
        conn_close(c);
}

static void on_send(kvr_uring_op_t *op, int res)
{
    gconn_t *c = op->data;

    c->writing = 0;
    if (res <= 0 || c->dead) {
        conn_close(c);
    } else {
        c->woff += (size_t)res;
        if (c->woff < c->wlen) {
            if (kvr_uring_send(&c->g->uring, c->fd, c->wbuf + c->woff, c->wlen - c->woff, &c->wop) == KVR_OK)
                c->writing = 1;
            else
                conn_close(c);
        } else {
            conn_pump(c);
        }
    }
    conn_maybe_free(c);
}

static void on_recv(kvr_uring_op_t *op, int res)
{
    gconn_t *c = op->data;
    ssize_t rv;

    c->reading = 0;
    if (res <= 0 || c->dead) {
        conn_close(c);
    } else if ((rv = nghttp2_session_mem_recv(c->session, c->rbuf, (size_t)res)) < 0) {
        kvr_debug("grpc: protocol error: %s", nghttp2_strerror((int)rv));
        conn_close(c);
    } else {
        conn_read(c);
        conn_pump(c);
    }
    conn_maybe_free(c);
}

static gconn_t *conn_new(kvr_grpc_t *g, int fd)
{
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 256},
                                   {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20}};
    gconn_t *c = calloc(1, sizeof(*c));

    if (c == NULL || (c->rbuf = malloc(RBUF_SIZE)) == NULL) {
        free(c);
        return NULL;
    }
    c->g = g;
    c->fd = fd;
    c->streams.next = c->streams.prev = &c->streams;
    c->rop.cb = on_recv;
    c->rop.data = c;
    c->wop.cb = on_send;
    c->wop.data = c;
    c->last_ping_ms = now_ms();
    nghttp2_session_server_new(&c->session, g->cbs, c);
    nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, 2);
    c->next = g->conns.next;
    c->prev = &g->conns;
    g->conns.next->prev = c;
    g->conns.next = c;
    g->nconns++;
    return c;
}

static void on_accept(kvr_uring_op_t *op, int res)
{
    kvr_grpc_t *g = op->data;
    gconn_t *c;

    g->accepting = 0;
    if (res >= 0) {
        c = conn_new(g, res);
        if (c == NULL) {
            close(res);
        } else {
            conn_read(c);
            conn_pump(c);
        }
    } else if (res != -EAGAIN && res != -EINTR && res != -ECANCELED) {
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "grpc: accept: %s", strerror(-res));
    }
    if (!g->draining && kvr_uring_accept(&g->uring, g->listen_fd, &g->accept_op) == KVR_OK)
        g->accepting = 1;
}

/* ------------------------------------------------------------------ loop glue */

static void kick_pool_streams(kvr_grpc_t *g)
{
    for (gconn_t *c = g->conns.next; c != &g->conns; c = c->next) {
        for (gstream_t *s = c->streams.next; s != &c->streams; s = s->next) {
            if (s->rpc != KVR_RELAY_RPC_SUBSCRIBE_KV_POOL || s->end_status >= 0)
                continue;
            if (s->phase == PH_WAIT_ADMIT) {
                pool_refill(s, 0);
                if (s->phase != PH_WAIT_ADMIT || s->end_status >= 0)
                    stream_kick(s);
            } else if (s->deferred) {
                stream_kick(s);
            }
        }
        conn_pump(c);
    }
}

static void on_uring_event(h2o_socket_t *sock, const char *err)
{
    kvr_grpc_t *g = sock->data;
    kvr_uring_process(&g->uring);
    kvr_uring_flush(&g->uring);
}

static void on_kick_timeout(h2o_timeout_entry_t *entry)
{
    kvr_grpc_t *g = (kvr_grpc_t *)((char *)entry - offsetof(kvr_grpc_t, kick_entry));
    g->last_kick_ms = now_ms();
    kick_pool_streams(g);
    kvr_uring_flush(&g->uring);
}

/*
 * The publisher published (or admitted a subscriber). Streams are kicked at most once per
 * KICK_COALESCE_MS: under a heavy PUT load deltas come every few hundred microseconds, and
 * sending each one to every subscriber separately costs a send per delta per stream.
 */
static void on_wake(h2o_socket_t *sock, const char *err)
{
    kvr_grpc_t *g = sock->data;
    uint64_t v, t = now_ms();

    (void)!read(g->wake_fd, &v, sizeof(v));
    if (h2o_timeout_is_linked(&g->kick_entry))
        return;
    if (t - g->last_kick_ms >= KICK_COALESCE_MS) {
        g->last_kick_ms = t;
        kick_pool_streams(g);
        kvr_uring_flush(&g->uring);
    } else {
        h2o_timeout_link(g->loop, &g->kick_timeout, &g->kick_entry);
    }
}

void kvr_grpc_flush(kvr_grpc_t *g)
{
    kvr_uring_flush(&g->uring);
}

void kvr_grpc_tick(kvr_grpc_t *g)
{
    uint64_t t = now_ms();

    for (gconn_t *c = g->conns.next, *cn; c != &g->conns; c = cn) {
        cn = c->next;
        if (c->dead) {
            conn_maybe_free(c);
            continue;
        }
        for (gstream_t *s = c->streams.next; s != &c->streams; s = s->next) {
            if (s->end_status >= 0)
                continue;
            switch (s->rpc) {
            case KVR_RELAY_RPC_SUBSCRIBE_KV_POOL:
                if (s->phase == PH_SNAPSHOT || s->phase == PH_WAIT_ADMIT) {
                    if (t - s->progress_ms > g->cfg->snapshot_progress_timeout_ms) {
                        pool_release(s);
                        pool_fail(s, KVR_RELAY_REASON_SNAPSHOT_PROGRESS_TIMEOUT, "snapshot made no progress");
                    }
                } else if (s->phase == PH_DELTAS) {
                    int pending;
                    pool_refill(s, 0); /* state only: closed, lagged, generation retired */
                    pending = s->sub >= 0 && kvr_relay_sub_pending(g->relay, s->sub);
                    if (s->end_status < 0 && !pending && s->out_off >= s->out_len &&
                        t - s->last_send_ms >= g->cfg->pool_heartbeat_ms)
                        emit_heartbeat(s);
                    if (s->out_off < s->out_len || pending || s->end_status >= 0)
                        stream_kick(s);
                }
                break;
            case KVR_RELAY_RPC_WATCH_KV_POOL_CATALOG:
                if (kvr_relay_catalog_revision(g->relay) != s->sent_revision) {
                    emit_catalog(s);
                    stream_kick(s);
                }
                break;
            case KVR_RELAY_RPC_SUBSCRIBE_SERVING_READINESS:
                if (t >= s->next_emit_ms) {
                    emit_readiness(s);
                    s->next_emit_ms = t + g->cfg->readiness_heartbeat_ms;
                    stream_kick(s);
                }
                break;
            case KVR_RELAY_RPC_SUBSCRIBE_KV_POOL_LOAD:
            case KVR_RELAY_RPC_SUBSCRIBE_SERVING_LOAD:
                if (t >= s->next_emit_ms) {
                    /* a subscriber that does not drain its windows lags (§1.7) */
                    if (s->out_len - s->out_off > 16u * 4096u) {
                        relay_stat(g, RC_LAGGED, 1);
                        stream_end(s, KVR_GRPC_RESOURCE_EXHAUSTED, KVR_RELAY_REASON_SUBSCRIBER_LAGGED,
                                   "load subscriber lagged");
                    } else if (s->rpc == KVR_RELAY_RPC_SUBSCRIBE_KV_POOL_LOAD)
                        emit_load(s);
                    else
                        emit_serving_load(s);
                    s->next_emit_ms = t + g->cfg->load_window_ms;
                    stream_kick(s);
                }
                break;
            }
        }
        if (c->ping_outstanding && t - c->ping_sent_ms > PING_TIMEOUT_MS) {
            kvr_info("grpc: keepalive ping unanswered; closing the connection");
            conn_close(c);
            continue;
        }
        if (!c->ping_outstanding && t - c->last_ping_ms >= PING_INTERVAL_MS) {
            nghttp2_submit_ping(c->session, NGHTTP2_FLAG_NONE, NULL);
            c->ping_outstanding = 1;
            c->ping_sent_ms = t;
            c->last_ping_ms = t;
        }
        conn_pump(c);
    }
    if (!g->detached)
        kvr_uring_flush(&g->uring);
}

void kvr_grpc_start_drain(kvr_grpc_t *g)
{
    if (g->draining)
        return;
    g->draining = 1;
    for (gconn_t *c = g->conns.next; c != &g->conns; c = c->next) {
        for (gstream_t *s = c->streams.next; s != &c->streams; s = s->next) {
            if (s->end_status >= 0)
                continue;
            pool_release(s);
            stream_end(s, KVR_GRPC_UNAVAILABLE, KVR_RELAY_REASON_PUBLICATION_UNAVAILABLE, "server shutting down");
        }
        nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(c->session),
                              NGHTTP2_NO_ERROR, NULL, 0);
        conn_pump(c);
    }
    /* The accept in flight completes when the listener is shut down. */
    shutdown(g->listen_fd, SHUT_RDWR);
    kvr_uring_flush(&g->uring);
}

unsigned kvr_grpc_connections(const kvr_grpc_t *g)
{
    return g->nconns;
}

static void set_callbacks(kvr_grpc_t *g)
{
    nghttp2_session_callbacks_new(&g->cbs);
    nghttp2_session_callbacks_set_on_begin_headers_callback(g->cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(g->cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(g->cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(g->cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(g->cbs, on_stream_close);
    nghttp2_session_callbacks_set_send_data_callback(g->cbs, send_data_cb);
    nghttp2_session_callbacks_set_data_source_read_length_callback(g->cbs, read_length_cb);
}

kvr_grpc_t *kvr_grpc_create_detached(const kvr_config_t *cfg, kvr_seg_t *seg, kvr_store_t *store, kvr_relay_t *relay)
{
    kvr_grpc_t *g = calloc(1, sizeof(*g));

    if (g == NULL)
        return NULL;
    g->cfg = cfg;
    g->seg = seg;
    g->store = store;
    g->relay = relay;
    g->listen_fd = g->wake_fd = -1;
    g->detached = 1;
    g->conns.next = g->conns.prev = &g->conns;
    set_callbacks(g);
    return g;
}

void kvr_grpc_feed(kvr_grpc_t *g, const uint8_t *data, size_t len)
{
    gconn_t *c = conn_new(g, -1);

    if (c == NULL)
        return;
    if (nghttp2_session_mem_recv(c->session, data, len) >= 0) {
        kick_pool_streams(g); /* as a publisher wake-up would */
        kvr_grpc_tick(g);
        conn_pump(c);
    }
    conn_close(c);
    conn_maybe_free(c);
}

void kvr_grpc_destroy_detached(kvr_grpc_t *g)
{
    nghttp2_session_callbacks_del(g->cbs);
    free(g);
}

kvr_grpc_t *kvr_grpc_create(const kvr_config_t *cfg, kvr_seg_t *seg, kvr_store_t *store, kvr_relay_t *relay,
                            void *loop, int listen_fd, int wake_fd)
{
    kvr_grpc_t *g = calloc(1, sizeof(*g));

    if (g == NULL)
        return NULL;
    g->cfg = cfg;
    g->seg = seg;
    g->store = store;
    g->relay = relay;
    g->loop = loop;
    g->listen_fd = listen_fd;
    g->wake_fd = wake_fd;
    g->conns.next = g->conns.prev = &g->conns;
    if (kvr_uring_init(&g->uring, 256) != KVR_OK) {
        free(g);
        return NULL;
    }
    set_callbacks(g);

    h2o_timeout_init(g->loop, &g->kick_timeout, KICK_COALESCE_MS);
    g->kick_entry.cb = on_kick_timeout;
    g->uring_sock = h2o_evloop_socket_create(g->loop, g->uring.efd, H2O_SOCKET_FLAG_DONT_READ);
    g->uring_sock->data = g;
    h2o_socket_read_start(g->uring_sock, on_uring_event);
    g->wake_sock = h2o_evloop_socket_create(g->loop, wake_fd, H2O_SOCKET_FLAG_DONT_READ);
    g->wake_sock->data = g;
    h2o_socket_read_start(g->wake_sock, on_wake);

    g->accept_op.cb = on_accept;
    g->accept_op.data = g;
    if (kvr_uring_accept(&g->uring, listen_fd, &g->accept_op) == KVR_OK)
        g->accepting = 1;
    kvr_uring_flush(&g->uring);
    return g;
}
