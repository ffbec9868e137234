/*
 * grpc_health.c — grpc.health.v1.Health: Check answers SERVING (NOT_SERVING while the
 * worker drains) for the whole server ("") and for dynamo.kvrelay.v1.KvEventRelay; Watch is
 * not offered (UNIMPLEMENTED).
 */
#include "io/grpc_int.h"

#include "wire/health.pb-c.h"
#include "wire/relay_validate.h"

#define GRPC_UNIMPLEMENTED 12

static void health(gstream_t *s, const uint8_t *msg, size_t len, int watch)
{
    Grpc__Health__V1__HealthCheckRequest *rq = grpc__health__v1__health_check_request__unpack(NULL, len, msg);
    Grpc__Health__V1__HealthCheckResponse rs = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    int known;

    if (rq == NULL) {
        kvr_grpc_stream_end(s, KVR_GRPC_INTERNAL, 0, "malformed HealthCheckRequest");
        return;
    }
    known = rq->service[0] == '\0' || strcmp(rq->service, "dynamo.kvrelay.v1.KvEventRelay") == 0;
    grpc__health__v1__health_check_request__free_unpacked(rq, NULL);
    if (watch) {
        kvr_grpc_stream_end(s, GRPC_UNIMPLEMENTED, 0, "Watch is not implemented");
        return;
    }
    if (!known) {
        kvr_grpc_stream_end(s, KVR_GRPC_NOT_FOUND, 0, "unknown service");
        return;
    }
    rs.status = s->conn->g->draining ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                                     : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    kvr_grpc_out_message(s, &rs.base);
    kvr_grpc_send_headers(s);
    kvr_grpc_stream_end(s, KVR_GRPC_OK, 0, NULL);
}

static void call_check(gstream_t *s, const uint8_t *msg, size_t len)
{
    health(s, msg, len, 0);
}

static void call_watch(gstream_t *s, const uint8_t *msg, size_t len)
{
    health(s, msg, len, 1);
}

const kvr_grpc_method_t kvr_grpc_health_methods[] = {
    {.path = "/grpc.health.v1.Health/Check", .rpc = -1, .call = call_check},
    {.path = "/grpc.health.v1.Health/Watch", .rpc = -1, .call = call_watch},
};
const size_t kvr_grpc_health_nmethods = KVR_ARRAY_SIZE(kvr_grpc_health_methods);
