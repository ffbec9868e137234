/*
 * json.h — the two JSON writers the results file needs (json.c): a string, and a latency
 * histogram as {count, mean, p50, p90, p99, p99_9, max} in milliseconds.
 */
#ifndef KVB_JSON_H
#define KVB_JSON_H

#include "hist.h"

#include <stdio.h>

void kvb_json_str(FILE *f, const char *s);
void kvb_json_lat(FILE *f, const kvb_hist_t *h);

#endif
