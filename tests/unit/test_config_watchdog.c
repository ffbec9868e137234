/* --hang-timeout (the supervisor's watchdog) and its environment twin: default and limits. */
#include "core/config.h"

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
