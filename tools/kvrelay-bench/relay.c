/*
 * relay.c — the relay workload's consumers: N gRPC subscribers, each on its own HTTP/2
 * connection (kvrelay's kvr_gclient), doing what a Dynamo router does: WatchKvPoolCatalog
 * for the producer, then SubscribeKvPool, every FilterUpdate decoded and applied to a
 * kvr_mirror replica (fail-closed: a frame the mirror refuses ends that subscriber).
 *
 * Publish latency: the paced PUT load (engine.c, thread 0) appends (sequence hash, time its
 * 201 arrived) to an append-only log; each subscriber reads the log at its own cursor and
 * keeps the hashes its replica does not hold yet. After every frame applied, the pending
 * hashes the replica now contains are done: latency = now - the 201's time, one sample per
 * (PUT, subscriber). A hash already in the replica when its 201 is read counts ~0.
 *
 * Subscribers are spread over threads 1..T-1 (thread 0 paces the PUTs) and driven from the
 * thread's epoll loop: readable -> kvr_gclient_step().
 */
#include "relay.h"
#include "evsub.h"
#include "json.h"

#include "io/grpc_client.h"
#include "wire/mirror.h"
#include "wire/relay.pb-c.h"
#include "wire/relay_validate.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>

#define ACK_CHUNK  65536u
#define ACK_CHUNKS 65536u

typedef struct ack {
    uint64_t hash, t;
    int measured;
} ack_t;

static ack_t *ack_chunk[ACK_CHUNKS];
static uint64_t nacks; /* published with release by the one writer (thread 0) */
static int puts_done;  /* release: nacks is final */
static uint64_t t_puts_done;
static uint64_t run_seed;

typedef struct kvb_sub {
    int kind; /* KVB_FD_SUB */
    int id;
    kvb_worker_t *w;
    kvr_gclient_t *gc;
    kvr_gcall_t *call;
    kvb_evsub_t *ev; /* a KV events subscriber (--events) instead of a gRPC one */
    Dynamo__Kvrelay__V1__KvPoolCatalogUpdate *cat;
    kvr_mirror_t mirror;
    int mirror_ready, live, ended, failed, closing, registered, events;
    uint64_t frames, bytes, chunks, deltas, heartbeats;
    uint64_t m_frames, m_bytes; /* inside the measured window */
    uint64_t cursor;            /* next ack to read */
    uint64_t *pend;             /* ack indices not yet in the replica */
    size_t npend, cap;
    uint64_t seen, unpublished, sequence;
    uint64_t gaps; /* KV events: batches missed (seq gaps), taken at close */
    uint64_t t_ended;
    int grpc_status;
    char grpc_message[256], reason[64], err[200];
} kvb_sub_t;

typedef struct kvb_relay_w {
    kvb_sub_t **subs;
    int n;
    kvb_hist_t lat;   /* publish latency, ns, every (PUT, gRPC subscriber) pair */
    kvb_hist_t evlat; /* the same, to a KV events subscriber */
} kvb_relay_w_t;

void kvb_relay_init(void)
{
    if (getrandom(&run_seed, sizeof(run_seed), 0) != sizeof(run_seed))
        run_seed = kvb_mix64(kvb_now() ^ (uint64_t)getpid());
}

uint64_t kvb_relay_seq_hash(uint64_t i)
{
    return kvb_mix64(run_seed + i); /* a bijection of i: unique within a run */
}

static inline ack_t *ack_at(uint64_t i)
{
    return &ack_chunk[i / ACK_CHUNK][i % ACK_CHUNK];
}

void kvb_relay_ack(uint64_t hash, uint64_t t, int measured)
{
    uint64_t i = nacks;
    ack_t *a;
    if (i / ACK_CHUNK >= ACK_CHUNKS)
        return;
    if (ack_chunk[i / ACK_CHUNK] == NULL && (ack_chunk[i / ACK_CHUNK] = malloc(ACK_CHUNK * sizeof(ack_t))) == NULL)
        return;
    a = ack_at(i);
    a->hash = hash;
    a->t = t;
    a->measured = measured;
    __atomic_store_n(&nacks, i + 1, __ATOMIC_RELEASE);
}

