/*
 * fuzz_worker.h — the world a worker-side fuzz driver runs in: a configuration from argv, a
 * 4 MiB segment formatted with store and relay regions, this process in worker slot 1, and
 * the relay attached with no eventfds. Aborts on any failure (a driver cannot run without it).
 */
#ifndef KVR_FUZZ_WORKER_H
#define KVR_FUZZ_WORKER_H

#include "core/config.h"
#include "base/log.h"
#include "core/relay_int.h"
#include "core/store.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

static void fuzz_worker_setup(int argc, char **argv, kvr_config_t *cfg, kvr_seg_t *seg, kvr_store_t *store,
                              kvr_relay_t *relay, kvr_relay_fds_t *fds)
{
    kvr_seg_config_t sc = {.memory = 4 << 20, .page_size = 4096, .max_blocks = 256, .hugepages = KVR_HUGEPAGES_OFF};

    kvr_log_level = KVR_LOG_OFF;
    if (kvr_config_load(cfg, argc, argv, stderr) != KVR_OK)
        abort();
    sc.ckf_buckets = kvr_relay_bucket_count(cfg, 256);
    if (kvr_seg_create(seg, &sc) != KVR_OK || kvr_store_format(seg, 0) != KVR_OK ||
        kvr_seg_proc_claim_at(seg, 1, KVR_ROLE_WORKER) != 1 || kvr_store_open(store, seg) != KVR_OK ||
        kvr_relay_format(relay, seg, cfg) != KVR_OK ||
        kvr_store_pool(store, KVR_NS_DEFAULT, "default", cfg->model, strlen(cfg->model), KVR_POOLS_MAX) != 0)
        abort();
    /* pool 0 as a publisher takes it on, so that subscriptions reach past the pool lookup */
    kvr_relay_take_pool(relay, 0, "default", cfg->model);
    kvr_relay_set_pools_ready(relay, 1);
    fds->publisher = -1;
    for (int i = 0; i < KVR_MAX_PROCS; i++)
        fds->worker[i] = fds->accept[i] = -1;
    fds->accept[1] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); /* the h1 driver's turn eventfd */
    kvr_relay_attach(relay, seg, cfg, fds);
}

/* The driver's client reads whatever the server sent (a peer that reads everything); 1 once
 * the server has closed the connection. */
static inline int drain_client(int fd)
{
    static char buf[1 << 16];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0)
            return 1;
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : 1;
    }
}

#endif
