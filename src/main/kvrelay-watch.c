/*
 * kvrelay-watch — a command-line consumer of a kvrelay (or any dynamo.kvrelay.v1) relay.
 *
 * It reads the catalog, subscribes to its first pool (or --model's), keeps a live replica with the CBI1
 * mirror (every sequencing and format check of docs/relay-contract.md §6), prints sequence /
 * fill / lag once a second, and answers `contains` for hashes (--contains) or for token lists
 * (--tokens, hashed as Dynamo routers do with --kv-block-size, --hash-format, --lora,
 * --cache-namespace) once the replica is live.
 *
 *   kvrelay-watch --grpc 127.0.0.1:5561                     follow and print status
 *   kvrelay-watch --grpc ... --contains 0x7ee2cbedc694ab46 --contains 42
 *   kvrelay-watch --grpc ... --tokens 0,1,2,3,4,5,6,7 --kv-block-size 4
 *
 * Over a fleet (--relay NAME=HOST:PORT, repeatable, or --relays N1=A1,N2=A2,...): one replica
 * per node, each subscribed on its own connection, all driven from one poll(). With lookups it
 * answers, once every reachable replica is live, which nodes hold each hash — the router's
 * view of a sharded pool, where each node publishes only its own blocks:
 *
 *   kvrelay-watch --relay n1=127.0.0.1:5561 --relay n2=127.0.0.1:5562 --lookup 'my/key' --lookup 0x2a
 *   0x7ee2cbedc694ab46 n2 key=my/key
 *   0x000000000000002a - hash
 *
 * --lookup takes a hash (0x hex or decimal digits) or a key, hashed as the server hashes a PUT
 * without X-KV-Sequence-Hash (docs/http-contract.md §3.2); --key forces a key, --contains a hash,
 * --tokens the block hashes of a token list. The nodes column is "-" when none holds it. A
 * replica is a Cuckoo filter: a "yes" may be a false positive (about 1 in 10^4 per lookup and
 * node at the default fill), a "no" is exact. A node that cannot be reached is reported on
 * stderr and leaves the exit status 1; the others still answer.
 *
 * A kvrelay under --tenants shows each token its namespace's pools, the admin token every pool
 * (docs/tenancy.md): --token TOKEN, --token-file FILE (its content, trailing whitespace
 * stripped) or, without either, the environment variable KVRELAY_TOKEN is sent as
 * `authorization: Bearer TOKEN` gRPC metadata on every call. Without it such a relay ends the
 * first call UNAUTHENTICATED; another namespace's pool gets PERMISSION_DENIED. Both are
 * reported on stderr, exit status 1:
 *
 *   kvrelay-watch --grpc 127.0.0.1:5561 --token-file /var/run/kvrelay/admin/token
 */
#include "base/clock.h"
#include "wire/ckf.h"
#include "core/kvhash.h"
#include "wire/keys.h"
#include "io/grpc_client.h"
#include "wire/mirror.h"
#include "wire/relay.pb-c.h"
#include "wire/relay_validate.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    return (double)kvr_clock_ns() / 1e9;
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
    if (fu->send_ts_us && kvr_clock_wall_us() > fu->send_ts_us)
        w->lag_us = kvr_clock_wall_us() - fu->send_ts_us;
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
            "          [--hash-format standard|eagle] [--lora NAME] [--cache-namespace NS] [--quiet]\n"
            "          [--token T | --token-file FILE] [--model NAME]\n"
            "   or: %s --relay NAME=HOST:PORT... | --relays N1=A1,N2=A2,...\n"
            "          [--lookup KEY|HASH]... [--key KEY]... [--contains HASH]... [--tokens ...]\n"
            "          [--token T | --token-file FILE]\n"
            "  --token T         bearer token sent as gRPC authorization metadata (under --tenants a\n"
            "                    namespace's token sees its own pools, the admin token all); or\n"
            "                    --token-file FILE: its content, trailing whitespace stripped;\n"
            "                    default: $KVRELAY_TOKEN, if set\n"
            "  --model NAME      follow the pool of this model (default: the catalog's first pool)\n",
            p, p);
}

