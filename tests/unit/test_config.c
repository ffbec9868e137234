/*
 * Unit tests of the command line and its environment twins (src/core/config.c): the parsers
 * of sizes, durations and addresses; flag over KVRELAY_* over the reference server's
 * variables; --hang-timeout (the supervisor's watchdog) with its default and limits; the warm
 * restart options --segment-path/--segment-reset/--log-format (issue 13).
 */
#include "core/config.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* The one parser of sizes ("256K", "2M", "1GiB"): every T_SIZE flag and its env twin. */
Test(config, size_suffixes)
{
    static const struct {
        const char *s;
        uint64_t v;
    } ok[] = {
        {"0", 0},
        {"4096", 4096},
        {"256K", 256ull << 10},
        {"256k", 256ull << 10},
        {"2M", 2ull << 20},
        {"2MiB", 2ull << 20},
        {"2mib", 2ull << 20},
        {"2MB", 2ull << 20},
        {"3G", 3ull << 30},
        {"1T", 1ull << 40},
        {"16777215T", 16777215ull << 40},
    };
    static const char *const bad[] = {
        "1.5M",
        " 1K",
        "1 K",
        "K",
        "-1K",
        "1KK",
        "1Kx",
        "1iB",
        "16777216T",
        "18446744073709551616",
    };
    uint64_t v;

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        cr_assert_eq(kvr_config_parse_size(ok[i].s, &v), KVR_OK, "%s", ok[i].s);
        cr_assert_eq(v, ok[i].v, "%s", ok[i].s);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(kvr_config_parse_size(bad[i], &v), KVR_EINVAL, "%s", bad[i]);
    cr_assert_eq(kvr_config_parse_size(NULL, &v), KVR_EINVAL);
}

Test(config, sizes_durations_and_addresses)
{
    uint64_t v;
    char host[64];
    uint16_t port;

    cr_assert_eq(kvr_config_parse_size("64M", &v), KVR_OK);
    cr_assert_eq(v, 64ull << 20);
    cr_assert_eq(kvr_config_parse_size("1GiB", &v), KVR_OK);
    cr_assert_eq(v, 1ull << 30);
    cr_assert_eq(kvr_config_parse_size("12x", &v), KVR_EINVAL);
    cr_assert_eq(kvr_config_parse_size("", &v), KVR_EINVAL);
    cr_assert_eq(kvr_config_parse_size("99999999999999999999", &v), KVR_EINVAL);
    cr_assert_eq(kvr_config_parse_duration("500ms", &v), KVR_OK);
    cr_assert_eq(v, 500);
    cr_assert_eq(kvr_config_parse_duration("10s", &v), KVR_OK);
    cr_assert_eq(v, 10000);
    cr_assert_eq(kvr_config_parse_duration("3", &v), KVR_OK);
    cr_assert_eq(v, 3000);
    cr_assert_eq(kvr_config_parse_duration("1h", &v), KVR_EINVAL);
    cr_assert_eq(kvr_config_split_hostport("127.0.0.1:9130", host, sizeof(host), &port), KVR_OK);
    cr_assert_str_eq(host, "127.0.0.1");
    cr_assert_eq(port, 9130);
    cr_assert_eq(kvr_config_split_hostport("[::1]:0", host, sizeof(host), &port), KVR_OK);
    cr_assert_str_eq(host, "::1");
    cr_assert_eq(kvr_config_split_hostport("nohost", host, sizeof(host), &port), KVR_EINVAL);
    cr_assert_eq(kvr_config_split_hostport("h:70000", host, sizeof(host), &port), KVR_EINVAL);
}

