/* json.c — see json.h. */
#include "wire/json.h"

#include "base/utf8.h"

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

void kvr_json_str(kvr_json_t *j, const void *s, size_t n)
{
    const uint8_t *p = s;
    char esc[8];

    put(j, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i];
        size_t l;
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') { /* a run of plain ASCII, in one put */
            for (l = i + 1; l < n && p[l] >= 0x20 && p[l] < 0x7f && p[l] != '"' && p[l] != '\\'; l++)
                ;
            put(j, (const char *)p + i, l - i);
            i = l;
        } else if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(j, esc, 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            put(j, esc, 6);
            i++;
        } else if ((l = kvr_utf8_seq(p + i, n - i)) > 0) {
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
