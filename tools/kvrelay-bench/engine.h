/*
 * engine.h — the load engine (engine.c, engine_proto.c, engine_h2.c): one epoll loop per
 * thread over many keep-alive connections speaking HTTP/1.1, h2c, RESP2 or memcached text.
 */
#ifndef KVB_ENGINE_H
#define KVB_ENGINE_H

#include "worker.h"

kvb_worker_t *kvb_worker_new(int id);
int kvb_worker_add_conn(kvb_worker_t *w);
/* The thread: (preload,) barrier, barrier (main sets the clock), main phase, close. */
void *kvb_worker_main(void *arg);

#endif
