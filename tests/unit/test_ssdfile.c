/* The disk tier's file (io/ssdfile.c) on a real file under /var/tmp: format and reopen, files
 * that are refused and left as they are, records written from pieces and read back, a page's
 * recycling making its old records stale, and torn records found by the scan. */
#include "io/ssdscan.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define PAGE (1ull << 20)
#define SIZE (KVR_SSD_SUPER_BYTES + 4 * PAGE)

static char dir[64], path[128];

static void setup(void)
{
    strcpy(dir, "/var/tmp/kvr-ssdf-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/ssd", dir);
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
}

TestSuite(ssdfile, .init = setup, .fini = teardown);

static void *aligned(size_t n)
{
    void *p = NULL;
    cr_assert_eq(posix_memalign(&p, KVR_SSD_ALIGN, n), 0);
    return p;
}

/* A record of key and a payload of len bytes (byte i of it: seed + i*7), written at (p, off)
 * from two pieces as the arena gives them: whole pages, then the rest. */
static uint64_t put(kvr_ssdf_t *f, uint64_t p, uint64_t version, uint64_t off, const char *key, uint64_t len,
                    uint8_t seed, uint64_t seq)
{
    size_t klen = strlen(key), total = klen + len, first = total > 8192 ? 8192 : total & ~(size_t)4095;
    uint8_t *a = aligned(first ? first : 4096), *b = aligned(total - first + 4096);
    struct iovec iov[2];
    kvr_ssd_rec_t r;
    int n = 0;

    memset(&r, 0, sizeof(r));
    for (size_t i = 0; i < total; i++) {
        uint8_t v = i < klen ? (uint8_t)key[i] : (uint8_t)(seed + (i - klen) * 7);
        (i < first ? a : b)[i < first ? i : i - first] = v;
    }
    if (first)
        iov[n++] = (struct iovec){a, first};
    iov[n++] = (struct iovec){b, total - first};
    r.version = version;
    r.seq = seq;
    r.key_len = (uint16_t)klen;
    memcpy(r.key, key, klen);
    r.khash = XXH3_64bits(key, klen);
    r.canon = seq * 1000;
    r.length = len;
    r.ns_len = 7;
    memcpy(r.ns, "default", 7);
    r.model_len = 7;
    memcpy(r.model, "kvrelay", 7);
    cr_assert_eq(kvr_ssdf_rec_write(f, p, off, &r, iov, n), KVR_OK);
    free(a);
    free(b);
    return off + kvr_ssd_rec_span(klen, len);
}

typedef struct {
    int n;
    char keys[16][32];
    uint64_t page[16], off[16];
} seen_t;

static int collect(void *ctx, uint64_t page, uint64_t off, const kvr_ssd_page_t *pg, const kvr_ssd_rec_t *rec)
{
    seen_t *s = ctx;
    (void)pg;
    cr_assert_lt(s->n, 16);
    memcpy(s->keys[s->n], rec->key, rec->key_len);
    s->keys[s->n][rec->key_len] = '\0';
    s->page[s->n] = page;
    s->off[s->n++] = off;
    return 0;
}

/* Where the scan saw key, or -1: the scan walks pages interleaved, so tests look keys up. */
static int find(const seen_t *s, const char *key)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->keys[i], key) == 0)
            return i;
    return -1;
}

static void flip(uint64_t at)
{
    int fd = open(path, O_RDWR);
    uint8_t c;
    cr_assert(fd >= 0);
    cr_assert_eq(pread(fd, &c, 1, (off_t)at), 1);
    c ^= 0x40;
    cr_assert_eq(pwrite(fd, &c, 1, (off_t)at), 1);
    close(fd);
}

Test(ssdfile, format_reopen_and_refusals)
{
    kvr_ssdf_t f;
    int formatted = -1;
    uint64_t id;

    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, &formatted), KVR_OK);
    cr_assert_eq(formatted, 1);
    cr_assert_eq(f.npages, 4);
    cr_assert(f.direct, "/var/tmp takes O_DIRECT");
    id = f.file_id;
    kvr_ssdf_close(&f);
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE + PAGE / 2, PAGE, &formatted), KVR_OK, "rounded to whole pages");
    cr_assert(formatted == 0 && f.file_id == id, "reopened, not formatted again");
    kvr_ssdf_close(&f);
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE + PAGE, PAGE, NULL), KVR_EINVAL, "another size");
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, 2 * PAGE, NULL), KVR_EINVAL, "another page size");
    cr_assert_eq(kvr_ssdf_open(&f, path, KVR_SSD_SUPER_BYTES + PAGE, PAGE, NULL), KVR_EINVAL, "one page");
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE + 512, NULL), KVR_EINVAL, "unaligned page size");

    /* a file that is not ours: refused, and left as it was */
    unlink(path);
    FILE *o = fopen(path, "w");
    cr_assert_not_null(o);
    fputs("precious data, not a disk tier", o);
    fclose(o);
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_EINVAL);
    char back[64] = {0};
    o = fopen(path, "r");
    cr_assert_not_null(fgets(back, sizeof(back), o));
    fclose(o);
    cr_assert_str_eq(back, "precious data, not a disk tier");
}

