/*
 * main.c — kvrelay-bench's command line, the run's phases, the results table and the JSON
 * file. See kvb.h for the modules, `kvrelay-bench --help` for the usage.
 *
 * Phases: the threads connect and (with --preload) PUT every key once; barrier; main sets
 * the clock (start, end of warmup, deadline); barrier; the threads run the workload until the
 * deadline or the request budget and drain what is in flight; main prints a progress line
 * once a second meanwhile (a terminal only), then merges the per-thread statistics.
 */
#include "kvb.h"

#include "core/config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

kvb_cfg_t G;
kvb_ctl_t C;

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

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    double v;
    uint64_t mul = 1;
    if (s == NULL || !isdigit((unsigned char)*s))
        return -1;
    v = strtod(s, &end);
    switch (toupper((unsigned char)*end)) {
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
    default:
        break;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end || v < 0)
        return -1;
    *out = (uint64_t)llround(v * (double)mul);
    return 0;
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

static void fmt_size(uint64_t v, char *out, size_t cap)
{
    if (v >= (1ull << 30) && v % (1ull << 30) == 0)
        snprintf(out, cap, "%lluG", (unsigned long long)(v >> 30));
    else if (v >= (1ull << 20) && v % (1ull << 20) == 0)
        snprintf(out, cap, "%lluM", (unsigned long long)(v >> 20));
    else if (v >= (1ull << 10) && v % (1ull << 10) == 0)
        snprintf(out, cap, "%lluK", (unsigned long long)(v >> 10));
    else
        snprintf(out, cap, "%llu", (unsigned long long)v);
}

static void on_signal(int sig)
{
    C.stop = 1;
}

/* ---------------------------------------------------------------- JSON */

void kvb_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

void kvb_json_lat(FILE *f, const kvb_hist_t *h)
{
    fprintf(f, "{\"count\": %llu, \"mean\": %.6f, \"p50\": %.6f, \"p90\": %.6f, \"p99\": %.6f, \"p99_9\": %.6f, "
               "\"max\": %.6f}",
            (unsigned long long)h->n, h->n ? (double)h->sum / (double)h->n / 1e6 : 0.0,
            kvb_hist_quantile(h, 0.50) / 1e6, kvb_hist_quantile(h, 0.90) / 1e6, kvb_hist_quantile(h, 0.99) / 1e6,
            kvb_hist_quantile(h, 0.999) / 1e6, h->max / 1e6);
}

/* ---------------------------------------------------------------- results */

typedef struct totals {
    uint64_t requests, ok, errors, bytes, miss_ok;
    uint64_t err[EK_N];
    kvb_hist_t lat;
} totals_t;

/* What main allocates stays reachable until exit (LeakSanitizer builds). */
void *kvb_reachable[8]; /* external: the stores cannot be optimised away */

static void sum_totals(const kvb_stats_t *s, totals_t *t)
{
    memset(t, 0, sizeof(*t));
    for (int o = 0; o < OP_N; o++) {
        t->ok += s->ok[o];
        t->miss_ok += s->miss_ok[o];
        t->bytes += s->bytes[o];
        for (int k = 0; k < EK_N; k++) {
            t->errors += s->err[o][k];
            t->err[k] += s->err[o][k];
        }
        kvb_hist_merge(&t->lat, &s->lat[o]);
    }
    t->requests = t->ok + t->errors;
}

static uint64_t op_errors(const kvb_stats_t *s, int o)
{
    uint64_t e = 0;
    for (int k = 0; k < EK_N; k++)
        e += s->err[o][k];
    return e;
}

static const char *proto_label(void)
{
    return G.proto == PROTO_RESP ? "resp" : G.proto == PROTO_MEMCACHE ? "memcache" : G.http2 ? "h2c" : "http/1.1";
}

static const char *const workload_name[] = {"put", "get", "head", "exists", "mixed", "relay"};