void kvb_relay_puts_done(void)
{
    t_puts_done = kvb_now();
    __atomic_store_n(&puts_done, 1, __ATOMIC_RELEASE);
}

int kvb_relay_add_sub(kvb_worker_t *w, int id, int events)
{
    kvb_relay_w_t *rw = w->relay;
    kvb_sub_t *s = calloc(1, sizeof(*s)), **v;
    if (rw == NULL) {
        if ((rw = calloc(1, sizeof(*rw))) == NULL)
            return -1;
        w->relay = rw;
    }
    if (s == NULL || (v = realloc(rw->subs, (size_t)(rw->n + 1) * sizeof(*v))) == NULL)
        return -1;
    s->kind = KVB_FD_SUB;
    s->id = id;
    s->events = events;
    s->w = w;
    s->grpc_status = -1;
    rw->subs = v;
    rw->subs[rw->n++] = s;
    return 0;
}

/* ---------------------------------------------------------------- frames */

static void record(kvb_sub_t *s, const ack_t *a, uint64_t now)
{
    if (!a->measured)
        return;
    kvb_hist_add(s->ev != NULL ? &s->w->relay->evlat : &s->w->relay->lat, now > a->t ? now - a->t : 0);
    s->seen++;
}

/* Whether the subscriber knows the hash: in its replica, or among the events' stored hashes. */
static int holds(const kvb_sub_t *s, uint64_t hash)
{
    return s->ev != NULL ? kvb_evsub_holds(s->ev, hash) : kvr_mirror_contains(&s->mirror, hash);
}

static void check_pending(kvb_sub_t *s, uint64_t now)
{
    for (size_t i = 0; i < s->npend;) {
        const ack_t *a = ack_at(s->pend[i]);
        if (holds(s, a->hash)) {
            record(s, a, now);
            s->pend[i] = s->pend[--s->npend];
        } else {
            i++;
        }
    }
}

static void pull(kvb_sub_t *s, uint64_t now)
{
    uint64_t n = __atomic_load_n(&nacks, __ATOMIC_ACQUIRE);
    int live = s->ev != NULL || (s->mirror_ready && kvr_mirror_state(&s->mirror) == KVR_MIRROR_LIVE);
    while (s->cursor < n) {
        const ack_t *a = ack_at(s->cursor);
        if (live && holds(s, a->hash)) {
            record(s, a, now);
        } else {
            if (s->npend == s->cap) {
                size_t cap = s->cap ? s->cap * 2 : 1024;
                uint64_t *p = realloc(s->pend, cap * sizeof(*p));
                if (p == NULL)
                    break;
                s->pend = p;
                s->cap = cap;
            }
            s->pend[s->npend++] = s->cursor;
        }
        s->cursor++;
    }
}

static int on_catalog(void *ctx, kvr_gcall_t *call, const uint8_t *msg, size_t len)
{
    kvb_sub_t *s = ctx;
    if (s->cat == NULL)
        s->cat = dynamo__kvrelay__v1__kv_pool_catalog_update__unpack(NULL, len, msg);
    return 1; /* the first catalog message is all we need */
}

