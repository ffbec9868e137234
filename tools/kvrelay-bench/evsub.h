/*
 * evsub.h — a KV events subscriber for the relay workload (evsub.c): one ZMQ SUB socket on
 * kvrelay's --kv-events-bind, every batch decoded (vLLM's array or map form), the stored hashes
 * kept in a set, so that the publish latency of a PUT can be taken when its hash arrives.
 */
#ifndef KVB_EVSUB_H
#define KVB_EVSUB_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvb_evsub kvb_evsub_t;

/* Connects and subscribes to every kv@ topic. NULL with err on failure. */
kvb_evsub_t *kvb_evsub_open(const char *endpoint, char *err, size_t errlen);
int kvb_evsub_fd(kvb_evsub_t *e); /* ZMQ_FD, for epoll (edge: drain with step) */
/* Reads every waiting message; returns how many, or -1 when one did not decode (err set). */
int kvb_evsub_step(kvb_evsub_t *e, char *err, size_t errlen);
int kvb_evsub_holds(const kvb_evsub_t *e, uint64_t hash);
void kvb_evsub_counts(const kvb_evsub_t *e, uint64_t *batches, uint64_t *bytes, uint64_t *gaps);
void kvb_evsub_close(kvb_evsub_t *e);

#endif
