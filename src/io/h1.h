/*
 * h1.h — cleartext HTTP/1.1 on the worker's io_uring: the data plane's fast path.
 *
 * Every connection the worker takes from the shared listener is accepted here
 * (IORING_OP_ACCEPT; the workers take turns by load, see kvr_seg_accept_yield). Its first
 * bytes are looked at without being consumed (MSG_PEEK): a TLS ClientHello or the HTTP/2
 * preface hands the socket to h2o (http.c) with no byte lost; everything else is served here.
 *
 * Per connection the worker holds one fixed head buffer (16 KiB + slack: 431 beyond) and one
 * response record; nothing it allocates grows with a body. A PUT is decided from its head by
 * the request layer (api.h); a new block's body is received with recvmsg straight into the
 * spans of its reservation in the arena, a dedup hit's body is discarded in the kernel
 * (MSG_TRUNC). The only body bytes copied in user space are those that arrived in the same
 * read as the head (at most the head buffer). A GET is one sendmsg of the response head and
 * the pinned block's spans; the pin is released when the last byte has been handed to the
 * kernel. Chunked request bodies are the exception: they are collected in a heap buffer of at
 * most KVR_H1_CHUNKED_MAX bytes (413 beyond), at most KVR_H1_CHUNKED_CONNS at a time per
 * worker (503 beyond), and then stored with one copy.
 *
 * Deadlines (docs/dataplane.md, "Connection states and their deadlines"): every state has
 * one. A head must be complete within --header-timeout of its first byte; a body or block
 * response in flight keeps --min-body-rate over --body-rate-window (408 or the cut); nothing
 * may pause for --io-timeout; idle connections close after --idle-timeout. One client address
 * holds at most --peer-inflight-share of the PUT budget. Out of descriptors or at
 * --max-connections, the longest-idle connections are closed to make room; with none idle the
 * worker stops accepting until one ends (logged once per episode).
 */
#ifndef KVR_IO_H1_H
#define KVR_IO_H1_H

#include "common.h"
#include "io/api.h"
#include "io/http.h"

#define KVR_H1_HEAD_MAX      (KVR_API_MAX_HEAD + 512) /* head buffer per connection */
#define KVR_H1_CHUNKED_MAX   (8u << 20)
#define KVR_H1_CHUNKED_CONNS 8

typedef struct kvr_h1_s kvr_h1_t;

/* Serves listen_fd, which every worker shares, on a ring of its own whose completions join
 * the h2o loop of http. accept_fds holds every worker's turn eventfd by process slot (ours at
 * api->seg->slot): see kvr_h1_accept_turn in h1_accept.c. */
kvr_h1_t *kvr_h1_create(const kvr_config_t *cfg, kvr_api_t *api, kvr_http_t *http, int listen_fd,
                        const int *accept_fds);

/* 1 when the worker's loop waits in this server's ring (kvr_h1_turn) rather than in h2o's
 * (io_uring, and h2o's epoll descriptor found). */
int kvr_h1_waits(const kvr_h1_t *s);
/* One turn of a loop that waits in the ring (kvr_h1_waits): submits, waits up to max_ms (or
 * h2o's next timer) for a completion or for h2o's descriptors, runs the completions'
 * callbacks, then runs h2o without waiting when it has events, work queued or a timer due, and
 * at least every KVR_TICK_MS. */
void kvr_h1_turn(kvr_h1_t *s, int32_t max_ms);
/* Pushes queued submissions now (before the loop gives up its core: responses that wait in the
 * ring until the next kvr_h1_turn would wait out the yield too). */
void kvr_h1_submit(kvr_h1_t *s);

/* Queues what waits for a loop turn (waiting PUTs, the accept turn) and, unless the loop waits
 * in the ring, pushes queued submissions; the worker calls it once per loop iteration. */
void kvr_h1_flush(kvr_h1_t *s);

/* Timeouts, accept back-off, waiting PUTs; every 50 ms or so. */
void kvr_h1_tick(kvr_h1_t *s);

/* Stops accepting; idle connections close, busy ones after their response. */
void kvr_h1_start_drain(kvr_h1_t *s);

/* Connections still open. */
uint64_t kvr_h1_connections(const kvr_h1_t *s);

#endif
