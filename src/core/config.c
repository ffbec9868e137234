/* config.c — see config.h. */
#include "core/config.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

enum { T_STR,
       T_SIZE,
       T_UINT,
       T_BOOL,
       T_DURATION };

typedef struct {
    const char *name; /* flag without "--"; the env twin is KVRELAY_ + upper(name), '-' -> '_' */
    int type;
    const char *def;
    uint64_t min, max; /* for numeric types */
    size_t off;
    size_t len; /* for strings */
    const char *help;
} opt_t;

#define S(f) offsetof(kvr_config_t, f), sizeof(((kvr_config_t *)0)->f)
#define N(f) offsetof(kvr_config_t, f), 0
#define GIB  (1ull << 30)

static const opt_t opts[] = {
    {"http-bind", T_STR, "127.0.0.1:9130", 0, 0, S(http_bind), "HTTP listener host:port (port 0: ephemeral)"},
    {"grpc-bind", T_STR, "127.0.0.1:5561", 0, 0, S(grpc_bind), "gRPC relay listener host:port, or 'off'"},
    {"memory", T_SIZE, "1G", 1ull << 20, 1ull << 42, N(memory), "block arena payload capacity (K/M/G suffixes)"},
    {"page-size", T_SIZE, "4K", 4096, 2ull << 20, N(page_size), "arena allocation granule (power of two)"},
    {"max-blocks", T_UINT, "0", 0, 1ull << 31, N(max_blocks), "index entries (0: one per two arena pages)"},
    {"change-log-events", T_UINT, "0", 0, 1ull << 30, N(change_log_events), "the ring of store changes the publisher reads (0: two per index entry, at least 131072; docs/concurrency.md)"},
    {"workers", T_UINT, "0", 0, 60, N(workers), "worker processes (0: one per CPU this process may run on, from its affinity mask)"},
    {"no-evict", T_BOOL, "false", 0, 1, N(no_evict), "answer 507 instead of evicting when full"},
    {"max-block-size", T_SIZE, "256M", 1, 4 * GIB, N(max_block_size), "largest PUT body accepted (413 above; lowered at start to what --memory can hold)"},
    {"token", T_STR, "", 0, 0, S(token), "bearer token required on every request but the probes"},
    {"token-file", T_STR, "", 0, 0, S(token_file), "file holding the bearer token (e.g. a mounted secret)"},
    {"tenants", T_STR, "", 0, 0, S(tenants), "tenants file: one 'NAMESPACE TOKEN [memory=SIZE] [model=NAME]' a line, each token opens its namespace; reloaded on SIGHUP and when it changes (docs/operations.md); --token stays the token of namespace 'default'"},
    {"admin-token", T_STR, "", 0, 0, S(admin_token), "bearer token of the admin requests (namespace 'default')"},
    {"tls-cert", T_STR, "", 0, 0, S(tls_cert), "PEM certificate: serve TLS (ALPN h2, http/1.1) on --http-bind"},
    {"tls-key", T_STR, "", 0, 0, S(tls_key), "PEM private key for --tls-cert"},
    {"shutdown-grace", T_DURATION, "10s", 0, 3600000, N(shutdown_grace_ms), "on SIGTERM, time allowed for in-flight requests"},
    {"hang-timeout", T_DURATION, "5s", 500, 3600000, N(hang_timeout_ms), "kill and replace a worker or publisher whose heartbeat stops for this long (readiness fails at once)"},
    {"idle-timeout", T_DURATION, "60s", 100, 3600000, N(idle_timeout_ms), "close idle keep-alive connections after"},
    {"io-timeout", T_DURATION, "30s", 100, 3600000, N(io_timeout_ms), "cut a request when no byte moved either way for"},
    {"header-timeout", T_DURATION, "10s", 100, 3600000, N(header_timeout_ms), "a request head must be complete this long after its first byte (408 after; docs/dataplane.md)"},
    {"min-body-rate", T_SIZE, "256K", 0, 1ull << 40, N(min_body_rate), "bytes per second a body in flight (PUT or GET) must keep over --body-rate-window, or finish (408; 0: off)"},
    {"body-rate-window", T_DURATION, "5s", 100, 3600000, N(body_rate_window_ms), "the window --min-body-rate is averaged over"},
    {"max-connections", T_UINT, "0", 0, 1u << 24, N(max_connections), "client connections per worker (0: RLIMIT_NOFILE less a reserve); at it the longest-idle ones are closed to make room"},
    {"peer-inflight-share", T_UINT, "50", 1, 100, N(peer_inflight_share), "percent of a worker's PUT budget one peer address may hold beyond its first reservation (100: no limit)"},
    {"max-inflight-bytes", T_SIZE, "0", 0, 1ull << 42, N(max_inflight_bytes), "PUT reservations in flight, all workers (0: a quarter of --memory); beyond it PUTs wait"},
    {"h2o-max-connections", T_UINT, "256", 1, 65536, N(h2o_max_connections), "TLS and h2c connections per worker (more wait)"},
    {"h2o-max-body", T_SIZE, "80M", 1, 4 * GIB, N(h2o_max_body), "largest PUT body over TLS and h2c (413 above)"},
    {"h2o-buffer", T_SIZE, "256M", 1 << 20, 1ull << 40, N(h2o_buffer), "worker heap for TLS/h2c bodies: past it one connection reads at a time"},
    {"hugepages", T_STR, "auto", 0, 0, S(hugepages), "auto | off | require"},
    {"log-level", T_STR, "info", 0, 0, S(log_level), "debug | info | warn | error"},
    {"port-file", T_STR, "", 0, 0, S(port_file), "write the bound ports (http=..., grpc=...) to this file"},
    {"segment-path", T_STR, "", 0, 0, S(segment_path), "keep the segment in this file on tmpfs/hugetlbfs: re-attached at start (warm restart)"},
    {"segment-reset", T_BOOL, "false", 0, 1, N(segment_reset), "with --segment-path: discard the file's contents and start empty"},
    {"ssd-path", T_STR, "", 0, 0, S(ssd_path), "the disk tier's file on an NVMe file system (made with --ssd-size when new): blocks evicted from the arena that were read at least once are kept there and survive restarts; off when empty (docs/ssd-tier.md)"},
    {"ssd-size", T_SIZE, "0", 0, 1ull << 52, N(ssd_size), "with --ssd-path: the file's size (preallocated); required"},
    {"ssd-page-size", T_SIZE, "256M", 1 << 20, 4ull << 30, N(ssd_page_size), "with --ssd-path: the disk tier's unit of allocation and eviction; blocks larger than half of it are not kept on disk"},
    {"ssd-slots", T_UINT, "0", 0, 1u << 31, N(ssd_slots), "with --ssd-path: blocks the disk index can hold, 76 to 84 bytes of segment each (0: --ssd-size / 64 KiB, at least 1024)"},
    {"ssd-sync-interval", T_DURATION, "5s", 100, 3600000, N(ssd_sync_interval_ms), "with --ssd-path: the longest the disk writer goes on writing without an fdatasync (it also syncs whenever it runs out of work): the power-loss bound (docs/ssd-tier.md)"},
    {"ssd-window", T_SIZE, "0", 0, 1ull << 52, N(ssd_window), "with --ssd-path: how much of each namespace's least recently used end the disk writer keeps copied, so that eviction finds copies (0: a quarter of --memory)"},
    {"log-format", T_STR, "text", 0, 0, S(log_format), "text | json (one object per line)"},
    {"arena-prefault", T_SIZE, "64M", 0, 1ull << 42, N(arena_prefault), "each worker maps the arena into its own page tables in the background, this far past the highest page used yet, so that no PUT pays a page fault (0: off; docs/dataplane.md)"},
    {"recv-lowat", T_SIZE, "256K", 0, 64ull << 20, N(recv_lowat), "PUT bodies of twice this or more: the kernel wakes their receive once this many bytes are queued, not per segment (0: off; docs/dataplane.md)"},
    {"send-zc-min", T_SIZE, "0", 0, 1ull << 42, N(send_zc_min), "GET bodies this large or larger go out with io_uring's zero-copy send (0: never; docs/dataplane.md)"},
    {"io-engine", T_STR, "auto", 0, 0, S(io_engine), "auto | uring | epoll: socket I/O through io_uring, or epoll readiness where seccomp denies io_uring (auto: io_uring when it works)"},
    {"model", T_STR, "kvrelay", 0, 0, S(model), "model card source_path for the pool identity"},
    {"kv-block-size", T_UINT, "16", 1, 1u << 20, N(kv_block_size), "tokens per KV block (pool query semantics)"},
    {"hash-format", T_STR, "standard", 0, 0, S(hash_format), "standard | eagle"},
    {"endpoint", T_STR, "kvrelay/store/kv", 0, 0, S(endpoint), "namespace/component/endpoint of the pool"},
    {"dc-id", T_STR, "default", 0, 0, S(dc_id), "logical data-center name (hashed into DcId)"},
    {"expected-unique-blocks", T_UINT, "0", 0, 53687091, N(expected_unique_blocks), "Cuckoo filter sizing (0: the index capacity)"},
    {"pool-heartbeat-interval", T_DURATION, "10s", 1, 3600000, N(pool_heartbeat_ms), "heartbeat on idle pool streams"},
    {"snapshot-progress-timeout", T_DURATION, "60s", 1, 3600000, N(snapshot_progress_timeout_ms), "cut subscribers stalled in a snapshot"},
    {"load-window", T_DURATION, "1s", 1, 3600000, N(load_window_ms), "load window length"},
    {"readiness-heartbeat-interval", T_DURATION, "10s", 1, 3600000, N(readiness_heartbeat_ms), "readiness snapshot repeat"},
    {"max-streams", T_UINT, "64", 1, 4096, N(max_streams), "admission limit per relay stream type"},
    {"max-pools", T_UINT, "16", 1, 256, N(max_pools), "relay pools, one per (namespace, model), each with its own filter; a PUT that would make one more gets 507 (docs/tenancy.md)"},
    {"max-pools-per-namespace", T_UINT, "4", 1, 256, N(max_pools_per_ns), "relay pools one namespace may make (its models); a PUT that would make one more gets 507"},
    {"publication-threshold", T_UINT, "16", 1, 1u << 20, N(publication_threshold), "events per published delta"},
    {"publication-delay", T_DURATION, "1ms", 0, 60000, N(publication_delay_us), "flush a partial delta after"},
    {"publication-coalesce-max", T_UINT, "64", 1, 1024, N(publication_coalesce_max), "while pool subscribers fall behind, a delta may wait up to this many times --publication-delay, however many events come (1: never; docs/relay-contract.md, 5.3)"},
    {"kv-events-bind", T_STR, "", 0, 0, S(kv_events_bind), "ZMQ PUB endpoint of the KV events in vLLM's format, e.g. tcp://127.0.0.1:5557 (port *: a free one); off when empty (docs/kv-events.md)"},
    {"kv-events-replay-bind", T_STR, "", 0, 0, S(kv_events_replay_bind), "ZMQ ROUTER endpoint answering replay requests of the KV events; none when empty"},
    {"kv-events-format", T_STR, "vllm", 0, 0, S(kv_events_format), "vllm | vllm-map | rfc1527: the events as vLLM's arrays, as vLLM's maps (after vLLM PR #42892), or with Mooncake RFC #1527's fields"},
    {"kv-events-backend-id", T_STR, "", 0, 0, S(kv_events_backend_id), "the cache owner named in every topic kv@ID@MODEL (empty: $POD_NAME, else the host name)"},
    {"kv-events-hwm", T_UINT, "10000", 1, 1u << 24, N(kv_events_hwm), "messages (batches) queued per subscriber; beyond, ZMQ drops that subscriber's messages (it replays)"},
    {"kv-events-buffer", T_UINT, "10000", 1, 1u << 22, N(kv_events_buffer), "event batches kept for replay, all topics"},
    {"kv-events-buffer-bytes", T_SIZE, "64M", 1 << 16, 1ull << 34, N(kv_events_buffer_bytes), "bytes of event batches kept for replay"},
    {"kv-events-interval", T_DURATION, "5ms", 0, 1000, N(kv_events_interval_ms), "a pool's KV events wait at most this long to go out together in one batch (0: every publisher turn)"},
    {"kv-events-max-batch", T_UINT, "512", 1, 65536, N(kv_events_max_batch), "events per batch at most"},
};

