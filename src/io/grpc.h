/*
 * grpc.h — the worker's gRPC server: dynamo.kvrelay.v1.KvEventRelay and grpc.health.v1 on
 * libnghttp2, with socket I/O on the worker's io_uring (io/uring.h), joined to the h2o
 * event loop through the ring's completion eventfd and the worker's wake-up eventfd.
 *
 * Each worker owns one SO_REUSEPORT listener. Streams (docs/relay-contract.md):
 *   GetRelayInfo               unary
 *   WatchKvPoolCatalog         the caller's pools, at once and when what it lists changes
 *   SubscribeKvPool            snapshot chunks from a publisher snapshot copy, then the
 *                              published deltas from the shared frame ring, heartbeats
 *   SubscribeServingReadiness  an empty, complete topology, repeated every interval
 *   SubscribeKvPoolLoad        one window per --load-window
 *   SubscribeServingLoad       the caller's pools with status UNAVAILABLE, one window per interval
 *   grpc.health.v1.Health/Check
 * Errors before the first message are Trailers-Only; every error carries grpc-status,
 * grpc-message and, where a reason applies, the kv-relay-error-reason trailer
 * (docs/relay-contract.md, "Transport and service").
 *
 * The parts (io/grpc_int.h): grpc_conn.c (connections), grpc_relay.c (the relay service, a
 * table of RPCs), grpc_health.c, and the framing in wire/grpc_frame.h.
 */
#ifndef KVR_IO_GRPC_H
#define KVR_IO_GRPC_H

#include "common.h"
#include "core/config.h"
#include "core/relay.h"
#include "core/store.h"

typedef struct kvr_grpc_s kvr_grpc_t;

/*
 * Starts serving listen_fd on the h2o loop `loop` (an h2o_evloop_t *), with wake_fd being
 * this worker's eventfd (the publisher signals it). NULL on failure (logged).
 */
kvr_grpc_t *kvr_grpc_create(const kvr_config_t *cfg, kvr_seg_t *seg, kvr_store_t *store, kvr_relay_t *relay,
                            void *loop, int listen_fd, int wake_fd);

/* Periodic work: heartbeats, load windows, catalog changes, timeouts, keepalive pings. */
void kvr_grpc_tick(kvr_grpc_t *g);

/* Stop accepting; end every stream with UNAVAILABLE; GOAWAY. */
void kvr_grpc_start_drain(kvr_grpc_t *g);

/* Connections still open. */
unsigned kvr_grpc_connections(const kvr_grpc_t *g);

/* Pushes queued io_uring submissions (call once per loop iteration). */
void kvr_grpc_flush(kvr_grpc_t *g);

#endif
