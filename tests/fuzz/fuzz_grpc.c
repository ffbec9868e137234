/*
 * libFuzzer driver for the gRPC request path: raw client bytes (after the HTTP/2 client
 * preface, which the driver supplies) are sent over a real loopback TCP connection to the real
 * gRPC server (io/grpc_*.c: accept and recv/send on its ring, the h2o loop) backed by a real
 * segment, store and relay state. The driver drains what the server sends, plays a publisher
 * wake-up once the input is in, half-closes, and runs the loop until the server has closed the
 * connection (bounded). Everything a connection does runs: HPACK, stream bookkeeping, message
 * reassembly and limits, request validation, dispatch of every RPC, admission, responses,
 * trailers, ticks, teardown. A crash, a sanitizer report, a connection the server never ends
 * or a leaked admission permit or subscriber slot is a bug.
 *
 * Seeds: run with KVR_FUZZ_GEN_CORPUS=DIR to write one input per RPC (valid and invalid
 * requests, produced by nghttp2's client session) into DIR.
 */
#include "core/config.h"
#include "base/log.h"
#include "core/relay_int.h"
#include "core/store.h"
#include "io/grpc.h"
#include "io/listen.h"
#include "fuzz_worker.h"
#include "wire/health.pb-c.h"
#include "wire/relay.pb-c.h"

#define H2O_USE_LIBUV 0
#include <errno.h>
#include <h2o.h>
#include <netinet/in.h>
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static kvr_config_t cfg;
static kvr_seg_t seg;
static kvr_store_t store;
static kvr_relay_t relay;
static kvr_relay_fds_t fds;
static kvr_grpc_t *server;
static h2o_evloop_t *loop;
static int wake_fd;
static uint16_t port;

/* ---- seed generation with nghttp2's client session */

typedef struct {
    uint8_t *buf;
    size_t len;
} sink_t;

static ssize_t body_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t length, uint32_t *flags,
                         nghttp2_data_source *src, void *user)
{
    sink_t *b = src->ptr;
    size_t n = b->len < length ? b->len : length;
    memcpy(buf, b->buf, n);
    b->buf += n;
    b->len -= n;
    if (b->len == 0)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

#define H(n, v) \
    { \
        (uint8_t *)(n), (uint8_t *)(v), strlen(n), strlen(v), NGHTTP2_NV_FLAG_NONE \
    }

static void write_seed(const char *dir, const char *name, const char *path, const uint8_t *msg, size_t mlen)
{
    nghttp2_session_callbacks *cbs;
    nghttp2_session *s;
    nghttp2_nv hdrs[] = {H(":method", "POST"), H(":scheme", "http"), H(":path", path), H(":authority", "x"),
                         H("content-type", "application/grpc"), H("te", "trailers")};
    uint8_t body[4096];
    sink_t src = {body, mlen + 5};
    nghttp2_data_provider prd = {{.ptr = &src}, body_read};
    char fn[512];
    FILE *f;
    const uint8_t *out;
    ssize_t n;

    body[0] = 0;
    kvr_put_be32(body + 1, (uint32_t)mlen);
    memcpy(body + 5, msg, mlen);
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_client_new(&s, cbs, NULL);
    nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, NULL, 0);
    nghttp2_submit_request(s, NULL, hdrs, KVR_ARRAY_SIZE(hdrs), &prd, NULL);
    snprintf(fn, sizeof(fn), "%s/%s", dir, name);
    f = fopen(fn, "wb");
    while ((n = nghttp2_session_mem_send(s, &out)) > 0) {
        /* the driver adds the 24-byte client preface itself */
        if (out[0] == 'P' && n >= 24 && !memcmp(out, NGHTTP2_CLIENT_MAGIC, 24)) {
            out += 24;
            n -= 24;
        }
        fwrite(out, 1, (size_t)n, f);
    }
    fclose(f);
    nghttp2_session_del(s);
    nghttp2_session_callbacks_del(cbs);
}

