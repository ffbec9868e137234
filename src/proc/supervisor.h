/*
 * supervisor.h — the kvrelay-supervisor process (see supervisor.c for the design).
 */
#ifndef KVR_PROC_SUPERVISOR_H
#define KVR_PROC_SUPERVISOR_H

#include "core/config.h"

/* Runs until SIGTERM/SIGINT and a drain; returns the process exit code. cfg->max_block_size
 * is clamped to what the arena can hold (kvr_store_block_max) before any child starts. */
int kvr_supervisor_run(kvr_config_t *cfg);

#endif
