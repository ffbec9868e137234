/*
 * supervisor.h — the kvrelay-supervisor process (see supervisor.c for the design).
 */
#ifndef KVR_PROC_SUPERVISOR_H
#define KVR_PROC_SUPERVISOR_H

#include "core/config.h"

/* Runs until SIGTERM/SIGINT and a drain; returns the process exit code. */
int kvr_supervisor_run(const kvr_config_t *cfg);

#endif