int kvr_config_parse_size(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;
    uint64_t mul = 1;

    if (s == NULL || !isdigit((unsigned char)*s))
        return KVR_EINVAL;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0)
        return KVR_EINVAL;
    switch (toupper((unsigned char)*end)) {
    case '\0':
        break;
    case 'K':
        mul = 1ull << 10;
        end++;
        break;
    case 'M':
        mul = 1ull << 20;
        end++;
        break;
    case 'G':
        mul = 1ull << 30;
        end++;
        break;
    case 'T':
        mul = 1ull << 40;
        end++;
        break;
    default:
        return KVR_EINVAL;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0' || (v != 0 && mul > UINT64_MAX / v))
        return KVR_EINVAL;
    *out = v * mul;
    return KVR_OK;
}

int kvr_config_parse_duration(const char *s, uint64_t *out_ms)
{
    char *end;
    double v;

    if (s == NULL || !(isdigit((unsigned char)*s) || *s == '.'))
        return KVR_EINVAL;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || v < 0)
        return KVR_EINVAL;
    if (strcmp(end, "ms") == 0)
        ;
    else if (strcmp(end, "us") == 0)
        v /= 1000.0;
    else if (*end == '\0' || strcmp(end, "s") == 0)
        v *= 1000.0;
    else if (strcmp(end, "m") == 0)
        v *= 60000.0;
    else
        return KVR_EINVAL;
    if (v > 1e15)
        return KVR_EINVAL;
    *out_ms = (uint64_t)(v + 0.5);
    return KVR_OK;
}

