/*
 * config.h — kvrelay's configuration. One table in config.c (name, type, default, range,
 * target field, help) drives parsing, the KVRELAY_* environment twins, range checks, --help
 * and --print-config, so an option is added in one place.
 *
 * Precedence, lowest first: built-in default, the reference server's environment
 * (EPISTEMIC_GRAPH_KVCACHE_ADDR / _TOKEN, only where the KVRELAY_* twin is unset), the
 * KVRELAY_* environment twin of each flag, the command line.
 */
#ifndef KVR_CORE_CONFIG_H
#define KVR_CORE_CONFIG_H

#include "common.h"

#include <stdio.h>

#define KVR_CFG_STR_MAX 512

/* A worker's tick, not a flag: its event loop waits at most this long, and the periodic work
 * of HTTP/1.1 (timeouts, accept back-off, waiting PUTs) and of gRPC streams runs this often. */
#define KVR_TICK_MS 50

typedef struct {
    char http_bind[KVR_CFG_STR_MAX];
    char grpc_bind[KVR_CFG_STR_MAX];
    uint64_t memory;
    uint64_t page_size;
    uint64_t max_blocks;
    uint64_t change_log_events;
    uint64_t workers;
    int no_evict;
    uint64_t max_block_size;
    char token[KVR_CFG_STR_MAX];
    char token_file[KVR_CFG_STR_MAX];
    char tenants[KVR_CFG_STR_MAX];     /* the tenants file (core/tenants.h); "" none */
    char admin_token[KVR_CFG_STR_MAX]; /* the admin token; "" none */
    char tls_cert[KVR_CFG_STR_MAX];
    char tls_key[KVR_CFG_STR_MAX];
    uint64_t shutdown_grace_ms;
    uint64_t hang_timeout_ms; /* watchdog: a heartbeat still for this long is a hang */
    uint64_t idle_timeout_ms;
    uint64_t io_timeout_ms;
    uint64_t header_timeout_ms;   /* a head must be complete this long after its first byte */
    uint64_t min_body_rate;       /* bytes/s a body in flight must keep (0: off) */
    uint64_t body_rate_window_ms; /* ... averaged over this window */
    uint64_t max_connections;     /* per worker; 0: from RLIMIT_NOFILE */
    uint64_t peer_inflight_share; /* percent of a worker's PUT budget per peer address */
    uint64_t max_inflight_bytes;
    uint64_t arena_prefault; /* bytes mapped past the arena high-water mark per worker (0: off) */
    uint64_t recv_lowat;     /* 0: off; else SO_RCVLOWAT while a PUT body is received */
    uint64_t send_zc_min;    /* 0: off; else GET bodies >= this use SENDMSG_ZC */
    uint64_t h2o_max_connections;
    uint64_t h2o_max_body;
    uint64_t h2o_buffer;
    char hugepages[16];
    char log_level[16];
    char port_file[KVR_CFG_STR_MAX];
    char segment_path[KVR_CFG_STR_MAX]; /* warm restart: the segment lives in this file */
    int segment_reset;                  /* discard an existing segment file */
    char ssd_path[KVR_CFG_STR_MAX];     /* the disk tier's file (docs/ssd-tier.md); "" none */
    uint64_t ssd_size;                  /* its size in bytes */
    uint64_t ssd_page_size;             /* its pages */
    uint64_t ssd_slots;                 /* disk index slots (0: ssd_size / 64 KiB) */
    uint64_t ssd_sync_interval_ms;      /* the longest the disk writer writes without a sync */
    uint64_t ssd_window;                /* bytes from each LRU tail kept copied (0: a quarter of memory) */
    char log_format[16];                /* text | json */
    char io_engine[16];                 /* auto | uring | epoll (docs/dataplane.md) */
    /* relay (docs/relay-contract.md) */
    char model[KVR_CFG_STR_MAX];
    uint64_t kv_block_size;
    char hash_format[16];
    char endpoint[KVR_CFG_STR_MAX];
    char dc_id[KVR_CFG_STR_MAX];
    uint64_t expected_unique_blocks;
    uint64_t pool_heartbeat_ms;
    uint64_t snapshot_progress_timeout_ms;
    uint64_t load_window_ms;
    uint64_t readiness_heartbeat_ms;
    uint64_t max_streams;
    uint64_t max_pools;
    uint64_t max_pools_per_ns;
    uint64_t publication_threshold;
    uint64_t publication_delay_us;
    uint64_t publication_coalesce_max; /* 1: deltas never coalesce (docs/relay-contract.md §5.3) */
    /* KV events (docs/kv-events.md) */
    char kv_events_bind[KVR_CFG_STR_MAX];
    char kv_events_replay_bind[KVR_CFG_STR_MAX];
    char kv_events_format[16];
    char kv_events_backend_id[KVR_CFG_STR_MAX];
    uint64_t kv_events_hwm;
    uint64_t kv_events_buffer;
    uint64_t kv_events_buffer_bytes;
    uint64_t kv_events_max_batch;
    uint64_t kv_events_interval_ms;

    /* derived, not in the table */
    int print_config;
    int help;
    int version;
    char token_source[32]; /* where the token came from, for --print-config */
} kvr_config_t;

/*
 * Fills *cfg from defaults, environment and argv. Returns KVR_OK, or KVR_EINVAL after
 * printing the problem to `err`. --help and --print-config set the fields of those names.
 */
int kvr_config_load(kvr_config_t *cfg, int argc, char **argv, FILE *err);

void kvr_config_usage(FILE *out, const char *prog);
void kvr_config_print(const kvr_config_t *cfg, FILE *out);

/* The size parser of the tree: decimal digits, then optionally K, M, G or T (powers of 1024,
 * either case), then optionally "i" and then "B" ("4096", "512K", "64M", "1GiB", "2mb").
 * No sign, fraction, space or overflow. Returns KVR_OK or KVR_EINVAL. */
int kvr_config_parse_size(const char *s, uint64_t *out);
/* Parses "10s", "500ms", "2m", "3" (seconds) into milliseconds. */
int kvr_config_parse_duration(const char *s, uint64_t *out_ms);
/* Splits "host:port" / "[v6]:port" into host and port. Returns KVR_OK or KVR_EINVAL. */
int kvr_config_split_hostport(const char *s, char *host, size_t hostlen, uint16_t *port);

#endif
