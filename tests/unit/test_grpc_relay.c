/*
 * test_grpc_relay.c — the relay service's table of RPCs (src/io/grpc_relay.c): one entry per
 * dynamo.kvrelay.v1 method, each at the index and :path wire/relay_validate.h knows it by, and
 * the health service's two methods.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "io/grpc_int.h"
#include "wire/relay_validate.h"

Test(grpc_methods, one_relay_entry_per_method)
{
    cr_assert_eq(kvr_grpc_relay_nmethods, KVR_RELAY_RPC_COUNT);
    for (size_t i = 0; i < kvr_grpc_relay_nmethods; i++) {
        const kvr_grpc_method_t *m = &kvr_grpc_relay_methods[i];
        cr_assert_not_null(m->path, "entry %zu", i);
        cr_expect_eq(m->rpc, (int)i);
        cr_expect_eq(kvr_relay_rpc_from_path(m->path, strlen(m->path)), (int)i, "%s", m->path);
        cr_expect_not_null(m->call, "%s", m->path);
        cr_expect_not_null(m->done, "%s: its permit must go back", m->path);
    }
    cr_assert_eq(kvr_grpc_health_nmethods, 2);
    cr_expect_str_eq(kvr_grpc_health_methods[0].path, "/grpc.health.v1.Health/Check");
    cr_expect_str_eq(kvr_grpc_health_methods[1].path, "/grpc.health.v1.Health/Watch");
}
