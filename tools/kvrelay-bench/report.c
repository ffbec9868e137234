/*
 * report.c — the results: the table (or with --quiet one summary line) on stdout, the first
 * error of each kind, and the JSON file of --json. Everything here runs once, after the
 * threads have been joined.
 */
#include "report.h"
#include "json.h"
#include "relay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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

void kvb_sum_totals(const kvb_stats_t *s, kvb_totals_t *t)
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

/* The run's setup: the command line, target, workload, sizes, keys, load and limits. */
static void json_setup(FILE *f, double elapsed)
{
    int first;

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
            G.proto == PROTO_RESP ? "resp" : G.proto == PROTO_MEMCACHE ? "memcache"
                                                                       : "http",
            G.http2 ? "true" : "false",
            G.streams, kvb_proto_label(), kvb_workload_name[G.workload]);
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
}

/* "ops": per operation, its counts, rates, latency, errors by kind and HTTP statuses. */
static void json_ops(FILE *f, const kvb_stats_t *st, double elapsed)
{
    int first;

    fprintf(f, "\"ops\": {");
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
    fprintf(f, "}");
}

/* The --json file; errors of its own are reported on stderr and do not change the exit status. */
void kvb_report_json(const char *path, const kvb_run_t *run)
{
    FILE *f = fopen(path, "w");
    kvb_totals_t *t = malloc(sizeof(*t)), *tp = malloc(sizeof(*tp));
    kvb_worker_t **ws = run->ws;
    const kvb_stats_t *st = run->st;
    double elapsed = run->elapsed, pre_s = run->pre_s, cpu_user = run->cpu_user, cpu_sys = run->cpu_sys;
    uint64_t relay_err = run->relay_err;
    int nw = run->nw, rc = run->rc, first;
    if (f == NULL || t == NULL || tp == NULL) {
        fprintf(stderr, "kvrelay-bench: cannot write %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        free(t);
        free(tp);
        return;
    }
    kvb_sum_totals(st, t);
    kvb_sum_totals(run->pre, tp);
    json_setup(f, elapsed);
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
    fprintf(f, "},\n ");
    json_ops(f, st, elapsed);
    fprintf(f, ",\n \"cpu\": {\"user_s\": %.3f, \"sys_s\": %.3f, \"total_s\": %.3f, \"cores\": %.3f},\n", cpu_user,
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

/* The table (or with --quiet the summary line), the first error of each kind, the relay's table. */
void kvb_report_print(const kvb_run_t *run)
{
    kvb_worker_t **ws = run->ws;
    const kvb_stats_t *st = run->st;
    const kvb_totals_t *t = run->t, *tp = run->tp;
    double elapsed = run->elapsed, pre_s = run->pre_s, cpu_user = run->cpu_user, cpu_sys = run->cpu_sys;
    uint64_t relay_err = run->relay_err, all_errors = run->all_errors;
    uint64_t ended = run->ended, unpublished = run->unpublished, failed = run->failed;
    int rc = run->rc;

    if (!G.quiet) {
        char smin[32], smax[32];
        fmt_size(G.size_min, smin, sizeof(smin));
        fmt_size(G.size_max, smax, sizeof(smax));
        printf("kvrelay-bench: %s %s -> %s, size %s%s%s, %llu keys (%s), %d connections%s, %d threads\n", kvb_proto_label(),
               kvb_workload_name[G.workload], G.target, smin, G.size_min != G.size_max ? "-" : "",
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
        printf("%s %s: %llu requests in %.2f s, %.1f req/s, %.3f GB/s, p99 %.3f ms, %llu errors", kvb_proto_label(),
               kvb_workload_name[G.workload], (unsigned long long)t->requests, elapsed, (double)t->requests / elapsed,
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
}