Test(config, precedence_flag_over_env_over_reference_env)
{
    kvr_config_t c;
    char *argv[] = {"kvrelay", "--memory", "64M", "--no-evict", "--workers=3", NULL};
    FILE *devnull = fopen("/dev/null", "w");

    setenv("EPISTEMIC_GRAPH_KVCACHE_ADDR", "7777", 1);
    setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", "ref-token", 1);
    setenv("KVRELAY_MEMORY", "2G", 1);
    cr_assert_eq(kvr_config_load(&c, 5, argv, devnull), KVR_OK);
    cr_assert_str_eq(c.http_bind, "127.0.0.1:7777");
    cr_assert_str_eq(c.token, "ref-token");
    cr_assert_eq(c.memory, 64ull << 20, "the flag wins over KVRELAY_MEMORY");
    cr_assert_eq(c.no_evict, 1);
    cr_assert_eq(c.workers, 3);
    setenv("KVRELAY_HTTP_BIND", "0.0.0.0:1", 1);
    setenv("KVRELAY_TOKEN", "ours", 1);
    cr_assert_eq(kvr_config_load(&c, 1, argv, devnull), KVR_OK);
    cr_assert_str_eq(c.http_bind, "0.0.0.0:1", "our twin wins over the reference variable");
    cr_assert_str_eq(c.token, "ours");
    cr_assert_eq(c.memory, 2ull << 30);
    setenv("EPISTEMIC_GRAPH_KVCACHE_ADDR", "yes", 1);
    unsetenv("KVRELAY_HTTP_BIND");
    cr_assert_eq(kvr_config_load(&c, 1, argv, devnull), KVR_OK);
    cr_assert_str_eq(c.http_bind, "127.0.0.1:9130");
    {
        char *bad[] = {"kvrelay", "--memory", "lots", NULL};
        char *unknown[] = {"kvrelay", "--frobnicate", NULL};
        char *range[] = {"kvrelay", "--workers", "1000", NULL};
        cr_assert_eq(kvr_config_load(&c, 3, bad, devnull), KVR_EINVAL);
        cr_assert_eq(kvr_config_load(&c, 2, unknown, devnull), KVR_EINVAL);
        cr_assert_eq(kvr_config_load(&c, 3, range, devnull), KVR_EINVAL);
    }
    fclose(devnull);
}

/* ------------------------------------------------------------------ warm restart options (issue 13) */

static int load_argv(int argc, char **argv, kvr_config_t *c)
{
    FILE *devnull = fopen("/dev/null", "w");
    int rc = kvr_config_load(c, argc, argv, devnull);
    fclose(devnull);
    return rc;
}

Test(config_warm, segment_path_reset_and_log_format)
{
    kvr_config_t c;
    char *ok[] = {"kvrelay", "--segment-path", "/dev/shm/kvrelay.seg", "--segment-reset", "--log-format", "json", NULL};
    char *rel[] = {"kvrelay", "--segment-path", "rel/seg", NULL};
    char *reset_alone[] = {"kvrelay", "--segment-reset", NULL};
    char *badfmt[] = {"kvrelay", "--log-format", "xml", NULL};
    char *ver[] = {"kvrelay", "--version", NULL};
    char longp[KVR_CFG_STR_MAX + 2];
    char *toolong[] = {"kvrelay", "--segment-path", longp, NULL};
    char *justfits[] = {"kvrelay", "--segment-path", longp, NULL};

    unsetenv("KVRELAY_SEGMENT_PATH");
    unsetenv("KVRELAY_SEGMENT_RESET");
    unsetenv("KVRELAY_LOG_FORMAT");
    cr_assert_eq(load_argv(6, ok, &c), KVR_OK);
    cr_assert_str_eq(c.segment_path, "/dev/shm/kvrelay.seg");
    cr_assert_eq(c.segment_reset, 1);
    cr_assert_str_eq(c.log_format, "json");
    cr_assert_eq(load_argv(1, ok, &c), KVR_OK);
    cr_assert_str_eq(c.segment_path, "", "default: no file (a memfd)");
    cr_assert_str_eq(c.log_format, "text");
    cr_assert_eq(load_argv(3, rel, &c), KVR_EINVAL, "a relative path is refused");
    cr_assert_eq(load_argv(2, reset_alone, &c), KVR_EINVAL, "--segment-reset needs --segment-path");
    cr_assert_eq(load_argv(3, badfmt, &c), KVR_EINVAL);
    cr_assert_eq(load_argv(2, ver, &c), KVR_OK);
    cr_assert_eq(c.version, 1);

    /* The limit: KVR_CFG_STR_MAX - 1 bytes fit, one more is refused. */
    memset(longp, 'a', sizeof(longp));
    longp[0] = '/';
    longp[KVR_CFG_STR_MAX - 1] = '\0';
    cr_assert_eq(load_argv(3, justfits, &c), KVR_OK);
    cr_assert_eq(strlen(c.segment_path), KVR_CFG_STR_MAX - 1);
    longp[KVR_CFG_STR_MAX - 1] = 'a';
    longp[KVR_CFG_STR_MAX] = '\0';
    cr_assert_eq(load_argv(3, toolong, &c), KVR_EINVAL);

    /* The environment twins. */
    setenv("KVRELAY_SEGMENT_PATH", "/dev/shm/x.seg", 1);
    setenv("KVRELAY_SEGMENT_RESET", "yes", 1);
    setenv("KVRELAY_LOG_FORMAT", "json", 1);
    cr_assert_eq(load_argv(1, ok, &c), KVR_OK);
    cr_assert_str_eq(c.segment_path, "/dev/shm/x.seg");
    cr_assert_eq(c.segment_reset, 1);
    cr_assert_str_eq(c.log_format, "json");
    setenv("KVRELAY_SEGMENT_RESET", "maybe", 1);
    cr_assert_eq(load_argv(1, ok, &c), KVR_EINVAL);
    unsetenv("KVRELAY_SEGMENT_PATH");
    unsetenv("KVRELAY_SEGMENT_RESET");
    unsetenv("KVRELAY_LOG_FORMAT");
}

