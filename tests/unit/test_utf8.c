/* Unit tests of base/utf8: the one validator behind the JSON writers and subscriber_id. */
#include "base/utf8.h"

#include <criterion/criterion.h>
#include <string.h>

static size_t seq(const char *s, size_t n)
{
    return kvr_utf8_seq((const uint8_t *)s, n);
}

static int valid(const char *s, size_t n)
{
    return kvr_utf8_valid((const uint8_t *)s, n);
}

Test(utf8, sequence_lengths)
{
    cr_assert_eq(seq("a", 1), 1);
    cr_assert_eq(seq("\x01", 1), 1); /* controls are ASCII: the writers escape them */
    cr_assert_eq(seq("\x7f", 1), 1);
    cr_assert_eq(seq("\xc2\x80", 2), 2);         /* U+0080, the smallest two-byte form */
    cr_assert_eq(seq("\xdf\xbf", 2), 2);         /* U+07FF */
    cr_assert_eq(seq("\xe0\xa0\x80", 3), 3);     /* U+0800 */
    cr_assert_eq(seq("\xe2\x82\xac", 3), 3);     /* U+20AC euro */
    cr_assert_eq(seq("\xef\xbf\xbf", 3), 3);     /* U+FFFF */
    cr_assert_eq(seq("\xf0\x90\x80\x80", 4), 4); /* U+10000 */
    cr_assert_eq(seq("\xf4\x8f\xbf\xbf", 4), 4); /* U+10FFFF, the last code point */
}

Test(utf8, rejects)
{
    cr_assert_eq(seq("\x80", 1), 0);             /* a lone continuation byte */
    cr_assert_eq(seq("\xc0\xaf", 2), 0);         /* overlong '/' */
    cr_assert_eq(seq("\xc1\xbf", 2), 0);         /* overlong */
    cr_assert_eq(seq("\xe0\x80\xaf", 3), 0);     /* overlong three-byte form */
    cr_assert_eq(seq("\xf0\x80\x80\xaf", 4), 0); /* overlong four-byte form */
    cr_assert_eq(seq("\xed\xa0\x80", 3), 0);     /* U+D800, a surrogate */
    cr_assert_eq(seq("\xed\xbf\xbf", 3), 0);     /* U+DFFF */
    cr_assert_eq(seq("\xf4\x90\x80\x80", 4), 0); /* U+110000, above the range */
    cr_assert_eq(seq("\xf5\x80\x80\x80", 4), 0); /* F5..FF never start a sequence */
    cr_assert_eq(seq("\xff", 1), 0);
    cr_assert_eq(seq("\xe2\x82", 2), 0);     /* truncated by the length */
    cr_assert_eq(seq("\xe2\x82\xac", 2), 0); /* the bytes are there, the length says no */
    cr_assert_eq(seq("\xe2\x28\xac", 3), 0); /* a non-continuation in the middle */
}

Test(utf8, whole_strings)
{
    cr_assert(valid("", 0));
    cr_assert(valid("router-\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 18));
    cr_assert(valid("nul\0inside", 10)); /* NUL is valid UTF-8; subscriber_id refuses it as Cc */
    cr_assert_not(valid("pool\xffsub", 8));
    cr_assert_not(valid("pool\xc3", 5));
    cr_assert_not(valid("pool\xc0\xafsub", 9));
    cr_assert_not(valid("pool\xed\xa0\x80sub", 10));
}
