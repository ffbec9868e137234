/*
 * kvb.h — kvrelay-bench, the load generator run against a live kvrelay (or redis-server, or
 * memcached). Shared types of its modules:
 *
 *   main.c    options, --help, threads and phases, the results table and the JSON file
 *   engine.c  one epoll loop per thread over many keep-alive connections: HTTP/1.1, h2c
 *             (libnghttp2 client sessions), RESP2 and the memcached text protocol
 *   data.c    block bytes as a function of (key, size), their checksums, key choice
 *   hist.c    log-bucketed latency histograms (1/128 relative precision)
 *   relay.c   the relay workload's gRPC subscribers (kvr_gclient + kvr_mirror)
 *
 * The hot path does no per-byte work except the verification checksum (XXH3-64 over a GET
 * body while it is received): PUT bodies are sent with writev straight from one read-only
 * pool, responses are read 256 KiB at a time into one buffer per thread.
 */
#ifndef KVB_H
#define KVB_H

#include "common.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

/* Operations, in report order. */
enum kvb_op { OP_PUT, OP_GET, OP_HEAD, OP_EXISTS, OP_DELETE, OP_N };

/* Error kinds. A miss (404, nil, END, EN) is an error of kind "miss" unless --misses ok. */
enum kvb_ek {
    EK_CORRUPT,     /* GET body differs from the bytes PUT (checksum mismatch) */
    EK_STATUS,      /* unexpected status / reply (5xx, 409, 507, -ERR, SERVER_ERROR, ...) */
    EK_MISS,        /* block absent */
    EK_LENGTH,      /* a length other than the size PUT (Content-Length, $n, VALUE n, s<n>) */
    EK_SHORT,       /* connection or stream ended inside a response */
    EK_CONNECT,     /* connect failed, or the connection failed before a response began */
    EK_TIMEOUT,     /* no complete response within --timeout */
    EK_PROTOCOL,    /* unparseable response, unexpected bytes */
    EK_UNPUBLISHED, /* relay: an acknowledged PUT never reached a subscriber's replica */
    EK_N
};

enum kvb_proto { PROTO_HTTP, PROTO_RESP, PROTO_MEMCACHE };
enum kvb_wl { WL_PUT, WL_GET, WL_HEAD, WL_EXISTS, WL_MIXED, WL_RELAY };
enum kvb_phase { PH_PRELOAD, PH_MAIN };

extern const char *const kvb_op_name[OP_N];
extern const char *const kvb_ek_name[EK_N];

/* ---------------------------------------------------------------- histogram (hist.c) */

#define KVB_HIST_SUB 7
#define KVB_HIST_N   ((64 - KVB_HIST_SUB + 1) << KVB_HIST_SUB)

typedef struct kvb_hist {
    uint64_t n, max, sum;
    uint64_t b[KVB_HIST_N];
} kvb_hist_t;

void kvb_hist_add(kvb_hist_t *h, uint64_t v);
void kvb_hist_merge(kvb_hist_t *d, const kvb_hist_t *s);
/* The value at quantile q (0..1): the middle of its bucket, never above the maximum. */
uint64_t kvb_hist_quantile(const kvb_hist_t *h, double q);

/* ---------------------------------------------------------------- statistics */

typedef struct kvb_stats {
    uint64_t ok[OP_N];     /* successes, misses included when --misses ok */
    uint64_t miss_ok[OP_N];
    uint64_t bytes[OP_N];  /* payload bytes of successes: PUT bodies, verified GET bodies */
    uint64_t err[OP_N][EK_N];
    uint64_t status[OP_N][600]; /* HTTP status codes seen (HTTP only) */
    kvb_hist_t lat[OP_N];       /* latency of successes, ns */
} kvb_stats_t;

void kvb_stats_merge(kvb_stats_t *d, const kvb_stats_t *s);

/* ---------------------------------------------------------------- configuration */