/* A gRPC status code's name, for the error lines. */
static const char *status_name(int code)
{
    static const char *const names[] = {"OK",
                                        "CANCELLED",
                                        "UNKNOWN",
                                        "INVALID_ARGUMENT",
                                        "DEADLINE_EXCEEDED",
                                        "NOT_FOUND",
                                        "ALREADY_EXISTS",
                                        "PERMISSION_DENIED",
                                        "RESOURCE_EXHAUSTED",
                                        "FAILED_PRECONDITION",
                                        "ABORTED",
                                        "OUT_OF_RANGE",
                                        "UNIMPLEMENTED",
                                        "INTERNAL",
                                        "UNAVAILABLE",
                                        "DATA_LOSS",
                                        "UNAUTHENTICATED"};
    return code >= 0 && (size_t)code < sizeof(names) / sizeof(names[0]) ? names[code] : "no status";
}

/* What to try after a refusal: the token options for UNAUTHENTICATED and PERMISSION_DENIED. */
static const char *status_hint(int code)
{
    if (code == KVR_GRPC_UNAUTHENTICATED)
        return " (--token / --token-file / KVRELAY_TOKEN?)";
    if (code == KVR_GRPC_PERMISSION_DENIED)
        return " (the pool is another namespace's: its token, or the admin token)";
    return "";
}

/* --model: the pool to follow, by its registration's model; NULL: the catalog's first pool. */
static const char *want_model;

/* The catalog's pool to follow: the first, or the first of --model. NULL when none is. */
static Dynamo__Kvrelay__V1__ProducerIdentity *pick_pool(const Dynamo__Kvrelay__V1__KvPoolCatalogSnapshot *snap)
{
    for (size_t i = 0; i < snap->n_pools; i++) {
        const Dynamo__Kvrelay__V1__KvPoolDescriptor *d = snap->pools[i];
        if (want_model == NULL)
            return d->producer;
        for (size_t r = 0; r < d->n_registrations; r++)
            if (d->registrations[r]->canonical_model_id != NULL &&
                strcmp(d->registrations[r]->canonical_model_id, want_model) == 0)
                return d->producer;
    }
    return NULL;
}

/* ------------------------------------------------------------------ fleet */

#define FLEET_MAX      32  /* relays */
#define FLEET_LOOKUPS  256 /* hashes asked at once (as --contains) */
#define FLEET_NAME_MAX 64
#define FLEET_LIVE_S   15.0 /* without --duration: how long the replicas may take to go live */

typedef struct {
    char name[FLEET_NAME_MAX];
    char addr[256];
    kvr_gclient_t *c;
    kvr_gcall_t *call;
    Dynamo__Kvrelay__V1__KvPoolCatalogUpdate *cat;
    int subscribed, down;
    watch_t w;
} node_t;

typedef struct {
    uint64_t hash;
    char what[80]; /* how it was asked, for the answer line */
} lookup_t;

static int fleet_add(node_t *nodes, size_t *n, const char *spec)
{
    const char *eq = strchr(spec, '=');
    size_t nl = eq != NULL ? (size_t)(eq - spec) : 0;
    node_t *x;

    if (eq == NULL || nl == 0 || nl >= FLEET_NAME_MAX || strlen(eq + 1) == 0 || strlen(eq + 1) >= 256) {
        fprintf(stderr, "kvrelay-watch: --relay wants NAME=HOST:PORT, got '%s'\n", spec);
        return -1;
    }
    if (*n == FLEET_MAX) {
        fprintf(stderr, "kvrelay-watch: at most %d relays\n", FLEET_MAX);
        return -1;
    }
    x = &nodes[(*n)++];
    memset(x, 0, sizeof(*x));
    memcpy(x->name, spec, nl);
    strcpy(x->addr, eq + 1);
    return 0;
}

