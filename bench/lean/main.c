/*
 * main.c — lean_client (build/bench/lean_client), the second load client of
 * scripts/bench-dataplane.sh (--client lean): written apart from tools/kvrelay-bench (no code,
 * no header and no block format in common) and linked with nothing of the tree, so that a figure
 * both clients agree on is not an artefact of one client. main.c: options and results;
 * engine.c: blocks, connections, protocols, the epoll loops, statistics.
 *
 *   build/bench/lean_client --protocol http|memcache|resp --target HOST:PORT --size N[K|M|G]
 *                           --workload get|put [--preload] [--keys N] [--key-prefix S]
 *                           [--connections N] [--threads N] [--duration SEC] [--requests N]
 *                           [--timeout SEC] [--pick uniform|round-robin] [--no-verify]
 *                           [--json FILE] [--quiet]
 *
 * Design: one level-triggered epoll loop per thread (--threads, default 1), the --connections
 * keep-alive TCP connections (TCP_NODELAY) dealt out to them, a closed loop with exactly one
 * request outstanding per connection. Requests: http `PUT /kv/<key>` with Content-Length and
 * `GET /kv/<key>`; memcache `set <key> 0 0 <n>` / `get <key>`; resp SET / GET as RESP arrays.
 * PUT bodies go out with writev from one buffer built at start-up (a 16-byte stamp per request,
 * then a slice of the pool: no per-request copy of the body); answers are read 256 KiB at a time.
 *
 * Keys: <prefix>-<n>. get: n over 0..--keys-1, uniformly (default) or round-robin; --preload PUTs
 * every one of them first (not measured). put: every PUT a new key, n counting up from --keys
 * when --preload ran (else from 0), never wrapping.
 *
 * A block's bytes follow from (key, size) by this client's own rule (engine.c): h = the key's FNV-1a 64 hash,
 * finalised; bytes 0..7 are h, bytes 8..15 mix(h ^ size) (little-endian), and byte 16 + i is
 * byte (h >> 20) % 4096 * 8 + i of a pool of splitmix64 words (seed 0x6c65616e). A GET is
 * verified while it is received: its length, the 16-byte stamp, one 8-byte word at a position
 * chosen by h, and the last 8 bytes; any difference is an error of kind "corrupt". --no-verify
 * checks the length only (the null server answers kvrelay-bench's bytes, not these).
 *
 * Errors by kind: status (an unexpected status or reply), miss (404, END, $-1), length, corrupt,
 * short (the connection ended inside an answer), connect, timeout (no complete answer within
 * --timeout: the connection is reopened), protocol (an answer this client cannot frame).
 * Latency of successful requests from a log histogram of 128 buckets per power of two (< 0.8 %
 * wide): p50/p90/p99/p99.9/max. Exit status: 0 success; 1 any error, or no request completed;
 * 2 usage; 3 setup failure (cannot connect).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "engine.h"

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
    fprintf(f, "usage: lean_client [options]   (bench/lean_client.c has the design)\n"
               "  --protocol P       http | memcache | resp (default http)\n"
               "  --target HOST:PORT server (default 127.0.0.1:9130)\n"
               "  --size N[K|M|G]    block size, at least 16 bytes (default 16K)\n"
               "  --workload W       get | put (default get)\n"
               "  --preload          PUT every GET key once first (not measured)\n"
               "  --keys N           GET key space <prefix>-0..N-1 (default 1000)\n"
               "  --key-prefix S     (default lean-<size>)\n"
               "  --pick P           uniform | round-robin GET keys (default uniform)\n"
               "  --connections N    keep-alive connections, one request in flight each (default 16)\n"
               "  --threads N        epoll threads (default 1)\n"
               "  --duration SEC     measured time (default 10; none with --requests alone)\n"
               "  --requests N       stop after N measured requests (with --duration: first)\n"
               "  --timeout SEC      a request without its answer after SEC is an error (default 10)\n"
               "  --no-verify        check GET lengths only, not the bytes\n"
               "  --json FILE        results as JSON\n"
               "  --quiet            one summary line\n"
               "Exit: 0 ok; 1 errors or nothing completed; 2 usage; 3 cannot connect.\n");
}

static void die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "lean_client: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (--help lists the options)\n");
    exit(2);
}

static uint64_t parse_count(const char *s, const char *opt)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        die_usage("%s takes a count", opt);
    return v;
}

static double parse_secs(const char *s, const char *opt)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || (*end && strcmp(end, "s")) || !(v > 0) || v > 86400)
        die_usage("%s takes seconds, e.g. 1 or 0.5", opt);
    return v;
}

static uint64_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    int sh = 0;
    if (*end == 'K' || *end == 'k')
        sh = 10;
    else if (*end == 'M' || *end == 'm')
        sh = 20;
    else if (*end == 'G' || *end == 'g')
        sh = 30;
    if (sh)
        end++;
    if (errno || end == s || *end || s[0] == '-' || v > (1ull << 30) >> sh || (v << sh) < 16 || (v << sh) > (1ull << 30))
        die_usage("--size takes 16 bytes to 1G, e.g. 16K or 2M, not %s", s);
    return v << sh;
}

static void parse_target(const char *t)
{
    char host[256];
    const char *colon = strrchr(t, ':');
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (colon == NULL || colon == t || (size_t)(colon - t) >= sizeof(host))
        die_usage("--target takes HOST:PORT, not %s", t);
    memcpy(host, t, (size_t)(colon - t));
    host[colon - t] = 0;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0)
        die_usage("cannot resolve --target %s", t);
    memcpy(&O.addr, ai->ai_addr, ai->ai_addrlen);
    O.addrlen = ai->ai_addrlen;
    freeaddrinfo(ai);
}

static void parse_args(int argc, char **argv)
{
    /* clang-format off */
    static const struct option lo[] = {
        {"protocol", 1, NULL, 'P'}, {"target", 1, NULL, 't'},      {"size", 1, NULL, 's'},
        {"connections", 1, NULL, 'c'}, {"threads", 1, NULL, 'T'},  {"workload", 1, NULL, 'w'},
        {"preload", 0, NULL, 'p'},  {"keys", 1, NULL, 'k'},        {"key-prefix", 1, NULL, 'x'},
        {"duration", 1, NULL, 'd'}, {"requests", 1, NULL, 'r'},    {"timeout", 1, NULL, 'o'},
        {"json", 1, NULL, 'j'},     {"quiet", 0, NULL, 'q'},       {"no-verify", 0, NULL, 'n'},
        {"pick", 1, NULL, 'K'},     {"help", 0, NULL, 'h'},        {NULL, 0, NULL, 0}};
    /* clang-format on */
    int c, dur_set = 0;
    O.argc = argc;
    O.argv = argv;
    O.target = "127.0.0.1:9130";
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'P':
            O.proto = !strcmp(optarg, "http") ? P_HTTP : !strcmp(optarg, "memcache") ? P_MC
                                                   : !strcmp(optarg, "resp")         ? P_RESP
                                                                                     : -1;
            if (O.proto < 0)
                die_usage("--protocol is http, memcache or resp, not %s", optarg);
            break;
        case 't': O.target = optarg; break;
        case 's':
            O.size = parse_size(optarg);
            O.size_spec = optarg;
            break;
        case 'c': O.conns = (int)parse_count(optarg, "--connections"); break;
        case 'T': O.threads = (int)parse_count(optarg, "--threads"); break;
        case 'w':
            O.workload = !strcmp(optarg, "get") ? W_GET : !strcmp(optarg, "put") ? W_PUT
                                                                                 : -1;
            if (O.workload < 0)
                die_usage("--workload is get or put, not %s", optarg);
            break;
        case 'p': O.preload = 1; break;
        case 'k':
            O.keys = parse_count(optarg, "--keys");
            O.keys_set = 1;
            break;
        case 'x': O.prefix = optarg; break;
        case 'd':
            O.duration = parse_secs(optarg, "--duration");
            dur_set = 1;
            break;
        case 'r': O.requests = parse_count(optarg, "--requests"); break;
        case 'o': O.timeout = parse_secs(optarg, "--timeout"); break;
        case 'j': O.json = optarg; break;
        case 'q': O.quiet = 1; break;
        case 'n': O.verify = 0; break;
        case 'K':
            if (strcmp(optarg, "uniform") && strcmp(optarg, "round-robin"))
                die_usage("--pick is uniform or round-robin, not %s", optarg);
            O.round_robin = !strcmp(optarg, "round-robin");
            break;
        case 'h': usage(stdout); exit(0);
        default: die_usage("%s", "unknown option or missing value");
        }
    }
    if (optind < argc)
        die_usage("unexpected argument %s", argv[optind]);
    if (O.conns < 1 || O.conns > 100000 || O.threads < 1 || O.threads > 256 || O.keys < 1)
        die_usage("%s", "--connections, --threads and --keys must be at least 1");
    if (O.threads > O.conns)
        O.threads = O.conns;
    if (O.requests && !dur_set)
        O.duration = 0;
    if (O.prefix == NULL) {
        snprintf(O.prefix_buf, sizeof(O.prefix_buf), "lean-%s", O.size_spec);
        O.prefix = O.prefix_buf;
    }
    if (strlen(O.prefix) > 200 || strpbrk(O.prefix, " \r\n/?#%"))
        die_usage("--key-prefix: at most 200 characters, no space, / ? # %% or line break (%s)", O.prefix);
    parse_target(O.target);
}

