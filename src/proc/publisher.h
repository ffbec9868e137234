/*
 * publisher.h — the relay publisher process (see publisher.c for the design).
 */
#ifndef KVR_PROC_PUBLISHER_H
#define KVR_PROC_PUBLISHER_H

#include "core/config.h"
#include "core/relay.h"
#include "shm/segment.h"

/* Fault injection for tests: publish()'s buffer allocations are numbered from 1 in each
 * publisher process; the one numbered kvr_pub_fail_alloc_at fails (0: none). Set it before
 * the publisher is forked; production never sets it. */
extern unsigned kvr_pub_fail_alloc_at;

/*
 * The KV events' endpoints (proc/publisher_events.c): "tcp://HOST:*" (or port 0) becomes
 * "tcp://HOST:PORT" with a port free now, in place; the supervisor resolves them once so that
 * every publisher binds the same port. Returns the port, 0 for an endpoint without one (ipc),
 * -1 when it cannot be resolved (a host name: give the port).
 */
int kvr_kvev_resolve_endpoint(char *ep, size_t cap);

/* Runs the publisher in process slot `slot`; never returns. */
void kvr_publisher_main(const kvr_config_t *cfg, kvr_seg_t *seg, int slot, const kvr_relay_fds_t *fds)
    __attribute__((noreturn));

#endif