/* A hash as X-KV-Sequence-Hash writes it ("0x..." or decimal, wire/keys.h); anything else (or
 * any argument of --key): a key, hashed as a PUT without X-KV-Sequence-Hash is. */
static void lookup_parse(lookup_t *l, const char *arg, int force_key)
{
    size_t n = strlen(arg);

    if (!force_key && kvr_parse_u64(arg, n, &l->hash) == KVR_OK) {
        snprintf(l->what, sizeof(l->what), "hash");
        return;
    }
    l->hash = kvr_key_canon(arg, n);
    snprintf(l->what, sizeof(l->what), "key=%.70s", arg);
}

/* Catalog, then subscription, on each node's own connection. Returns 1 while not all done. */
static int fleet_advance(node_t *x, const char *sid, uint8_t *req, size_t cap)
{
    Dynamo__Kvrelay__V1__SubscribeKvPoolRequest sreq = DYNAMO__KVRELAY__V1__SUBSCRIBE_KV_POOL_REQUEST__INIT;
    size_t rlen;

    if (x->down || x->subscribed)
        return 0;
    if (!x->w.catalog_seen) {
        if (x->call != NULL && x->call->done) {
            fprintf(stderr, "kvrelay-watch: %s: no catalog (status %d %s: %s)%s\n", x->name, x->call->grpc_status,
                    status_name(x->call->grpc_status), x->call->grpc_message, status_hint(x->call->grpc_status));
            x->down = 1;
        }
        return !x->down;
    }
    x->cat = dynamo__kvrelay__v1__kv_pool_catalog_update__unpack(NULL, x->w.catalog_len, x->w.catalog_bytes);
    if (x->cat == NULL || x->cat->contract_marker != MARKER || x->cat->protocol_version != 1 ||
        x->cat->snapshot == NULL || (x->w.producer = pick_pool(x->cat->snapshot)) == NULL) {
        fprintf(stderr, "kvrelay-watch: %s: the catalog has no pool%s%s\n", x->name, want_model ? " of model " : "",
                want_model ? want_model : "");
        x->down = 1;
        return 0;
    }
    if (kvr_relay_validate_producer(x->w.producer) != 0 ||
        kvr_mirror_init(&x->w.mirror, x->w.producer->ckf_format->seed, x->w.producer->ckf_format->bucket_count,
                        x->w.producer->pool_id->dc_id) != KVR_OK) {
        fprintf(stderr, "kvrelay-watch: %s: the pool's producer identity is invalid\n", x->name);
        x->w.producer = NULL;
        x->down = 1;
        return 0;
    }
    sreq.subscriber_id = (char *)sid;
    sreq.expected_producer = x->w.producer;
    sreq.contract_marker = MARKER;
    rlen = dynamo__kvrelay__v1__subscribe_kv_pool_request__get_packed_size(&sreq);
    if (rlen > cap) {
        x->down = 1;
        return 0;
    }
    rlen = dynamo__kvrelay__v1__subscribe_kv_pool_request__pack(&sreq, req);
    x->call = kvr_gclient_call(x->c, "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool", req, rlen, on_update, &x->w);
    x->subscribed = 1;
    if (x->call == NULL)
        x->down = 1;
    return 0;
}

