/* Unit tests of the JSON writer (src/wire/json.c): escapes and overflow. */
#include "wire/json.h"

#include <criterion/criterion.h>

Test(json, escapes_and_overflow)
{
    char buf[64];
    kvr_json_t j;

    kvr_json_init(&j, buf, sizeof(buf));
    kvr_json_raw(&j, "{");
    kvr_json_key(&j, "hash", 1);
    kvr_json_str(&j, "a\"b\\c\n\x01\xe2\x82\xac\xff", 11);
    kvr_json_raw(&j, "}");
    cr_assert_not(j.overflow);
    cr_assert_str_eq(buf, "{\"hash\":\"a\\\"b\\\\c\\u000a\\u0001\xe2\x82\xac\\u00ff\"}");
    /* plain runs on both sides of each escape, DEL escaped */
    kvr_json_init(&j, buf, sizeof(buf));
    kvr_json_str(&j, "ab cd~\x7f/x\"yz", 12);
    cr_assert_not(j.overflow);
    cr_assert_str_eq(buf, "\"ab cd~\\u007f/x\\\"yz\"");
    kvr_json_init(&j, buf, 8);
    kvr_json_raw(&j, "0123456789");
    cr_assert(j.overflow);
}