/* --tenants and --admin-token (multi-tenancy): flags, environment twins, and the admin token
 * masked by --print-config like the bearer token. */
Test(config, tenants_and_admin_token)
{
    static kvr_config_t cfg;
    char *argv[] = {"t", "--tenants", "/etc/kvrelay/tenants", "--admin-token=root-secret", NULL};
    FILE *devnull = fopen("/dev/null", "w");
    char *out = NULL;
    size_t outlen = 0;
    FILE *mem;

    unsetenv("KVRELAY_TENANTS");
    unsetenv("KVRELAY_ADMIN_TOKEN");
    cr_assert_eq(load(&cfg, NULL), KVR_OK);
    cr_assert_str_eq(cfg.tenants, "", "no tenants file by default");
    cr_assert_str_eq(cfg.admin_token, "");
    cr_assert_eq(kvr_config_load(&cfg, 4, argv, devnull), KVR_OK);
    cr_assert_str_eq(cfg.tenants, "/etc/kvrelay/tenants");
    cr_assert_str_eq(cfg.admin_token, "root-secret");
    setenv("KVRELAY_TENANTS", "/run/tenants", 1);
    setenv("KVRELAY_ADMIN_TOKEN", "env-root", 1);
    cr_assert_eq(load(&cfg, NULL), KVR_OK);
    cr_assert_str_eq(cfg.tenants, "/run/tenants");
    cr_assert_str_eq(cfg.admin_token, "env-root");
    mem = open_memstream(&out, &outlen);
    kvr_config_print(&cfg, mem);
    fclose(mem);
    cr_assert(strstr(out, "tenants=/run/tenants\n") != NULL, "%s", out);
    cr_assert(strstr(out, "admin-token=<set>\n") != NULL, "%s", out);
    cr_assert(strstr(out, "env-root") == NULL, "the admin token is never printed");
    free(out);
    unsetenv("KVRELAY_TENANTS");
    unsetenv("KVRELAY_ADMIN_TOKEN");
    fclose(devnull);
}

static int load2(kvr_config_t *cfg, const char *a, const char *b)
{
    char *argv[] = {"t", (char *)a, (char *)b, NULL};
    FILE *devnull = fopen("/dev/null", "w");
    int rc = kvr_config_load(cfg, 3, argv, devnull);
    fclose(devnull);
    return rc;
}