Test(ssdfile, records_scan_and_recycling)
{
    kvr_ssdf_t f;
    kvr_ssdf_scan_t st;
    seen_t seen = {0};
    kvr_ssd_rec_t r;
    uint64_t off, used;
    uint8_t *body = aligned(PAGE);

    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    /* page 0, open (version 1): two records */
    cr_assert_eq(kvr_ssdf_page_write(&f, &(kvr_ssd_page_t){.page = 0, .version = 1, .file_id = f.file_id}), KVR_OK);
    off = put(&f, 0, 1, KVR_SSD_ALIGN, "a-small", 100, 1, 1);
    put(&f, 0, 1, off, "a-large", 300000, 2, 2);
    /* page 1, sealed (version 2): one record, `used` past it */
    cr_assert_eq(kvr_ssdf_page_write(&f, &(kvr_ssd_page_t){.page = 1, .version = 2, .file_id = f.file_id}), KVR_OK);
    used = put(&f, 1, 2, KVR_SSD_ALIGN, "b-one", 5000, 3, 3);
    cr_assert_eq(kvr_ssdf_sync(&f), KVR_OK);
    cr_assert_eq(kvr_ssdf_page_write(&f, &(kvr_ssd_page_t){.page = 1, .version = 2, .file_id = f.file_id, .sealed = 1, .nrecords = 1, .used = used}),
                 KVR_OK);
    /* page 2: written as version 3, then recycled as version 4 with nothing in it yet */
    cr_assert_eq(kvr_ssdf_page_write(&f, &(kvr_ssd_page_t){.page = 2, .version = 3, .file_id = f.file_id}), KVR_OK);
    put(&f, 2, 3, KVR_SSD_ALIGN, "c-old", 10, 4, 4);
    cr_assert_eq(kvr_ssdf_page_write(&f, &(kvr_ssd_page_t){.page = 2, .version = 4, .file_id = f.file_id}), KVR_OK);
    kvr_ssdf_close(&f);

    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdf_scan(&f, collect, &seen, &st), KVR_OK);
    cr_assert_eq(seen.n, 3, "c-old is stale: its page was recycled");
    cr_assert(find(&seen, "a-small") >= 0 && find(&seen, "a-large") >= 0 && find(&seen, "b-one") >= 0);
    cr_assert_lt(find(&seen, "a-small"), find(&seen, "a-large"), "a page's records in offset order");
    cr_assert(st.pages_open == 2 && st.pages_sealed == 1 && st.pages_empty == 1 && st.pages_bad == 0);
    cr_assert(st.records == 3 && st.record_bytes == 305100 && st.records_torn == 0);
    cr_assert(st.max_version == 4 && st.max_seq == 3);

    /* a body read back whole and checked */
    int large = find(&seen, "a-large");
    cr_assert_eq(kvr_ssdf_rec_read(&f, 0, 1, seen.off[large], &r), KVR_SSD_OK);
    cr_assert_eq(kvr_ssdf_body_read(&f, 0, seen.off[large], &r, body), KVR_OK);
    cr_assert(memcmp(body, "a-large", 7) == 0);
    for (uint64_t i = 0; i < r.length; i++)
        cr_assert_eq(body[7 + i], (uint8_t)(2 + i * 7), "payload byte %llu", (unsigned long long)i);
    kvr_ssdf_close(&f);
    free(body);
}