typedef struct kvb_cfg {
    char target[256];
    struct sockaddr_storage addr;
    socklen_t addrlen;
    int proto, http2, streams;
    const char *token;
    int workload;
    unsigned mix[OP_N], mix_total;
    uint64_t size_min, size_max;
    char size_spec[64];
    uint64_t keys;
    char prefix[256];
    int zipf;
    double zipf_s, dedup;
    int conns, threads;
    double duration, warmup, timeout;
    uint64_t requests;
    int preload, quiet, verify, misses_ok;
    const char *json;
    uint64_t max_errors;
    char grpc[256];
    int subscribers;
    double rate;
    int argc;
    char **argv;
} kvb_cfg_t;

extern kvb_cfg_t G;

/* Run control shared by the threads; written by main between phases. */
typedef struct kvb_ctl {
    volatile int stop;     /* SIGINT, or a fatal setup failure */
    int fatal;
    uint64_t t_start;      /* main phase begins (ns, CLOCK_MONOTONIC) */
    uint64_t t_measure;    /* warmup ends: completions of requests started from here count */
    uint64_t t_deadline;   /* no new request from here (0: none) */
    uint64_t preload_next; /* atomic: next key to preload */
    uint64_t claimed;      /* atomic: measured requests claimed (--requests) */
    pthread_barrier_t bar;
} kvb_ctl_t;

extern kvb_ctl_t C;

static inline uint64_t kvb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- data (data.c) */

static inline uint64_t kvb_mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static inline uint64_t kvb_rand(uint64_t *s)
{
    *s += 0x9E3779B97F4A7C15ull;
    return kvb_mix64(*s);
}

/* A block: its first bytes (a stamp of key and size) then a slice of the shared pool. */
typedef struct kvb_block {
    uint8_t stamp[16];
    size_t stamp_len;
    const uint8_t *rest;
    size_t rest_len;
} kvb_block_t;

int kvb_data_init(int cache_checksums);
size_t kvb_key_name(uint64_t k, char *out, size_t cap); /* raw key (RESP, memcache) */
size_t kvb_key_path(uint64_t k, char *out, size_t cap); /* percent-encoded (HTTP path) */
uint64_t kvb_key_size(uint64_t k);
void kvb_block(uint64_t k, kvb_block_t *b);
uint64_t kvb_block_checksum(uint64_t k); /* XXH3-64 of the block, cached per key */
uint64_t kvb_pick_key(uint64_t *rng);    /* --popularity over [0, keys) */
const char *kvb_prefix_enc(void);

/* ---------------------------------------------------------------- engine (engine.c) */

typedef struct kvb_worker kvb_worker_t;
typedef struct kvb_conn kvb_conn_t;
struct kvb_relay_w;

enum { KVB_FD_CONN = 1, KVB_FD_SUB = 2 };

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

kvb_worker_t *kvb_worker_new(int id);
int kvb_worker_add_conn(kvb_worker_t *w);
void *kvb_worker_main(void *arg);
void kvb_note_error(kvb_worker_t *w, int ek, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---------------------------------------------------------------- relay (relay.c) */

void kvb_relay_init(void);
int kvb_relay_add_sub(kvb_worker_t *w, int id); /* before the threads start */
int kvb_relay_setup(kvb_worker_t *w);           /* in the thread: connect, catalog, subscribe, live */
void kvb_relay_event(kvb_worker_t *w, void *sub, uint32_t events);
void kvb_relay_tick(kvb_worker_t *w, uint64_t now);
int kvb_relay_busy(kvb_worker_t *w, uint64_t now); /* still waiting for acknowledged PUTs */
void kvb_relay_ack(uint64_t hash, uint64_t t, int measured);
void kvb_relay_puts_done(void);
void kvb_relay_close(kvb_worker_t *w);
uint64_t kvb_relay_seq_hash(uint64_t i);
/* Results: errors added to err[], JSON and table written by the caller's helpers. */
uint64_t kvb_relay_errors(kvb_worker_t **ws, int n, uint64_t *ended, uint64_t *unpublished, uint64_t *failed);
void kvb_relay_print(FILE *f, kvb_worker_t **ws, int n, double elapsed);
void kvb_relay_json(FILE *f, kvb_worker_t **ws, int n, double elapsed);

/* JSON helpers (main.c) */
void kvb_json_str(FILE *f, const char *s);
void kvb_json_lat(FILE *f, const kvb_hist_t *h);

#endif