/* One poll() over every connection (at most timeout_ms), then a step of each that is ready. */
static void fleet_step(node_t *nodes, size_t n, int timeout_ms)
{
    struct pollfd pfd[FLEET_MAX];
    size_t map[FLEET_MAX], k = 0;

    for (size_t i = 0; i < n; i++) {
        if (nodes[i].down)
            continue;
        pfd[k].fd = kvr_gclient_fd(nodes[i].c);
        pfd[k].events = POLLIN;
        pfd[k].revents = 0;
        map[k++] = i;
    }
    if (k == 0)
        return;
    (void)poll(pfd, k, timeout_ms);
    for (size_t j = 0; j < k; j++) {
        node_t *x = &nodes[map[j]];
        /* an error or hang-up (a refused connect shows here) ends the node after what it sent */
        if (kvr_gclient_step(x->c) != KVR_OK || x->w.failed || (pfd[j].revents & (POLLERR | POLLHUP)) ||
            (x->subscribed && x->call != NULL && x->call->done)) {
            fprintf(stderr, "kvrelay-watch: %s: %s\n", x->name,
                    x->w.failed ? x->w.error : "the relay connection or stream ended");
            x->down = 1;
        }
    }
}

static int fleet_live(const node_t *nodes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!nodes[i].down && !nodes[i].w.mirror_ready)
            return 0;
    return 1;
}

static void fleet_answer(const node_t *nodes, size_t n, const lookup_t *ls, size_t nl)
{
    for (size_t i = 0; i < nl; i++) {
        int any = 0;
        printf("0x%016" PRIx64 " ", ls[i].hash);
        for (size_t j = 0; j < n; j++)
            if (!nodes[j].down && nodes[j].w.mirror_ready && kvr_mirror_contains(&nodes[j].w.mirror, ls[i].hash)) {
                printf("%s%s", any ? "," : "", nodes[j].name);
                any = 1;
            }
        printf("%s %s\n", any ? "" : "-", ls[i].what);
    }
    fflush(stdout);
}

static void fleet_status(const node_t *nodes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const node_t *x = &nodes[i];
        if (x->down)
            printf("%s down\n", x->name);
        else if (!x->w.mirror_ready)
            printf("%s syncing\n", x->name);
        else
            printf("%s seq %" PRIu64 "  fill %.2f%%  lag %.1f ms  frames %" PRIu64 "\n", x->name, x->w.mirror.sequence,
                   100.0 * fill(&x->w.mirror), (double)x->w.lag_us / 1000.0, x->w.frames);
    }
    fflush(stdout);
}

static int fleet_main(node_t *nodes, size_t n, const char *sid, const char *token, const lookup_t *ls, size_t nl,
                      double duration, int quiet)
{
    Dynamo__Kvrelay__V1__WatchKvPoolCatalogRequest creq = DYNAMO__KVRELAY__V1__WATCH_KV_POOL_CATALOG_REQUEST__INIT;
    double start = now_s(), last_print = 0, limit = duration > 0 ? duration : FLEET_LIVE_S;
    uint8_t req[4096];
    size_t rlen;
    char err[256];
    int rc = 0, answered = 0;

    creq.subscriber_id = (char *)sid;
    creq.contract_marker = MARKER;
    rlen = dynamo__kvrelay__v1__watch_kv_pool_catalog_request__pack(&creq, req);
    for (size_t i = 0; i < n; i++) {
        node_t *x = &nodes[i];
        x->c = kvr_gclient_connect(x->addr, 3000, err, sizeof(err));
        if (x->c == NULL) {
            fprintf(stderr, "kvrelay-watch: %s: %s\n", x->name, err);
            x->down = 1;
            continue;
        }
        (void)kvr_gclient_set_token(x->c, token); /* checked when it was read */
        x->call = kvr_gclient_call(x->c, "/dynamo.kvrelay.v1.KvEventRelay/WatchKvPoolCatalog", req, rlen, on_catalog,
                                   &x->w);
        if (x->call == NULL)
            x->down = 1;
    }
    while (now_s() - start < limit) {
        int waiting = 0;
        for (size_t i = 0; i < n; i++)
            waiting |= fleet_advance(&nodes[i], sid, req, sizeof(req));
        fleet_step(nodes, n, waiting ? 10 : 100);
        if (!waiting && fleet_live(nodes, n) && nl > 0) {
            fleet_step(nodes, n, 50); /* one more beat: deltas already on the wire are applied */
            fleet_answer(nodes, n, ls, nl);
            answered = 1;
            break;
        }
        if (!quiet && nl == 0 && now_s() - last_print >= 1.0) {
            last_print = now_s();
            fleet_status(nodes, n);
        }
    }
    if (nl > 0 && !answered) {
        fprintf(stderr, "kvrelay-watch: not every replica became live within %.0f s\n", limit);
        rc = 1;
    }
    for (size_t i = 0; i < n; i++) {
        node_t *x = &nodes[i];
        rc |= x->down;
        if (x->cat != NULL)
            dynamo__kvrelay__v1__kv_pool_catalog_update__free_unpacked(x->cat, NULL);
        free(x->w.catalog_bytes);
        if (x->w.producer != NULL)
            kvr_mirror_destroy(&x->w.mirror);
        if (x->c != NULL)
            kvr_gclient_close(x->c);
    }
    return rc;
}

