/*
 * kvrelay-watch — a command-line consumer of a kvrelay (or any dynamo.kvrelay.v1) relay.
 *
 * It reads the catalog, subscribes to the first pool, keeps a live replica with the CBI1
 * mirror (every sequencing and format check of spec §6.1), prints sequence / fill / lag
 * once a second, and answers `contains` for hashes (--contains) or for token lists
 * (--tokens, hashed as Dynamo routers do with --kv-block-size, --hash-format, --lora,
 * --cache-namespace) once the replica is live.
 *
 *   kvrelay-watch --grpc 127.0.0.1:5561                     follow and print status
 *   kvrelay-watch --grpc ... --contains 0x7ee2cbedc694ab46 --contains 42
 *   kvrelay-watch --grpc ... --tokens 0,1,2,3,4,5,6,7 --kv-block-size 4
 */
#include "core/ckf.h"
#include "core/kvhash.h"
#include "io/grpc_client.h"
#include "wire/mirror.h"
#include "wire/relay.pb-c.h"
#include "wire/relay_validate.h"

#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MARKER 0x4B565231u

typedef struct {
    Dynamo__Kvrelay__V1__ProducerIdentity *producer; /* from the catalog */
    kvr_mirror_t mirror;
    int mirror_ready;
    int failed;
    char error[256];
    uint64_t frames, deltas, heartbeats, lag_us;
    int catalog_seen;
    uint8_t *catalog_bytes;
    size_t catalog_len;
} watch_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static int on_catalog(void *ctx, kvr_gcall_t *call, const uint8_t *msg, size_t len)
{
    watch_t *w = ctx;
    w->catalog_bytes = malloc(len ? len : 1);
    memcpy(w->catalog_bytes, msg, len);
    w->catalog_len = len;
    w->catalog_seen = 1;
    return 1; /* the first (complete) catalog is all we need */
}

static int on_update(void *ctx, kvr_gcall_t *call, const uint8_t *msg, size_t len)
{
    watch_t *w = ctx;
    Dynamo__Kvrelay__V1__FilterUpdate *fu = dynamo__kvrelay__v1__filter_update__unpack(NULL, len, msg);
    kvr_mirror_update_t u;
    int rc;

    if (fu == NULL || kvr_relay_filter_update_fields(fu, &u) != 0 ||
        !kvr_relay_producer_equal(fu->producer, w->producer)) {
        snprintf(w->error, sizeof(w->error), "frame with a malformed envelope or another producer");
        w->failed = 1;
        if (fu)
            dynamo__kvrelay__v1__filter_update__free_unpacked(fu, NULL);
        return 1;
    }
    rc = kvr_mirror_apply(&w->mirror, &u);
    if (rc != KVR_MIRROR_OK) {
        snprintf(w->error, sizeof(w->error), "replica rejected frame seq %" PRIu64 ": %s", u.sequence,
                 kvr_mirror_strerror(rc));
        w->failed = 1;
    }
    w->frames++;
    if (u.kind == DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_DELTA)
        w->deltas++;
    if (u.kind == DYNAMO__KVRELAY__V1__FILTER_UPDATE_KIND__FILTER_UPDATE_KIND_HEARTBEAT)
        w->heartbeats++;
    if (fu->send_ts_us && wall_us() > fu->send_ts_us)
        w->lag_us = wall_us() - fu->send_ts_us;
    if (kvr_mirror_state(&w->mirror) == KVR_MIRROR_LIVE)
        w->mirror_ready = 1;
    dynamo__kvrelay__v1__filter_update__free_unpacked(fu, NULL);
    return w->failed;
}

static double fill(const kvr_mirror_t *m)
{
    uint64_t used = 0;
    for (uint64_t b = 0; b < m->bucket_count; b++)
        for (int s = 0; s < 4; s++)
            used += ((m->buckets[b] >> (16 * s)) & 0xffff) != 0;
    return (double)used / (double)(m->bucket_count * 4);
}