int kvr_config_split_hostport(const char *s, char *host, size_t hostlen, uint16_t *port)
{
    const char *colon;
    size_t hl;
    char *end;
    unsigned long p;

    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (rb == NULL || rb[1] != ':')
            return KVR_EINVAL;
        hl = (size_t)(rb - s - 1);
        if (hl + 1 > hostlen)
            return KVR_EINVAL;
        memcpy(host, s + 1, hl);
        host[hl] = '\0';
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (colon == NULL)
            return KVR_EINVAL;
        hl = (size_t)(colon - s);
        if (hl == 0 || hl + 1 > hostlen)
            return KVR_EINVAL;
        memcpy(host, s, hl);
        host[hl] = '\0';
    }
    errno = 0;
    p = strtoul(colon + 1, &end, 10);
    if (errno != 0 || *end != '\0' || colon[1] == '\0' || p > 65535)
        return KVR_EINVAL;
    *port = (uint16_t)p;
    return KVR_OK;
}

static void env_name(const opt_t *o, char *buf, size_t n)
{
    size_t i = 0, k;
    const char *pre = "KVRELAY_";
    for (k = 0; pre[k] && i + 1 < n; k++)
        buf[i++] = pre[k];
    for (k = 0; o->name[k] && i + 1 < n; k++)
        buf[i++] = o->name[k] == '-' ? '_' : (char)toupper((unsigned char)o->name[k]);
    buf[i] = '\0';
}

