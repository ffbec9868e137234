/*
 * args.h — the command line (args.c): fills G (kvb.h) from argv, with every default applied,
 * or exits 2 with a usage error (0 after --help).
 */
#ifndef KVB_ARGS_H
#define KVB_ARGS_H

#include "kvb.h"

void kvb_args_parse(int argc, char **argv);

#endif