/* The KV events' flags (docs/kv-events.md): each limit refuses the start. */
Test(config, kv_events_flags_and_their_limits)
{
    static kvr_config_t cfg;
    char host[256] = "";

    unsetenv("POD_NAME");
    cr_assert_eq(load(&cfg, NULL), KVR_OK);
    cr_assert_str_empty(cfg.kv_events_bind, "off by default");
    cr_assert_str_eq(cfg.kv_events_format, "vllm");
    cr_assert_eq(cfg.kv_events_interval_ms, 5);
    gethostname(host, sizeof(host) - 1);
    cr_assert_str_eq(cfg.kv_events_backend_id, host, "the backend id defaults to the host name");
    setenv("POD_NAME", "kvrelay-3", 1);
    cr_assert_eq(load(&cfg, NULL), KVR_OK);
    cr_assert_str_eq(cfg.kv_events_backend_id, "kvrelay-3", "POD_NAME (the downward API) first");
    cr_assert_eq(load(&cfg, "--kv-events-backend-id=mine"), KVR_OK);
    cr_assert_str_eq(cfg.kv_events_backend_id, "mine", "the flag over POD_NAME");
    unsetenv("POD_NAME");
    cr_assert_eq(load(&cfg, "--kv-events-backend-id=a@b"), KVR_EINVAL, "'@' separates the topic's fields");
    cr_assert_eq(load(&cfg, "--kv-events-bind=tcp://127.0.0.1:5557"), KVR_OK);
    cr_assert_eq(load(&cfg, "--kv-events-bind=ipc:///tmp/kv"), KVR_OK);
    cr_assert_eq(load(&cfg, "--kv-events-bind=127.0.0.1:5557"), KVR_EINVAL, "a ZMQ endpoint names its transport");
    cr_assert_eq(load(&cfg, "--kv-events-bind=udp://127.0.0.1:5557"), KVR_EINVAL);
    cr_assert_eq(load(&cfg, "--kv-events-replay-bind=tcp://127.0.0.1:5558"), KVR_EINVAL,
                 "a replay socket without the stream it replays");
    cr_assert_eq(load2(&cfg, "--kv-events-bind=tcp://127.0.0.1:5557", "--kv-events-replay-bind=tcp://127.0.0.1:5558"),
                 KVR_OK);
    cr_assert_eq(load(&cfg, "--kv-events-format=vllm-map"), KVR_OK);
    cr_assert_eq(load(&cfg, "--kv-events-format=rfc1527"), KVR_OK);
    cr_assert_eq(load(&cfg, "--kv-events-format=json"), KVR_EINVAL);
    cr_assert_eq(load(&cfg, "--kv-events-hwm=0"), KVR_EINVAL, "ZMQ's 0 means no limit: refused");
    cr_assert_eq(load(&cfg, "--kv-events-buffer=0"), KVR_EINVAL);
    cr_assert_eq(load(&cfg, "--kv-events-buffer-bytes=1K"), KVR_EINVAL, "below 64 KiB");
    cr_assert_eq(load(&cfg, "--kv-events-max-batch=0"), KVR_EINVAL);
    cr_assert_eq(load(&cfg, "--kv-events-max-batch=65537"), KVR_EINVAL);
    cr_assert_eq(load(&cfg, "--kv-events-interval=0"), KVR_OK, "0: every publisher turn");
    cr_assert_eq(load(&cfg, "--kv-events-interval=2s"), KVR_EINVAL, "at most a second");
}

Test(config, publication_flags_defaults_and_limits)
{
    static kvr_config_t cfg;

    cr_assert_eq(load(&cfg, NULL), KVR_OK);
    cr_assert_eq(cfg.publication_coalesce_max, 64, "docs/relay-contract.md §5.3: up to 64 delays");
    cr_assert_eq(load(&cfg, "--publication-coalesce-max=1"), KVR_OK, "1: never coalesce");
    cr_assert_eq(cfg.publication_coalesce_max, 1);
    cr_assert_eq(load(&cfg, "--publication-coalesce-max=1024"), KVR_OK);
    cr_assert_eq(load(&cfg, "--publication-coalesce-max=0"), KVR_EINVAL, "a boundary cannot shrink to nothing");
    cr_assert_eq(load(&cfg, "--publication-coalesce-max=1025"), KVR_EINVAL);

    /* the ring the publisher reads: 0 sizes it from the index (shm/segment.c) */
    cr_assert_eq(load(&cfg, NULL), KVR_OK);
    cr_assert_eq(cfg.change_log_events, 0);
    cr_assert_eq(load(&cfg, "--change-log-events=4096"), KVR_OK);
    cr_assert_eq(cfg.change_log_events, 4096);
    cr_assert_eq(load(&cfg, "--change-log-events=1073741824"), KVR_OK);
    cr_assert_eq(load(&cfg, "--change-log-events=1073741825"), KVR_EINVAL);
}

