/* log.c — see log.h. */
#include "base/log.h"

#include "base/utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

int kvr_log_level = KVR_LOG_INFO;
int kvr_log_style = KVR_LOG_TEXT;
static char log_role[32] = "kvrelay";

#define LOG_MSG_MAX 1024

void kvr_log_set_role(const char *role)
{
    snprintf(log_role, sizeof(log_role), "%s", role);
}

const char *kvr_log_role(void)
{
    return log_role;
}

/* Appends c to out (JSON string escaping); returns the new length. out has room for 6 bytes. */
static size_t json_byte(char *out, size_t n, unsigned char c)
{
    static const char hex[] = "0123456789abcdef";

    if (c == '"' || c == '\\') {
        out[n++] = '\\';
        out[n++] = (char)c;
    } else if (c == '\n') {
        out[n++] = '\\';
        out[n++] = 'n';
    } else if (c < 0x20 || c >= 0x7f) { /* control bytes, and bytes that are not UTF-8 */
        memcpy(out + n, "\\u00", 4);
        out[n + 4] = hex[c >> 4];
        out[n + 5] = hex[c & 15];
        n += 6;
    } else {
        out[n++] = (char)c;
    }
    return n;
}

/* Writes s[0..len) as a JSON string body: valid UTF-8 kept, other bytes as \u00XX. */
static size_t json_str(char *out, size_t n, const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;

    for (size_t i = 0; i < len;) {
        size_t k = u[i] >= 0x80 ? kvr_utf8_seq(u + i, len - i) : 0;
        if (k > 0) {
            memcpy(out + n, u + i, k);
            n += k;
            i += k;
        } else {
            n = json_byte(out, n, u[i++]);
        }
    }
    return n;
}

static int is_key_char(char c, int first)
{
    return (c >= 'a' && c <= 'z') || c == '_' || (!first && ((c >= '0' && c <= '9') || c == '.' || c == '-'));
}

/* A JSON number as written by JSON's grammar (the value of a field, if it is one). */
static int is_json_number(const char *s, size_t len)
{
    size_t i = 0;

    if (i < len && s[i] == '-')
        i++;
    if (i >= len || !(s[i] >= '0' && s[i] <= '9') || (s[i] == '0' && i + 1 < len && s[i + 1] != '.'))
        return 0;
    while (i < len && s[i] >= '0' && s[i] <= '9')
        i++;
    if (i < len && s[i] == '.') {
        if (++i >= len)
            return 0;
        while (i < len && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    return i == len;
}

/*
 * "fields": every key=value token of the message (key: [a-z_][a-z0-9_.-]*, value up to the
 * next space or comma), numbers as numbers, everything else as strings.
 */
static size_t json_fields(char *out, size_t n, const char *msg, size_t len)
{
    int first = 1;

    out[n++] = '{';
    for (size_t i = 0; i < len;) {
        size_t k = i, v, e;
        if (i > 0 && msg[i - 1] != ' ' && msg[i - 1] != '(') {
            i++;
            continue;
        }
        while (k < len && is_key_char(msg[k], k == i))
            k++;
        if (k == i || k >= len || msg[k] != '=') {
            i = k > i ? k : i + 1;
            continue;
        }
        v = k + 1;
        for (e = v; e < len && msg[e] != ' ' && msg[e] != ',' && msg[e] != ')'; e++)
            ;
        if (!first)
            out[n++] = ',';
        first = 0;
        out[n++] = '"';
        n = json_str(out, n, msg + i, k - i);
        memcpy(out + n, "\":", 2);
        n += 2;
        if (e > v && is_json_number(msg + v, e - v)) {
            memcpy(out + n, msg + v, e - v);
            n += e - v;
        } else {
            out[n++] = '"';
            n = json_str(out, n, msg + v, e - v);
            out[n++] = '"';
        }
        i = e;
    }
    out[n++] = '}';
    return n;
}

void kvr_log_write(int level, const char *fmt, ...)
{
    static const char *names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    static const char *lower[] = {"debug", "info", "warn", "error"};
    char msg[LOG_MSG_MAX];
    char line[LOG_MSG_MAX * 14]; /* JSON: message and fields, each at most 6 bytes per byte, + names */
    struct timeval tv;
    struct tm tm;
    va_list ap;
    int lv = level < 0 ? 0 : level > 3 ? 3
                                       : level,
        m;
    size_t n, ml;

    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    va_start(ap, fmt);
    m = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    ml = (size_t)m < sizeof(msg) ? (size_t)m : sizeof(msg) - 1;
    if (kvr_log_style == KVR_LOG_JSON) {
        m = snprintf(line, sizeof(line),
                     "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03dZ\",\"level\":\"%s\",\"role\":\"",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (int)(tv.tv_usec / 1000), lower[lv]);
        n = json_str(line, (size_t)m, log_role, strlen(log_role));
        n += (size_t)snprintf(line + n, sizeof(line) - n, "\",\"pid\":%d,\"message\":\"", (int)getpid());
        n = json_str(line, n, msg, ml);
        memcpy(line + n, "\",\"fields\":", 11);
        n = json_fields(line, n + 11, msg, ml);
        line[n++] = '}';
    } else {
        m = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s[%d] %s ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000),
                     log_role, (int)getpid(), names[lv]);
        n = (size_t)m;
        memcpy(line + n, msg, ml);
        n += ml;
    }
    line[n++] = '\n';
    /* One write(2) per line so lines from several processes never interleave. */
    (void)!write(STDERR_FILENO, line, n);
}
