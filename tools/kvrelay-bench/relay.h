/*
 * relay.h — the relay workload's gRPC subscribers (relay.c): N SubscribeKvPool consumers with
 * a CBI1 replica each, and the publish latency of the paced PUTs the engine acknowledges.
 */
#ifndef KVB_RELAY_H
#define KVB_RELAY_H

#include "worker.h"

#include <stdint.h>
#include <stdio.h>

void kvb_relay_init(void);
int kvb_relay_add_sub(kvb_worker_t *w, int id, int events); /* before the threads start; events: a KV events SUB */
int kvb_relay_setup(kvb_worker_t *w);                       /* in the thread: connect, catalog, subscribe, live */
void kvb_relay_event(kvb_worker_t *w, void *sub, uint32_t events);
void kvb_relay_tick(kvb_worker_t *w, uint64_t now);
int kvb_relay_busy(kvb_worker_t *w, uint64_t now); /* still waiting for acknowledged PUTs */
void kvb_relay_ack(uint64_t hash, uint64_t t, int measured);
void kvb_relay_puts_done(void);
void kvb_relay_close(kvb_worker_t *w);
uint64_t kvb_relay_seq_hash(uint64_t i);
/* Results: the relay's errors (added to the run's), its table and its JSON member. */
uint64_t kvb_relay_errors(kvb_worker_t **ws, int n, uint64_t *ended, uint64_t *unpublished, uint64_t *failed);
void kvb_relay_print(FILE *f, kvb_worker_t **ws, int n, double elapsed);
void kvb_relay_json(FILE *f, kvb_worker_t **ws, int n, double elapsed);

#endif
