/* --hang-timeout (the supervisor's watchdog) and its environment twin: default and limits; the
 * rule of the workers' accept turns over their process slots (kvr_seg_accept_yield). */
#include "core/config.h"
#include "base/log.h"
#include "core/store.h"
#include "shm/segment.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

static int load(kvr_config_t *cfg, const char *arg)
{
    char *argv[] = {"t", (char *)arg, NULL};
    FILE *devnull = fopen("/dev/null", "w");
    int rc = kvr_config_load(cfg, arg ? 2 : 1, argv, devnull);
    fclose(devnull);
    return rc;
}

Test(config, hang_timeout_default_and_limits)
{
    static kvr_config_t cfg;

    unsetenv("KVRELAY_HANG_TIMEOUT");
    cr_assert_eq(load(&cfg, NULL), KVR_OK);
    cr_assert_eq(cfg.hang_timeout_ms, 5000, "default: a few seconds");
    cr_assert_eq(load(&cfg, "--hang-timeout=500ms"), KVR_OK, "the lower bound is accepted");
    cr_assert_eq(cfg.hang_timeout_ms, 500);
    cr_assert_eq(load(&cfg, "--hang-timeout=499ms"), KVR_EINVAL, "below 500 ms: a busy machine would kill healthy workers");
    cr_assert_eq(load(&cfg, "--hang-timeout=0"), KVR_EINVAL, "the watchdog cannot be switched off by 0");
    cr_assert_eq(load(&cfg, "--hang-timeout=1h"), KVR_EINVAL, "'h' is not a duration suffix");
    cr_assert_eq(load(&cfg, "--hang-timeout=60m"), KVR_OK, "the upper bound (1 hour) is accepted");
    cr_assert_eq(cfg.hang_timeout_ms, 3600000);
    cr_assert_eq(load(&cfg, "--hang-timeout=3601s"), KVR_EINVAL, "above 1 hour");
    cr_assert_eq(load(&cfg, "--hang-timeout=soon"), KVR_EINVAL);
}

Test(config, hang_timeout_environment_twin)
{
    static kvr_config_t cfg;

    setenv("KVRELAY_HANG_TIMEOUT", "2s", 1);
    cr_assert_eq(load(&cfg, NULL), KVR_OK);
    cr_assert_eq(cfg.hang_timeout_ms, 2000, "KVRELAY_HANG_TIMEOUT is read");
    cr_assert_eq(load(&cfg, "--hang-timeout=3s"), KVR_OK);
    cr_assert_eq(cfg.hang_timeout_ms, 3000, "the flag wins over the environment");
    setenv("KVRELAY_HANG_TIMEOUT", "100ms", 1);
    cr_assert_eq(load(&cfg, NULL), KVR_EINVAL, "the twin has the flag's limits");
    unsetenv("KVRELAY_HANG_TIMEOUT");
}

/* ------------------------------------------------------------------ accept turns */

/* A handle on f's segment claiming `slot` as a worker (a simulated process), ready or not. */
static void as_worker(const kvr_seg_t *f, kvr_seg_t *h, int slot, uint32_t role, int ready, uint32_t conns)
{
    *h = *f;
    h->slot = -1;
    cr_assert_eq(kvr_seg_proc_claim_at(h, slot, role), slot);
    kvr_seg_set_conns(h, conns);
    atomic_store(&h->procs[slot].ready, (uint32_t)ready);
}

Test(accept_turns, yield_to_the_least_loaded_serving_worker_past_the_slack)
{
    kvr_seg_config_t sc = {0};
    kvr_seg_t seg, w1, w2, w3, pub;
    uint32_t conns;
    uint64_t hb;

    kvr_log_level = KVR_LOG_ERROR;
    sc.memory = 4 << 20;
    sc.page_size = 64 << 10;
    sc.max_blocks = 64;
    sc.hugepages = KVR_HUGEPAGES_OFF;
    cr_assert_eq(kvr_seg_create(&seg, &sc), KVR_OK);
    cr_assert_eq(kvr_store_format(&seg, 0), KVR_OK);
    as_worker(&seg, &w1, 1, KVR_ROLE_WORKER, 1, 0);
    cr_assert_eq(kvr_seg_accept_yield(&w1, 100, 1), -1, "the only serving worker always accepts");

    as_worker(&seg, &w2, 2, KVR_ROLE_WORKER, 1, 3);
    as_worker(&seg, &w3, 3, KVR_ROLE_WORKER, 1, 5);
    as_worker(&seg, &pub, 4, KVR_ROLE_PUBLISHER, 1, 0);
    cr_assert_eq(kvr_seg_worker_load(&w1, 2, &conns, &hb), 1);
    cr_assert_eq(conns, 3, "kvr_seg_set_conns is read back by another process");
    cr_assert_eq(kvr_seg_worker_load(&w1, 4, &conns, &hb), 0, "the publisher is no worker");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 4, 1), -1, "one more than the least loaded (3): still ours");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 5, 1), 2, "two more: the turn goes to slot 2, not the publisher");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 3, 0), -1, "slack 0: level is still ours");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 4, 0), 2);

    atomic_store(&w2.procs[2].ready, 0); /* hung or dead: out of every decision */
    cr_assert_eq(kvr_seg_worker_load(&w1, 2, &conns, &hb), 0);
    cr_assert_eq(kvr_seg_accept_yield(&w1, 6, 1), -1, "5 + 1 without slot 2");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 7, 1), 3);
    kvr_seg_set_conns(&w3, 0);
    cr_assert_eq(kvr_seg_accept_yield(&w3, 0, 1), -1, "a worker never yields to itself");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 2, 1), 3, "a new count moves the turn at once");
    kvr_seg_destroy(&seg);
}