/* ------------------------------------------------------------------ command line */

#define WATCH_HASHES 256 /* --contains and --tokens hashes asked at once */

typedef struct {
    const char *addr, *sid, *tokens, *lora, *ns;
    char token[512]; /* bearer token ("" for none): --token, --token-file or $KVRELAY_TOKEN */
    uint64_t hashes[WATCH_HASHES];
    size_t nh;
    double duration;
    uint32_t block_size;
    int eagle, quiet;
    node_t fleet[FLEET_MAX];
    size_t nfleet;
    lookup_t lookups[FLEET_LOOKUPS];
    size_t nl;
} args_t;

/* --relays N1=A1,N2=A2,...: each one as a --relay. */
static int fleet_add_list(node_t *nodes, size_t *n, const char *arg)
{
    char list[4096], *save = NULL;

    snprintf(list, sizeof(list), "%s", arg);
    for (char *t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save))
        if (fleet_add(nodes, n, t) < 0)
            return -1;
    return 0;
}

/* --token-file: the file's content, trailing whitespace stripped. */
static int read_token(args_t *a, const char *file)
{
    FILE *f = fopen(file, "r");
    size_t n;

    if (f == NULL) {
        fprintf(stderr, "kvrelay-watch: %s: %s\n", file, strerror(errno));
        return -1;
    }
    n = fread(a->token, 1, sizeof(a->token), f);
    fclose(f);
    if (n == sizeof(a->token)) {
        fprintf(stderr, "kvrelay-watch: %s: a token of at most %zu bytes\n", file, sizeof(a->token) - 2);
        return -1;
    }
    while (n > 0 && isspace((unsigned char)a->token[n - 1]))
        n--;
    a->token[n] = '\0';
    return 0;
}

/* The token, once the options are read: $KVRELAY_TOKEN without --token / --token-file, and
 * a token that cannot travel as a header value is refused. 0, or -1 (reported). */
static int check_token(args_t *a, int given)
{
    const char *env = getenv("KVRELAY_TOKEN");

    if (!given && env != NULL)
        snprintf(a->token, sizeof(a->token), "%s", env);
    for (const char *p = a->token; *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e) {
            fprintf(stderr, "kvrelay-watch: the token has a space, control or non-ASCII byte\n");
            return -1;
        }
    if (strlen(a->token) >= sizeof(a->token) - 1) {
        fprintf(stderr, "kvrelay-watch: a token of at most %zu bytes\n", sizeof(a->token) - 2);
        return -1;
    }
    return 0;
}

/* Fills a (zeroed by the caller) from the command line. Returns -1 to go on, else the exit
 * status: 0 after --help, 2 for a command line in error. */