static void usage(const char *p)
{
    fprintf(stderr,
            "usage: %s --grpc HOST:PORT [--subscriber-id ID] [--duration SECONDS]\n"
            "          [--contains HASH]... [--tokens T0,T1,...] [--kv-block-size N]\n"
            "          [--hash-format standard|eagle] [--lora NAME] [--cache-namespace NS] [--quiet]\n",
            p);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"grpc", 1, 0, 'g'},          {"subscriber-id", 1, 0, 'i'},
                                       {"duration", 1, 0, 'd'},      {"contains", 1, 0, 'c'},
                                       {"tokens", 1, 0, 't'},        {"kv-block-size", 1, 0, 'b'},
                                       {"hash-format", 1, 0, 'f'},   {"lora", 1, 0, 'l'},
                                       {"cache-namespace", 1, 0, 'n'}, {"quiet", 0, 0, 'q'},
                                       {"help", 0, 0, 'h'},          {0, 0, 0, 0}};
    const char *addr = "127.0.0.1:5561", *sid = "kvrelay-watch", *tokens = NULL, *lora = "", *ns = "";
    uint64_t hashes[256];
    size_t nh = 0;
    double duration = 0, start, last_print = 0;
    uint32_t block_size = 16;
    int eagle = 0, quiet = 0, opt, rc = 0;
    char err[256];
    kvr_gclient_t *c;
    kvr_gcall_t *call;
    watch_t w;
    Dynamo__Kvrelay__V1__WatchKvPoolCatalogRequest creq = DYNAMO__KVRELAY__V1__WATCH_KV_POOL_CATALOG_REQUEST__INIT;
    Dynamo__Kvrelay__V1__SubscribeKvPoolRequest sreq = DYNAMO__KVRELAY__V1__SUBSCRIBE_KV_POOL_REQUEST__INIT;
    Dynamo__Kvrelay__V1__KvPoolCatalogUpdate *cat;
    uint8_t req[4096];
    size_t rlen;

    memset(&w, 0, sizeof(w));
    while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (opt) {
        case 'g': addr = optarg; break;
        case 'i': sid = optarg; break;
        case 'd': duration = atof(optarg); break;
        case 'c':
            if (nh < 256)
                hashes[nh++] = strtoull(optarg, NULL, 0);
            break;
        case 't': tokens = optarg; break;
        case 'b': block_size = (uint32_t)atoi(optarg); break;
        case 'f': eagle = !strcmp(optarg, "eagle"); break;
        case 'l': lora = optarg; break;
        case 'n': ns = optarg; break;
        case 'q': quiet = 1; break;
        default: usage(argv[0]); return opt == 'h' ? 0 : 2;
        }
    }
    if (tokens != NULL) { /* hash the token list as a router would */
        uint32_t tok[65536];
        size_t nt = 0, nb;
        uint64_t blocks[4096];
        for (const char *p = tokens; *p && nt < 65536;) {
            tok[nt++] = (uint32_t)strtoul(p, (char **)&p, 10);
            if (*p == ',')
                p++;
        }
        nb = kvr_kvhash_blocks(tok, nt, block_size, eagle ? KVR_KVHASH_EAGLE : KVR_KVHASH_STANDARD,
                               kvr_kvhash_salt(lora, strlen(lora), ns, strlen(ns)), NULL, 0, blocks, 4096);
        if (nb == (size_t)-1) {
            fprintf(stderr, "kvrelay-watch: cannot hash the tokens\n");
            return 2;
        }
        if (nb > 4096)
            nb = 4096;
        kvr_kvhash_seq(blocks, nb, blocks);
        for (size_t i = 0; i < nb && nh < 256; i++)
            hashes[nh++] = blocks[i];
    }

    c = kvr_gclient_connect(addr, 3000, err, sizeof(err));
    if (c == NULL) {
        fprintf(stderr, "kvrelay-watch: %s\n", err);
        return 1;
    }
    creq.subscriber_id = (char *)sid;
    creq.contract_marker = MARKER;
    rlen = dynamo__kvrelay__v1__watch_kv_pool_catalog_request__pack(&creq, req);
    call = kvr_gclient_call(c, "/dynamo.kvrelay.v1.KvEventRelay/WatchKvPoolCatalog", req, rlen, on_catalog, &w);
    while (call != NULL && !w.catalog_seen && kvr_gclient_wait(c, call, 5000) == KVR_AGAIN)
        ;
    if (!w.catalog_seen) {
        fprintf(stderr, "kvrelay-watch: no catalog (status %d %s %s)\n", call ? call->grpc_status : -1,
                call ? call->grpc_message : "", call ? call->reason : "");
        return 1;
    }
    cat = dynamo__kvrelay__v1__kv_pool_catalog_update__unpack(NULL, w.catalog_len, w.catalog_bytes);
    if (cat == NULL || cat->contract_marker != MARKER || cat->protocol_version != 1 || cat->snapshot == NULL ||
        cat->snapshot->n_pools == 0) {
        fprintf(stderr, "kvrelay-watch: the catalog has no pool\n");
        return 1;
    }
    w.producer = cat->snapshot->pools[0]->producer;
    if (kvr_relay_validate_producer(w.producer) != 0 ||
        kvr_mirror_init(&w.mirror, w.producer->ckf_format->seed, w.producer->ckf_format->bucket_count,
                        w.producer->pool_id->dc_id) != KVR_OK) {
        fprintf(stderr, "kvrelay-watch: the pool's producer identity is invalid\n");
        return 1;
    }
    if (!quiet)
        printf("pool: generation %" PRIu64 ", %" PRIu64 " buckets, catalog revision %" PRIu64 "\n",
               w.producer->layout_generation, w.producer->ckf_format->bucket_count, cat->revision);
    sreq.subscriber_id = (char *)sid;
    sreq.expected_producer = w.producer;
    sreq.contract_marker = MARKER;
    rlen = dynamo__kvrelay__v1__subscribe_kv_pool_request__pack(&sreq, req);
    call = kvr_gclient_call(c, "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool", req, rlen, on_update, &w);
    start = now_s();
    while (call != NULL && !call->done && !w.failed) {
        int r = kvr_gclient_wait(c, NULL, 100);
        double t = now_s();
        if (r == KVR_ERR)
            break;
        if (w.mirror_ready && nh > 0) {
            /* one more beat so that deltas already on the wire are applied */
            kvr_gclient_wait(c, NULL, 50);
            for (size_t i = 0; i < nh; i++)
                printf("0x%016" PRIx64 " %s\n", hashes[i], kvr_mirror_contains(&w.mirror, hashes[i]) ? "yes" : "no");
            break;
        }
        if (!quiet && t - last_print >= 1.0 && w.mirror_ready) {
            last_print = t;
            printf("seq %" PRIu64 "  fill %.2f%%  lag %.1f ms  frames %" PRIu64 "  deltas %" PRIu64 "  heartbeats %" PRIu64 "\n",
                   w.mirror.sequence, 100.0 * fill(&w.mirror), (double)w.lag_us / 1000.0, w.frames, w.deltas,
                   w.heartbeats);
            fflush(stdout);
        }
        if (duration > 0 && t - start >= duration)
            break;
    }
    if (w.failed) {
        fprintf(stderr, "kvrelay-watch: %s\n", w.error);
        rc = 1;
    } else if (call != NULL && call->done && call->grpc_status != 0) {
        fprintf(stderr, "kvrelay-watch: stream ended: status %d %s %s\n", call->grpc_status, call->grpc_message,
                call->reason);
        rc = 1;
    } else if (nh > 0 && !w.mirror_ready) {
        fprintf(stderr, "kvrelay-watch: the replica never became live\n");
        rc = 1;
    }
    dynamo__kvrelay__v1__kv_pool_catalog_update__free_unpacked(cat, NULL);
    free(w.catalog_bytes);
    kvr_mirror_destroy(&w.mirror);
    kvr_gclient_close(c);
    return rc;
}
