/*
 * json.c — JSON writers shared by the report (report.c) and the relay's results (relay.c).
 */
#include "json.h"

void kvb_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

void kvb_json_lat(FILE *f, const kvb_hist_t *h)
{
    fprintf(f, "{\"count\": %llu, \"mean\": %.6f, \"p50\": %.6f, \"p90\": %.6f, \"p99\": %.6f, \"p99_9\": %.6f, "
               "\"max\": %.6f}",
            (unsigned long long)h->n, h->n ? (double)h->sum / (double)h->n / 1e6 : 0.0,
            kvb_hist_quantile(h, 0.50) / 1e6, kvb_hist_quantile(h, 0.90) / 1e6, kvb_hist_quantile(h, 0.99) / 1e6,
            kvb_hist_quantile(h, 0.999) / 1e6, h->max / 1e6);
}