Test(ssdfile, torn_records)
{
    kvr_ssdf_t f;
    kvr_ssdf_scan_t st;
    seen_t seen = {0};
    kvr_ssd_rec_t r;
    uint64_t o1 = KVR_SSD_ALIGN, o2, o3, used;
    uint8_t *body = aligned(PAGE);

    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdf_page_write(&f, &(kvr_ssd_page_t){.page = 0, .version = 1, .file_id = f.file_id}), KVR_OK);
    o2 = put(&f, 0, 1, o1, "t1", 20000, 1, 1);
    o3 = put(&f, 0, 1, o2, "t2", 20000, 2, 2);
    put(&f, 0, 1, o3, "t3", 20000, 3, 3);
    cr_assert_eq(kvr_ssdf_page_write(&f, &(kvr_ssd_page_t){.page = 1, .version = 2, .file_id = f.file_id}), KVR_OK);
    used = put(&f, 1, 2, KVR_SSD_ALIGN, "s1", 9000, 4, 4);
    cr_assert_eq(kvr_ssdf_page_write(&f, &(kvr_ssd_page_t){.page = 1, .version = 2, .file_id = f.file_id, .sealed = 1, .nrecords = 1, .used = used}),
                 KVR_OK);
    kvr_ssdf_close(&f);

    /* the open page: t2's body torn, so t2 and what follows it are not used */
    flip(KVR_SSD_SUPER_BYTES + o2 + KVR_SSD_ALIGN + 5000);
    /* the sealed page: its body is not read by the scan, but a read of it is refused */
    flip(KVR_SSD_SUPER_BYTES + PAGE + KVR_SSD_ALIGN + KVR_SSD_ALIGN + 100);
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdf_scan(&f, collect, &seen, &st), KVR_OK);
    cr_assert_eq(seen.n, 2);
    cr_assert(find(&seen, "t1") >= 0 && find(&seen, "s1") >= 0, "t2 torn, t3 after it");
    cr_assert_eq(st.records_torn, 1);
    cr_assert_eq(kvr_ssdf_rec_read(&f, 1, 2, KVR_SSD_ALIGN, &r), KVR_SSD_OK);
    cr_assert_eq(kvr_ssdf_body_read(&f, 1, KVR_SSD_ALIGN, &r, body), KVR_EINVAL, "a flipped body is never served");
    kvr_ssdf_close(&f);

    /* a page header flipped: the page is bad and reused, its records not used */
    flip(KVR_SSD_SUPER_BYTES + 20);
    memset(&seen, 0, sizeof(seen));
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdf_scan(&f, collect, &seen, &st), KVR_OK);
    cr_assert(st.pages_bad == 1 && seen.n == 1);
    cr_assert_str_eq(seen.keys[0], "s1");
    kvr_ssdf_close(&f);
    free(body);
}

Test(ssdfile, a_record_must_fit_its_page)
{
    kvr_ssdf_t f;
    kvr_ssd_rec_t r = {.version = 1, .key_len = 1, .key = {'k'}, .length = PAGE, .ns_len = 1, .ns = "d", .model_len = 1, .model = "m"};
    uint8_t *b = aligned(PAGE + 4096);
    struct iovec iov = {b, PAGE + 1};

    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdf_rec_write(&f, 0, KVR_SSD_ALIGN, &r, &iov, 1), KVR_EINVAL);
    r.length = 100;
    iov.iov_len = 50; /* fewer body bytes than the record says */
    cr_assert_eq(kvr_ssdf_rec_write(&f, 0, KVR_SSD_ALIGN, &r, &iov, 1), KVR_EINVAL);
    kvr_ssdf_close(&f);
    free(b);
}

/* Many sealed pages walked at once on the ring and one read at a time: the same records, the
 * same counts. */
Test(ssdfile, ring_and_one_at_a_time_agree)
{
    kvr_ssdf_t f;
    kvr_ssdf_scan_t a, b;
    static seen_t sa, sb;
    uint64_t size = KVR_SSD_SUPER_BYTES + 12 * PAGE;
    char key[32];

    cr_assert_eq(kvr_ssdf_open(&f, path, size, PAGE, NULL), KVR_OK);
    for (uint64_t p = 0; p < 12; p++) {
        uint64_t off = KVR_SSD_ALIGN;
        if (p == 5)
            continue; /* one page never written */
        cr_assert_eq(kvr_ssdf_page_write(&f, &(kvr_ssd_page_t){.page = p, .version = p + 1, .file_id = f.file_id}),
                     KVR_OK);
        if (p != 7) /* one page opened with nothing in it yet */
            off = put(&f, p, p + 1, off, (snprintf(key, sizeof(key), "p%llu", (unsigned long long)p), key),
                      100 + p * 9000, (uint8_t)p, p + 1);
        if (p % 3 != 2 && p != 7) /* every third page left open, and the empty one */
            cr_assert_eq(kvr_ssdf_page_write(&f, &(kvr_ssd_page_t){.page = p, .version = p + 1, .file_id = f.file_id, .sealed = 1, .nrecords = 1, .used = off}),
                         KVR_OK);
    }
    cr_assert_eq(kvr_ssdf_scan_depth(&f, 1, collect, &sa, &a), KVR_OK);
    cr_assert_eq(kvr_ssdf_scan_depth(&f, 4, collect, &sb, &b), KVR_OK);
    cr_assert_eq(sa.n, 10);
    cr_assert_eq(sb.n, 10);
    for (int i = 0; i < sa.n; i++)
        cr_assert_geq(find(&sb, sa.keys[i]), 0, "%s", sa.keys[i]);
    cr_assert(a.pages_empty == 1 && b.pages_empty == 1);
    cr_assert_eq(a.pages_open, 4);
    cr_assert_eq(b.pages_open, 4);
    cr_assert(a.pages_sealed == 7 && b.pages_sealed == 7);
    cr_assert(a.records == b.records && a.record_bytes == b.record_bytes && a.max_version == 12 && b.max_version == 12);
    cr_assert(a.max_seq == 12 && b.max_seq == 12);
    kvr_ssdf_close(&f);
}

