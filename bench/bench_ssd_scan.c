/*
 * bench_ssd_scan — the disk tier's restart scan (src/io/ssdscan.c), measured. Prints
 * "name value unit" lines.
 *
 * Fills a file of --file-size (default 1G) under --path (default /var/tmp) with sealed pages of
 * 16 MiB full of records of one size, first without summaries (the scan walks one 4 KiB header
 * per record), then with them (one read per page), and scans each one read at a time and with
 * KVR_SSDF_SCAN_DEPTH walkers; it projects the scan of 1 TiB of such records from the rate.
 * Record sizes: 64 KiB and 2 MiB (--sizes "64K 2M"). The file is removed at the end.
 *
 *   scan_<size>_<headers|summary>_depth<d>_records_per_s   records indexed per second
 *   scan_<size>_<headers|summary>_depth<d>_1tib_s          seconds for 1 TiB of such records
 */
#include "base/log.h"
#include "io/ssdscan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define PAGE (16ull << 20)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t parse_size(const char *s)
{
    char *end;
    uint64_t v = strtoull(s, &end, 10);
    switch (*end) {
    case 'K': return v << 10;
    case 'M': return v << 20;
    case 'G': return v << 30;
    }
    return v;
}

static int count(void *ctx, uint64_t page, uint64_t off, const kvr_ssd_page_t *pg, const kvr_ssd_rec_t *rec)
{
    (void)page, (void)off, (void)pg, (void)rec;
    ++*(uint64_t *)ctx;
    return 0;
}

/* Fills every page with records of len payload bytes and seals it, with its summary when
 * summarized (else the scan walks its headers). Returns the records written, 0 on error. */
static uint64_t fill(kvr_ssdf_t *f, uint64_t len, uint8_t *body, int summarized)
{
    size_t cap = (size_t)(f->page_size / (2 * KVR_SSD_ALIGN)) * KVR_SSD_SUMENT_MAX;
    uint8_t *sum = malloc(cap);
    uint64_t n = 0, seq = 0;
    char key[64];

    for (uint64_t p = 0; sum != NULL && p < f->npages; p++) {
        kvr_ssd_page_t pg = {.page = p, .version = p + 1, .file_id = f->file_id};
        uint64_t off = KVR_SSD_ALIGN, recs = 0;
        size_t slen = 0;
        if (kvr_ssdf_page_write(f, &pg) != KVR_OK)
            goto fail;
        for (;;) {
            kvr_ssd_rec_t r = {.version = p + 1, .seq = ++seq, .length = len, .ns_len = 7, .ns = "default", .model_len = 7, .model = "kvrelay"};
            int kl = snprintf(key, sizeof(key), "bench/%012llu", (unsigned long long)seq);
            struct iovec iov = {body, (size_t)kl + len};
            if (off + kvr_ssd_rec_span((size_t)kl, len) + slen + KVR_SSD_SUMENT_MAX > f->page_size)
                break; /* room for the record and the summary after it */
            r.key_len = (uint16_t)kl;
            memcpy(r.key, key, (size_t)kl);
            memcpy(body, key, (size_t)kl); /* the body starts with the key, as in the arena */
            r.khash = XXH3_64bits(key, (size_t)kl);
            if (kvr_ssdf_rec_write(f, p, off, &r, &iov, 1) != KVR_OK)
                goto fail;
            slen += kvr_ssd_sument_encode(&r, off, sum + slen);
            off += kvr_ssd_rec_span((size_t)kl, len);
            recs++;
        }
        pg.used = off;
        pg.nrecords = (uint32_t)recs;
        if (kvr_ssdf_page_seal(f, &pg, sum, summarized ? slen : 0) != KVR_OK)
            goto fail;
        n += recs;
    }
    free(sum);
    return n;
fail:
    free(sum);
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = "/var/tmp", *sizes = "64K 2M";
    uint64_t file_size = 1ull << 30;
    char path[512], list[128], *save = NULL;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--path") == 0)
            dir = argv[i + 1];
        else if (strcmp(argv[i], "--file-size") == 0)
            file_size = parse_size(argv[i + 1]);
        else if (strcmp(argv[i], "--sizes") == 0)
            sizes = argv[i + 1];
        else {
            fprintf(stderr, "usage: bench_ssd_scan [--path DIR] [--file-size SIZE] [--sizes \"64K 2M\"]\n");
            return 2;
        }
    }
    kvr_log_level = KVR_LOG_WARN;
    snprintf(path, sizeof(path), "%s/kvrelay-bench-ssd-scan.%d", dir, (int)getpid());
    snprintf(list, sizeof(list), "%s", sizes);
    for (char *tok = strtok_r(list, " ", &save); tok != NULL; tok = strtok_r(NULL, " ", &save)) {
        uint64_t len = parse_size(tok), written, got;
        uint8_t *body = kvr_ssdf_buf(len + KVR_SSD_ALIGN);
        kvr_ssdf_t f;
        kvr_ssdf_scan_t st;
        int rc = 1;

        unlink(path);
        if (body == NULL || kvr_ssdf_open(&f, path, KVR_SSD_SUPER_BYTES + file_size, PAGE, NULL) != KVR_OK) {
            fprintf(stderr, "bench_ssd_scan: cannot make %s\n", path);
            free(body);
            return 1;
        }
        memset(body, 0x5a, len + KVR_SSD_ALIGN);
        for (int summarized = 0; summarized < 2 && rc != 2; summarized++) {
            const char *how = summarized ? "summary" : "headers";
            written = fill(&f, len, body, summarized);
            rc = written > 0 ? KVR_OK : 2;
            for (unsigned depth = 1; rc == KVR_OK && depth <= KVR_SSDF_SCAN_DEPTH; depth *= KVR_SSDF_SCAN_DEPTH) {
                double t0 = now(), dt;
                got = 0;
                rc = kvr_ssdf_scan_depth(&f, depth, count, &got, &st);
                dt = now() - t0;
                if (rc != KVR_OK || got != written || st.summaries != (summarized ? f.npages : 0)) {
                    fprintf(stderr, "bench_ssd_scan: scan found %llu of %llu records, %llu summaries (rc %d)\n",
                            (unsigned long long)got, (unsigned long long)written, (unsigned long long)st.summaries, rc);
                    rc = 2;
                    break;
                }
                printf("scan_%s_%s_depth%u_records_per_s %.0f records/s\n", tok, how, depth, (double)got / dt);
                printf("scan_%s_%s_depth%u_1tib_s %.1f s\n", tok, how, depth,
                       (double)(1ull << 40) / (double)kvr_ssd_rec_span(20, len) / ((double)got / dt));
            }
        }
        kvr_ssdf_close(&f);
        unlink(path);
        free(body);
        if (rc != KVR_OK)
            return 1;
    }
    return 0;
}