static int on_update(void *ctx, kvr_gcall_t *call, const uint8_t *msg, size_t len)
{
    kvb_sub_t *s = ctx;
    uint64_t now = kvb_now();
    Dynamo__Kvrelay__V1__FilterUpdate *fu;
    kvr_mirror_update_t u;
    int rc;

    s->frames++;
    s->bytes += len + 5;
    if (now >= C.t_measure && C.t_measure && (!C.t_deadline || now < C.t_deadline)) {
        s->m_frames++;
        s->m_bytes += len + 5;
    }
    fu = dynamo__kvrelay__v1__filter_update__unpack(NULL, len, msg);
    if (fu == NULL || kvr_relay_filter_update_fields(fu, &u) != 0) {
        snprintf(s->err, sizeof(s->err), "frame %llu: not a valid FilterUpdate", (unsigned long long)s->frames);
        if (fu != NULL)
            dynamo__kvrelay__v1__filter_update__free_unpacked(fu, NULL);
        s->failed = 1;
        return 1;
    }
    rc = kvr_mirror_apply(&s->mirror, &u);
    dynamo__kvrelay__v1__filter_update__free_unpacked(fu, NULL);
    if (rc != KVR_MIRROR_OK) {
        snprintf(s->err, sizeof(s->err), "frame %llu (kind %d, %llu -> %llu): the replica refused it: %s",
                 (unsigned long long)s->frames, (int)u.kind, (unsigned long long)u.base_sequence,
                 (unsigned long long)u.sequence, kvr_mirror_strerror(rc));
        s->failed = 1;
        return 1;
    }
    if (u.kind == KVR_FILTER_UPDATE_SNAPSHOT_CHUNK)
        s->chunks++;
    else if (u.kind == KVR_FILTER_UPDATE_DELTA)
        s->deltas++;
    else if (u.kind == KVR_FILTER_UPDATE_HEARTBEAT)
        s->heartbeats++;
    if (kvr_mirror_state(&s->mirror) == KVR_MIRROR_LIVE) {
        s->live = 1;
        s->sequence = s->mirror.sequence;
        if (s->npend)
            check_pending(s, now);
    }
    return 0;
}

static int sub_fd(kvb_sub_t *s)
{
    return s->ev != NULL ? kvb_evsub_fd(s->ev) : kvr_gclient_fd(s->gc);
}

/* The stream is over (by the server, a dead connection, or our own cancel of a bad frame). */
static void sub_ended(kvb_sub_t *s)
{
    if (s->ended)
        return;
    s->ended = 1;
    s->t_ended = kvb_now();
    if (s->call != NULL) {
        s->grpc_status = s->call->grpc_status;
        snprintf(s->grpc_message, sizeof(s->grpc_message), "%s", s->call->grpc_message);
        snprintf(s->reason, sizeof(s->reason), "%s", s->call->reason);
    }
    if (s->registered) {
        epoll_ctl(s->w->ep, EPOLL_CTL_DEL, sub_fd(s), NULL);
        s->registered = 0;
    }
}

static void sub_step(kvb_sub_t *s, uint64_t now)
{
    int rc;
    if (s->ended)
        return;
    if (s->ev != NULL) { /* every waiting batch, then the PUTs it acknowledges */
        rc = kvb_evsub_step(s->ev, s->err, sizeof(s->err));
        if (rc < 0) {
            s->failed = 1;
            sub_ended(s);
            return;
        }
        if (rc > 0 && s->npend)
            check_pending(s, now);
        pull(s, now);
        return;
    }
    rc = kvr_gclient_step(s->gc);
    if (s->failed) {
        sub_ended(s);
        return;
    }
    if (rc != KVR_OK || s->call->done) {
        sub_ended(s);
        if (s->grpc_status < 0 && !s->grpc_message[0])
            snprintf(s->grpc_message, sizeof(s->grpc_message), "connection closed");
        return;
    }
    pull(s, now);
}

/* ---------------------------------------------------------------- setup */

static int grpc_open(kvb_sub_t *s, char *err, size_t errlen);

static int sub_open(kvb_sub_t *s, char *err, size_t errlen)
{
    if (s->events) {
        s->ev = kvb_evsub_open(G.events, err, errlen);
        s->live = s->ev != NULL;
        return s->ev != NULL ? 0 : -1;
    }
    return grpc_open(s, err, errlen);
}

