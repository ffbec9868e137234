/*
 * main.c — kvrelay-bench's run: the target's address, the threads and their phases, the
 * progress line, the merged results. See kvb.h for the modules, `kvrelay-bench --help` for the
 * usage.
 *
 * Phases: the threads connect and (with --preload) PUT every key once; barrier; main sets
 * the clock (start, end of warmup, deadline); barrier; the threads run the workload until the
 * deadline or the request budget and drain what is in flight; main prints a progress line
 * once a second meanwhile (a terminal only), then merges the per-thread statistics.
 */
#include "args.h"
#include "data.h"
#include "engine.h"
#include "relay.h"
#include "report.h"

#include "core/config.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* What main allocates stays reachable until exit (LeakSanitizer builds). */
void *kvb_reachable[8]; /* external: the stores cannot be optimised away */

static void on_signal(int sig)
{
    C.stop = 1;
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

/* The threads' workers with their connections (and the relay's subscribers); NULL: out of memory. */
static kvb_worker_t **new_workers(void)
{
    kvb_worker_t **ws = kvb_reachable[0] = calloc((size_t)G.threads, sizeof(*ws));
    for (int i = 0; ws != NULL && i < G.threads; i++)
        if ((ws[i] = kvb_worker_new(i)) == NULL)
            ws = NULL;
    if (ws == NULL)
        return NULL;
    for (int i = 0; i < G.conns; i++)
        if (kvb_worker_add_conn(ws[G.workload == WL_RELAY ? 0 : i % G.threads]) != 0)
            return NULL;
    if (G.workload == WL_RELAY) {
        ws[0]->paced = 1;
        for (int i = 0; i < G.subscribers + G.event_subs; i++)
            if (kvb_relay_add_sub(ws[G.threads > 1 ? 1 + i % (G.threads - 1) : 0], i, i >= G.subscribers) != 0)
                return NULL;
    }
    return ws;
}

/* Until every thread has been joined: the CPU snapshot at the end of the warmup (*ru0,
 * *snapped) and, on a terminal, a progress line once a second. -1: out of memory. */
static int watch(kvb_worker_t **ws, int tty, struct rusage *ru0, int *snapped)
{
    uint64_t last_done = 0, last_bytes = 0;
    double next_print = 1.0;
    int *joined = calloc((size_t)G.threads, sizeof(int));

    if (joined == NULL)
        return -1;
    for (;;) {
        uint64_t now = kvb_now();
        int all = 1;
        if (!*snapped && now >= C.t_measure) {
            getrusage(RUSAGE_SELF, ru0);
            *snapped = 1;
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
                       (double)(now - C.t_measure) / 1e9, kvb_proto_label(), kvb_workload_name[G.workload],
                       (double)(done - last_done), (double)(bytes - last_bytes) / 1e9, (unsigned long long)errs,
                       (unsigned long long)done);
            fflush(stdout);
            last_done = done;
            last_bytes = bytes;
            next_print += 1.0;
        }
        sleep_ns(*snapped ? 50000000ull : 5000000ull);
    }
    free(joined);
    return 0;
}

/* The threads have been joined: merge, decide the exit status, report. */
static int finish(kvb_worker_t **ws, uint64_t pre_ns, const struct rusage *ru0, const struct rusage *ru1)
{
    kvb_stats_t *st, *pre;
    kvb_totals_t *t, *tp;
    kvb_run_t run = {.ws = ws, .nw = G.threads};
    uint64_t t_end = 0;

    for (int i = 0; i < G.threads; i++)
        if (ws[i]->t_last_done > t_end)
            t_end = ws[i]->t_last_done;
    if (t_end <= C.t_measure)
        t_end = kvb_now();
    run.elapsed = (double)(t_end - C.t_measure) / 1e9;
    if (run.elapsed <= 0)
        run.elapsed = 1e-9;
    run.pre_s = (double)pre_ns / 1e9;
    run.cpu_user = tv_s(ru1->ru_utime) - tv_s(ru0->ru_utime);
    run.cpu_sys = tv_s(ru1->ru_stime) - tv_s(ru0->ru_stime);

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
    kvb_sum_totals(st, t);
    kvb_sum_totals(pre, tp);
    run.st = st;
    run.pre = pre;
    run.t = t;
    run.tp = tp;
    if (G.workload == WL_RELAY)
        run.relay_err = kvb_relay_errors(ws, G.threads, &run.ended, &run.unpublished, &run.failed);
    run.all_errors = t->errors + tp->errors + run.relay_err;
    if (run.all_errors > G.max_errors)
        run.rc = 1;
    if (t->requests == 0 && G.workload != WL_RELAY && !C.stop)
        run.rc = 1;

    kvb_report_print(&run);
    if (G.json != NULL)
        kvb_report_json(G.json, &run);
    fflush(stdout);
    return run.rc;
}

int main(int argc, char **argv)
{
    kvb_worker_t **ws;
    struct rusage ru0, ru1;
    uint64_t t_pre0, t_pre1;
    int tty, snapped = 0;
    struct sigaction sa;

    kvb_relay_init();
    kvb_args_parse(argc, argv);
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

    if ((ws = new_workers()) == NULL) {
        fprintf(stderr, "kvrelay-bench: out of memory\n");
        return 3;
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

    if (watch(ws, tty, &ru0, &snapped) != 0)
        return 3;
    getrusage(RUSAGE_SELF, &ru1);
    if (!snapped)
        ru0 = ru1;
    if (tty)
        printf("\r\033[K");
    if (C.fatal)
        return 3;
    return finish(ws, t_pre1 - t_pre0, &ru0, &ru1);
}
