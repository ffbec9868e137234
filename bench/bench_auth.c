/*
 * bench_auth — what deciding a request's namespace costs a worker (docs/tenancy.md): the
 * authorisation step every HTTP request runs (kvr_api_authorize, io/api_auth.c), in the three
 * configurations of scripts/bench-tenants.sh, one core, a warm loop. Prints "name value unit".
 *
 *   auth_open_ns      no --token, no --tenants: every request in "default"
 *   auth_token_ns     --token: one bearer token
 *   auth_tenants_ns   --tenants with 1,024 tokens over 63 namespaces, a token near the end
 *   auth_tenants_cold_ns  the same with the worker's answer cache missing every time (1,024
 *                     tokens in turn, 4 to each of its 256 slots: the SHA-256 and the table scan)
 *
 * Everything else a request does is the same in the three configurations by construction (the
 * index lookup hashes with the namespace's seed in each, namespace 0 included), so the
 * difference of these figures is the namespace lookup's cost per request.
 */
#include "base/log.h"
#include "core/config.h"
#include "core/store.h"
#include "core/tenants.h"
#include "core/tenants_table.h"
#include "io/api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUNDS 2000000

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A fresh segment with its tenants table published from text (NULL: none) and token. */
static void make_seg(kvr_seg_t *seg, const char *text, const char *token)
{
    kvr_seg_config_t c = {.memory = 8 << 20, .page_size = 4096, .max_blocks = 256, .hugepages = KVR_HUGEPAGES_OFF};
    static kvr_tenants_t tab;
    uint8_t td[KVR_SHA256_LEN];
    char err[256];
    uint64_t gen;

    if (kvr_seg_create(seg, &c) != KVR_OK || kvr_store_format(seg, 0) != KVR_OK)
        exit(1);
    kvr_tenants_format(seg);
    kvr_seg_seal(seg);
    memset(&tab, 0, sizeof(tab));
    if (text != NULL && kvr_tenants_parse(text, strlen(text), &tab, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "bench_auth: %s\n", err);
        exit(1);
    }
    if (token != NULL)
        kvr_tenants_digest(token, strlen(token), td);
    if (kvr_tenants_publish(seg, &tab, token != NULL ? td : NULL, NULL, &gen, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "bench_auth: %s\n", err);
        exit(1);
    }
}

/* ns per kvr_api_authorize of a request bearing `bearer` (NULL: none); cold: the tokens tok-0 ..
 * tok-(cold-1) of the table in turn, more than the worker's answer cache holds. */
static double run(kvr_config_t *cfg, kvr_seg_t *seg, const char *bearer, int cold, int want_ns)
{
    kvr_api_t a;
    kvr_api_req_t rq;
    kvr_api_res_t res;
    char hdr[64];
    double t0, t;
    int ok = 0;

    memset(&a, 0, sizeof(a));
    a.cfg = cfg;
    a.seg = seg;
    if (kvr_api_auth_init(&a) != KVR_OK)
        exit(1);
    memset(&rq, 0, sizeof(rq));
    if (bearer != NULL || cold) {
        rq.auth = hdr;
        rq.auth_len = (size_t)snprintf(hdr, sizeof(hdr), "Bearer %s", bearer != NULL ? bearer : "");
    }
    t0 = now();
    for (int i = 0; i < ROUNDS / (cold ? 100 : 1); i++) {
        if (cold)
            rq.auth_len = (size_t)snprintf(hdr, sizeof(hdr), "Bearer tok-%d", i % cold);
        ok += kvr_api_authorize(&a, &rq, &res);
    }
    t = now() - t0;
    if (ok != ROUNDS / (cold ? 100 : 1) || (want_ns >= 0 && res.ns != want_ns)) {
        fprintf(stderr, "bench_auth: %d of the requests authorised, namespace %u\n", ok, res.ns);
        exit(1);
    }
    free(a.auth);
    return t * 1e9 / (ROUNDS / (cold ? 100 : 1));
}

int main(int argc, char **argv)
{
    static kvr_config_t cfg;
    kvr_seg_t open_seg, token_seg, tenants_seg;
    char *text = malloc(1024 * 32), *p = text;
    char *args[] = {"bench_auth", NULL};

    (void)argc;
    (void)argv;
    kvr_log_level = KVR_LOG_ERROR;
    if (text == NULL || kvr_config_load(&cfg, 1, args, stderr) != KVR_OK)
        return 1;
    /* the tenants file of scripts/bench-tenants.sh: 16 tokens per namespace over 63, 16 more in default */
    for (int i = 0; i < 1024; i++)
        p += i / 16 >= 63 ? sprintf(p, "default tok-%d\n", i) : sprintf(p, "team-%d tok-%d\n", i / 16, i);
    make_seg(&open_seg, NULL, NULL);
    make_seg(&token_seg, NULL, "tok-single");
    make_seg(&tenants_seg, text, NULL);

    cfg.tenants[0] = '\0';
    printf("auth_open_ns %.1f ns\n", run(&cfg, &open_seg, NULL, 0, KVR_NS_DEFAULT));
    printf("auth_token_ns %.1f ns\n", run(&cfg, &token_seg, "tok-single", 0, KVR_NS_DEFAULT));
    snprintf(cfg.tenants, sizeof(cfg.tenants), "%s", "/bench/tenants"); /* only "set" matters here */
    printf("auth_tenants_ns %.1f ns\n", run(&cfg, &tenants_seg, "tok-1000", 0, -1));
    printf("auth_tenants_cold_ns %.1f ns\n", run(&cfg, &tenants_seg, NULL, 1024, -1));
    kvr_seg_destroy(&open_seg);
    kvr_seg_destroy(&token_seg);
    kvr_seg_destroy(&tenants_seg);
    free(text);
    return 0;
}