static void print_row(FILE *f, const char *name, uint64_t ok, uint64_t errs, uint64_t bytes, const kvb_hist_t *h,
                      double el)
{
    fprintf(f, "%-7s %10llu %10llu %8llu %11.1f %8.3f %8.3f %8.3f %8.3f %8.3f %9.3f\n", name,
            (unsigned long long)(ok + errs), (unsigned long long)ok, (unsigned long long)errs, (double)(ok + errs) / el,
            (double)bytes / el / 1e9, kvb_hist_quantile(h, 0.5) / 1e6, kvb_hist_quantile(h, 0.9) / 1e6,
            kvb_hist_quantile(h, 0.99) / 1e6, kvb_hist_quantile(h, 0.999) / 1e6, h->max / 1e6);
}

static void print_samples(FILE *f, kvb_worker_t **ws, int n)
{
    int any = 0;
    for (int k = 0; k < EK_N; k++)
        for (int i = 0; i < n; i++)
            if (ws[i]->sample[k][0]) {
                if (!any++)
                    fprintf(f, "first error of each kind:\n");
                fprintf(f, "  %-11s %s\n", kvb_ek_name[k], ws[i]->sample[k]);
                break;
            }
}

static void write_json(const char *path, kvb_worker_t **ws, int nw, const kvb_stats_t *st, const kvb_stats_t *pre,
                       double elapsed, double pre_s, double cpu_user, double cpu_sys, uint64_t relay_err, int rc)
{
    FILE *f = fopen(path, "w");
    totals_t *t = malloc(sizeof(*t)), *tp = malloc(sizeof(*tp));
    char smin[32], smax[32];
    int first;
    if (f == NULL || t == NULL || tp == NULL) {
        fprintf(stderr, "kvrelay-bench: cannot write %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        free(t);
        free(tp);
        return;
    }
    sum_totals(st, t);
    sum_totals(pre, tp);
    fmt_size(G.size_min, smin, sizeof(smin));
    fmt_size(G.size_max, smax, sizeof(smax));
    fprintf(f, "{\"tool\": \"kvrelay-bench\", \"version\": 1, \"command_line\": [");
    for (int i = 0; i < G.argc; i++) {
        if (i)
            fprintf(f, ", ");
        kvb_json_str(f, G.argv[i]);
    }
    fprintf(f, "],\n \"target\": ");
    kvb_json_str(f, G.target);
    fprintf(f, ", \"protocol\": \"%s\", \"http2\": %s, \"streams\": %d, \"transport\": \"%s\", \"workload\": \"%s\", "
               "\"mix\": {",
            G.proto == PROTO_RESP ? "resp" : G.proto == PROTO_MEMCACHE ? "memcache" : "http", G.http2 ? "true" : "false",
            G.streams, proto_label(), workload_name[G.workload]);
    first = 1;
    for (int o = 0; o < OP_N; o++)
        if (G.mix[o]) {
            fprintf(f, "%s\"%s\": %u", first ? "" : ", ", kvb_op_name[o], G.mix[o]);
            first = 0;
        }
    fprintf(f, "},\n \"size\": {\"spec\": ");
    kvb_json_str(f, G.size_spec);
    fprintf(f, ", \"min\": %llu, \"max\": %llu}, \"keys\": %llu, \"key_prefix\": ", (unsigned long long)G.size_min,
            (unsigned long long)G.size_max, (unsigned long long)G.keys);
    kvb_json_str(f, G.prefix);
    fprintf(f, ", \"popularity\": \"%s\", \"zipf_s\": %.4f, \"dedup\": %.4f, \"verify\": %s, \"misses_policy\": \"%s\",\n",
            G.zipf ? "zipf" : "uniform", G.zipf ? G.zipf_s : 0.0, G.dedup, G.verify ? "true" : "false",
            G.misses_ok ? "ok" : "error");
    fprintf(f, " \"connections\": %d, \"threads\": %d, \"duration_s\": %.6f, \"duration_limit_s\": %.3f, "
               "\"warmup_s\": %.3f, \"request_limit\": %llu, \"timeout_s\": %.3f,\n",
            G.conns, G.threads, elapsed, G.duration, G.warmup, (unsigned long long)G.requests, G.timeout);
    fprintf(f, " \"preload\": ");
    if (G.preload)
        fprintf(f, "{\"keys\": %llu, \"requests\": %llu, \"successes\": %llu, \"errors\": %llu, \"bytes\": %llu, "
                   "\"seconds\": %.6f},\n",
                (unsigned long long)G.keys, (unsigned long long)tp->requests, (unsigned long long)tp->ok,
                (unsigned long long)tp->errors, (unsigned long long)tp->bytes, pre_s);
    else
        fprintf(f, "null,\n");
    fprintf(f, " \"requests\": %llu, \"successes\": %llu, \"misses\": %llu, \"errors\": %llu, \"bytes\": %llu,\n",
            (unsigned long long)t->requests, (unsigned long long)t->ok, (unsigned long long)t->miss_ok,
            (unsigned long long)t->errors, (unsigned long long)t->bytes);
    fprintf(f, " \"throughput\": {\"requests_per_s\": %.3f, \"successes_per_s\": %.3f, \"bytes_per_s\": %.1f, "
               "\"gb_per_s\": %.6f, \"gib_per_s\": %.6f},\n",
            (double)t->requests / elapsed, (double)t->ok / elapsed, (double)t->bytes / elapsed,
            (double)t->bytes / elapsed / 1e9, (double)t->bytes / elapsed / (double)(1ull << 30));
    fprintf(f, " \"latency_ms\": ");
    kvb_json_lat(f, &t->lat);
    if (G.workload == WL_RELAY) {
        uint64_t ended, failed;
        (void)kvb_relay_errors(ws, nw, &ended, &t->err[EK_UNPUBLISHED], &failed);
    }
    fprintf(f, ",\n \"errors_by_kind\": {");
    for (int k = 0; k < EK_N; k++)
        fprintf(f, "%s\"%s\": %llu", k ? ", " : "", kvb_ek_name[k], (unsigned long long)t->err[k]);
    fprintf(f, "},\n \"error_samples\": {");
    first = 1;
    for (int k = 0; k < EK_N; k++)
        for (int i = 0; i < nw; i++)
            if (ws[i]->sample[k][0]) {
                fprintf(f, "%s\"%s\": ", first ? "" : ", ", kvb_ek_name[k]);
                kvb_json_str(f, ws[i]->sample[k]);
                first = 0;
                break;
            }
    fprintf(f, "},\n \"ops\": {");
    first = 1;
    for (int o = 0; o < OP_N; o++) {
        uint64_t e = op_errors(st, o);
        int sf = 1;
        if (st->ok[o] + e == 0)
            continue;
        fprintf(f, "%s\n  \"%s\": {\"requests\": %llu, \"successes\": %llu, \"misses\": %llu, \"errors\": %llu, "
                   "\"bytes\": %llu, \"requests_per_s\": %.3f, \"gb_per_s\": %.6f, \"latency_ms\": ",
                first ? "" : ",", kvb_op_name[o], (unsigned long long)(st->ok[o] + e), (unsigned long long)st->ok[o],
                (unsigned long long)st->miss_ok[o], (unsigned long long)e, (unsigned long long)st->bytes[o],
                (double)(st->ok[o] + e) / elapsed, (double)st->bytes[o] / elapsed / 1e9);
        kvb_json_lat(f, &st->lat[o]);
        fprintf(f, ", \"errors_by_kind\": {");
        for (int k = 0; k < EK_N; k++)
            fprintf(f, "%s\"%s\": %llu", k ? ", " : "", kvb_ek_name[k], (unsigned long long)st->err[o][k]);
        fprintf(f, "}, \"statuses\": {");
        for (int c = 0; c < 600; c++)
            if (st->status[o][c]) {
                fprintf(f, "%s\"%d\": %llu", sf ? "" : ", ", c, (unsigned long long)st->status[o][c]);
                sf = 0;
            }
        fprintf(f, "}}");
        first = 0;
    }
    fprintf(f, "},\n \"cpu\": {\"user_s\": %.3f, \"sys_s\": %.3f, \"total_s\": %.3f, \"cores\": %.3f},\n", cpu_user,
            cpu_sys, cpu_user + cpu_sys, (cpu_user + cpu_sys) / elapsed);
    if (G.workload == WL_RELAY) {
        fprintf(f, " ");
        kvb_relay_json(f, ws, nw, elapsed);
        fprintf(f, ",\n");
    }
    fprintf(f, " \"relay_errors\": %llu, \"total_errors\": %llu, \"max_errors\": %llu, \"exit_status\": %d}\n",
            (unsigned long long)relay_err, (unsigned long long)(t->errors + tp->errors + relay_err),
            (unsigned long long)G.max_errors, rc);
    if (fclose(f) != 0)
        fprintf(stderr, "kvrelay-bench: writing %s: %s\n", path, strerror(errno));
    free(t);
    free(tp);
}

/* ---------------------------------------------------------------- options */

enum {
    O_TARGET = 256, O_PROTOCOL, O_HTTP2, O_STREAMS, O_TOKEN, O_WORKLOAD, O_MIX, O_SIZE, O_KEYS, O_PREFIX, O_POP,
    O_DEDUP, O_CONNS, O_THREADS, O_DURATION, O_REQUESTS, O_WARMUP, O_PRELOAD, O_JSON, O_QUIET, O_NOVERIFY,
    O_MAXERR, O_GRPC, O_SUBS, O_RATE, O_TIMEOUT, O_MISSES, O_HELP
};

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
    {"grpc", required_argument, NULL, O_GRPC},         {"subscribers", required_argument, NULL, O_SUBS},
    {"rate", required_argument, NULL, O_RATE},         {"timeout", required_argument, NULL, O_TIMEOUT},
    {"misses", required_argument, NULL, O_MISSES},     {"help", no_argument, NULL, O_HELP},
    {NULL, 0, NULL, 0}};

