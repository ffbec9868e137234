/*
 * worker.h — one load thread: its epoll loop, connections, statistics and, for the relay
 * workload, its subscribers. The engine (engine*.c) runs it; the relay subscribers
 * (relay.c) register with its epoll instance and keep their state behind `relay`; main reads
 * the progress counters while the thread runs and everything else after it has been joined.
 * A header of types only: the functions that work on a worker are the engine's (engine.h).
 */
#ifndef KVB_WORKER_H
#define KVB_WORKER_H

#include "hist.h"

#include <pthread.h>
#include <stdint.h>

typedef struct kvb_worker kvb_worker_t;
typedef struct kvb_conn kvb_conn_t; /* engine_int.h */
struct kvb_relay_w;                 /* relay.c */

/* The first int of every object registered with a worker's epoll says what it is. */
enum { KVB_FD_CONN = 1,
       KVB_FD_SUB = 2 };

struct kvb_worker {
    int id;
    pthread_t th;
    int ep;
    kvb_conn_t **conns;
    int nconns;
    kvb_conn_t **reopen, **reopen_b;
    int nreopen;
    uint8_t *tbuf;
    uint64_t rng;
    uint64_t put_cursor;
    int phase, issuing, paced;
    uint64_t active;      /* requests in flight */
    uint64_t paced_sent;  /* relay: PUTs issued */
    uint64_t relay_next;  /* relay: next unique key */
    uint64_t t_last_done; /* last completion of a measured request */
    kvb_stats_t *st, *pre;
    struct kvb_relay_w *relay;
    char sample[EK_N][200]; /* the first error of each kind, for the report */
    /* progress, read by the main thread */
    uint64_t p_done __attribute__((aligned(64)));
    uint64_t p_bytes, p_errors;
};

#endif
