/* log.c — see log.h. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

int kvr_log_level = KVR_LOG_INFO;
static char log_role[32] = "kvrelay";

void kvr_log_set_role(const char *role)
{
    snprintf(log_role, sizeof(log_role), "%s", role);
}

const char *kvr_log_role(void)
{
    return log_role;
}

void kvr_log_write(int level, const char *fmt, ...)
{
    static const char *names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    char line[1024];
    struct timeval tv;
    struct tm tm;
    va_list ap;
    int n;

    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s[%d] %s ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 (int)(tv.tv_usec / 1000), log_role, (int)getpid(),
                 names[level < 0 ? 0 : level > 3 ? 3 : level]);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(line))
        n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(line) - 1)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    /* One write(2) per line so lines from several processes never interleave. */
    (void)!write(STDERR_FILENO, line, (size_t)n);
}