/* ---------------------------------------------------------------- results */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void json_lat(FILE *f, const stats_t *s)
{
    fprintf(f, "{\"count\": %" PRIu64 ", \"mean\": %.6f, \"p50\": %.6f, \"p90\": %.6f, \"p99\": %.6f, \"p99_9\": %.6f, \"max\": %.6f}",
            s->hn, s->hn ? (double)s->hsum / (double)s->hn / 1e6 : 0.0, quantile_ns(s, 0.5) / 1e6, quantile_ns(s, 0.9) / 1e6,
            quantile_ns(s, 0.99) / 1e6, quantile_ns(s, 0.999) / 1e6, (double)s->hmax / 1e6);
}

static void json_counts(FILE *f, const stats_t *s, double el)
{
    uint64_t e = errs_of(s);
    fprintf(f, "\"requests\": %" PRIu64 ", \"successes\": %" PRIu64 ", \"misses\": %" PRIu64 ", \"errors\": %" PRIu64 ", \"bytes\": %" PRIu64,
            s->ok + e, s->ok, s->misses, e, s->bytes);
    fprintf(f, ", \"requests_per_s\": %.3f, \"gb_per_s\": %.6f, \"latency_ms\": ", (double)(s->ok + e) / el, (double)s->bytes / el / 1e9);
    json_lat(f, s);
}

