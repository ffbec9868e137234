/*
 * worker.h — a worker process: one h2o event loop serving HTTP (and, later, gRPC) over the
 * shared store. Forked by the supervisor, which owns its process slot number and its
 * listening socket.
 */
#ifndef KVR_PROC_WORKER_H
#define KVR_PROC_WORKER_H

#include "core/config.h"
#include "core/relay.h"
#include "shm/segment.h"

/* Runs worker `index` in process slot `slot` on listen_fd (HTTP) and grpc_fd (-1: no gRPC);
 * never returns. */
void kvr_worker_main(const kvr_config_t *cfg, kvr_seg_t *seg, int index, int slot, int listen_fd,
                     int grpc_fd, const kvr_relay_fds_t *fds) __attribute__((noreturn));

#endif
