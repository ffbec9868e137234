/* dassert.c — see dassert.h. */
#include "base/dassert.h"

#include "base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void kvr_dassert_fail(const char *file, int line, const char *expr)
{
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "%s[%d] %s:%d: assertion failed: %s\n", kvr_log_role(), (int)getpid(),
                     file, line, expr);

    /* One write(2): no stdio buffer to flush, nothing allocated, whatever state we are in. */
    if (n > 0)
        (void)!write(STDERR_FILENO, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
    abort();
}