static int set_opt(kvr_config_t *cfg, const opt_t *o, const char *val, const char *from, FILE *err)
{
    char *base = (char *)cfg;
    uint64_t v = 0;
    int rc = KVR_OK;

    switch (o->type) {
    case T_STR:
        if (strlen(val) >= o->len) {
            fprintf(err, "kvrelay: %s for --%s is too long (max %zu bytes)\n", from, o->name, o->len - 1);
            return KVR_EINVAL;
        }
        memcpy(base + o->off, val, strlen(val) + 1);
        return KVR_OK;
    case T_BOOL:
        if (!strcasecmp(val, "1") || !strcasecmp(val, "true") || !strcasecmp(val, "yes") || !strcasecmp(val, "on"))
            v = 1;
        else if (!strcasecmp(val, "0") || !strcasecmp(val, "false") || !strcasecmp(val, "no") || !strcasecmp(val, "off"))
            v = 0;
        else
            rc = KVR_EINVAL;
        if (rc == KVR_OK)
            *(int *)(base + o->off) = (int)v;
        break;
    case T_SIZE:
        rc = kvr_config_parse_size(val, &v);
        break;
    case T_UINT: {
        char *end;
        errno = 0;
        v = strtoull(val, &end, 10);
        rc = (errno || *end || !isdigit((unsigned char)*val)) ? KVR_EINVAL : KVR_OK;
        break;
    }
    case T_DURATION:
        rc = kvr_config_parse_duration(val, &v);
        if (rc == KVR_OK && o->off == offsetof(kvr_config_t, publication_delay_us))
            v *= 1000; /* stored in microseconds */
        break;
    }
    if (rc != KVR_OK) {
        fprintf(err, "kvrelay: invalid value '%s' for --%s (%s)\n", val, o->name, from);
        return KVR_EINVAL;
    }
    if (o->type != T_BOOL) {
        uint64_t chk = o->off == offsetof(kvr_config_t, publication_delay_us) ? v / 1000 : v;
        if (chk < o->min || chk > o->max) {
            fprintf(err, "kvrelay: --%s=%s is out of range [%llu, %llu] (%s)\n", o->name, val,
                    (unsigned long long)o->min, (unsigned long long)o->max, from);
            return KVR_EINVAL;
        }
        *(uint64_t *)(base + o->off) = v;
    }
    return KVR_OK;
}