static int grpc_open(kvb_sub_t *s, char *err, size_t errlen)
{
    uint8_t req[4096];
    size_t n;
    char sid[64];
    Dynamo__Kvrelay__V1__WatchKvPoolCatalogRequest cq = DYNAMO__KVRELAY__V1__WATCH_KV_POOL_CATALOG_REQUEST__INIT;
    Dynamo__Kvrelay__V1__SubscribeKvPoolRequest sq = DYNAMO__KVRELAY__V1__SUBSCRIBE_KV_POOL_REQUEST__INIT;
    Dynamo__Kvrelay__V1__ProducerIdentity *p;
    kvr_gcall_t *call;
    uint64_t end = kvb_now() + 10000000000ull;

    s->gc = kvr_gclient_connect(G.grpc, 5000, err, errlen);
    if (s->gc == NULL)
        return -1;
    snprintf(sid, sizeof(sid), "kvrelay-bench-%d", s->id);
    cq.subscriber_id = sid;
    cq.contract_marker = KVR_RELAY_CONTRACT_MARKER;
    n = dynamo__kvrelay__v1__watch_kv_pool_catalog_request__pack(&cq, req);
    call = kvr_gclient_call(s->gc, "/dynamo.kvrelay.v1.KvEventRelay/WatchKvPoolCatalog", req, n, on_catalog, s);
    if (call == NULL) {
        snprintf(err, errlen, "WatchKvPoolCatalog: cannot start the call");
        return -1;
    }
    while (s->cat == NULL && !call->done && kvb_now() < end)
        if (kvr_gclient_wait(s->gc, call, 100) == KVR_ERR)
            break;
    if (s->cat == NULL) {
        snprintf(err, errlen, "WatchKvPoolCatalog: no catalog (grpc-status %d %.100s %.60s)", call->grpc_status,
                 call->grpc_message, call->reason);
        return -1;
    }
    if (s->cat->snapshot == NULL || s->cat->snapshot->n_pools < 1 || s->cat->snapshot->pools[0]->producer == NULL ||
        s->cat->snapshot->pools[0]->producer->ckf_format == NULL ||
        s->cat->snapshot->pools[0]->producer->pool_id == NULL) {
        snprintf(err, errlen, "WatchKvPoolCatalog: the first message holds no pool");
        return -1;
    }
    p = s->cat->snapshot->pools[0]->producer;
    if (kvr_mirror_init(&s->mirror, p->ckf_format->seed, p->ckf_format->bucket_count, p->pool_id->dc_id) != KVR_OK) {
        snprintf(err, errlen, "the producer's filter format is not supported (bucket_count %llu)",
                 (unsigned long long)p->ckf_format->bucket_count);
        return -1;
    }
    s->mirror_ready = 1;
    sq.subscriber_id = sid;
    sq.expected_producer = p;
    sq.contract_marker = KVR_RELAY_CONTRACT_MARKER;
    n = dynamo__kvrelay__v1__subscribe_kv_pool_request__pack(&sq, req);
    s->call = kvr_gclient_call(s->gc, "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool", req, n, on_update, s);
    if (s->call == NULL) {
        snprintf(err, errlen, "SubscribeKvPool: cannot start the call");
        return -1;
    }
    return 0;
}