Test(config, ssd_sync_interval_default_and_limits)
{
    static kvr_config_t cfg;

    cr_assert_eq(load(&cfg, NULL), KVR_OK);
    cr_assert_eq(cfg.ssd_sync_interval_ms, 5000, "docs/ssd-tier.md, \"Syncs\": 5 s by default");
    cr_assert_eq(load(&cfg, "--ssd-sync-interval=250ms"), KVR_OK);
    cr_assert_eq(cfg.ssd_sync_interval_ms, 250);
    cr_assert_eq(load(&cfg, "--ssd-sync-interval=60m"), KVR_OK);
    cr_assert_eq(cfg.ssd_sync_interval_ms, 3600000);
    cr_assert_eq(load(&cfg, "--ssd-sync-interval=50ms"), KVR_EINVAL, "below 100 ms: a flush per round");
    cr_assert_eq(load(&cfg, "--ssd-sync-interval=61m"), KVR_EINVAL, "above an hour");
}

/* The disk tier's flags (issue 26): all or nothing, sizes it can use, the derived defaults,
 * and an environment twin. */
Test(config, ssd_flags_defaults_and_refusals)
{
    kvr_config_t c;
    char *ok[] = {"kvrelay", "--memory", "1G", "--ssd-path", "/var/tmp/t.ssd", "--ssd-size", "64G", NULL};
    char *set[] = {"kvrelay", "--ssd-path", "/var/tmp/t.ssd", "--ssd-size", "1G", "--ssd-page-size", "64M",
                   "--ssd-slots", "5000", "--ssd-window", "100M", NULL};
    char *size_alone[] = {"kvrelay", "--ssd-size", "1G", NULL};
    char *rel[] = {"kvrelay", "--ssd-path", "t.ssd", "--ssd-size", "1G", NULL};
    char *no_size[] = {"kvrelay", "--ssd-path", "/var/tmp/t.ssd", NULL};
    char *small[] = {"kvrelay", "--ssd-path", "/var/tmp/t.ssd", "--ssd-size", "400M", NULL};
    char *odd_page[] = {"kvrelay", "--ssd-path", "/var/tmp/t.ssd", "--ssd-size", "1G", "--ssd-page-size", "1000000", NULL};

    unsetenv("KVRELAY_SSD_PATH");
    unsetenv("KVRELAY_SSD_SIZE");
    cr_assert_eq(load_argv(1, ok, &c), KVR_OK);
    cr_assert_str_eq(c.ssd_path, "", "off by default");
    cr_assert_eq(load_argv(7, ok, &c), KVR_OK);
    cr_assert_eq(c.ssd_size, 64ull << 30);
    cr_assert_eq(c.ssd_page_size, 256ull << 20, "256 MiB pages by default");
    cr_assert_eq(c.ssd_slots, (64ull << 30) / (64 << 10), "a slot per 64 KiB of the file");
    cr_assert_eq(c.ssd_window, (1ull << 30) / 4, "a quarter of --memory");
    cr_assert_eq(load_argv(11, set, &c), KVR_OK);
    cr_assert(c.ssd_page_size == 64ull << 20 && c.ssd_slots == 5000 && c.ssd_window == 100ull << 20);
    cr_assert_eq(load_argv(3, size_alone, &c), KVR_EINVAL, "--ssd-size needs --ssd-path");
    cr_assert_eq(load_argv(5, rel, &c), KVR_EINVAL, "a relative path");
    cr_assert_eq(load_argv(3, no_size, &c), KVR_EINVAL, "no size: nothing to make the file with");
    cr_assert_eq(load_argv(5, small, &c), KVR_EINVAL, "not two pages of 256 MiB");
    cr_assert_eq(load_argv(7, odd_page, &c), KVR_EINVAL, "pages in 4 KiB units");
    setenv("KVRELAY_SSD_PATH", "/var/tmp/env.ssd", 1);
    setenv("KVRELAY_SSD_SIZE", "2G", 1);
    cr_assert_eq(load_argv(1, ok, &c), KVR_OK);
    cr_assert_str_eq(c.ssd_path, "/var/tmp/env.ssd");
    cr_assert_eq(c.ssd_size, 2ull << 30);
    cr_assert_eq(c.ssd_slots, 32768);
    unsetenv("KVRELAY_SSD_PATH");
    unsetenv("KVRELAY_SSD_SIZE");
}