/* The reference server's address forms: an enable token, a bare port, or host:port. */
static int epistemic_addr(const char *v, char *out, size_t n)
{
    const char *p;
    if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) {
        snprintf(out, n, "127.0.0.1:9130");
        return KVR_OK;
    }
    for (p = v; *p && isdigit((unsigned char)*p); p++)
        ;
    if (*v && *p == '\0') {
        snprintf(out, n, "127.0.0.1:%s", v);
        return KVR_OK;
    }
    if (strlen(v) >= n)
        return KVR_EINVAL;
    snprintf(out, n, "%s", v);
    return KVR_OK;
}

/* The KV events' flags (docs/kv-events.md): endpoints in ZMQ's tcp:// or ipc:// form, the
 * format, a topic part without '@' (it separates the topic's fields). The backend id defaults to
 * $POD_NAME (the Kubernetes downward API), else the host name. */
static int validate_kv_events(kvr_config_t *cfg, FILE *err)
{
    const char *eps[2] = {cfg->kv_events_bind, cfg->kv_events_replay_bind};
    const char *pod = getenv("POD_NAME");

    for (int i = 0; i < 2; i++)
        if (eps[i][0] != '\0' && strncmp(eps[i], "tcp://", 6) != 0 && strncmp(eps[i], "ipc://", 6) != 0) {
            fprintf(err, "kvrelay: --kv-events-%sbind must be tcp://HOST:PORT or ipc://PATH, got '%s'\n",
                    i ? "replay-" : "", eps[i]);
            return KVR_EINVAL;
        }
    if (cfg->kv_events_replay_bind[0] != '\0' && cfg->kv_events_bind[0] == '\0') {
        fprintf(err, "kvrelay: --kv-events-replay-bind needs --kv-events-bind\n");
        return KVR_EINVAL;
    }
    if (strcmp(cfg->kv_events_format, "vllm") && strcmp(cfg->kv_events_format, "vllm-map") &&
        strcmp(cfg->kv_events_format, "rfc1527")) {
        fprintf(err, "kvrelay: --kv-events-format must be vllm, vllm-map or rfc1527\n");
        return KVR_EINVAL;
    }
    if (cfg->kv_events_backend_id[0] == '\0') {
        if (pod != NULL && *pod != '\0' && strlen(pod) < sizeof(cfg->kv_events_backend_id))
            snprintf(cfg->kv_events_backend_id, sizeof(cfg->kv_events_backend_id), "%s", pod);
        else if (gethostname(cfg->kv_events_backend_id, sizeof(cfg->kv_events_backend_id) - 1) != 0)
            snprintf(cfg->kv_events_backend_id, sizeof(cfg->kv_events_backend_id), "kvrelay");
    }
    if (strchr(cfg->kv_events_backend_id, '@') != NULL || cfg->kv_events_backend_id[0] == '\0') {
        fprintf(err, "kvrelay: --kv-events-backend-id must be non-empty and without '@', got '%s'\n",
                cfg->kv_events_backend_id);
        return KVR_EINVAL;
    }
    return KVR_OK;
}