int kvb_relay_setup(kvb_worker_t *w)
{
    kvb_relay_w_t *rw = w->relay;
    char err[300];
    uint64_t end;

    for (int i = 0; i < rw->n; i++) {
        kvb_sub_t *s = rw->subs[i];
        struct epoll_event ev;
        if (sub_open(s, err, sizeof(err)) != 0) {
            fprintf(stderr, "kvrelay-bench: subscriber %d (%s): %s\n", s->id, s->events ? G.events : G.grpc, err);
            return -1;
        }
        ev.events = EPOLLIN;
        ev.data.ptr = s;
        epoll_ctl(w->ep, EPOLL_CTL_ADD, sub_fd(s), &ev);
        s->registered = 1;
        if (s->events) /* ZMQ sends a subscription to the publisher after the connect: give it time
                        * to arrive, or the first PUTs' events go to nobody */
            usleep(300000);
    }
    /* every replica live (snapshot installed) before the load starts; a stream the server
     * ends meanwhile (e.g. refused by admission) is reported with the others, not fatal */
    end = kvb_now() + 30000000000ull;
    for (;;) {
        int ready = 0, live = 0;
        struct epoll_event evs[64];
        int n = epoll_wait(w->ep, evs, 64, 10);
        for (int i = 0; i < n; i++)
            sub_step(evs[i].data.ptr, kvb_now());
        for (int i = 0; i < rw->n; i++) {
            kvb_sub_t *s = rw->subs[i];
            ready += s->live || s->ended;
            live += s->live;
        }
        if (ready == rw->n)
            return 0;
        if (kvb_now() > end) {
            fprintf(stderr, "kvrelay-bench: %d of %d subscribers live after 30 s\n", live, rw->n);
            return -1;
        }
    }
}

/* ---------------------------------------------------------------- the run */

void kvb_relay_event(kvb_worker_t *w, void *sub, uint32_t events)
{
    sub_step(sub, kvb_now());
}

void kvb_relay_tick(kvb_worker_t *w, uint64_t now)
{
    kvb_relay_w_t *rw = w->relay;
    for (int i = 0; i < rw->n; i++)
        sub_step(rw->subs[i], now);
}

int kvb_relay_busy(kvb_worker_t *w, uint64_t now)
{
    kvb_relay_w_t *rw = w->relay;
    uint64_t final;
    if (C.stop && C.fatal)
        return 0;
    if (!__atomic_load_n(&puts_done, __ATOMIC_ACQUIRE))
        return 1;
    final = __atomic_load_n(&nacks, __ATOMIC_ACQUIRE);
    if (now > t_puts_done + (uint64_t)(G.timeout * 1e9)) {
        /* drained as long as allowed: what is still pending was never published */
        for (int i = 0; i < rw->n; i++) {
            kvb_sub_t *s = rw->subs[i];
            if (s->ended)
                continue;
            pull(s, now);
            for (size_t j = 0; j < s->npend; j++)
                s->unpublished += ack_at(s->pend[j])->measured;
            s->npend = 0;
        }
        return 0;
    }
    for (int i = 0; i < rw->n; i++) {
        kvb_sub_t *s = rw->subs[i];
        if (s->ended)
            continue;
        pull(s, now);
        if (s->cursor < final || s->npend > 0)
            return 1;
    }
    return 0;
}

void kvb_relay_close(kvb_worker_t *w)
{
    kvb_relay_w_t *rw = w->relay;
    for (int i = 0; i < rw->n; i++) {
        kvb_sub_t *s = rw->subs[i];
        if (s->registered)
            epoll_ctl(w->ep, EPOLL_CTL_DEL, sub_fd(s), NULL);
        s->registered = 0;
        if (s->ev != NULL) /* its counts stay for the report */
            kvb_evsub_counts(s->ev, &s->frames, &s->bytes, &s->gaps);
        kvb_evsub_close(s->ev);
        s->ev = NULL;
        if (s->gc != NULL)
            kvr_gclient_close(s->gc); /* frees the calls */
        s->gc = NULL;
        s->call = NULL;
        if (s->mirror_ready)
            kvr_mirror_destroy(&s->mirror);
        s->mirror_ready = 0;
        if (s->cat != NULL)
            dynamo__kvrelay__v1__kv_pool_catalog_update__free_unpacked(s->cat, NULL);
        s->cat = NULL;
    }
}

/* ---------------------------------------------------------------- results */