static void write_json(const stats_t *m, const stats_t *p, thr_t *ts, double el, double pre_s, double cpu_u, double cpu_s, int rc)
{
    FILE *f = fopen(O.json, "w");
    uint64_t e = errs_of(m), pe = errs_of(p);
    if (f == NULL) {
        fprintf(stderr, "lean_client: cannot write %s: %s\n", O.json, strerror(errno));
        return;
    }
    fprintf(f, "{\"tool\": \"lean_client\", \"version\": 1, \"command_line\": [");
    for (int i = 0; i < O.argc; i++) {
        fputs(i ? ", " : "", f);
        json_str(f, O.argv[i]);
    }
    fprintf(f, "],\n \"target\": ");
    json_str(f, O.target);
    fprintf(f, ", \"protocol\": \"%s\", \"workload\": \"%s\", \"size\": {\"spec\": ", proto_name[O.proto], wl_name[O.workload]);
    json_str(f, O.size_spec);
    fprintf(f, ", \"min\": %" PRIu64 ", \"max\": %" PRIu64 "}, \"keys\": %" PRIu64 ", \"key_prefix\": ", O.size, O.size, O.keys);
    json_str(f, O.prefix);
    fprintf(f, ", \"pick\": \"%s\", \"verify\": %s,\n \"connections\": %d, \"threads\": %d, \"duration_s\": %.6f, "
               "\"duration_limit_s\": %.3f, \"request_limit\": %" PRIu64 ", \"timeout_s\": %.3f,\n \"preload\": ",
            O.round_robin ? "round-robin" : "uniform", O.verify ? "true" : "false", O.conns, O.threads, el, O.duration, O.requests, O.timeout);
    if (O.preload)
        fprintf(f, "{\"keys\": %" PRIu64 ", \"requests\": %" PRIu64 ", \"successes\": %" PRIu64 ", \"errors\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"seconds\": %.6f},\n",
                O.keys, p->ok + pe, p->ok, pe, p->bytes, pre_s);
    else
        fprintf(f, "null,\n");
    fprintf(f, " \"requests\": %" PRIu64 ", \"successes\": %" PRIu64 ", \"misses\": %" PRIu64 ", \"errors\": %" PRIu64 ", \"bytes\": %" PRIu64 ",\n",
            m->ok + e, m->ok, m->misses, e, m->bytes);
    fprintf(f, " \"throughput\": {\"requests_per_s\": %.3f, \"successes_per_s\": %.3f, \"bytes_per_s\": %.1f, \"gb_per_s\": %.6f, \"gib_per_s\": %.6f},\n",
            (double)(m->ok + e) / el, (double)m->ok / el, (double)m->bytes / el, (double)m->bytes / el / 1e9, (double)m->bytes / el / (double)(1u << 30));
    fprintf(f, " \"latency_ms\": ");
    json_lat(f, m);
    fprintf(f, ",\n \"errors_by_kind\": {");
    for (int k = 0; k < EK_N; k++)
        fprintf(f, "%s\"%s\": %" PRIu64, k ? ", " : "", ek_name[k], m->err[k] + p->err[k]);
    fprintf(f, "},\n \"error_samples\": {");
    for (int k = 0, first = 1; k < EK_N; k++)
        for (int i = 0; i < O.threads; i++)
            if (ts[i].sample[k][0]) {
                fprintf(f, "%s\"%s\": ", first ? "" : ", ", ek_name[k]);
                json_str(f, ts[i].sample[k]);
                first = 0;
                break;
            }
    fprintf(f, "},\n \"statuses\": {");
    for (int i = 0, first = 1; i < 600; i++)
        if (m->status[i]) {
            fprintf(f, "%s\"%d\": %" PRIu64, first ? "" : ", ", i, m->status[i]);
            first = 0;
        }
    fprintf(f, "},\n \"ops\": {\"%s\": {", wl_name[O.workload]);
    json_counts(f, m, el);
    fprintf(f, "}},\n \"cpu\": {\"user_s\": %.3f, \"sys_s\": %.3f, \"total_s\": %.3f, \"cores\": %.3f},\n", cpu_u, cpu_s, cpu_u + cpu_s, (cpu_u + cpu_s) / el);
    fprintf(f, " \"total_errors\": %" PRIu64 ", \"exit_status\": %d}\n", e + pe, rc);
    if (fclose(f) != 0)
        fprintf(stderr, "lean_client: writing %s: %s\n", O.json, strerror(errno));
}

