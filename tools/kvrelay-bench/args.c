/*
 * args.c — kvrelay-bench's command line: --help, the options (getopt_long), their defaults
 * and their consistency. Fills G (kvb.h) before anything else runs; a usage error exits 2.
 */
#include "args.h"
#include "relay.h"

#include "core/config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: kvrelay-bench [options]\n"
    "\n"
    "Load generator for kvrelay (HTTP /kv/ API, HTTP/1.1 or h2c), redis-server (RESP2) and\n"
    "memcached (text protocol). Closed loop: every connection keeps one request in flight\n"
    "(--streams per HTTP/2 connection) and sends the next as soon as the answer is in.\n"
    "\n"
    "Target\n"
    "  --target HOST:PORT       server (default 127.0.0.1:9130; resp 127.0.0.1:6379;\n"
    "                           memcache 127.0.0.1:11211)\n"
    "  --protocol P             http | resp | memcache (default http)\n"
    "                           http: PUT/GET/HEAD/DELETE /kv/<key>, GET /kv/<key>/exists\n"
    "                           resp: SET, GET, STRLEN (head), EXISTS (exists), DEL (delete)\n"
    "                           memcache: set, get, mg <key> s (head), mg <key> (exists), delete\n"
    "  --http2                  h2c with prior knowledge (libnghttp2); HTTP/1.1 otherwise\n"
    "  --streams N              concurrent streams per HTTP/2 connection (default 1)\n"
    "  --token T                Authorization: Bearer T on every HTTP request\n"
    "\n"
    "Workload\n"
    "  --workload W             put | get | head | exists | mixed | relay (default get)\n"
    "  --mix SPEC               for mixed: weights, e.g. get=80,put=20,head=0,exists=0,delete=0\n"
    "                           (default get=80,put=20)\n"
    "  --size S | A-B           block size, e.g. 16K, 2M, or a uniform range 256K-8M; a key's\n"
    "                           size is a fixed function of the key (default 16K; relay 1K)\n"
    "  --keys N                 key space (default: put 1000000; relay unlimited, one new key\n"
    "                           per PUT; otherwise min(10000, 1 GiB / mean size))\n"
    "  --key-prefix P           keys are P-0 .. P-(N-1) (default kvb-<size>, e.g. kvb-16K, so\n"
    "                           runs with different sizes never collide; relay kvb-relay-<run>)\n"
    "  --popularity D           uniform | zipf[:s] (default s=0.99) for GET/HEAD/exists/DELETE\n"
    "                           keys; rank r is key r\n"
    "  --dedup R                share (0..1) of PUTs that repeat a key this thread already PUT\n"
    "                           (same size: a dedup hit). Other PUTs walk the key space in\n"
    "                           order, each thread its own share, wrapping at the end\n"
    "  --preload                PUT every key once before the run (not measured), so that\n"
    "                           get/head/exists/mixed reads hit; also computes each block's\n"
    "                           checksum outside the measurement\n"
    "  --misses ok|error        a miss (404, nil, END, EN, exists:false) is an error of kind\n"
    "                           \"miss\" (default), or a success counted apart (default when\n"
    "                           --mix has delete > 0)\n"
    "  --no-verify              do not checksum GET bodies (their length is still checked)\n"
    "\n"
    "Load and duration\n"
    "  --connections N          keep-alive connections (default 16; relay 4)\n"
    "  --threads T              event-loop threads, one epoll each, at most one per core\n"
    "                           (default min(cores, N); relay min(cores, 1 + subscribers):\n"
    "                           thread 0 paces the PUTs, the others run the subscribers)\n"
    "  --duration S             measured time, e.g. 5, 5s, 500ms, 1m (default 10 s)\n"
    "  --requests N             stop after N measured requests instead (with --duration: first)\n"
    "  --warmup S               run the workload S first without measuring it\n"
    "  --timeout S              a request without a complete answer after S is an error of\n"
    "                           kind \"timeout\" and its connection is reopened (default 10)\n"
    "\n"
    "Relay (--workload relay)\n"
    "  --grpc HOST:PORT         kvrelay's gRPC relay listener (required)\n"
    "  --subscribers N          SubscribeKvPool consumers, each on its own connection with a\n"
    "                           CBI1 replica (kvr_mirror) fed by every frame (default 1)\n"
    "  --rate R                 paced PUT/s of new keys (--size, default 1K), each with a unique\n"
    "                           X-KV-Sequence-Hash (default 1000). Reports the publish latency\n"
    "                           (201 received -> the hash in a subscriber's replica), frames/s\n"
    "                           and bytes/s per subscriber, and every stream that ended early\n"
    "                           (grpc-status, kv-relay-error-reason). After the load, the\n"
    "                           subscribers wait up to --timeout for the last hashes\n"
    "  --events ENDPOINT        kvrelay's KV events PUB endpoint (--kv-events-bind), e.g.\n"
    "                           tcp://127.0.0.1:5557: KV events subscribers (ZMQ SUB) take the\n"
    "                           latency 201 -> the hash's BlockStored (docs/kv-events.md)\n"
    "  --event-subscribers N    how many (default 1 with --events); --subscribers 0 runs\n"
    "                           them without gRPC subscribers\n"
    "\n"
    "Output\n"
    "  --json FILE              write the results as JSON (command line, protocol, workload,\n"
    "                           sizes, connections, duration, requests, bytes, throughput,\n"
    "                           latency percentiles, errors by kind, client CPU seconds)\n"
    "  --quiet                  no progress line, one summary line instead of the table\n"
    "  --max-errors N           exit 1 when more than N errors occurred (default 0)\n"
    "  --help                   this text\n"
    "\n"
    "Every GET body is verified: a block's bytes are a fixed function of (key, size), and the\n"
    "XXH3-64 of the body, computed while it is received, must equal that of the block PUT;\n"
    "a mismatch is an error of kind \"corrupt\". Error kinds: corrupt, status (unexpected\n"
    "status or reply), miss, length (a length other than the size PUT), short (the connection\n"
    "or stream ended inside a response), connect, timeout, protocol (unparseable response),\n"
    "unpublished (relay). Latency: p50/p90/p99/p99.9/max of successful requests from a\n"
    "log-bucketed histogram (0.8 % buckets). Throughput: requests/s, and GB/s (10^9 bytes) of\n"
    "payload (PUT bodies sent, GET bodies verified). A progress line (rate, GB/s, errors) is\n"
    "printed once a second when stdout is a terminal.\n"
    "\n"
    "Exit status: 0 success; 1 more than --max-errors errors (or no request completed);\n"
    "2 usage; 3 setup failure (address, relay subscription).\n";