/* The disk tier's flags: all or nothing, and sizes it can use. */
static int validate_ssd(kvr_config_t *cfg, FILE *err)
{
    if (cfg->ssd_path[0] == '\0') {
        if (cfg->ssd_size != 0) {
            fprintf(err, "kvrelay: --ssd-size needs --ssd-path\n");
            return KVR_EINVAL;
        }
        return KVR_OK;
    }
    if (cfg->ssd_path[0] != '/') {
        fprintf(err, "kvrelay: --ssd-path must be an absolute path, got '%s'\n", cfg->ssd_path);
        return KVR_EINVAL;
    }
    if (cfg->ssd_page_size % 4096 != 0 || cfg->ssd_size < (1ull << 20) + 2 * cfg->ssd_page_size) {
        fprintf(err, "kvrelay: --ssd-size must hold 1 MiB and two pages of --ssd-page-size (a multiple of 4 KiB)\n");
        return KVR_EINVAL;
    }
    if (cfg->ssd_slots == 0)
        cfg->ssd_slots = cfg->ssd_size / (64 << 10) > 1024 ? cfg->ssd_size / (64 << 10) : 1024;
    if (cfg->ssd_window == 0)
        cfg->ssd_window = cfg->memory / 4;
    return KVR_OK;
}

static int validate(kvr_config_t *cfg, FILE *err)
{
    char host[256];
    uint16_t port;

    if (kvr_config_split_hostport(cfg->http_bind, host, sizeof(host), &port) != KVR_OK) {
        fprintf(err, "kvrelay: --http-bind must be host:port, got '%s'\n", cfg->http_bind);
        return KVR_EINVAL;
    }
    if (strcmp(cfg->grpc_bind, "off") != 0 &&
        kvr_config_split_hostport(cfg->grpc_bind, host, sizeof(host), &port) != KVR_OK) {
        fprintf(err, "kvrelay: --grpc-bind must be host:port or off, got '%s'\n", cfg->grpc_bind);
        return KVR_EINVAL;
    }
    if (cfg->page_size & (cfg->page_size - 1)) {
        fprintf(err, "kvrelay: --page-size must be a power of two\n");
        return KVR_EINVAL;
    }
    if (strcmp(cfg->hugepages, "auto") && strcmp(cfg->hugepages, "off") && strcmp(cfg->hugepages, "require")) {
        fprintf(err, "kvrelay: --hugepages must be auto, off or require\n");
        return KVR_EINVAL;
    }
    if (strcmp(cfg->log_level, "debug") && strcmp(cfg->log_level, "info") && strcmp(cfg->log_level, "warn") &&
        strcmp(cfg->log_level, "error")) {
        fprintf(err, "kvrelay: --log-level must be debug, info, warn or error\n");
        return KVR_EINVAL;
    }
    if (strcmp(cfg->log_format, "text") && strcmp(cfg->log_format, "json")) {
        fprintf(err, "kvrelay: --log-format must be text or json\n");
        return KVR_EINVAL;
    }
    if (strcmp(cfg->io_engine, "auto") && strcmp(cfg->io_engine, "uring") && strcmp(cfg->io_engine, "epoll")) {
        fprintf(err, "kvrelay: --io-engine must be auto, uring or epoll\n");
        return KVR_EINVAL;
    }
    if (cfg->segment_reset && cfg->segment_path[0] == '\0') {
        fprintf(err, "kvrelay: --segment-reset needs --segment-path\n");
        return KVR_EINVAL;
    }
    if (cfg->segment_path[0] != '\0' && cfg->segment_path[0] != '/') {
        fprintf(err, "kvrelay: --segment-path must be an absolute path, got '%s'\n", cfg->segment_path);
        return KVR_EINVAL;
    }
    if (validate_ssd(cfg, err) != KVR_OK)
        return KVR_EINVAL;
    if (strcmp(cfg->hash_format, "standard") && strcmp(cfg->hash_format, "eagle")) {
        fprintf(err, "kvrelay: --hash-format must be standard or eagle\n");
        return KVR_EINVAL;
    }
    if (validate_kv_events(cfg, err) != KVR_OK)
        return KVR_EINVAL;
    if ((cfg->tls_cert[0] == '\0') != (cfg->tls_key[0] == '\0')) {
        fprintf(err, "kvrelay: --tls-cert and --tls-key go together\n");
        return KVR_EINVAL;
    }
    if (cfg->token_file[0] != '\0') {
        FILE *f = fopen(cfg->token_file, "r");
        size_t n;
        if (f == NULL) {
            fprintf(err, "kvrelay: cannot read --token-file %s: %s\n", cfg->token_file, strerror(errno));
            return KVR_EINVAL;
        }
        n = fread(cfg->token, 1, sizeof(cfg->token) - 1, f);
        fclose(f);
        cfg->token[n] = '\0';
        while (n > 0 && isspace((unsigned char)cfg->token[n - 1]))
            cfg->token[--n] = '\0';
        if (n == 0) {
            fprintf(err, "kvrelay: --token-file %s is empty\n", cfg->token_file);
            return KVR_EINVAL;
        }
        snprintf(cfg->token_source, sizeof(cfg->token_source), "token-file");
    }
    return KVR_OK;
}