uint64_t kvb_relay_errors(kvb_worker_t **ws, int n, uint64_t *ended, uint64_t *unpublished, uint64_t *failed)
{
    *ended = *unpublished = *failed = 0;
    for (int k = 0; k < n; k++) {
        kvb_relay_w_t *rw = ws[k]->relay;
        for (int i = 0; rw != NULL && i < rw->n; i++) {
            kvb_sub_t *s = rw->subs[i];
            *unpublished += s->unpublished;
            if (s->failed)
                (*failed)++;
            else if (s->ended)
                (*ended)++;
        }
    }
    return *ended + *unpublished + *failed;
}

static void merged_latency(kvb_worker_t **ws, int n, kvb_hist_t *h, int events)
{
    memset(h, 0, sizeof(*h));
    for (int k = 0; k < n; k++)
        if (ws[k]->relay != NULL)
            kvb_hist_merge(h, events ? &ws[k]->relay->evlat : &ws[k]->relay->lat);
}

static double window_s(double elapsed)
{
    return elapsed > 0 ? elapsed : 1e-9;
}

void kvb_relay_print(FILE *f, kvb_worker_t **ws, int n, double elapsed)
{
    kvb_hist_t *h = malloc(sizeof(*h));
    uint64_t ended, unpublished, failed, acks = __atomic_load_n(&nacks, __ATOMIC_ACQUIRE);
    double win = window_s(elapsed);
    if (h == NULL)
        return;
    kvb_relay_errors(ws, n, &ended, &unpublished, &failed);
    fprintf(f, "\nrelay: %d subscribers on %s, %d KV events subscribers on %s, %llu PUTs acknowledged (%.0f PUT/s paced at %.0f)\n",
            G.subscribers, G.grpc[0] ? G.grpc : "-", G.event_subs, G.events[0] ? G.events : "-",
            (unsigned long long)acks, 0.0 + (double)acks / (elapsed > 0 ? elapsed : 1), G.rate);
    for (int events = 0; events < 2; events++) {
        merged_latency(ws, n, h, events);
        fprintf(f, "%s, %llu samples:\n",
                events ? "KV events latency (201 -> its BlockStored at a subscriber)"
                       : "publish latency (201 -> in a subscriber's replica)",
                (unsigned long long)h->n);
        fprintf(f, "  p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  p99.9 %.3f ms  max %.3f ms\n",
                kvb_hist_quantile(h, 0.50) / 1e6, kvb_hist_quantile(h, 0.90) / 1e6, kvb_hist_quantile(h, 0.99) / 1e6,
                kvb_hist_quantile(h, 0.999) / 1e6, h->max / 1e6);
    }
    fprintf(f, "  never published: %llu   streams ended early: %llu   replicas failed: %llu\n",
            (unsigned long long)unpublished, (unsigned long long)ended, (unsigned long long)failed);
    fprintf(f, "  %-4s %10s %10s %12s %8s %8s %6s %10s  %s\n", "sub", "frames", "frames/s", "bytes/s", "chunks",
            "deltas", "hbeat", "sequence", "state");
    for (int k = 0; k < n; k++) {
        kvb_relay_w_t *rw = ws[k]->relay;
        for (int i = 0; rw != NULL && i < rw->n; i++) {
            kvb_sub_t *s = rw->subs[i];
            char state[400];
            if (s->failed)
                snprintf(state, sizeof(state), "FAILED: %s", s->err);
            else if (s->ended)
                snprintf(state, sizeof(state), "ENDED after %.3f s: grpc-status %d%s%s%s%s",
                         s->t_ended > C.t_start ? (double)(s->t_ended - C.t_start) / 1e9 : 0.0, s->grpc_status,
                         s->grpc_message[0] ? " " : "", s->grpc_message, s->reason[0] ? " reason " : "", s->reason);
            else if (s->events)
                snprintf(state, sizeof(state), "live (KV events: frames = batches, %llu seq gaps)",
                         (unsigned long long)s->gaps);
            else
                snprintf(state, sizeof(state), "live");
            fprintf(f, "  %-4d %10llu %10.1f %12.0f %8llu %8llu %6llu %10llu  %s\n", s->id,
                    (unsigned long long)s->frames, (double)s->m_frames / win, (double)s->m_bytes / win,
                    (unsigned long long)s->chunks, (unsigned long long)s->deltas, (unsigned long long)s->heartbeats,
                    (unsigned long long)s->sequence, state);
        }
    }
    free(h);
}