static void gen_corpus(const char *dir)
{
    uint8_t m[2048];
    size_t n;
    kvr_relay_ident_t id;
    Dynamo__Kvrelay__V1__RelayInfoRequest ri = DYNAMO__KVRELAY__V1__RELAY_INFO_REQUEST__INIT;
    Dynamo__Kvrelay__V1__WatchKvPoolCatalogRequest wc = DYNAMO__KVRELAY__V1__WATCH_KV_POOL_CATALOG_REQUEST__INIT;
    Dynamo__Kvrelay__V1__SubscribeKvPoolRequest sp = DYNAMO__KVRELAY__V1__SUBSCRIBE_KV_POOL_REQUEST__INIT;
    Dynamo__Kvrelay__V1__SubscribeKvPoolLoadRequest sl = DYNAMO__KVRELAY__V1__SUBSCRIBE_KV_POOL_LOAD_REQUEST__INIT;
    Dynamo__Kvrelay__V1__SubscribeServingReadinessRequest sr = DYNAMO__KVRELAY__V1__SUBSCRIBE_SERVING_READINESS_REQUEST__INIT;
    Dynamo__Kvrelay__V1__SubscribeServingLoadRequest ss = DYNAMO__KVRELAY__V1__SUBSCRIBE_SERVING_LOAD_REQUEST__INIT;
    Grpc__Health__V1__HealthCheckRequest hc = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;

    ri.contract_marker = 0x4B565231u;
    n = dynamo__kvrelay__v1__relay_info_request__pack(&ri, m);
    write_seed(dir, "get_relay_info", "/dynamo.kvrelay.v1.KvEventRelay/GetRelayInfo", m, n);
    ri.contract_marker = 1;
    n = dynamo__kvrelay__v1__relay_info_request__pack(&ri, m);
    write_seed(dir, "get_relay_info_bad_marker", "/dynamo.kvrelay.v1.KvEventRelay/GetRelayInfo", m, n);
    wc.subscriber_id = "pylon";
    wc.contract_marker = 0x4B565231u;
    n = dynamo__kvrelay__v1__watch_kv_pool_catalog_request__pack(&wc, m);
    write_seed(dir, "watch_catalog", "/dynamo.kvrelay.v1.KvEventRelay/WatchKvPoolCatalog", m, n);
    kvr_relay_ident(&relay, 0, 1, &id);
    sp.subscriber_id = "router";
    sp.expected_producer = &id.producer;
    sp.contract_marker = 0x4B565231u;
    n = dynamo__kvrelay__v1__subscribe_kv_pool_request__pack(&sp, m);
    write_seed(dir, "subscribe_pool", "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool", m, n);
    id.producer.layout_generation = 0;
    n = dynamo__kvrelay__v1__subscribe_kv_pool_request__pack(&sp, m);
    write_seed(dir, "subscribe_pool_gen0", "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool", m, n);
    sl.subscriber_id = "l";
    sl.contract_marker = 0x4B565231u;
    n = dynamo__kvrelay__v1__subscribe_kv_pool_load_request__pack(&sl, m);
    write_seed(dir, "subscribe_load", "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPoolLoad", m, n);
    sr.subscriber_id = "r";
    sr.contract_marker = 0x4B565231u;
    n = dynamo__kvrelay__v1__subscribe_serving_readiness_request__pack(&sr, m);
    write_seed(dir, "subscribe_readiness", "/dynamo.kvrelay.v1.KvEventRelay/SubscribeServingReadiness", m, n);
    ss.subscriber_id = "s";
    ss.contract_marker = 0x4B565231u;
    n = dynamo__kvrelay__v1__subscribe_serving_load_request__pack(&ss, m);
    write_seed(dir, "subscribe_serving_load", "/dynamo.kvrelay.v1.KvEventRelay/SubscribeServingLoad", m, n);
    hc.service = "dynamo.kvrelay.v1.KvEventRelay";
    n = grpc__health__v1__health_check_request__pack(&hc, m);
    write_seed(dir, "health_check", "/grpc.health.v1.Health/Check", m, n);
    write_seed(dir, "unknown_method", "/dynamo.kvrelay.v1.KvEventRelay/Nope", m, n);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char *args[] = {"fuzz", NULL};
    const char *gen = getenv("KVR_FUZZ_GEN_CORPUS");
    int lfd;

    fuzz_worker_setup(1, args, &cfg, &seg, &store, &relay, &fds);
    atomic_store(&relay.sh->generation, 1); /* as if a publisher ran */
    atomic_store(&seg.hdr->ctl.publisher_running, 1);
    port = 0;
    lfd = kvr_listen_tcp("127.0.0.1:0", &port, 64);
    loop = h2o_evloop_create();
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (lfd < 0 || wake_fd < 0)
        abort();
    server = kvr_grpc_create(&cfg, &seg, &store, &relay, loop, lfd, wake_fd);
    if (server == NULL)
        abort();
    if (gen != NULL) {
        gen_corpus(gen);
        exit(0);
    }
    return 0;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* One iteration of the worker's loop as proc/worker.c runs it, with the tick at every turn
 * (the worker ticks every 50 ms): timers, heartbeats and windows are reached sooner. */
static void run_loop(int ms)
{
    h2o_evloop_run(loop, ms);
    kvr_grpc_tick(server);
    kvr_grpc_flush(server);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t buf[1 << 20];
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    size_t n = size < sizeof(buf) - 24 ? size : sizeof(buf) - 24, off = 0;
    uint64_t one = 1, t0;
    int fd = socket(AF_INET, SOCK_STREAM, 0), closed = 0;

    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        abort();
    memcpy(buf, NGHTTP2_CLIENT_MAGIC, 24);
    memcpy(buf + 24, data, n);
    n += 24;
    for (t0 = mono_ms(); off < n && mono_ms() - t0 < 3000;) {
        ssize_t w = send(fd, buf + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN)
            break; /* the server closed on us */
        if (w > 0)
            off += (size_t)w;
        run_loop(0);
        closed = drain_client(fd);
    }
    /* as a publisher wake-up would: waiting pool subscribers look at their slots */
    if (write(wake_fd, &one, sizeof(one)) != sizeof(one))
        abort();
    for (int i = 0; i < 3 && !closed; i++) {
        run_loop(1);
        closed = drain_client(fd);
    }
    shutdown(fd, SHUT_WR);
    /* The server closes the connection at EOF. */
    for (t0 = mono_ms(); !closed && mono_ms() - t0 < 3000;) {
        run_loop(1);
        closed = drain_client(fd);
    }
    close(fd);
    for (int i = 0; i < 200 && kvr_grpc_connections(server) > 0; i++)
        run_loop(1);
    if (!closed || kvr_grpc_connections(server) > 0) {
        fprintf(stderr, "fuzz_grpc: connection not ended (client saw close %d, server has %u)\n", closed,
                kvr_grpc_connections(server));
        abort(); /* a connection the server never ended */
    }
    /* every stream was torn down with the connection: no permit may be left behind */
    for (int t = 0; t < KVR_STREAM_TYPES; t++)
        if (atomic_load(&relay.sh->active[t]) != 0)
            abort();
    /* and every pool subscription was released: its slot is FREE (never claimed) or
     * RELEASING (handed back); here, with no publisher, this driver frees it as the
     * publisher would (docs/concurrency.md, "Subscriber slots") */
    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++) {
        kvr_relay_sub_t *s = &relay.sh->sub[i];
        uint32_t st = KVR_SUB_RELEASING;
        if (atomic_compare_exchange_strong(&s->state, &st, KVR_SUB_FREE))
            atomic_store(&s->owner, 0);
        else if (st != KVR_SUB_FREE)
            abort();
    }
    return 0;
}
