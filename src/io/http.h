/*
 * http.h — the h2o 2.2 side of the worker's HTTP surface: TLS (ALPN h2 and http/1.1) and HTTP/2
 * cleartext (prior knowledge). Cleartext HTTP/1.1 is served by the io_uring path (h1.h), which
 * accepts every connection and hands a socket here when its first bytes are a TLS ClientHello
 * or the HTTP/2 preface (peeked, so no byte is lost).
 *
 * Requests go through the same request layer (api.h). h2o 2.2 buffers every request body whole
 * before the handler runs, so this path has its own bounds: at most --h2o-max-connections
 * connections per worker (further ones wait, unread, in the io_uring path) and bodies of at most
 * --h2o-max-body (413 / REFUSED_STREAM above); the body is then copied once into the reservation.
 * GET bodies are handed to h2o as iovecs of the pinned block; the pin is released when h2o
 * disposes of the request, never earlier.
 *
 * Connections are tracked (socket on_close) so that the worker can cut those whose bytes have
 * not moved for --io-timeout while a request is in flight, and drain on SIGTERM.
 */
#ifndef KVR_IO_HTTP_H
#define KVR_IO_HTTP_H

#include "common.h"
#include "core/config.h"
#include "io/api.h"

typedef struct kvr_http_s kvr_http_t;

/* Creates the h2o side of one worker on an h2o event loop it creates. NULL on failure (logged). */
kvr_http_t *kvr_http_create(const kvr_config_t *cfg, kvr_api_t *api);

/* Hands an accepted socket to h2o. KVR_OK, or KVR_AGAIN when h2o is at its connection cap
 * (the caller keeps the socket and tries again later). */
int kvr_http_adopt(kvr_http_t *h, int fd);

/* 1 when TLS is configured. */
int kvr_http_tls(const kvr_http_t *h);

/* Calls cb(data) whenever fd (an eventfd) is readable; the callback reads it. */
int kvr_http_watch_fd(kvr_http_t *h, int fd, void (*cb)(void *data), void *data);

/* Runs the loop once for at most max_wait_ms; does periodic housekeeping. */
void kvr_http_run_once(kvr_http_t *h, int32_t max_wait_ms);

/* h2o's epoll descriptor, for a loop that waits elsewhere and polls it (readable: h2o has an
 * event; run it with kvr_http_run_once(h, 0)); -1 when it cannot be found (logged). */
int kvr_http_epoll_fd(const kvr_http_t *h);

/* How long h2o can go without a run: 0 when it has work queued (a socket state change, a
 * pending callback, a timer due), else the time to its next timer, at most max_ms. */
int32_t kvr_http_idle_ms(kvr_http_t *h, int32_t max_ms);

/* Begins draining: no new keep-alive, idle connections close. */
void kvr_http_start_drain(kvr_http_t *h);

/* 1 once draining and no connection is left. */
int kvr_http_drained(kvr_http_t *h);

uint64_t kvr_http_connections(const kvr_http_t *h);

/* The h2o loop, for other I/O joining it (the gRPC server). */
void *kvr_http_loop(kvr_http_t *h);

void kvr_http_destroy(kvr_http_t *h);

#endif
