/*
 * log.h — levelled logging that says who speaks.
 *
 * Every line is "<iso time> <role>[<pid>] <LEVEL> message" on stderr, or with
 * --log-format json one object per line: {"time","level","role","pid","message","fields"},
 * where fields holds the message's key=value tokens (numbers as numbers). Messages are cut
 * at 1023 bytes; bytes that are not UTF-8 are escaped as \u00XX. The role is set
 * once per process (kvr_log_set_role) after fork. Lines below the configured level cost
 * one comparison. Repeated errors should go through KVR_LOG_RATELIMITED.
 */
#ifndef KVR_BASE_LOG_H
#define KVR_BASE_LOG_H

#include <time.h>

enum { KVR_LOG_DEBUG = 0,
       KVR_LOG_INFO = 1,
       KVR_LOG_WARN = 2,
       KVR_LOG_ERROR = 3,
       KVR_LOG_OFF = 4 };

enum { KVR_LOG_TEXT = 0,
       KVR_LOG_JSON = 1 };

extern int kvr_log_level;
extern int kvr_log_style; /* KVR_LOG_TEXT or KVR_LOG_JSON, set once before any fork */

void kvr_log_set_role(const char *role);
const char *kvr_log_role(void);
void kvr_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define kvr_log(level, ...) \
    do { \
        if ((level) >= kvr_log_level) \
            kvr_log_write((level), __VA_ARGS__); \
    } while (0)
#define kvr_debug(...) kvr_log(KVR_LOG_DEBUG, __VA_ARGS__)
#define kvr_info(...)  kvr_log(KVR_LOG_INFO, __VA_ARGS__)
#define kvr_warn(...)  kvr_log(KVR_LOG_WARN, __VA_ARGS__)
#define kvr_error(...) kvr_log(KVR_LOG_ERROR, __VA_ARGS__)

/* At most one line per second from this call site. */
#define KVR_LOG_RATELIMITED(level, ...) \
    do { \
        static time_t kvr__last_; \
        time_t kvr__now_ = time(NULL); \
        if (kvr__now_ != kvr__last_) { \
            kvr__last_ = kvr__now_; \
            kvr_log(level, __VA_ARGS__); \
        } \
    } while (0)

#endif