static int parse_args(args_t *a, int argc, char **argv)
{
    /* clang-format off */ /* a table aligned by hand */
    static const struct option lo[] = {{"grpc", 1, 0, 'g'},          {"subscriber-id", 1, 0, 'i'},
                                       {"duration", 1, 0, 'd'},      {"contains", 1, 0, 'c'},
                                       {"tokens", 1, 0, 't'},        {"kv-block-size", 1, 0, 'b'},
                                       {"hash-format", 1, 0, 'f'},   {"lora", 1, 0, 'l'},
                                       {"cache-namespace", 1, 0, 'n'}, {"quiet", 0, 0, 'q'},
                                       {"relay", 1, 0, 'r'},         {"relays", 1, 0, 'R'},
                                       {"lookup", 1, 0, 'L'},        {"key", 1, 0, 'K'},
                                       {"token", 1, 0, 'A'},         {"token-file", 1, 0, 'F'},
                                       {"model", 1, 0, 'm'},         {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    /* clang-format on */
    int opt, token_given = 0;

    a->addr = "127.0.0.1:5561";
    a->sid = "kvrelay-watch";
    a->lora = a->ns = "";
    a->block_size = 16;
    while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (opt) {
        case 'g': a->addr = optarg; break;
        case 'i': a->sid = optarg; break;
        case 'd': a->duration = atof(optarg); break;
        case 'c':
            if (a->nh < WATCH_HASHES)
                a->hashes[a->nh++] = strtoull(optarg, NULL, 0);
            break;
        case 't': a->tokens = optarg; break;
        case 'b': a->block_size = (uint32_t)atoi(optarg); break;
        case 'f': a->eagle = !strcmp(optarg, "eagle"); break;
        case 'l': a->lora = optarg; break;
        case 'n': a->ns = optarg; break;
        case 'q': a->quiet = 1; break;
        case 'm': want_model = optarg; break;
        case 'r':
            if (fleet_add(a->fleet, &a->nfleet, optarg) < 0)
                return 2;
            break;
        case 'R':
            if (fleet_add_list(a->fleet, &a->nfleet, optarg) < 0)
                return 2;
            break;
        case 'L':
        case 'K':
            if (a->nl == FLEET_LOOKUPS) {
                fprintf(stderr, "kvrelay-watch: at most %d lookups\n", FLEET_LOOKUPS);
                return 2;
            }
            lookup_parse(&a->lookups[a->nl++], optarg, opt == 'K');
            break;
        case 'A':
            snprintf(a->token, sizeof(a->token), "%s", optarg);
            token_given = 1;
            break;
        case 'F':
            if (read_token(a, optarg) < 0)
                return 2;
            token_given = 1;
            break;
        default: usage(argv[0]); return opt == 'h' ? 0 : 2;
        }
    }
    if (a->nl > 0 && a->nfleet == 0) {
        fprintf(stderr, "kvrelay-watch: --lookup and --key need --relay\n");
        return 2;
    }
    return check_token(a, token_given) < 0 ? 2 : -1;
}

/* --tokens: hashes the token list as a router would and adds its blocks to the hashes asked. */
static int hash_tokens(args_t *a)
{
    uint32_t tok[65536];
    size_t nt = 0, nb;
    uint64_t blocks[4096];

    if (a->tokens == NULL)
        return 0;
    for (const char *p = a->tokens; *p && nt < 65536;) {
        tok[nt++] = (uint32_t)strtoul(p, (char **)&p, 10);
        if (*p == ',')
            p++;
    }
    nb = kvr_kvhash_blocks(tok, nt, a->block_size, a->eagle ? KVR_KVHASH_EAGLE : KVR_KVHASH_STANDARD,
                           kvr_kvhash_salt(a->lora, strlen(a->lora), a->ns, strlen(a->ns)), NULL, 0, blocks, 4096);
    if (nb == (size_t)-1) {
        fprintf(stderr, "kvrelay-watch: cannot hash the tokens\n");
        return -1;
    }
    if (nb > 4096)
        nb = 4096;
    kvr_kvhash_seq(blocks, nb, blocks);
    for (size_t i = 0; i < nb && a->nh < WATCH_HASHES; i++)
        a->hashes[a->nh++] = blocks[i];
    return 0;
}

/* ------------------------------------------------------------------ one relay (--grpc) */

/* Asks for the catalog and waits for the first one (each wait at most 5 s). 0 once it came. */
static int fetch_catalog(kvr_gclient_t *c, const char *sid, watch_t *w)
{
    Dynamo__Kvrelay__V1__WatchKvPoolCatalogRequest creq = DYNAMO__KVRELAY__V1__WATCH_KV_POOL_CATALOG_REQUEST__INIT;
    uint8_t req[4096];
    size_t rlen;
    kvr_gcall_t *call;

    creq.subscriber_id = (char *)sid;
    creq.contract_marker = MARKER;
    rlen = dynamo__kvrelay__v1__watch_kv_pool_catalog_request__pack(&creq, req);
    call = kvr_gclient_call(c, "/dynamo.kvrelay.v1.KvEventRelay/WatchKvPoolCatalog", req, rlen, on_catalog, w);
    while (call != NULL && !w->catalog_seen && kvr_gclient_wait(c, call, 5000) == KVR_AGAIN)
        ;
    if (!w->catalog_seen) {
        int st = call ? call->grpc_status : -1;
        fprintf(stderr, "kvrelay-watch: no catalog (status %d %s: %s %s)%s\n", st, status_name(st),
                call ? call->grpc_message : "", call ? call->reason : "", status_hint(st));
        return -1;
    }
    return 0;
}

/* The catalog's first pool (of --model): *cat is the unpacked catalog (the caller frees it), w's
 * producer is checked and its replica made. 0 on success. */
static int open_pool(watch_t *w, Dynamo__Kvrelay__V1__KvPoolCatalogUpdate **cat)
{
    Dynamo__Kvrelay__V1__KvPoolCatalogUpdate *k;

    k = *cat = dynamo__kvrelay__v1__kv_pool_catalog_update__unpack(NULL, w->catalog_len, w->catalog_bytes);
    if (k == NULL || k->contract_marker != MARKER || k->protocol_version != 1 || k->snapshot == NULL ||
        (w->producer = pick_pool(k->snapshot)) == NULL) {
        fprintf(stderr, "kvrelay-watch: the catalog has no pool%s%s\n", want_model ? " of model " : "",
                want_model ? want_model : "");
        return -1;
    }
    if (kvr_relay_validate_producer(w->producer) != 0 ||
        kvr_mirror_init(&w->mirror, w->producer->ckf_format->seed, w->producer->ckf_format->bucket_count,
                        w->producer->pool_id->dc_id) != KVR_OK) {
        fprintf(stderr, "kvrelay-watch: the pool's producer identity is invalid\n");
        return -1;
    }
    return 0;
}

static kvr_gcall_t *subscribe(kvr_gclient_t *c, const char *sid, watch_t *w)
{
    Dynamo__Kvrelay__V1__SubscribeKvPoolRequest sreq = DYNAMO__KVRELAY__V1__SUBSCRIBE_KV_POOL_REQUEST__INIT;
    uint8_t req[4096];
    size_t rlen;

    sreq.subscriber_id = (char *)sid;
    sreq.expected_producer = w->producer;
    sreq.contract_marker = MARKER;
    rlen = dynamo__kvrelay__v1__subscribe_kv_pool_request__pack(&sreq, req);
    return kvr_gclient_call(c, "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool", req, rlen, on_update, w);
}

/* Follows the stream until it ends, a check fails or --duration is up: a status line each
 * second, or, with hashes asked, their answers as soon as the replica is live. */
static void follow(kvr_gclient_t *c, kvr_gcall_t *call, watch_t *w, const args_t *a)
{
    double start = now_s(), last_print = 0;

    while (call != NULL && !call->done && !w->failed) {
        int r = kvr_gclient_wait(c, NULL, 100);
        double t = now_s();
        if (r == KVR_ERR)
            break;
        if (w->mirror_ready && a->nh > 0) {
            /* one more beat so that deltas already on the wire are applied */
            kvr_gclient_wait(c, NULL, 50);
            for (size_t i = 0; i < a->nh; i++)
                printf("0x%016" PRIx64 " %s\n", a->hashes[i],
                       kvr_mirror_contains(&w->mirror, a->hashes[i]) ? "yes" : "no");
            break;
        }
        if (!a->quiet && t - last_print >= 1.0 && w->mirror_ready) {
            last_print = t;
            printf("seq %" PRIu64 "  fill %.2f%%  lag %.1f ms  frames %" PRIu64 "  deltas %" PRIu64 "  heartbeats %" PRIu64 "\n",
                   w->mirror.sequence, 100.0 * fill(&w->mirror), (double)w->lag_us / 1000.0, w->frames, w->deltas,
                   w->heartbeats);
            fflush(stdout);
        }
        if (a->duration > 0 && t - start >= a->duration)
            break;
    }
}

/* 1 when a check failed, the stream ended with an error status, or hashes were asked and
 * the replica never went live. */
static int follow_result(const kvr_gcall_t *call, const watch_t *w, size_t nh)
{
    if (w->failed) {
        fprintf(stderr, "kvrelay-watch: %s\n", w->error);
        return 1;
    }
    if (call != NULL && call->done && call->grpc_status != 0) {
        fprintf(stderr, "kvrelay-watch: stream ended: status %d %s: %s %s%s\n", call->grpc_status,
                status_name(call->grpc_status), call->grpc_message, call->reason, status_hint(call->grpc_status));
        return 1;
    }
    if (nh > 0 && !w->mirror_ready) {
        fprintf(stderr, "kvrelay-watch: the replica never became live\n");
        return 1;
    }
    return 0;
}

static int watch_one(const args_t *a)
{
    Dynamo__Kvrelay__V1__KvPoolCatalogUpdate *cat = NULL;
    char err[256];
    kvr_gclient_t *c;
    kvr_gcall_t *call;
    watch_t w;
    int rc;

    memset(&w, 0, sizeof(w));
    c = kvr_gclient_connect(a->addr, 3000, err, sizeof(err));
    if (c == NULL) {
        fprintf(stderr, "kvrelay-watch: %s\n", err);
        return 1;
    }
    (void)kvr_gclient_set_token(c, a->token); /* checked when it was read */
    if (fetch_catalog(c, a->sid, &w) != 0 || open_pool(&w, &cat) != 0)
        return 1;
    if (!a->quiet)
        printf("pool: generation %" PRIu64 ", %" PRIu64 " buckets, catalog revision %" PRIu64 "\n",
               w.producer->layout_generation, w.producer->ckf_format->bucket_count, cat->revision);
    call = subscribe(c, a->sid, &w);
    follow(c, call, &w, a);
    rc = follow_result(call, &w, a->nh);
    dynamo__kvrelay__v1__kv_pool_catalog_update__free_unpacked(cat, NULL);
    free(w.catalog_bytes);
    kvr_mirror_destroy(&w.mirror);
    kvr_gclient_close(c);
    return rc;
}

int main(int argc, char **argv)
{
    static args_t a;
    int rc = parse_args(&a, argc, argv);

    if (rc >= 0)
        return rc;
    if (hash_tokens(&a) != 0)
        return 2;
    if (a.nfleet > 0) {
        /* over a fleet, --contains and --tokens hashes are lookups like the others */
        for (size_t i = 0; i < a.nh && a.nl < FLEET_LOOKUPS; i++) {
            a.lookups[a.nl].hash = a.hashes[i];
            snprintf(a.lookups[a.nl++].what, sizeof(a.lookups[0].what), "hash");
        }
        return fleet_main(a.fleet, a.nfleet, a.sid, a.token, a.lookups, a.nl, a.duration, a.quiet);
    }
    return watch_one(&a);
}