void kvb_relay_json(FILE *f, kvb_worker_t **ws, int n, double elapsed)
{
    kvb_hist_t *h = malloc(sizeof(*h));
    uint64_t ended, unpublished, failed, acks = __atomic_load_n(&nacks, __ATOMIC_ACQUIRE), measured = 0;
    double win = window_s(elapsed);
    int first = 1;
    if (h == NULL)
        return;
    for (uint64_t i = 0; i < acks; i++)
        measured += ack_at(i)->measured != 0;
    kvb_relay_errors(ws, n, &ended, &unpublished, &failed);
    fprintf(f, "\"relay\": {\"grpc\": ");
    kvb_json_str(f, G.grpc);
    fprintf(f, ", \"events\": ");
    kvb_json_str(f, G.events);
    merged_latency(ws, n, h, 1);
    fprintf(f, ", \"event_subscribers\": %d, \"events_samples\": %llu, \"events_latency_ms\": ", G.event_subs,
            (unsigned long long)h->n);
    kvb_json_lat(f, h);
    merged_latency(ws, n, h, 0);
    fprintf(f, ", \"subscribers\": %d, \"rate\": %.3f, \"puts_acknowledged\": %llu, \"puts_measured\": %llu, "
               "\"publish_latency_ms\": ",
            G.subscribers, G.rate, (unsigned long long)acks, (unsigned long long)measured);
    kvb_json_lat(f, h);
    fprintf(f, ", \"publish_samples\": %llu, \"unpublished\": %llu, \"ended_streams\": %llu, \"failed_replicas\": %llu, "
               "\"subscriber_stats\": [",
            (unsigned long long)h->n, (unsigned long long)unpublished, (unsigned long long)ended,
            (unsigned long long)failed);
    for (int k = 0; k < n; k++) {
        kvb_relay_w_t *rw = ws[k]->relay;
        for (int i = 0; rw != NULL && i < rw->n; i++) {
            kvb_sub_t *s = rw->subs[i];
            fprintf(f, "%s{\"id\": %d, \"frames\": %llu, \"bytes\": %llu, \"frames_per_s\": %.3f, \"bytes_per_s\": %.1f, "
                       "\"snapshot_chunks\": %llu, \"deltas\": %llu, \"heartbeats\": %llu, \"sequence\": %llu, "
                       "\"latency_samples\": %llu, \"unpublished\": %llu, \"ended\": %s, \"failed\": %s, \"grpc_status\": %d, "
                       "\"ended_after_s\": %.3f, \"grpc_message\": ",
                    first ? "" : ", ", s->id, (unsigned long long)s->frames, (unsigned long long)s->bytes,
                    (double)s->m_frames / win, (double)s->m_bytes / win, (unsigned long long)s->chunks,
                    (unsigned long long)s->deltas, (unsigned long long)s->heartbeats, (unsigned long long)s->sequence,
                    (unsigned long long)s->seen, (unsigned long long)s->unpublished, s->ended && !s->failed ? "true" : "false",
                    s->failed ? "true" : "false", s->ended ? s->grpc_status : -1,
                    s->ended && s->t_ended > C.t_start ? (double)(s->t_ended - C.t_start) / 1e9 : -1.0);
            kvb_json_str(f, s->grpc_message);
            fprintf(f, ", \"reason\": ");
            kvb_json_str(f, s->reason);
            fprintf(f, ", \"error\": ");
            kvb_json_str(f, s->err);
            fprintf(f, "}");
            first = 0;
        }
    }
    fprintf(f, "]}");
    free(h);
}
