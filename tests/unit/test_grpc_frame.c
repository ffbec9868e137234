/*
 * test_grpc_frame.c — gRPC framing (src/wire/grpc_frame.c): prefixes, the one-message rule
 * and the status metadata.
 */
#include <criterion/criterion.h>

#include "wire/grpc_frame.h"
#include "wire/health.pb-c.h"
#include "wire/relay_validate.h"

Test(grpc_frame, pack_writes_the_prefix)
{
    Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    uint8_t buf[64];
    const uint8_t *msg;
    size_t n, mlen;

    rq.service = "abc";
    n = kvr_grpc_pack(&rq.base, buf);
    cr_assert_eq(n, kvr_grpc_packed_size(&rq.base));
    cr_assert_eq(n, 5 + 5); /* tag, length, "abc" */
    cr_expect_eq(buf[0], 0);
    cr_expect_eq(kvr_be32(buf + 1), 5);
    cr_assert_eq(kvr_grpc_one_message(buf, n, &msg, &mlen), KVR_GRPC_ONE_OK);
    cr_expect_eq(msg, buf + 5);
    cr_expect_eq(mlen, 5);
}

Test(grpc_frame, one_message_rule)
{
    uint8_t b[16] = {0, 0, 0, 0, 2, 'h', 'i'};
    const uint8_t *msg = NULL;
    size_t mlen = 0;

    cr_expect_eq(kvr_grpc_one_message(b, 4, &msg, &mlen), KVR_GRPC_ONE_MALFORMED); /* short prefix */
    cr_expect_eq(kvr_grpc_one_message(b, 6, &msg, &mlen), KVR_GRPC_ONE_MALFORMED); /* truncated */
    cr_expect_eq(kvr_grpc_one_message(b, 8, &msg, &mlen), KVR_GRPC_ONE_MALFORMED); /* trailing byte */
    cr_expect_eq(kvr_grpc_one_message(b, 7, &msg, &mlen), KVR_GRPC_ONE_OK);
    cr_expect_eq(mlen, 2);
    b[0] = 1;
    cr_expect_eq(kvr_grpc_one_message(b, 7, &msg, &mlen), KVR_GRPC_ONE_COMPRESSED);
    kvr_put_be32(b + 1, 0);
    b[0] = 0;
    cr_expect_eq(kvr_grpc_one_message(b, 5, &msg, &mlen), KVR_GRPC_ONE_OK); /* an empty message */
    cr_expect_eq(mlen, 0);
}

Test(grpc_frame, status_metadata)
{
    kvr_grpc_status_md_t md;

    kvr_grpc_status_md(&md, 0, NULL, 0);
    cr_assert_eq(md.n, 1);
    cr_expect_str_eq(md.name[0], "grpc-status");
    cr_expect_str_eq(md.value[0], "0");
    kvr_grpc_status_md(&md, 8, "Relay stream limit reached", KVR_RELAY_REASON_RESOURCE_LIMIT);
    cr_assert_eq(md.n, 3);
    cr_expect_str_eq(md.value[0], "8");
    cr_expect_str_eq(md.name[1], "grpc-message");
    cr_expect_str_eq(md.value[1], "Relay stream limit reached");
    cr_expect_str_eq(md.name[2], "kv-relay-error-reason");
    cr_expect_str_eq(md.value[2], kvr_relay_reason_name(KVR_RELAY_REASON_RESOURCE_LIMIT));
    kvr_grpc_status_md(&md, 13, NULL, 9999); /* a reason without a name sends no trailer */
    cr_expect_eq(md.n, 1);
}