/* The reference server's environment, where our twins are unset. */
static int load_reference_env(kvr_config_t *cfg, FILE *err)
{
    const char *v;

    if (getenv("KVRELAY_HTTP_BIND") == NULL && (v = getenv("EPISTEMIC_GRAPH_KVCACHE_ADDR")) != NULL && *v) {
        if (epistemic_addr(v, cfg->http_bind, sizeof(cfg->http_bind)) != KVR_OK) {
            fprintf(err, "kvrelay: invalid EPISTEMIC_GRAPH_KVCACHE_ADDR\n");
            return KVR_EINVAL;
        }
    }
    if (getenv("KVRELAY_TOKEN") == NULL && (v = getenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN")) != NULL && *v) {
        if (strlen(v) >= sizeof(cfg->token)) {
            fprintf(err, "kvrelay: EPISTEMIC_GRAPH_KVCACHE_TOKEN is too long\n");
            return KVR_EINVAL;
        }
        snprintf(cfg->token, sizeof(cfg->token), "%s", v);
        snprintf(cfg->token_source, sizeof(cfg->token_source), "EPISTEMIC_GRAPH_KVCACHE_TOKEN");
    }
    return KVR_OK;
}

/* Every option's KVRELAY_* twin that is set. */
static int load_env(kvr_config_t *cfg, FILE *err)
{
    char ev[96];
    const char *v;

    for (size_t i = 0; i < KVR_ARRAY_SIZE(opts); i++) {
        env_name(&opts[i], ev, sizeof(ev));
        if ((v = getenv(ev)) != NULL) {
            if (set_opt(cfg, &opts[i], v, ev, err) != KVR_OK)
                return KVR_EINVAL;
            if (opts[i].off == offsetof(kvr_config_t, token))
                snprintf(cfg->token_source, sizeof(cfg->token_source), "KVRELAY_TOKEN");
        }
    }
    return KVR_OK;
}

/* The flags that take no value and set no option: 1 if arg is one of them. */
static int action_flag(kvr_config_t *cfg, const char *arg)
{
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
        cfg->help = 1;
        return 1;
    }
    if (!strcmp(arg, "--print-config")) {
        cfg->print_config = 1;
        return 1;
    }
    if (!strcmp(arg, "--version")) {
        cfg->version = 1;
        return 1;
    }
    return 0;
}

/* The option named by the first nl bytes of name, or NULL. */
static const opt_t *find_opt(const char *name, size_t nl)
{
    const opt_t *o = NULL;

    for (size_t i = 0; i < KVR_ARRAY_SIZE(opts); i++)
        if (strlen(opts[i].name) == nl && !strncmp(opts[i].name, name, nl))
            o = &opts[i];
    return o;
}

