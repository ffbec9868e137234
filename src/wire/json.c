/* json.c — see json.h. */
#include "wire/json.h"

#include <stdio.h>

void kvr_json_init(kvr_json_t *j, char *buf, size_t cap)
{
    j->buf = buf;
    j->cap = cap;
    j->len = 0;
    j->overflow = 0;
    if (cap > 0)
        buf[0] = '\0';
}

static void put(kvr_json_t *j, const char *s, size_t n)
{
    if (j->overflow || j->len + n + 1 > j->cap) {
        j->overflow = 1;
        return;
    }
    memcpy(j->buf + j->len, s, n);
    j->len += n;
    j->buf[j->len] = '\0';
}

void kvr_json_raw(kvr_json_t *j, const char *s)
{
    put(j, s, strlen(s));
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if invalid. */
static size_t utf8_len(const uint8_t *p, size_t n)
{
    uint32_t cp;
    size_t len;

    if (p[0] < 0x80)
        return 1;
    if ((p[0] & 0xe0) == 0xc0) {
        len = 2;
        cp = p[0] & 0x1f;
    } else if ((p[0] & 0xf0) == 0xe0) {
        len = 3;
        cp = p[0] & 0x0f;
    } else if ((p[0] & 0xf8) == 0xf0) {
        len = 4;
        cp = p[0] & 0x07;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

void kvr_json_str(kvr_json_t *j, const void *s, size_t n)
{
    const uint8_t *p = s;
    char esc[8];

    put(j, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i];
        size_t l;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(j, esc, 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            put(j, esc, 6);
            i++;
        } else if ((l = utf8_len(p + i, n - i)) > 0) {
            put(j, (const char *)p + i, l);
            i += l;
        } else {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            put(j, esc, 6);
            i++;
        }
    }
    put(j, "\"", 1);
}

void kvr_json_u64(kvr_json_t *j, uint64_t v)
{
    char num[24];
    int n = snprintf(num, sizeof(num), "%llu", (unsigned long long)v);
    put(j, num, (size_t)n);
}

void kvr_json_key(kvr_json_t *j, const char *name, int first)
{
    if (!first)
        put(j, ",", 1);
    kvr_json_str(j, name, strlen(name));
    put(j, ":", 1);
}