static void print_summary(const stats_t *m, const stats_t *p, thr_t *ts, double el, double pre_s)
{
    uint64_t e = errs_of(m), pe = errs_of(p);
    if (!O.quiet && O.preload)
        printf("lean_client: preload %" PRIu64 " PUTs in %.2f s, %" PRIu64 " errors\n", p->ok + pe, pre_s, pe);
    printf("lean_client: %s %s %s %s x%d: %" PRIu64 " requests in %.2f s, %.1f req/s, %.3f GB/s, p50 %.3f p99 %.3f "
           "p99.9 %.3f max %.3f ms, %" PRIu64 " errors",
           proto_name[O.proto], wl_name[O.workload], O.target, O.size_spec, O.conns, m->ok + e, el, (double)(m->ok + e) / el,
           (double)m->bytes / el / 1e9, quantile_ns(m, 0.5) / 1e6, quantile_ns(m, 0.99) / 1e6, quantile_ns(m, 0.999) / 1e6,
           (double)m->hmax / 1e6, e);
    if (pe)
        printf(" (+%" PRIu64 " in the preload)", pe);
    printf("\n");
    if (e + pe == 0)
        return;
    for (int k = 0; k < EK_N; k++)
        for (int i = 0; i < O.threads; i++)
            if (ts[i].sample[k][0]) {
                fprintf(stderr, "lean_client: %s x%" PRIu64 ", first: %s\n", ek_name[k], m->err[k] + p->err[k], ts[i].sample[k]);
                break;
            }
}

/* Opens every connection (blocking connect, then non-blocking), one epoll per thread. */

int main(int argc, char **argv)
{
    static stats_t m, p;
    struct rusage ru;
    uint64_t t0, last = 0;
    double el, pre_s, cpu_u, cpu_s;
    int rc;
    parse_args(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    pool_init();
    thr_t *ts = setup_threads();
    pthread_barrier_init(&G.bar, NULL, (unsigned)O.threads);
    t0 = now_ns();
    for (int i = 0; i < O.threads; i++)
        pthread_create(&ts[i].tid, NULL, thread_main, &ts[i]);
    for (int i = 0; i < O.threads; i++) {
        pthread_join(ts[i].tid, NULL);
        stats_add(&m, &ts[i].st[1]);
        stats_add(&p, &ts[i].st[0]);
        last = ts[i].last_ns > last ? ts[i].last_ns : last;
    }
    getrusage(RUSAGE_SELF, &ru);
    cpu_u = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 - G.cpu0_u; /* the measured phase's */
    cpu_s = (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6 - G.cpu0_s;
    pre_s = (double)(G.start_ns - t0) / 1e9;
    el = (double)((last > G.start_ns ? last : now_ns()) - G.start_ns) / 1e9;
    if (el <= 0)
        el = 1e-9;
    rc = (errs_of(&m) + errs_of(&p) > 0 || m.ok == 0) ? 1 : 0;
    print_summary(&m, &p, ts, el, pre_s);
    if (O.json)
        write_json(&m, &p, ts, el, pre_s, cpu_u, cpu_s, rc);
    free_threads(ts);
    return rc;
}
