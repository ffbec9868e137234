/* kvrelay-supervisor — the server's entry point: configuration, then the supervisor. */
#include "core/config.h"
#include "core/log.h"
#include "core/supervisor.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    static kvr_config_t cfg;

    if (kvr_config_load(&cfg, argc, argv, stderr) != KVR_OK)
        return 2;
    if (cfg.help) {
        kvr_config_usage(stdout, argv[0]);
        return 0;
    }
    if (cfg.print_config) {
        kvr_config_print(&cfg, stdout);
        return 0;
    }
    kvr_log_level = !strcmp(cfg.log_level, "debug") ? KVR_LOG_DEBUG
                  : !strcmp(cfg.log_level, "warn")  ? KVR_LOG_WARN
                  : !strcmp(cfg.log_level, "error") ? KVR_LOG_ERROR
                                                    : KVR_LOG_INFO;
    return kvr_supervisor_run(&cfg);
}
