/*
 * kvb.h — kvrelay-bench, the load generator run against a live kvrelay (or redis-server, or
 * memcached): what every module of the tool shares, and the map of the modules.
 *
 *   kvb.c          this header's definitions: the run's configuration (G), its control (C), names
 *   hist.c         log-bucketed latency histograms and the per-thread statistics
 *   data.c         block bytes as a function of (key, size), their checksums, key choice
 *   json.c         JSON string and latency writers for the results file
 *   worker.h       one load thread's state, shared by the engine and the relay subscribers
 *   engine*.c      one epoll loop per thread over many keep-alive connections: engine.c
 *                  (connections, requests, the loop), engine_proto.c (responses, HTTP/1.1, RESP2,
 *                  memcached text), engine_h2.c (h2c through libnghttp2 client sessions)
 *   relay.c        the relay workload's gRPC subscribers (kvr_gclient + kvr_mirror)
 *   args.c         the command line and --help
 *   report.c       the results table, the summary line and the JSON file
 *   main.c         threads and phases
 *
 * Each module's header declares only what its own .c files define, and the includes form no
 * circle (scripts/check-layers.py checks both): kvb, hist, data, json, worker at the bottom;
 * relay above them; engine above relay; args and report beside engine; main on top.
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
#include <time.h>

/* Operations, in report order. */
enum kvb_op { OP_PUT,
              OP_GET,
              OP_HEAD,
              OP_EXISTS,
              OP_DELETE,
              OP_N };

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

enum kvb_proto { PROTO_HTTP,
                 PROTO_RESP,
                 PROTO_MEMCACHE };
enum kvb_wl { WL_PUT,
              WL_GET,
              WL_HEAD,
              WL_EXISTS,
              WL_MIXED,
              WL_RELAY,
              WL_N };
enum kvb_phase { PH_PRELOAD,
                 PH_MAIN };

extern const char *const kvb_op_name[OP_N];
extern const char *const kvb_ek_name[EK_N];
extern const char *const kvb_workload_name[WL_N];

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
    char events[256]; /* --events: kvrelay's KV events PUB endpoint */
    int event_subs;
    double rate;
    int argc;
    char **argv;
} kvb_cfg_t;

/* Written by args.c before the threads start, read-only afterwards (target's address by main). */
extern kvb_cfg_t G;

/* Run control shared by the threads; written by main between phases. */
typedef struct kvb_ctl {
    volatile int stop; /* SIGINT, or a fatal setup failure */
    int fatal;
    uint64_t t_start;      /* main phase begins (ns, CLOCK_MONOTONIC) */
    uint64_t t_measure;    /* warmup ends: completions of requests started from here count */
    uint64_t t_deadline;   /* no new request from here (0: none) */
    uint64_t preload_next; /* atomic: next key to preload */
    uint64_t claimed;      /* atomic: measured requests claimed (--requests) */
    pthread_barrier_t bar;
} kvb_ctl_t;

extern kvb_ctl_t C;

/* "resp", "memcache", "h2c" or "http/1.1": the transport, as the reports name it. */
const char *kvb_proto_label(void);

static inline uint64_t kvb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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

#endif
