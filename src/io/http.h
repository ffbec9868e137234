/*
 * http.h — the worker's HTTP surface on h2o 2.2 (HTTP/1.1 keep-alive, h2c, TLS with ALPN).
 *
 * Endpoints (spec/kvcache-http.md §3): GET/PUT/HEAD/DELETE /kv/<key>, GET /kv/<key>/exists,
 * GET /kv/stats, GET /metrics, GET /healthz, GET /readyz, and the debug views GET /debug/store
 * (a full consistency scan of the store), /debug/relay (publication state, JSON) and
 * /debug/filter (the publisher's filter buckets, little-endian words).
 *
 * Routing is on the raw path (query stripped): exactly /kv/stats is the stats document;
 * /kv/<x>/exists is an existence probe of <x>; any other /kv/<x> is a block. <x> is then
 * percent-decoded.
 *
 * GET bodies are sent straight from the segment: the block is pinned, its arena spans are
 * handed to h2o as iovecs (streamed in batches through the generator's proceed callback),
 * and the pin is released when h2o disposes of the request (a dispose callback on an
 * object in the request's pool), never earlier.
 *
 * Connections are tracked (socket on_close) so that the worker can (1) cut connections
 * whose response writes stall longer than --io-timeout, and (2) drain on SIGTERM: stop
 * accepting, let in-flight requests finish, close idle keep-alive connections.
 */
#ifndef KVR_IO_HTTP_H
#define KVR_IO_HTTP_H

#include "common.h"
#include "core/config.h"
#include "core/relay.h"
#include "core/store.h"
#include "shm/stats.h"

#define KVR_HTTP_METHODS  5 /* GET PUT HEAD DELETE other */
#define KVR_HTTP_STATUSES 14
#define KVR_HTTP_BUCKETS  16
/* the counters must fit between KVR_ST_HTTP_REQ and KVR_ST_HTTP_HIST, and so on */
static_assert(KVR_ST_HTTP_REQ + KVR_HTTP_METHODS * KVR_HTTP_STATUSES <= KVR_ST_HTTP_HIST, "HTTP counters");
static_assert(KVR_ST_HTTP_HIST + KVR_HTTP_METHODS * (KVR_HTTP_BUCKETS + 2) <= KVR_ST_RELAY, "HTTP histograms");

typedef struct kvr_http_s kvr_http_t;

/*
 * Creates the HTTP server of one worker on an h2o event loop it creates, serving the
 * listening socket listen_fd. Returns NULL on failure (logged).
 */
kvr_http_t *kvr_http_create(const kvr_config_t *cfg, kvr_seg_t *seg, kvr_store_t *store, kvr_relay_t *relay,
                            int listen_fd);

/* Runs the loop once for at most max_wait_ms; does periodic housekeeping. */
void kvr_http_run_once(kvr_http_t *h, int32_t max_wait_ms);

/* Begins draining: stop accepting, no new keep-alive. */
void kvr_http_start_drain(kvr_http_t *h);

/* 1 once draining and no connection carries an in-flight request or unread input. */
int kvr_http_drained(kvr_http_t *h);

/* The h2o loop, for other I/O joining it (the gRPC server). */
void *kvr_http_loop(kvr_http_t *h);

void kvr_http_destroy(kvr_http_t *h);

/* Prometheus names of the method and status dimensions, for the metrics page. */
extern const char *const kvr_http_method_names[KVR_HTTP_METHODS];
extern const int kvr_http_status_codes[KVR_HTTP_STATUSES];
extern const double kvr_http_bucket_bounds[KVR_HTTP_BUCKETS];

#endif