static void die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "kvrelay-bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see kvrelay-bench --help)\n");
    exit(2);
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;
    if (s == NULL || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

/* Sizes are read by the server's own parser (core/config.h), so "64M" means one thing to both. */
static int parse_size(const char *s, uint64_t *out)
{
    return s != NULL && kvr_config_parse_size(s, out) == KVR_OK ? 0 : -1;
}

static int parse_secs(const char *s, double *out)
{
    char *end;
    double v;
    if (s == NULL || !(isdigit((unsigned char)*s) || *s == '.'))
        return -1;
    v = strtod(s, &end);
    if (!strcmp(end, "ms"))
        v /= 1000;
    else if (!strcmp(end, "m") || !strcmp(end, "min"))
        v *= 60;
    else if (*end && strcmp(end, "s"))
        return -1;
    if (v < 0 || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_mix(const char *s)
{
    char buf[256], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", s);
    memset(G.mix, 0, sizeof(G.mix));
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        uint64_t v;
        int o;
        if (eq == NULL)
            return -1;
        *eq = '\0';
        for (o = 0; o < OP_N && strcmp(tok, kvb_op_name[o]); o++)
            ;
        if (o == OP_N || parse_u64(eq + 1, &v) != 0 || v > 1000000)
            return -1;
        G.mix[o] = (unsigned)v;
    }
    G.mix_total = 0;
    for (int o = 0; o < OP_N; o++)
        G.mix_total += G.mix[o];
    return G.mix_total > 0 ? 0 : -1;
}

enum {
    O_TARGET = 256,
    O_PROTOCOL,
    O_HTTP2,
    O_STREAMS,
    O_TOKEN,
    O_WORKLOAD,
    O_MIX,
    O_SIZE,
    O_KEYS,
    O_PREFIX,
    O_POP,
    O_DEDUP,
    O_CONNS,
    O_THREADS,
    O_DURATION,
    O_REQUESTS,
    O_WARMUP,
    O_PRELOAD,
    O_JSON,
    O_QUIET,
    O_NOVERIFY,
    O_MAXERR,
    O_GRPC,
    O_SUBS,
    O_EVENTS,
    O_EVSUBS,
    O_RATE,
    O_TIMEOUT,
    O_MISSES,
    O_HELP
};

/* clang-format off */ /* a table aligned by hand */
static const struct option longopts[] = {
    {"target", required_argument, NULL, O_TARGET},     {"protocol", required_argument, NULL, O_PROTOCOL},
    {"http2", no_argument, NULL, O_HTTP2},              {"streams", required_argument, NULL, O_STREAMS},
    {"token", required_argument, NULL, O_TOKEN},       {"workload", required_argument, NULL, O_WORKLOAD},
    {"mix", required_argument, NULL, O_MIX},           {"size", required_argument, NULL, O_SIZE},
    {"keys", required_argument, NULL, O_KEYS},         {"key-prefix", required_argument, NULL, O_PREFIX},
    {"popularity", required_argument, NULL, O_POP},    {"dedup", required_argument, NULL, O_DEDUP},
    {"connections", required_argument, NULL, O_CONNS}, {"threads", required_argument, NULL, O_THREADS},
    {"duration", required_argument, NULL, O_DURATION}, {"requests", required_argument, NULL, O_REQUESTS},
    {"warmup", required_argument, NULL, O_WARMUP},     {"preload", no_argument, NULL, O_PRELOAD},
    {"json", required_argument, NULL, O_JSON},         {"quiet", no_argument, NULL, O_QUIET},
    {"no-verify", no_argument, NULL, O_NOVERIFY},      {"max-errors", required_argument, NULL, O_MAXERR},
    {"grpc", required_argument, NULL, O_GRPC}, {"events", required_argument, NULL, O_EVENTS},
    {"event-subscribers", required_argument, NULL, O_EVSUBS},         {"subscribers", required_argument, NULL, O_SUBS},
    {"rate", required_argument, NULL, O_RATE},         {"timeout", required_argument, NULL, O_TIMEOUT},
    {"misses", required_argument, NULL, O_MISSES},     {"help", no_argument, NULL, O_HELP},
    {NULL, 0, NULL, 0}};
/* clang-format on */

/* Which options the command line gave: the others get defaults that depend on it. */
struct seen {
    int size, keys, conns, threads, target, prefix, duration, misses, streams, event_subs;
};

/* --size S | A-B */
static void parse_size_opt(const char *a)
{
    const char *dash = strchr(a, '-');
    if (dash != NULL) {
        char lo[64];
        snprintf(lo, sizeof(lo), "%.*s", (int)(dash - a), a);
        if (parse_size(lo, &G.size_min) || parse_size(dash + 1, &G.size_max))
            die_usage("--size: a size (16K) or a range (256K-8M), not %s", a);
    } else if (parse_size(a, &G.size_min)) {
        die_usage("--size: a size (16K) or a range (256K-8M), not %s", a);
    } else {
        G.size_max = G.size_min;
    }
    if (G.size_min < 1 || G.size_max < G.size_min || G.size_max > (1ull << 30))
        die_usage("--size: 1 byte .. 1G, low <= high: %s", a);
    snprintf(G.size_spec, sizeof(G.size_spec), "%s", a);
}

/* --popularity uniform | zipf[:s] */
static void parse_popularity(const char *a)
{
    char *end;

    if (!strcmp(a, "uniform")) {
        G.zipf = 0;
    } else if (!strncmp(a, "zipf", 4) && (a[4] == '\0' || a[4] == ':')) {
        G.zipf = 1;
        if (a[4] == ':') {
            G.zipf_s = strtod(a + 5, &end);
            if (*end || !(G.zipf_s > 0) || G.zipf_s > 10)
                die_usage("--popularity zipf:s with 0 < s <= 10, not %s", a);
        }
    } else {
        die_usage("--popularity: uniform or zipf[:s], not %s", a);
    }
}

/* One option of the command line, as getopt_long returned it (see longopts); one case per
 * option, in the order of --help. It is long (past the tree's ~120 lines) because it is the
 * table of options itself: each case is a few lines that check and store one value. */
static void parse_option(int opt, const char *a, struct seen *have)
{
    uint64_t v;
    char *end;

    switch (opt) {
    case O_TARGET:
        snprintf(G.target, sizeof(G.target), "%s", a);
        have->target = 1;
        break;
    case O_PROTOCOL:
        if (!strcmp(a, "http"))
            G.proto = PROTO_HTTP;
        else if (!strcmp(a, "resp") || !strcmp(a, "redis"))
            G.proto = PROTO_RESP;
        else if (!strcmp(a, "memcache") || !strcmp(a, "memcached"))
            G.proto = PROTO_MEMCACHE;
        else
            die_usage("--protocol: http, resp or memcache, not %s", a);
        break;
    case O_HTTP2:
        G.http2 = 1;
        break;
    case O_STREAMS:
        if (parse_u64(a, &v) || v < 1 || v > 1024)
            die_usage("--streams: 1..1024, not %s", a);
        G.streams = (int)v;
        have->streams = 1;
        break;
    case O_TOKEN:
        G.token = a;
        break;
    case O_WORKLOAD: {
        int i;
        for (i = 0; i < WL_N && strcmp(a, kvb_workload_name[i]); i++)
            ;
        if (i == WL_N)
            die_usage("--workload: put, get, head, exists, mixed or relay, not %s", a);
        G.workload = i;
        break;
    }
    case O_MIX:
        if (parse_mix(a))
            die_usage("--mix: op=weight,... with ops put, get, head, exists, delete, not %s", a);
        break;
    case O_SIZE:
        parse_size_opt(a);
        have->size = 1;
        break;
    case O_KEYS:
        if (parse_u64(a, &G.keys) || G.keys < 1 || G.keys > (1ull << 32))
            die_usage("--keys: 1 .. 2^32, not %s", a);
        have->keys = 1;
        break;
    case O_PREFIX:
        if (!*a || strlen(a) > 200)
            die_usage("--key-prefix: 1..200 characters: %s", a);
        snprintf(G.prefix, sizeof(G.prefix), "%s", a);
        have->prefix = 1;
        break;
    case O_POP:
        parse_popularity(a);
        break;
    case O_DEDUP:
        G.dedup = strtod(a, &end);
        if (*end || !(G.dedup >= 0 && G.dedup <= 1))
            die_usage("--dedup: a share 0..1, not %s", a);
        break;
    case O_CONNS:
        if (parse_u64(a, &v) || v < 1 || v > 65536)
            die_usage("--connections: 1..65536, not %s", a);
        G.conns = (int)v;
        have->conns = 1;
        break;
    case O_THREADS:
        if (parse_u64(a, &v) || v < 1 || v > 1024)
            die_usage("--threads: 1..1024, not %s", a);
        G.threads = (int)v;
        have->threads = 1;
        break;
    case O_DURATION:
        if (parse_secs(a, &G.duration) || G.duration <= 0)
            die_usage("--duration: seconds (5, 5s, 500ms, 1m), not %s", a);
        have->duration = 1;
        break;
    case O_REQUESTS:
        if (parse_u64(a, &G.requests) || G.requests < 1)
            die_usage("--requests: a positive count, not %s", a);
        break;
    case O_WARMUP:
        if (parse_secs(a, &G.warmup))
            die_usage("--warmup: seconds, not %s", a);
        break;
    case O_TIMEOUT:
        if (parse_secs(a, &G.timeout) || G.timeout <= 0)
            die_usage("--timeout: seconds, not %s", a);
        break;
    case O_PRELOAD:
        G.preload = 1;
        break;
    case O_JSON:
        G.json = a;
        break;
    case O_QUIET:
        G.quiet = 1;
        break;
    case O_NOVERIFY:
        G.verify = 0;
        break;
    case O_MISSES:
        if (!strcmp(a, "ok"))
            G.misses_ok = 1;
        else if (!strcmp(a, "error"))
            G.misses_ok = 0;
        else
            die_usage("--misses: ok or error, not %s", a);
        have->misses = 1;
        break;
    case O_MAXERR:
        if (parse_u64(a, &G.max_errors))
            die_usage("--max-errors: a count, not %s", a);
        break;
    case O_GRPC:
        snprintf(G.grpc, sizeof(G.grpc), "%s", a);
        break;
    case O_EVENTS:
        snprintf(G.events, sizeof(G.events), "%s", a);
        break;
    case O_EVSUBS:
        if (parse_u64(a, &v) || v > 64)
            die_usage("--event-subscribers: 0..64, not %s", a);
        G.event_subs = (int)v;
        have->event_subs = 1;
        break;
    case O_SUBS:
        if (parse_u64(a, &v) || v > 4096)
            die_usage("--subscribers: 0..4096, not %s", a);
        G.subscribers = (int)v;
        break;
    case O_RATE:
        G.rate = strtod(a, &end);
        if (*end || !(G.rate > 0) || G.rate > 1e7)
            die_usage("--rate: PUT/s, 0 < R <= 1e7, not %s", a);
        break;
    case O_HELP:
        fputs(usage, stdout);
        exit(0);
    default:
        die_usage("unknown or incomplete option %s", G.argv[optind - 1]);
    }
}

/* What the options left open follows from the others; contradictions are usage errors. */
static void apply_defaults(const struct seen *have)
{
    if (!have->target)
        snprintf(G.target, sizeof(G.target), "%s",
                 G.proto == PROTO_RESP ? "127.0.0.1:6379" : G.proto == PROTO_MEMCACHE ? "127.0.0.1:11211"
                                                                                      : "127.0.0.1:9130");
    if (G.http2 && G.proto != PROTO_HTTP)
        die_usage("--http2 is for --protocol http%s", "");
    if (have->streams && !G.http2)
        die_usage("--streams needs --http2%s", "");
    if (!have->size) {
        G.size_min = G.size_max = G.workload == WL_RELAY ? 1024 : 16384;
        snprintf(G.size_spec, sizeof(G.size_spec), "%s", G.workload == WL_RELAY ? "1K" : "16K");
    }
    if (G.events[0] && !have->event_subs)
        G.event_subs = 1;
    if (G.event_subs > 0 && !G.events[0])
        die_usage("--event-subscribers needs --events ENDPOINT%s", "");
    if (G.workload == WL_RELAY) {
        if (!G.grpc[0] && G.subscribers > 0)
            die_usage("--workload relay needs --grpc HOST:PORT (or --subscribers 0 with --events)%s", "");
        if (G.subscribers + G.event_subs == 0)
            die_usage("--workload relay needs a subscriber%s", "");
        if (G.proto != PROTO_HTTP)
            die_usage("--workload relay is for --protocol http%s", "");
        if (G.preload)
            die_usage("--preload does not apply to --workload relay%s", "");
        G.keys = 0;
        memset(G.mix, 0, sizeof(G.mix));
        G.mix[OP_PUT] = 1;
        G.mix_total = 1;
    } else if (G.workload != WL_MIXED) {
        memset(G.mix, 0, sizeof(G.mix));
        G.mix[G.workload == WL_PUT ? OP_PUT : G.workload == WL_GET ? OP_GET
                                          : G.workload == WL_HEAD  ? OP_HEAD
                                                                   : OP_EXISTS] = 1;
        G.mix_total = 1;
    }
    if (!have->keys && G.workload != WL_RELAY) {
        if (G.workload == WL_PUT) {
            G.keys = 1000000;
        } else {
            uint64_t mean = (G.size_min + G.size_max) / 2, k = (1ull << 30) / (mean ? mean : 1);
            G.keys = k < 16 ? 16 : k > 10000 ? 10000
                                             : k;
        }
    }
    if (G.zipf && G.keys > 100000000ull)
        die_usage("--popularity zipf: at most 100000000 keys%s", "");
    if (!have->prefix) {
        if (G.workload == WL_RELAY)
            snprintf(G.prefix, sizeof(G.prefix), "kvb-relay-%08llx", (unsigned long long)(kvb_relay_seq_hash(~0ull) >> 32));
        else
            snprintf(G.prefix, sizeof(G.prefix), "kvb-%s", G.size_spec);
    }
    if (G.proto == PROTO_MEMCACHE) {
        for (const char *p = G.prefix; *p; p++)
            if ((unsigned char)*p <= ' ' || *p == 0x7f)
                die_usage("--key-prefix: memcached keys have no spaces or control characters: %s", G.prefix);
        if (strlen(G.prefix) > 228)
            die_usage("--key-prefix: memcached keys are at most 250 bytes: %s", G.prefix);
    }
    if (!have->misses)
        G.misses_ok = G.workload == WL_MIXED && G.mix[OP_DELETE] > 0;
    if (!have->conns)
        G.conns = G.workload == WL_RELAY ? 4 : 16;
    if (!have->duration && !G.requests)
        G.duration = 10;
    {
        /* at most one thread per core: the client must not be what decides the figures */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int want = G.workload == WL_RELAY ? 1 + G.subscribers + G.event_subs : G.conns;
        if (cores < 1)
            cores = 1;
        if (!have->threads)
            G.threads = want < cores ? want : (int)cores;
        if (G.threads > cores) {
            fprintf(stderr, "kvrelay-bench: --threads %d is more than the %ld cores: using %ld\n", G.threads, cores,
                    cores);
            G.threads = (int)cores;
        }
    }
    if (G.workload != WL_RELAY && G.threads > G.conns)
        G.threads = G.conns;
}

void kvb_args_parse(int argc, char **argv)
{
    struct seen have = {0};
    int opt;

    memset(&G, 0, sizeof(G));
    G.argc = argc;
    G.argv = argv;
    G.proto = PROTO_HTTP;
    G.streams = 1;
    G.workload = WL_GET;
    G.verify = 1;
    G.timeout = 10;
    G.subscribers = 1;
    G.rate = 1000;
    G.zipf_s = 0.99;
    parse_mix("get=80,put=20");
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1)
        parse_option(opt, optarg, &have);
    if (optind < argc)
        die_usage("unexpected argument %s", argv[optind]);
    apply_defaults(&have);
}
