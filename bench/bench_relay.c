/*
 * bench_relay — the relay measured end to end against the real server.
 *
 * Starts build/kvrelay-supervisor on ephemeral loopback ports (stopped by PID at the end),
 * drives PUTs over HTTP/1.1 keep-alive, and consumes SubscribeKvPool with kvrelay's own
 * gRPC client and CBI1 mirror. Prints "name value unit" lines:
 *
 *   publish_latency_p50_ms, _p99_ms   a PUT's 201 -> the subscriber's replica holding its
 *                                     hash, at a paced 10,000 PUT/s of 1 KiB blocks
 *   put_rate_0_subscribers            closed-loop PUT/s with no subscriber...
 *   put_rate_64_subscribers           ...and with 64 live subscribers
 *   put_rate_64_subscribers_ratio     the second over the first
 *   put_rate_64_subscribers_cut       of the 64, how many were cut for lag
 *   put_rate_paced_*                  the same paced at 10,000 PUT/s
 *   put_rate_16k_*                    closed loop with 16 KiB blocks into a full store
 *   snapshot_16m_buckets_gbps         a 16M-bucket filter (128 MiB) delivered to one subscriber
 */
#include "io/grpc_client.h"
#include "wire/mirror.h"
#include "wire/relay.pb-c.h"
#include "wire/relay_validate.h"

#include <errno.h>
#include <libgen.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MARKER 0x4B565231u

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------ the server */

typedef struct {
    pid_t pid;
    char http[160], grpc[160];
    char portfile[64];
} server_t;

static char server_bin[4096];

static void server_start(server_t *s, char *const extra[])
{
    char *argv[32];
    int n = 0;
    double end;
    FILE *f;

    snprintf(s->portfile, sizeof(s->portfile), "/tmp/kvrelay-bench-%d.ports", (int)getpid());
    unlink(s->portfile);
    argv[n++] = server_bin;
    argv[n++] = "--http-bind";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--grpc-bind";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--port-file";
    argv[n++] = s->portfile;
    argv[n++] = "--log-level";
    argv[n++] = "warn";
    for (int i = 0; extra[i] != NULL && n < 30; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    s->pid = fork();
    if (s->pid == 0) {
        execv(server_bin, argv);
        _exit(127);
    }
    end = now_s() + 10;
    s->http[0] = s->grpc[0] = '\0';
    while (now_s() < end) {
        if ((f = fopen(s->portfile, "r")) != NULL) {
            char line[128];
            while (fgets(line, sizeof(line), f)) {
                line[strcspn(line, "\n")] = '\0';
                if (!strncmp(line, "http=", 5))
                    snprintf(s->http, sizeof(s->http), "%s", line + 5);
                if (!strncmp(line, "grpc=", 5))
                    snprintf(s->grpc, sizeof(s->grpc), "%s", line + 5);
            }
            fclose(f);
            if (s->http[0] && s->grpc[0])
                break;
        }
        usleep(10000);
    }
    if (!s->http[0]) {
        fprintf(stderr, "bench_relay: the server did not start (%s)\n", server_bin);
        exit(1);
    }
    usleep(200000); /* the publisher's first generation */
}

static void server_stop(server_t *s)
{
    int status;
    kill(s->pid, SIGTERM);
    for (int i = 0; i < 100 && waitpid(s->pid, &status, WNOHANG) == 0; i++)
        usleep(50000);
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &status, 0);
    unlink(s->portfile);
}

/* ------------------------------------------------------------------ HTTP PUTs */

static int http_connect(const char *hostport)
{
    char host[64];
    int port, fd, on = 1;
    struct sockaddr_in a = {0};

    sscanf(hostport, "%63[^:]:%d", host, &port);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(0x7f000001);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        perror("connect");
        exit(1);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    return fd;
}

/* Sends one PUT with a sequence hash; returns the request text length. */
static int put_send(int fd, uint64_t key, uint64_t h, const char *body, size_t blen)
{
    char req[512];
    int n = snprintf(req, sizeof(req),
                     "PUT /kv/bench-%016llx HTTP/1.1\r\nHost: x\r\nX-KV-Sequence-Hash: %llu\r\nContent-Length: %zu\r\n\r\n",
                     (unsigned long long)key, (unsigned long long)h, blen);
    if (write(fd, req, (size_t)n) != n || write(fd, body, blen) != (ssize_t)blen)
        return -1;
    return n;
}

