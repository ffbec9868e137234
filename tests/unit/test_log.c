/* Unit tests of --log-format json (issue 13): the exact object, escaping, fields, the bound. */
#include "base/log.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs one kvr_log_write with stderr captured; returns the bytes written (malloc'd). */
static char *capture(int style, const char *fmt, const char *arg)
{
    FILE *f = tmpfile();
    int saved = dup(STDERR_FILENO);
    long n;
    char *buf;

    cr_assert_not_null(f);
    dup2(fileno(f), STDERR_FILENO);
    kvr_log_style = style;
    kvr_log_set_role("worker 3");
    kvr_log_write(KVR_LOG_WARN, fmt, arg);
    kvr_log_style = KVR_LOG_TEXT;
    dup2(saved, STDERR_FILENO);
    close(saved);
    n = ftell(f);
    buf = calloc(1, (size_t)n + 1);
    rewind(f);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return buf;
}

Test(log, json_object_with_escapes_and_fields)
{
    char *out = capture(KVR_LOG_JSON, "%s", "say \"hi\"\\ now\n\x01 \xff caf\xc3\xa9 a=1 b=x c=-2.5 d=01 (e=7, f=y)");
    char want[512], *p;

    snprintf(want, sizeof(want), "\",\"level\":\"warn\",\"role\":\"worker 3\",\"pid\":%d,\"message\":"
                                 "\"say \\\"hi\\\"\\\\ now\\n\\u0001 \\u00ff caf\xc3\xa9 a=1 b=x c=-2.5 d=01 (e=7, f=y)\","
                                 "\"fields\":{\"a\":1,\"b\":\"x\",\"c\":-2.5,\"d\":\"01\",\"e\":7,\"f\":\"y\"}}\n",
             (int)getpid());
    cr_assert_eq(strncmp(out, "{\"time\":\"", 9), 0, "%s", out);
    p = out + 9; /* 2026-12-01T08:58:45.247Z */
    cr_assert_eq(strlen(p) > 24 && p[4] == '-' && p[10] == 'T' && p[19] == '.' && p[23] == 'Z', 1, "%s", out);
    cr_assert_str_eq(p + 24, want);
    free(out);
}

Test(log, text_line_unchanged)
{
    char *out = capture(KVR_LOG_TEXT, "%s", "plain a=1");
    char want[64];

    snprintf(want, sizeof(want), " worker 3[%d] WARN plain a=1\n", (int)getpid());
    cr_assert_str_eq(out + 24, want);
    free(out);
}

Test(log, long_messages_are_cut_and_stay_one_valid_line)
{
    char *big = malloc(5000), *out;
    size_t n;

    /* every byte escapes to 6: the worst case for the line buffer */
    memset(big, '\x02', 4999);
    big[4999] = '\0';
    out = capture(KVR_LOG_JSON, "%s", big);
    n = strlen(out);
    cr_assert_eq(out[n - 1], '\n');
    cr_assert_eq(strchr(out, '\n'), out + n - 1, "one line");
    cr_assert_not_null(strstr(out, "\",\"fields\":{}}\n"), "the object is closed");
    /* 1023 bytes of the message kept, each as \u0002 */
    cr_assert_not_null(strstr(out, "\"message\":\"\\u0002"));
    {
        size_t count = 0;
        for (char *q = out; (q = strstr(q, "\\u0002")) != NULL; q += 6)
            count++;
        cr_assert_eq(count, 1023);
    }
    free(out);
    /* many key=value fields: fields bounded by the message too */
    for (size_t i = 0; i + 4 < 4999; i += 4)
        memcpy(big + i, "a=\x02 ", 4);
    out = capture(KVR_LOG_JSON, "%s", big);
    n = strlen(out);
    cr_assert_eq(strchr(out, '\n'), out + n - 1, "one line");
    cr_assert_eq(strcmp(out + n - 3, "\"}}\n") == 0 || strcmp(out + n - 3, "}}\n") == 0, 1, "%s", out + n - 20);
    free(out);
    free(big);
}