/* The summary of page p's records, read back from their headers as the writer would have kept
 * them; *n gets the count. */
static size_t summarize(kvr_ssdf_t *f, uint64_t p, uint64_t version, uint64_t used, uint8_t *out, uint32_t *n)
{
    static kvr_ssd_rec_t r;
    size_t len = 0;

    *n = 0;
    for (uint64_t off = KVR_SSD_ALIGN; off < used; off += kvr_ssd_rec_span(r.key_len, r.length)) {
        cr_assert_eq(kvr_ssdf_rec_read(f, p, version, off, &r), KVR_SSD_OK);
        len += kvr_ssd_sument_encode(&r, off, out + len);
        ++*n;
    }
    return len;
}

/* A page sealed with its summary is read from it in one read, on both scan paths; a summary
 * that does not check makes the scan walk the page's headers instead, with the same result. */
Test(ssdfile, sealed_pages_read_from_their_summary)
{
    kvr_ssdf_t f;
    kvr_ssdf_scan_t st;
    static seen_t seen;
    static uint8_t sum[16 * KVR_SSD_SUMENT_MAX];
    kvr_ssd_page_t pg = {.page = 0, .version = 3};
    uint64_t off = KVR_SSD_ALIGN;
    uint32_t n;
    size_t len;

    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    pg.file_id = f.file_id;
    cr_assert_eq(kvr_ssdf_page_write(&f, &pg), KVR_OK);
    off = put(&f, 0, 3, off, "sum-a", 1000, 1, 1);
    off = put(&f, 0, 3, off, "sum-b/with/a/longer/key", 70000, 2, 2);
    off = put(&f, 0, 3, off, "sum-c", 5, 3, 3);
    len = summarize(&f, 0, 3, off, sum, &n);
    pg.used = off;
    pg.nrecords = n;
    cr_assert_eq(kvr_ssdf_page_seal(&f, &pg, sum, len), KVR_OK);
    cr_assert(pg.sealed && pg.summary_len == len && pg.summary_sum != 0);
    for (unsigned depth = 1; depth <= 4; depth *= 4) {
        memset(&seen, 0, sizeof(seen));
        cr_assert_eq(kvr_ssdf_scan_depth(&f, depth, collect, &seen, &st), KVR_OK);
        cr_assert_eq(st.summaries, 1, "depth %u", depth);
        cr_assert(seen.n == 3 && st.records == 3 && st.record_bytes == 71005 && st.max_seq == 3);
        cr_assert(find(&seen, "sum-a") == 0 && find(&seen, "sum-b/with/a/longer/key") == 1 && find(&seen, "sum-c") == 2);
    }
    kvr_ssdf_close(&f);

    /* one byte of the summary flipped: its checksum fails, the headers are walked */
    flip(KVR_SSD_SUPER_BYTES + off + 70);
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    for (unsigned depth = 1; depth <= 4; depth *= 4) {
        memset(&seen, 0, sizeof(seen));
        cr_assert_eq(kvr_ssdf_scan_depth(&f, depth, collect, &seen, &st), KVR_OK);
        cr_assert(st.summaries == 0 && st.summaries_bad == 1, "depth %u", depth);
        cr_assert(seen.n == 3 && st.records == 3);
    }

    /* a summary that checks but names the first record twice: walked too */
    static kvr_ssd_rec_t a;
    cr_assert_eq(kvr_ssdf_rec_read(&f, 0, 3, KVR_SSD_ALIGN, &a), KVR_SSD_OK);
    len = kvr_ssd_sument_encode(&a, KVR_SSD_ALIGN, sum);
    len += kvr_ssd_sument_encode(&a, KVR_SSD_ALIGN, sum + len);
    len += kvr_ssd_sument_encode(&a, KVR_SSD_ALIGN, sum + len);
    pg.sealed = 0;
    cr_assert_eq(kvr_ssdf_page_seal(&f, &pg, sum, len), KVR_OK);
    memset(&seen, 0, sizeof(seen));
    cr_assert_eq(kvr_ssdf_scan(&f, collect, &seen, &st), KVR_OK);
    cr_assert(st.summaries == 0 && st.summaries_bad == 1 && seen.n == 3);
    kvr_ssdf_close(&f);
}
