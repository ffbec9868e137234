/*
 * kvb.c — the definitions of kvb.h: the run's configuration and control, and the names the
 * command line and the reports use for operations, error kinds and workloads.
 */
#include "kvb.h"

kvb_cfg_t G;
kvb_ctl_t C;

const char *const kvb_op_name[OP_N] = {"put", "get", "head", "exists", "delete"};
const char *const kvb_ek_name[EK_N] = {"corrupt", "status", "miss", "length", "short",
                                       "connect", "timeout", "protocol", "unpublished"};
const char *const kvb_workload_name[WL_N] = {"put", "get", "head", "exists", "mixed", "relay"};

const char *kvb_proto_label(void)
{
    return G.proto == PROTO_RESP ? "resp" : G.proto == PROTO_MEMCACHE ? "memcache"
                                      : G.http2                       ? "h2c"
                                                                      : "http/1.1";
}
