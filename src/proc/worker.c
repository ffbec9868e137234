/* worker.c — see worker.h. */
#include "proc/worker.h"

#include "base/barrier.h"
#include "base/clock.h"
#include "base/log.h"
#include "core/relay_int.h"
#include "core/store.h"
#include "io/api.h"
#include "io/grpc.h"
#include "io/h1.h"
#include "io/http.h"
#include "proc/prefault.h"

#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define YIELD_US 200 /* at most one sched_yield per this many us of the loop (see the loop) */

static volatile sig_atomic_t term_requested;

static void on_term(int sig)
{
    (void)sig;
    term_requested = 1;
}

void kvr_worker_main(const kvr_config_t *cfg, kvr_seg_t *seg, int index, int slot, int listen_fd,
                     int grpc_fd, const kvr_relay_fds_t *fds)
{
    static kvr_relay_t relay;
    kvr_grpc_t *grpc = NULL;
    uint64_t last_tick = 0, last_h1_tick = 0, last_yield_us = 0, us;
    int own_wait;
    char role[32];
    kvr_store_t store;
    static kvr_api_t api;
    kvr_http_t *http;
    kvr_h1_t *h1;
    struct sigaction sa;
    sigset_t none;
    uint64_t deadline = 0;

    /* Request bodies of up to tens of MiB come and go all the time: keep them on the heap
     * (no mmap/munmap and page faults per request) and do not trim it after each free. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    snprintf(role, sizeof(role), "worker %d", index);
    kvr_log_set_role(role);
    /* The supervisor is our lifeline: if it goes, drain and go too. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGINT, &sa, NULL); /* a terminal's ^C reaches the supervisor, which drains us */
    sigaction(SIGPIPE, &sa, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    if (kvr_seg_proc_claim_at(seg, slot, KVR_ROLE_WORKER) < 0 || kvr_store_open(&store, seg) != KVR_OK)
        _exit(70);
    store.notify_fd = fds->publisher;
    kvr_relay_attach(&relay, seg, cfg, fds);
    if (kvr_api_init(&api, cfg, seg, &store, &relay) != KVR_OK)
        _exit(70);
    http = kvr_http_create(cfg, &api);
    if (http == NULL)
        _exit(70);
    h1 = kvr_h1_create(cfg, &api, http, listen_fd, fds->accept);
    if (h1 == NULL)
        _exit(70);
    if (grpc_fd >= 0) {
        grpc = kvr_grpc_create(cfg, seg, &store, &relay, kvr_http_loop(http), grpc_fd, fds->worker[slot]);
        if (grpc == NULL)
            _exit(70);
    }
    /* release: pairs with the supervisor's acquire load of ready (its watchdog) and with
     * kvr_seg_worker_load's (role was written before, at the claim) */
    kvr_atomic_store_release(&seg->procs[slot].ready, 1);
    /* seq_cst RMW against the supervisor's fetch_sub when it takes us out of readiness
     * (take_readiness); /readyz loads the count relaxed */
    kvr_atomic_fetch_add_seq_cst(&seg->hdr->ctl.workers_running, 1);
    own_wait = kvr_h1_waits(h1);
    kvr_info("serving HTTP%s; the loop waits in %s", grpc != NULL ? " and gRPC" : "", own_wait ? "the io_uring ring" : "h2o's epoll");
    /* 4 KiB shmem pages (no hugetlb reserved, no shmem THP policy): collapse the arena into
     * transparent huge pages as it is mapped, unless --hugepages off asked for small pages */
    (void)kvr_prefault_start(&store.arena, cfg->arena_prefault,
                             seg->hdr->backing == KVR_BACKING_SHMEM && strcmp(cfg->hugepages, "off") != 0);

    for (;;) {
        uint64_t t;
        kvr_seg_heartbeat(seg);        /* the supervisor's watchdog (docs/concurrency.md) */
        kvr_store_unpin_flush(&store); /* the pins this iteration released, in one lock */
        if (own_wait)
            kvr_h1_turn(h1, KVR_TICK_MS); /* one io_uring_enter (docs/dataplane.md) */
        else
            kvr_http_run_once(http, KVR_TICK_MS);
        us = kvr_clock_us();
        t = us / 1000;
        if (us - last_yield_us >= YIELD_US) {
            /* Under load io_uring always has completions ready, so this loop never blocks and
             * would hold its core for a whole scheduler tick (4 ms at HZ=250) while the other
             * worker, the publisher or a client on the same core waits: every connection of
             * the waiting worker stalls that long. memcached's threads block in epoll_wait
             * often enough not to. A yield per YIELD_US lets them in: 16 KiB GETs over 64
             * connections went from p99 7-8 ms to 1.5 ms (docs/dataplane.md). With nobody
             * waiting it returns at once. */
            if (own_wait)
                kvr_h1_submit(h1); /* what this turn's callbacks queued goes out before we yield */
            sched_yield();
            last_yield_us = us;
        }
        if (t - last_h1_tick >= KVR_TICK_MS) {
            last_h1_tick = t;
            kvr_h1_tick(h1);
        }
        kvr_h1_flush(h1);
        if (grpc != NULL) {
            if (t - last_tick >= KVR_TICK_MS) {
                last_tick = t;
                kvr_grpc_tick(grpc);
            }
            kvr_grpc_flush(grpc);
        }
        if (term_requested && deadline == 0) {
            kvr_info("draining (grace %llu ms)", (unsigned long long)cfg->shutdown_grace_ms);
            deadline = t + cfg->shutdown_grace_ms;
            api.draining = 1;
            kvr_h1_start_drain(h1);
            kvr_http_start_drain(http);
            if (grpc != NULL)
                kvr_grpc_start_drain(grpc);
        }
        if (deadline != 0 && ((kvr_http_drained(http) && kvr_h1_connections(h1) == 0 && (grpc == NULL || kvr_grpc_connections(grpc) == 0)) ||
                              t >= deadline))
            break;
    }
    kvr_info("drained; exiting");
    exit(0);
}