/* Reads one response; returns its status. */
static int put_recv(int fd)
{
    char buf[1024];
    size_t got = 0;
    char *end, *cl;
    size_t need;

    for (;;) {
        ssize_t n = read(fd, buf + got, sizeof(buf) - 1 - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
        buf[got] = '\0';
        if ((end = strstr(buf, "\r\n\r\n")) != NULL)
            break;
    }
    cl = strcasestr(buf, "content-length:");
    need = (size_t)(end + 4 - buf) + (cl ? strtoul(cl + 15, NULL, 10) : 0);
    while (got < need) {
        ssize_t n = read(fd, buf + got, sizeof(buf) - 1 - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return atoi(buf + 9);
}

/* A counter or gauge of the server's /metrics (-1 when it cannot be read). */
static double server_metric(const server_t *srv, const char *name)
{
    static char buf[1 << 20];
    size_t got = 0, nlen = strlen(name);
    int fd = http_connect(srv->http);
    const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    double v = -1;
    ssize_t n;

    if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
        close(fd);
        return -1;
    }
    while (got < sizeof(buf) - 1 && (n = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0)
        got += (size_t)n;
    close(fd);
    buf[got] = '\0';
    for (char *l = strtok(buf, "\n"); l != NULL; l = strtok(NULL, "\n"))
        if (!strncmp(l, name, nlen) && l[nlen] == ' ')
            v = strtod(l + nlen + 1, NULL);
    return v;
}

/* ------------------------------------------------------------------ subscribers */

#define MAXPEND 65536

typedef struct {
    kvr_gclient_t *c;
    kvr_gcall_t *call;
    Dynamo__Kvrelay__V1__KvPoolCatalogUpdate *cat;
    kvr_mirror_t mirror;
    int live;
    int failed;
    uint64_t bytes;
    /* latency probes: hashes acknowledged but not yet seen in the replica */
    uint64_t pend_h[MAXPEND];
    double pend_t[MAXPEND];
    size_t npend;
    double *lat;
    size_t nlat, caplat;
} sub_t;

static int on_cat(void *ctx, kvr_gcall_t *call, const uint8_t *msg, size_t len)
{
    sub_t *s = ctx;
    s->cat = dynamo__kvrelay__v1__kv_pool_catalog_update__unpack(NULL, len, msg);
    return 1;
}

/* A consumer that only counts (the put-rate phase: 64 of them share this process's core
 * with the PUT load, so each must cost what a remote router's network stack would). */
static int on_update_light(void *ctx, kvr_gcall_t *call, const uint8_t *msg, size_t len)
{
    sub_t *s = ctx;
    s->bytes += len + 5;
    return 0;
}

static int on_update(void *ctx, kvr_gcall_t *call, const uint8_t *msg, size_t len)
{
    sub_t *s = ctx;
    Dynamo__Kvrelay__V1__FilterUpdate *fu = dynamo__kvrelay__v1__filter_update__unpack(NULL, len, msg);
    kvr_mirror_update_t u;
    double t = now_s();

    s->bytes += len + 5;
    if (fu == NULL || kvr_relay_filter_update_fields(fu, &u) != 0 || kvr_mirror_apply(&s->mirror, &u) != KVR_MIRROR_OK) {
        s->failed = 1;
        if (fu)
            dynamo__kvrelay__v1__filter_update__free_unpacked(fu, NULL);
        return 1;
    }
    dynamo__kvrelay__v1__filter_update__free_unpacked(fu, NULL);
    if (kvr_mirror_state(&s->mirror) == KVR_MIRROR_LIVE)
        s->live = 1;
    for (size_t i = 0; i < s->npend;) {
        if (kvr_mirror_contains(&s->mirror, s->pend_h[i])) {
            if (s->nlat < s->caplat)
                s->lat[s->nlat++] = t - s->pend_t[i];
            s->pend_h[i] = s->pend_h[--s->npend];
            s->pend_t[i] = s->pend_t[s->npend];
        } else {
            i++;
        }
    }
    return 0;
}

static void sub_open(sub_t *s, const char *grpc, int light)
{
    char err[256];
    uint8_t req[4096];
    size_t n;
    Dynamo__Kvrelay__V1__WatchKvPoolCatalogRequest cq = DYNAMO__KVRELAY__V1__WATCH_KV_POOL_CATALOG_REQUEST__INIT;
    Dynamo__Kvrelay__V1__SubscribeKvPoolRequest sq = DYNAMO__KVRELAY__V1__SUBSCRIBE_KV_POOL_REQUEST__INIT;
    Dynamo__Kvrelay__V1__ProducerIdentity *p;
    kvr_gcall_t *call;

    memset(s, 0, sizeof(*s));
    s->c = kvr_gclient_connect(grpc, 3000, err, sizeof(err));
    if (s->c == NULL) {
        fprintf(stderr, "bench_relay: %s\n", err);
        exit(1);
    }
    cq.subscriber_id = "bench";
    cq.contract_marker = MARKER;
    n = dynamo__kvrelay__v1__watch_kv_pool_catalog_request__pack(&cq, req);
    call = kvr_gclient_call(s->c, "/dynamo.kvrelay.v1.KvEventRelay/WatchKvPoolCatalog", req, n, on_cat, s);
    while (s->cat == NULL && kvr_gclient_wait(s->c, call, 5000) == KVR_AGAIN)
        ;
    if (s->cat == NULL || s->cat->snapshot == NULL || s->cat->snapshot->n_pools != 1) {
        fprintf(stderr, "bench_relay: no pool in the catalog\n");
        exit(1);
    }
    p = s->cat->snapshot->pools[0]->producer;
    kvr_mirror_init(&s->mirror, p->ckf_format->seed, p->ckf_format->bucket_count, p->pool_id->dc_id);
    sq.subscriber_id = "bench";
    sq.expected_producer = p;
    sq.contract_marker = MARKER;
    n = dynamo__kvrelay__v1__subscribe_kv_pool_request__pack(&sq, req);
    s->call = kvr_gclient_call(s->c, "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool", req, n,
                               light ? on_update_light : on_update, s);
    if (light)
        s->live = 1; /* counted as live once its stream is open */
}

static void sub_close(sub_t *s)
{
    kvr_gclient_close(s->c);
    kvr_mirror_destroy(&s->mirror);
    dynamo__kvrelay__v1__kv_pool_catalog_update__free_unpacked(s->cat, NULL);
    free(s->lat);
}

static void subs_poll(sub_t *subs, int n, int timeout_ms)
{
    struct pollfd pf[128];
    for (int i = 0; i < n; i++) {
        pf[i].fd = kvr_gclient_fd(subs[i].c);
        pf[i].events = POLLIN;
    }
    if (poll(pf, (nfds_t)n, timeout_ms) > 0)
        for (int i = 0; i < n; i++)
            if (pf[i].revents)
                kvr_gclient_step(subs[i].c);
}

static void wait_live(sub_t *subs, int n)
{
    double end = now_s() + 30;
    for (;;) {
        int live = 0;
        for (int i = 0; i < n; i++)
            live += subs[i].live;
        if (live == n)
            return;
        if (now_s() > end) {
            fprintf(stderr, "bench_relay: %d of %d subscribers live\n", live, n);
            exit(1);
        }
        subs_poll(subs, n, 10);
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ------------------------------------------------------------------ measurements */

static void bench_latency(void)
{
    server_t srv;
    char *extra[] = {"--memory", "256M", NULL};
    sub_t *s = calloc(1, sizeof(*s));
    char body[1024];
    int fd;
    const double rate = 10000, secs = 3;
    double t0, next;
    uint64_t sent = 0;

    server_start(&srv, extra);
    sub_open(s, srv.grpc, 0);
    wait_live(s, 1);
    s->caplat = (size_t)(rate * secs) + 16;
    s->lat = malloc(sizeof(double) * s->caplat);
    memset(body, 'v', sizeof(body));
    fd = http_connect(srv.http);
    t0 = next = now_s();
    while (now_s() - t0 < secs) {
        uint64_t h = 0x9E3779B97F4A7C15ull * (sent + 1);
        double t;
        while ((t = now_s()) < next)
            subs_poll(s, 1, 0);
        if (put_send(fd, sent, h, body, sizeof(body)) < 0 || put_recv(fd) != 201) {
            fprintf(stderr, "bench_relay: PUT failed\n");
            exit(1);
        }
        if (s->npend < MAXPEND) {
            s->pend_h[s->npend] = h;
            s->pend_t[s->npend++] = now_s();
        }
        sent++;
        next += 1.0 / rate;
        subs_poll(s, 1, 0);
    }
    {
        double end = now_s() + 2;
        while (s->npend > 0 && now_s() < end)
            subs_poll(s, 1, 5);
    }
    qsort(s->lat, s->nlat, sizeof(double), cmp_d);
    printf("publish_put_rate %.0f PUT/s\n", (double)sent / secs);
    if (s->nlat == 0 || s->npend > 0 || s->failed) {
        fprintf(stderr, "bench_relay: %zu of %llu PUTs never reached the replica (failed=%d)\n", s->npend,
                (unsigned long long)sent, s->failed);
        exit(1);
    }
    printf("publish_latency_p50_ms %.3f ms\n", 1000 * s->lat[s->nlat / 2]);
    printf("publish_latency_p99_ms %.3f ms\n", 1000 * s->lat[s->nlat * 99 / 100]);
    printf("publish_latency_max_ms %.3f ms\n", 1000 * s->lat[s->nlat - 1]);
    /* deltas the publisher coalesced because this subscriber fell behind (-1: an older server) */
    printf("publish_coalesced_deltas %.0f deltas\n", server_metric(&srv, "kvrelay_relay_coalesced_deltas_total"));
    close(fd);
    sub_close(s);
    free(s);
    server_stop(&srv);
}

/* Closed-loop PUT rate over `conns` connections (one request in flight each) for `secs`,
 * with the subscribers drained as they receive; epoll, so that 64 idle sockets cost nothing. */
static double put_rate_size(server_t *srv, sub_t *subs, int nsubs, int conns, double secs, size_t size)
{
    int fds[16], ep = epoll_create1(EPOLL_CLOEXEC);
    char *body = malloc(size);
    uint64_t done = 0, key = (uint64_t)rand() << 32;
    double t0;
    struct epoll_event ev, evs[128];

    memset(body, 'w', size);
    for (int i = 0; i < conns; i++) {
        fds[i] = http_connect(srv->http);
        ev.events = EPOLLIN;
        ev.data.u64 = (uint64_t)i;
        epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
        put_send(fds[i], key, key * 0x9E3779B97F4A7C15ull, body, size);
        key++;
    }
    for (int i = 0; i < nsubs; i++) {
        ev.events = EPOLLIN;
        ev.data.u64 = 1000 + (uint64_t)i;
        epoll_ctl(ep, EPOLL_CTL_ADD, kvr_gclient_fd(subs[i].c), &ev);
    }
    t0 = now_s();
    while (now_s() - t0 < secs) {
        int n = epoll_wait(ep, evs, 128, 100);
        for (int k = 0; k < n; k++) {
            uint64_t id = evs[k].data.u64;
            if (id < 1000) {
                if (put_recv(fds[id]) != 201) {
                    fprintf(stderr, "bench_relay: PUT failed\n");
                    exit(1);
                }
                done++;
                put_send(fds[id], key, key * 0x9E3779B97F4A7C15ull, body, size);
                key++;
            } else {
                kvr_gclient_step(subs[id - 1000].c);
            }
        }
    }
    for (int i = 0; i < conns; i++) {
        put_recv(fds[i]);
        close(fds[i]);
    }
    close(ep);
    free(body);
    return (double)done / (now_s() - t0);
}

static double put_rate(server_t *srv, sub_t *subs, int nsubs, int conns, double secs)
{
    return put_rate_size(srv, subs, nsubs, conns, secs, 1024);
}

/*
 * 64 light subscribers in a child process of their own (as routers would be: they do not
 * share the PUT client's event loop). The child reads until `stop` becomes readable, then
 * writes how many of its streams ended early (were cut) to `report`.
 */
static pid_t subscribers_start(server_t *srv, int n, int *stop_w, int *report_r)
{
    int stop[2], rep[2];
    pid_t pid;

    if (pipe(stop) < 0 || pipe(rep) < 0)
        exit(1);
    pid = fork();
    if (pid == 0) {
        sub_t *subs = calloc((size_t)n, sizeof(sub_t));
        int ep = epoll_create1(EPOLL_CLOEXEC), cut = 0;
        struct epoll_event ev, evs[128];
        close(stop[1]);
        close(rep[0]);
        for (int i = 0; i < n; i++) {
            sub_open(&subs[i], srv->grpc, 1);
            ev.events = EPOLLIN;
            ev.data.u64 = (uint64_t)i;
            epoll_ctl(ep, EPOLL_CTL_ADD, kvr_gclient_fd(subs[i].c), &ev);
        }
        ev.events = EPOLLIN;
        ev.data.u64 = 1000;
        epoll_ctl(ep, EPOLL_CTL_ADD, stop[0], &ev);
        if (write(rep[1], &cut, sizeof(cut)) != sizeof(cut)) /* ready */
            _exit(1);
        for (;;) {
            int k = epoll_wait(ep, evs, 128, 1000), done = 0;
            for (int j = 0; j < k; j++) {
                if (evs[j].data.u64 == 1000)
                    done = 1;
                else
                    kvr_gclient_step(subs[evs[j].data.u64].c);
            }
            if (done)
                break;
        }
        for (int i = 0; i < n; i++) {
            cut += subs[i].call->done;
            if (subs[i].call->done && getenv("KVR_BENCH_VERBOSE"))
                fprintf(stderr, "subscriber %d ended: status %d %s %s\n", i, subs[i].call->grpc_status,
                        subs[i].call->grpc_message, subs[i].call->reason);
        }
        if (write(rep[1], &cut, sizeof(cut)) != sizeof(cut))
            _exit(1);
        _exit(0);
    }
    close(stop[0]);
    close(rep[1]);
    {
        int ready;
        if (read(rep[0], &ready, sizeof(ready)) != sizeof(ready))
            exit(1);
    }
    usleep(1000000); /* every snapshot delivered */
    *stop_w = stop[1];
    *report_r = rep[0];
    return pid;
}

static int subscribers_stop(pid_t pid, int stop_w, int report_r)
{
    int cut = -1, status;
    if (write(stop_w, "x", 1) != 1 || read(report_r, &cut, sizeof(cut)) != sizeof(cut))
        cut = -1;
    waitpid(pid, &status, 0);
    close(stop_w);
    close(report_r);
    return cut;
}

/* PUTs paced at `rate` for `secs` on one connection; returns the rate achieved. */
static double put_paced(server_t *srv, double rate, double secs)
{
    char body[1024];
    int fd = http_connect(srv->http);
    uint64_t sent = 0, key = (uint64_t)rand() << 32;
    double t0 = now_s(), next = t0;

    memset(body, 'p', sizeof(body));
    while (now_s() - t0 < secs) {
        while (now_s() < next)
            ;
        if (put_send(fd, key, key * 0x9E3779B97F4A7C15ull, body, sizeof(body)) < 0 || put_recv(fd) != 201) {
            fprintf(stderr, "bench_relay: PUT failed\n");
            exit(1);
        }
        key++;
        sent++;
        next += 1.0 / rate;
    }
    close(fd);
    return (double)sent / (now_s() - t0);
}

static void bench_put_rate(void)
{
    server_t srv;
    char *extra[] = {"--memory", "512M", NULL};
    double r0, r64, p0, p64;
    int stop_w, report_r, cut, cut_paced;
    pid_t kids;

    server_start(&srv, extra);
    r0 = put_rate(&srv, NULL, 0, 8, 3.0);
    p0 = put_paced(&srv, 10000, 3.0);
    kids = subscribers_start(&srv, 64, &stop_w, &report_r);
    p64 = put_paced(&srv, 10000, 3.0);
    cut_paced = subscribers_stop(kids, stop_w, report_r);
    kids = subscribers_start(&srv, 64, &stop_w, &report_r);
    r64 = put_rate(&srv, NULL, 0, 8, 3.0);
    cut = subscribers_stop(kids, stop_w, report_r);
    /* closed loop: as fast as 8 connections go; the subscribers must keep up or be cut */
    printf("put_rate_0_subscribers %.0f PUT/s\n", r0);
    printf("put_rate_64_subscribers %.0f PUT/s\n", r64);
    printf("put_rate_64_subscribers_ratio %.3f ratio\n", r64 / r0);
    printf("put_rate_64_subscribers_cut %d streams\n", cut);
    /* paced at the 10,000 PUT/s of the latency target */
    printf("put_rate_paced_0_subscribers %.0f PUT/s\n", p0);
    printf("put_rate_paced_64_subscribers %.0f PUT/s\n", p64);
    printf("put_rate_paced_64_subscribers_ratio %.3f ratio\n", p64 / p0);
    printf("put_rate_paced_64_subscribers_cut %d streams\n", cut_paced);
    server_stop(&srv);
}

/*
 * The same closed loop with 16 KiB blocks (issue 25's acceptance) into a store that is full
 * within the first second, so that every PUT of a new key also evicts one: two change-log
 * events per PUT.
 */
static void bench_put_rate_16k(void)
{
    server_t srv;
    char *extra[] = {"--memory", "256M", NULL};
    double r0, r64, d0, d1;
    int stop_w, report_r, cut;
    pid_t kids;

    server_start(&srv, extra);
    r0 = put_rate_size(&srv, NULL, 0, 8, 3.0, 16384);
    kids = subscribers_start(&srv, 64, &stop_w, &report_r);
    d0 = server_metric(&srv, "kvrelay_relay_deltas_published_total");
    r64 = put_rate_size(&srv, NULL, 0, 8, 3.0, 16384);
    d1 = server_metric(&srv, "kvrelay_relay_deltas_published_total");
    cut = subscribers_stop(kids, stop_w, report_r);
    printf("put_rate_16k_0_subscribers %.0f PUT/s\n", r0);
    printf("put_rate_16k_64_subscribers %.0f PUT/s\n", r64);
    printf("put_rate_16k_64_subscribers_cut %d streams\n", cut);
    /* the frames each subscriber had to read: deltas published during that run */
    printf("put_rate_16k_64_subscribers_deltas %.0f deltas/s\n", (d1 - d0) / 3.0);
    server_stop(&srv);
}

/* Time to deliver a whole snapshot to one new subscriber (catalog, subscribe, every chunk). */
static double snapshot_once(server_t *srv, uint64_t *bytes, int light)
{
    sub_t *s = calloc(1, sizeof(*s));
    double t0 = now_s(), t;

    sub_open(s, srv->grpc, light);
    if (light) { /* count bytes until the whole snapshot (+ envelopes) arrived */
        uint64_t want = (1ull << 24) * 8;
        double end = now_s() + 30;
        while (s->bytes < want && now_s() < end)
            subs_poll(s, 1, 10);
    } else {
        wait_live(s, 1);
    }
    t = now_s() - t0;
    *bytes = s->bytes;
    sub_close(s);
    free(s);
    return t;
}

static void bench_snapshot(void)
{
    server_t srv;
    /* 53687091 expected blocks -> 2^24 buckets (§4.3), a 128 MiB filter in 32 chunks */
    char *extra[] = {"--memory", "64M", "--expected-unique-blocks", "53687091", NULL};
    uint64_t bytes, bytes_full;
    double cold, warm, full;

    server_start(&srv, extra);
    /* The first subscriber of a fresh server also pays the publisher's snapshot copy and the
     * first touch of its pages; later ones share the copy. */
    cold = snapshot_once(&srv, &bytes_full, 0);
    warm = snapshot_once(&srv, &bytes, 1);
    full = snapshot_once(&srv, &bytes_full, 0);
    /* delivered: a consumer that receives and frames every message (the server's rate) */
    printf("snapshot_16m_buckets_gbps %.2f GB/s\n", (double)bytes / warm / 1e9);
    printf("snapshot_16m_buckets_ms %.1f ms\n", warm * 1000);
    /* applied: our own client also decodes, checks and installs every chunk (CBI1 mirror) */
    printf("snapshot_16m_buckets_applied_gbps %.2f GB/s\n", (double)bytes_full / full / 1e9);
    printf("snapshot_16m_buckets_cold_ms %.1f ms\n", cold * 1000);
    server_stop(&srv);
}

int main(int argc, char **argv)
{
    char self[4096];
    const char *env = getenv("KVRELAY_BIN");

    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    if (env != NULL) {
        snprintf(server_bin, sizeof(server_bin), "%s", env);
    } else {
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        self[n > 0 ? n : 0] = '\0';
        snprintf(server_bin, sizeof(server_bin), "%s/../kvrelay-supervisor", dirname(self));
    }
    if (getenv("KVR_BENCH_ONLY_SNAPSHOT") == NULL) {
        bench_latency();
        bench_put_rate();
        bench_put_rate_16k();
    }
    bench_snapshot();
    return 0;
}
