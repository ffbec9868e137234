/* utf8.c — see utf8.h. */
#include "base/utf8.h"

size_t kvr_utf8_seq(const uint8_t *s, size_t left)
{
    uint8_t c = s[0];
    uint32_t cp, min;
    size_t n;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2, cp = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4, cp = c & 0x07, min = 0x10000;
    } else {
        return 0; /* a continuation byte, C0/C1 (always overlong) or F5..FF */
    }
    if (n > left)
        return 0;
    for (size_t k = 1; k < n; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

int kvr_utf8_valid(const uint8_t *s, size_t len)
{
    for (size_t i = 0, n; i < len; i += n)
        if ((n = kvr_utf8_seq(s + i, len - i)) == 0)
            return 0;
    return 1;
}