static int load_args(kvr_config_t *cfg, int argc, char **argv, FILE *err)
{
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a], *val = NULL, *eq;
        const opt_t *o;
        size_t nl;

        if (action_flag(cfg, arg))
            continue;
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(err, "kvrelay: unexpected argument '%s' (see --help)\n", arg);
            return KVR_EINVAL;
        }
        arg += 2;
        eq = strchr(arg, '=');
        nl = eq ? (size_t)(eq - arg) : strlen(arg);
        o = find_opt(arg, nl);
        if (o == NULL) {
            fprintf(err, "kvrelay: unknown option '--%.*s' (see --help)\n", (int)nl, arg);
            return KVR_EINVAL;
        }
        if (eq != NULL)
            val = eq + 1;
        else if (o->type == T_BOOL)
            val = "true";
        else if (a + 1 < argc)
            val = argv[++a];
        else {
            fprintf(err, "kvrelay: --%s needs a value\n", o->name);
            return KVR_EINVAL;
        }
        if (set_opt(cfg, o, val, "command line", err) != KVR_OK)
            return KVR_EINVAL;
        if (o->off == offsetof(kvr_config_t, token))
            snprintf(cfg->token_source, sizeof(cfg->token_source), "--token");
    }
    return KVR_OK;
}

/* Defaults, then the reference server's environment, then our twins, then the command line:
 * each later source overrides the earlier ones. */
int kvr_config_load(kvr_config_t *cfg, int argc, char **argv, FILE *err)
{
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < KVR_ARRAY_SIZE(opts); i++)
        if (set_opt(cfg, &opts[i], opts[i].def, "default", err) != KVR_OK)
            return KVR_EINVAL;
    if (load_reference_env(cfg, err) != KVR_OK || load_env(cfg, err) != KVR_OK ||
        load_args(cfg, argc, argv, err) != KVR_OK)
        return KVR_EINVAL;
    return validate(cfg, err);
}

void kvr_config_usage(FILE *out, const char *prog)
{
    char ev[96];

    fprintf(out, "usage: %s [options]\n\nkvrelay: shared KV-cache block store with a Dynamo KV relay filter.\n\n"
                 "Every option also reads from its environment twin; the command line wins.\n"
                 "EPISTEMIC_GRAPH_KVCACHE_ADDR / _TOKEN are honoured where KVRELAY_HTTP_BIND / KVRELAY_TOKEN are unset.\n\n",
            prog);
    for (size_t i = 0; i < KVR_ARRAY_SIZE(opts); i++) {
        env_name(&opts[i], ev, sizeof(ev));
        fprintf(out, "  --%-30s %s\n  %-32s env %s, default '%s'\n", opts[i].name, opts[i].help, "", ev, opts[i].def);
    }
    fprintf(out, "  --%-30s %s\n  --%-30s %s\n  --%-30s %s\n", "print-config",
            "print the effective configuration and exit", "version", "print the version and git commit and exit",
            "help", "this text");
    fprintf(out, "\nSupervision (docs/architecture.md): a worker or the publisher killed by a signal sent from\n"
                 "outside (SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1/2) or by the watchdog (heartbeat\n"
                 "still for --hang-timeout) is replaced at once. One that crashes (any other signal, or an\n"
                 "exit) within 5 s of its start is replaced at once the first time, then after a back-off\n"
                 "doubling from 100 ms to 10 s while the other workers serve; when no worker would be left\n"
                 "running, the back-off of the first to restart is cut to 100 ms.\n");
}

void kvr_config_print(const kvr_config_t *cfg, FILE *out)
{
    const char *base = (const char *)cfg;

    for (size_t i = 0; i < KVR_ARRAY_SIZE(opts); i++) {
        const opt_t *o = &opts[i];
        fprintf(out, "%s=", o->name);
        if (o->off == offsetof(kvr_config_t, token) || o->off == offsetof(kvr_config_t, admin_token)) {
            fprintf(out, "%s\n", base[o->off] ? "<set>" : "");
            continue;
        }
        switch (o->type) {
        case T_STR:
            fprintf(out, "%s\n", base + o->off);
            break;
        case T_BOOL:
            fprintf(out, "%s\n", *(const int *)(base + o->off) ? "true" : "false");
            break;
        case T_DURATION:
            if (o->off == offsetof(kvr_config_t, publication_delay_us))
                fprintf(out, "%lluus\n", (unsigned long long)*(const uint64_t *)(base + o->off));
            else
                fprintf(out, "%llums\n", (unsigned long long)*(const uint64_t *)(base + o->off));
            break;
        default:
            fprintf(out, "%llu\n", (unsigned long long)*(const uint64_t *)(base + o->off));
        }
    }
    fprintf(out, "token-source=%s\n", cfg->token[0] ? (cfg->token_source[0] ? cfg->token_source : "--token") : "none");
}
