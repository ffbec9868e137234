/*
 * relay.h — the relay as the HTTP side of a worker, the supervisor and the probes see it: the
 * wake-up eventfds, a handle to attach, and read-only status (/metrics, /readyz, /debug/relay,
 * /debug/filter). No protobuf-c and no shared layout here: the publisher and the gRPC relay
 * service use core/relay_int.h, which adds them.
 *
 * The publisher (proc/publisher.c) is the only writer of the filter, the frame ring and the
 * snapshot copies; workers only claim, read and release their subscriber slots, through
 * relay_int.h (nothing outside core/ touches kvr_relay_sh_t; docs/concurrency.md).
 */
#ifndef KVR_CORE_RELAY_H
#define KVR_CORE_RELAY_H

#include "common.h"
#include "core/config.h"
#include "shm/segment.h"
#include "shm/tenants_sh.h"

/* A process's handle on the relay's regions; its fields are in core/relay_int.h. */
typedef struct kvr_relay_s kvr_relay_t;

/* Wake-up eventfds, created by the supervisor before any fork. */
typedef struct {
    int publisher;
    int worker[KVR_MAX_PROCS]; /* by process slot; -1 where none */
    int accept[KVR_MAX_PROCS]; /* by process slot: a worker's turn to accept (io/h1.c) */
} kvr_relay_fds_t;

/* Signals an eventfd (no-op on -1). */
void kvr_relay_wake(int fd);

/* ---- status (any process; what probes, metrics and RPC handlers need) */

/* Stream types counted for admission (docs/relay-contract.md §1.3): KVR_STREAM_TYPES of
 * shm/relay_sh.h, which relay.c checks this against. */
#define KVR_RELAY_STREAM_TYPES 5

typedef struct {
    uint64_t generation, catalog_revision;
    uint64_t published_seq; /* the sum of every pool's last published sequence */
    uint32_t pools;         /* pools the publisher has taken on */
    uint64_t bucket_count, seed, dc_id, incarnation;
    uint32_t publisher_pid;
    uint32_t live_subscribers;               /* pool subscriber slots in LIVE */
    uint32_t active[KVR_RELAY_STREAM_TYPES]; /* admitted streams per type */
} kvr_relay_status_t;

/* Reads the relay's status from a segment (zeroes when it has no relay regions). */
void kvr_relay_status(const kvr_seg_t *seg, kvr_relay_status_t *st);

uint64_t kvr_relay_generation(const kvr_relay_t *r);
uint64_t kvr_relay_catalog_revision(const kvr_relay_t *r);
uint64_t kvr_relay_incarnation(const kvr_relay_t *r);
uint64_t kvr_relay_buckets(const kvr_relay_t *r);

/* Pools the publisher has taken on: ids 0 .. n-1 can be listed and streamed. */
uint32_t kvr_relay_pools_ready(const kvr_relay_t *r);

/* Pool i's resident blocks as the publisher last counted them (a gauge). */
uint64_t kvr_relay_pool_blocks(const kvr_relay_t *r, uint32_t pool);

/* Bucket i of pool's working filter (a relaxed read: a view, not a snapshot). */
uint64_t kvr_relay_filter_word(const kvr_relay_t *r, uint32_t pool, uint64_t i);

/* The Dynamo endpoint a pool of namespace ns_name is served under: --endpoint, with
 * "<its namespace>.<ns_name>" as the namespace for every namespace but "default"
 * (docs/tenancy.md, "Pools"). Writes the three parts, which always fit; KVR_OK, or KVR_EINVAL
 * when --endpoint is not namespace/component/endpoint (checked at the start). */
#define KVR_ENDPOINT_NS_MAX (KVR_CFG_STR_MAX + KVR_NS_NAME_MAX + 2)
int kvr_relay_pool_endpoint(const kvr_config_t *cfg, const char *ns_name, char ns[KVR_ENDPOINT_NS_MAX],
                            char component[KVR_CFG_STR_MAX], char endpoint[KVR_CFG_STR_MAX]);

/* 1 when this process has the relay's regions mapped (a segment formatted with a relay). */
int kvr_relay_present(const kvr_relay_t *r);

#endif