static void parse_args(int argc, char **argv)
{
    int opt, have_size = 0, have_keys = 0, have_conns = 0, have_threads = 0, have_target = 0, have_prefix = 0,
             have_duration = 0, have_misses = 0, have_streams = 0;
    uint64_t v;
    char *end;

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
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        const char *a = optarg;
        switch (opt) {
        case O_TARGET:
            snprintf(G.target, sizeof(G.target), "%s", a);
            have_target = 1;
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
            have_streams = 1;
            break;
        case O_TOKEN:
            G.token = a;
            break;
        case O_WORKLOAD: {
            int i;
            for (i = 0; i < (int)KVR_ARRAY_SIZE(workload_name) && strcmp(a, workload_name[i]); i++)
                ;
            if (i == (int)KVR_ARRAY_SIZE(workload_name))
                die_usage("--workload: put, get, head, exists, mixed or relay, not %s", a);
            G.workload = i;
            break;
        }
        case O_MIX:
            if (parse_mix(a))
                die_usage("--mix: op=weight,... with ops put, get, head, exists, delete, not %s", a);
            break;
        case O_SIZE: {
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
            have_size = 1;
            break;
        }
        case O_KEYS:
            if (parse_u64(a, &G.keys) || G.keys < 1 || G.keys > (1ull << 32))
                die_usage("--keys: 1 .. 2^32, not %s", a);
            have_keys = 1;
            break;
        case O_PREFIX:
            if (!*a || strlen(a) > 200)
                die_usage("--key-prefix: 1..200 characters: %s", a);
            snprintf(G.prefix, sizeof(G.prefix), "%s", a);
            have_prefix = 1;
            break;
        case O_POP:
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
            have_conns = 1;
            break;
        case O_THREADS:
            if (parse_u64(a, &v) || v < 1 || v > 1024)
                die_usage("--threads: 1..1024, not %s", a);
            G.threads = (int)v;
            have_threads = 1;
            break;
        case O_DURATION:
            if (parse_secs(a, &G.duration) || G.duration <= 0)
                die_usage("--duration: seconds (5, 5s, 500ms, 1m), not %s", a);
            have_duration = 1;
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
            have_misses = 1;
            break;
        case O_MAXERR:
            if (parse_u64(a, &G.max_errors))
                die_usage("--max-errors: a count, not %s", a);
            break;
        case O_GRPC:
            snprintf(G.grpc, sizeof(G.grpc), "%s", a);
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
            die_usage("unknown or incomplete option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        die_usage("unexpected argument %s", argv[optind]);

    /* defaults and consistency */
    if (!have_target)
        snprintf(G.target, sizeof(G.target), "%s",
                 G.proto == PROTO_RESP ? "127.0.0.1:6379" : G.proto == PROTO_MEMCACHE ? "127.0.0.1:11211" : "127.0.0.1:9130");
    if (G.http2 && G.proto != PROTO_HTTP)
        die_usage("--http2 is for --protocol http%s", "");
    if (have_streams && !G.http2)
        die_usage("--streams needs --http2%s", "");
    if (!have_size) {
        G.size_min = G.size_max = G.workload == WL_RELAY ? 1024 : 16384;
        snprintf(G.size_spec, sizeof(G.size_spec), "%s", G.workload == WL_RELAY ? "1K" : "16K");
    }
    if (G.workload == WL_RELAY) {
        if (!G.grpc[0])
            die_usage("--workload relay needs --grpc HOST:PORT%s", "");
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
        G.mix[G.workload == WL_PUT ? OP_PUT : G.workload == WL_GET ? OP_GET : G.workload == WL_HEAD ? OP_HEAD : OP_EXISTS] = 1;
        G.mix_total = 1;
    }
    if (!have_keys && G.workload != WL_RELAY) {
        if (G.workload == WL_PUT) {
            G.keys = 1000000;
        } else {
            uint64_t mean = (G.size_min + G.size_max) / 2, k = (1ull << 30) / (mean ? mean : 1);
            G.keys = k < 16 ? 16 : k > 10000 ? 10000 : k;
        }
    }
    if (G.zipf && G.keys > 100000000ull)
        die_usage("--popularity zipf: at most 100000000 keys%s", "");
    if (!have_prefix) {
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
    if (!have_misses)
        G.misses_ok = G.workload == WL_MIXED && G.mix[OP_DELETE] > 0;
    if (!have_conns)
        G.conns = G.workload == WL_RELAY ? 4 : 16;
    if (!have_duration && !G.requests)
        G.duration = 10;
    {
        /* at most one thread per core: the client must not be what decides the figures */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int want = G.workload == WL_RELAY ? 1 + (G.subscribers > 0 ? G.subscribers : 0) : G.conns;
        if (cores < 1)
            cores = 1;
        if (!have_threads)
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

static int resolve_target(void)
{
    char host[256], port[8];
    uint16_t p;
    struct addrinfo hints, *res = NULL;
    int rc;
    if (kvr_config_split_hostport(G.target, host, sizeof(host), &p) != KVR_OK || p == 0) {
        fprintf(stderr, "kvrelay-bench: --target: HOST:PORT, not %s\n", G.target);
        return -1;
    }
    snprintf(port, sizeof(port), "%u", p);
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if ((rc = getaddrinfo(host, port, &hints, &res)) != 0 || res == NULL) {
        fprintf(stderr, "kvrelay-bench: cannot resolve %s: %s\n", host, gai_strerror(rc));
        return -1;
    }
    memcpy(&G.addr, res->ai_addr, res->ai_addrlen);
    G.addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* One connection before anything else: a target that is down is one clear error, not a
 * stream of connect errors for the whole run. */
static int preflight(void)
{
    int fd = socket(G.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), err = 0;
    socklen_t sl = sizeof(err);
    struct pollfd pfd;
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&G.addr, G.addrlen) < 0) {
        if (errno != EINPROGRESS) {
            err = errno;
        } else {
            pfd.fd = fd;
            pfd.events = POLLOUT;
            if (poll(&pfd, 1, (int)(G.timeout < 5 ? G.timeout * 1000 : 5000)) != 1)
                err = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0)
                err = errno;
        }
    }
    close(fd);
    if (err != 0) {
        fprintf(stderr, "kvrelay-bench: cannot connect to %s: %s\n", G.target, strerror(err));
        return -1;
    }
    return 0;
}

static double tv_s(struct timeval tv)
{
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    kvb_worker_t **ws;
    kvb_stats_t *st, *pre;
    totals_t *t, *tp;
    struct rusage ru0, ru1;
    uint64_t t_pre0, t_pre1, t_end = 0, last_done = 0, last_bytes = 0, relay_err = 0;
    uint64_t ended = 0, unpublished = 0, failed = 0, all_errors;
    double elapsed, pre_s, cpu_user, cpu_sys, next_print;
    int tty, rc = 0, snapped = 0, *joined;
    struct sigaction sa;

    kvb_relay_init();
    parse_args(argc, argv);
    if (resolve_target() != 0 || preflight() != 0)
        return 3;
    if (kvb_data_init(G.verify && (G.mix[OP_GET] > 0)) != 0) {
        fprintf(stderr, "kvrelay-bench: out of memory\n");
        return 3;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    ws = kvb_reachable[0] = calloc((size_t)G.threads, sizeof(*ws));
    for (int i = 0; ws != NULL && i < G.threads; i++)
        if ((ws[i] = kvb_worker_new(i)) == NULL)
            ws = NULL;
    if (ws == NULL) {
        fprintf(stderr, "kvrelay-bench: out of memory\n");
        return 3;
    }
    for (int i = 0; i < G.conns; i++)
        if (kvb_worker_add_conn(ws[G.workload == WL_RELAY ? 0 : i % G.threads]) != 0) {
            fprintf(stderr, "kvrelay-bench: out of memory\n");
            return 3;
        }
    if (G.workload == WL_RELAY) {
        ws[0]->paced = 1;
        for (int i = 0; i < G.subscribers; i++)
            if (kvb_relay_add_sub(ws[G.threads > 1 ? 1 + i % (G.threads - 1) : 0], i) != 0) {
                fprintf(stderr, "kvrelay-bench: out of memory\n");
                return 3;
            }
    }
    pthread_barrier_init(&C.bar, NULL, (unsigned)G.threads + 1);
    tty = isatty(STDOUT_FILENO) && !G.quiet;

    t_pre0 = kvb_now();
    for (int i = 0; i < G.threads; i++)
        if (pthread_create(&ws[i]->th, NULL, kvb_worker_main, ws[i]) != 0) {
            fprintf(stderr, "kvrelay-bench: cannot start thread %d\n", i);
            return 3;
        }
    if (G.preload && tty) {
        printf("preloading %llu keys...", (unsigned long long)G.keys);
        fflush(stdout);
    }
    pthread_barrier_wait(&C.bar);
    t_pre1 = kvb_now();
    if (G.preload && tty)
        printf("\r\033[K");
    C.t_start = kvb_now();
    C.t_measure = C.t_start + (uint64_t)(G.warmup * 1e9);
    C.t_deadline = G.duration > 0 ? C.t_measure + (uint64_t)(G.duration * 1e9) : 0;
    if (G.warmup <= 0) {
        getrusage(RUSAGE_SELF, &ru0);
        snapped = 1;
    }
    pthread_barrier_wait(&C.bar);

    next_print = 1.0;
    if ((joined = calloc((size_t)G.threads, sizeof(int))) == NULL)
        return 3;
    for (;;) {
        uint64_t now = kvb_now();
        int all = 1;
        if (!snapped && now >= C.t_measure) {
            getrusage(RUSAGE_SELF, &ru0);
            snapped = 1;
        }
        for (int i = 0; i < G.threads; i++)
            if (!joined[i] && pthread_tryjoin_np(ws[i]->th, NULL) == 0)
                joined[i] = 1;
            else if (!joined[i])
                all = 0;
        if (all)
            break;
        if (tty && !C.fatal && (double)(now - C.t_start) / 1e9 >= next_print) {
            uint64_t done = 0, bytes = 0, errs = 0;
            for (int i = 0; i < G.threads; i++) {
                done += __atomic_load_n(&ws[i]->p_done, __ATOMIC_RELAXED);
                bytes += __atomic_load_n(&ws[i]->p_bytes, __ATOMIC_RELAXED);
                errs += __atomic_load_n(&ws[i]->p_errors, __ATOMIC_RELAXED);
            }
            if (now < C.t_measure)
                printf("\r\033[K[%5.1fs] warming up", (double)(now - C.t_start) / 1e9);
            else
                printf("\r\033[K[%5.1fs] %s %s: %11.1f req/s %8.3f GB/s  %llu errors  %llu requests",
                       (double)(now - C.t_measure) / 1e9, proto_label(), workload_name[G.workload],
                       (double)(done - last_done), (double)(bytes - last_bytes) / 1e9, (unsigned long long)errs,
                       (unsigned long long)done);
            fflush(stdout);
            last_done = done;
            last_bytes = bytes;
            next_print += 1.0;
        }
        sleep_ns(snapped ? 50000000ull : 5000000ull);
    }
    getrusage(RUSAGE_SELF, &ru1);
    if (!snapped)
        ru0 = ru1;
    free(joined);
    if (tty)
        printf("\r\033[K");
    if (C.fatal)
        return 3;

    for (int i = 0; i < G.threads; i++)
        if (ws[i]->t_last_done > t_end)
            t_end = ws[i]->t_last_done;
    if (t_end <= C.t_measure)
        t_end = kvb_now();
    elapsed = (double)(t_end - C.t_measure) / 1e9;
    if (elapsed <= 0)
        elapsed = 1e-9;
    pre_s = (double)(t_pre1 - t_pre0) / 1e9;
    cpu_user = tv_s(ru1.ru_utime) - tv_s(ru0.ru_utime);
    cpu_sys = tv_s(ru1.ru_stime) - tv_s(ru0.ru_stime);

    st = kvb_reachable[1] = calloc(1, sizeof(*st));
    pre = kvb_reachable[2] = calloc(1, sizeof(*pre));
    t = kvb_reachable[3] = malloc(sizeof(*t));
    tp = kvb_reachable[4] = malloc(sizeof(*tp));
    if (st == NULL || pre == NULL || t == NULL || tp == NULL)
        return 3;
    for (int i = 0; i < G.threads; i++) {
        kvb_stats_merge(st, ws[i]->st);
        kvb_stats_merge(pre, ws[i]->pre);
    }
    sum_totals(st, t);
    sum_totals(pre, tp);
    if (G.workload == WL_RELAY)
        relay_err = kvb_relay_errors(ws, G.threads, &ended, &unpublished, &failed);
    all_errors = t->errors + tp->errors + relay_err;
    if (all_errors > G.max_errors)
        rc = 1;
    if (t->requests == 0 && G.workload != WL_RELAY && !C.stop)
        rc = 1;

    if (!G.quiet) {
        char smin[32], smax[32];
        fmt_size(G.size_min, smin, sizeof(smin));
        fmt_size(G.size_max, smax, sizeof(smax));
        printf("kvrelay-bench: %s %s -> %s, size %s%s%s, %llu keys (%s), %d connections%s, %d threads\n", proto_label(),
               workload_name[G.workload], G.target, smin, G.size_min != G.size_max ? "-" : "",
               G.size_min != G.size_max ? smax : "", (unsigned long long)G.keys, G.zipf ? "zipf" : "uniform", G.conns,
               G.http2 && G.streams > 1 ? " x streams" : "", G.threads);
        if (G.preload)
            printf("preload: %llu PUTs in %.2f s (%.1f MB/s), %llu errors\n", (unsigned long long)tp->requests, pre_s,
                   (double)tp->bytes / pre_s / 1e6, (unsigned long long)tp->errors);
        printf("measured %.3f s%s: %llu requests, %llu ok (%llu misses), %llu errors, %.3f GB payload\n\n", elapsed,
               C.stop ? " (interrupted)" : "", (unsigned long long)t->requests, (unsigned long long)t->ok,
               (unsigned long long)t->miss_ok, (unsigned long long)t->errors, (double)t->bytes / 1e9);
        printf("%-7s %10s %10s %8s %11s %8s %8s %8s %8s %8s %9s\n", "op", "requests", "ok", "errors", "req/s", "GB/s",
               "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms");
        for (int o = 0; o < OP_N; o++)
            if (st->ok[o] + op_errors(st, o))
                print_row(stdout, kvb_op_name[o], st->ok[o], op_errors(st, o), st->bytes[o], &st->lat[o], elapsed);
        print_row(stdout, "total", t->ok, t->errors, t->bytes, &t->lat, elapsed);
        if (t->errors || tp->errors) {
            printf("errors by kind:");
            for (int k = 0; k < EK_N; k++)
                if (t->err[k] + tp->err[k])
                    printf(" %s %llu", kvb_ek_name[k], (unsigned long long)(t->err[k] + tp->err[k]));
            printf("\n");
        }
        if (G.proto == PROTO_HTTP) {
            printf("statuses:");
            for (int o = 0; o < OP_N; o++)
                for (int c = 0; c < 600; c++)
                    if (st->status[o][c])
                        printf(" %s %d x%llu", kvb_op_name[o], c, (unsigned long long)st->status[o][c]);
            printf("\n");
        }
        print_samples(stdout, ws, G.threads);
        printf("client cpu: %.2f s user, %.2f s sys (%.2f cores)\n", cpu_user, cpu_sys, (cpu_user + cpu_sys) / elapsed);
        if (G.workload == WL_RELAY)
            kvb_relay_print(stdout, ws, G.threads, elapsed);
        if (rc)
            printf("FAILED: %llu errors (allowed %llu)\n", (unsigned long long)all_errors,
                   (unsigned long long)G.max_errors);
    } else {
        printf("%s %s: %llu requests in %.2f s, %.1f req/s, %.3f GB/s, p99 %.3f ms, %llu errors", proto_label(),
               workload_name[G.workload], (unsigned long long)t->requests, elapsed, (double)t->requests / elapsed,
               (double)t->bytes / elapsed / 1e9, kvb_hist_quantile(&t->lat, 0.99) / 1e6,
               (unsigned long long)t->errors);
        if (tp->errors)
            printf(" (+%llu in the preload)", (unsigned long long)tp->errors);
        if (relay_err)
            printf(" (+%llu relay: %llu unpublished, %llu streams ended, %llu replicas failed)",
                   (unsigned long long)relay_err, (unsigned long long)unpublished, (unsigned long long)ended,
                   (unsigned long long)failed);
        printf("\n");
        if (rc)
            print_samples(stderr, ws, G.threads);
    }
    if (G.json != NULL)
        write_json(G.json, ws, G.threads, st, pre, elapsed, pre_s, cpu_user, cpu_sys, relay_err, rc);
    fflush(stdout);
    return rc;
}
