/* The disk tier's pages and write head (io/ssdpages.c) on a real file under /var/tmp: appends
 * fill pages in order and seal them with summaries a scan reads back, recycling takes the
 * oldest page and tells the indexer first, a restart continues versions and sequences and seals
 * the page that was open, records too large are refused without a write, and live counts follow
 * forget. Writes on the ring (reserve, next, settle) land where they were reserved, a page is
 * sealed only with none in flight, and a failed one cuts its page back to where it started. */
#include "io/ssdpages.h"
#include "io/ssdscan.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define PAGE  (1ull << 20)
#define PAGES 4
#define SIZE  (KVR_SSD_SUPER_BYTES + PAGES * PAGE)

static char dir[64], path[128];

static void setup(void)
{
    strcpy(dir, "/var/tmp/kvr-ssdp-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/ssd", dir);
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
}

TestSuite(ssdpages, .init = setup, .fini = teardown);

/* What the drop callback was told, in order. */
typedef struct {
    int n;
    uint64_t page[64], version[64];
} drops_t;

static void on_drop(void *ctx, uint64_t page, uint64_t version)
{
    drops_t *d = ctx;
    cr_assert_lt(d->n, 64);
    d->page[d->n] = page;
    d->version[d->n++] = version;
}

/* The record of key with a payload of len bytes (byte i: seed + i*3), its body in one aligned
 * piece (free() it). */
static uint8_t *make(const char *key, uint64_t len, uint8_t seed, kvr_ssd_rec_t *r)
{
    size_t klen = strlen(key), total = klen + len;
    uint8_t *b = NULL;

    cr_assert_eq(posix_memalign((void **)&b, KVR_SSD_ALIGN, total + KVR_SSD_ALIGN), 0);
    memcpy(b, key, klen);
    for (uint64_t i = 0; i < len; i++)
        b[klen + i] = (uint8_t)(seed + i * 3);
    memset(r, 0, sizeof(*r));
    r->key_len = (uint16_t)klen;
    memcpy(r->key, key, klen);
    r->khash = XXH3_64bits(key, klen);
    r->canon = r->khash ^ 1;
    r->length = len;
    r->ns_len = 7;
    memcpy(r->ns, "default", 7);
    r->model_len = 5;
    memcpy(r->model, "model", 5);
    return b;
}

/* Appends key with a payload of len bytes (byte i: seed + i*3) from one aligned piece. */
static int add(kvr_ssdp_t *p, const char *key, uint64_t len, uint8_t seed, kvr_ssdp_loc_t *loc)
{
    kvr_ssd_rec_t r;
    uint8_t *b = make(key, len, seed, &r);
    int rc = kvr_ssdp_append(p, &r, &(struct iovec){b, strlen(key) + len}, 1, loc);

    free(b);
    return rc;
}

/* A scan's records: key, page, version, offset, sequence. */
typedef struct {
    int n;
    char key[256][24];
    uint64_t page[256], version[256], off[256], seq[256];
    kvr_ssdp_t *feed; /* when set, each record is fed to the table too */
} seen_t;

static int collect(void *ctx, uint64_t page, uint64_t off, const kvr_ssd_page_t *pg, const kvr_ssd_rec_t *rec)
{
    seen_t *s = ctx;
    cr_assert_lt(s->n, 256);
    memcpy(s->key[s->n], rec->key, rec->key_len);
    s->key[s->n][rec->key_len] = '\0';
    s->page[s->n] = page;
    s->version[s->n] = pg->version;
    s->off[s->n] = off;
    s->seq[s->n++] = rec->seq;
    if (s->feed != NULL)
        kvr_ssdp_scan_rec(s->feed, page, off, pg, rec);
    return 0;
}

static int count(void *ctx, uint64_t page, uint64_t off, const kvr_ssd_page_t *pg, const kvr_ssd_rec_t *rec)
{
    (void)page, (void)off, (void)pg, (void)rec;
    (*(uint64_t *)ctx)++;
    return 0;
}

static int find(const seen_t *s, const char *key)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->key[i], key) == 0)
            return i;
    return -1;
}

/* Reads the record at loc back and checks its payload. */
static void check_body(kvr_ssdf_t *f, const kvr_ssdp_loc_t *loc, const char *key, uint64_t len, uint8_t seed)
{
    kvr_ssd_rec_t r;
    uint8_t *buf = NULL;

    cr_assert_eq(kvr_ssdf_rec_read(f, loc->page, loc->version, loc->off, &r), KVR_SSD_OK, "%s", key);
    cr_assert_eq(r.length, len);
    cr_assert_eq(posix_memalign((void **)&buf, KVR_SSD_ALIGN, loc->span), 0);
    cr_assert_eq(kvr_ssdf_body_read(f, loc->page, loc->off, &r, buf), KVR_OK, "%s", key);
    cr_assert_eq(memcmp(buf, key, strlen(key)), 0);
    for (uint64_t i = 0; i < len; i++)
        cr_assert_eq(buf[strlen(key) + i], (uint8_t)(seed + i * 3), "%s byte %llu", key, (unsigned long long)i);
    free(buf);
}

Test(ssdpages, fill_seal_recycle_oldest_first)
{
    kvr_ssdf_t f;
    kvr_ssdp_t p;
    drops_t d = {0};
    kvr_ssdp_loc_t loc[40];
    uint64_t span = kvr_ssd_rec_span(6, 200000); /* 50 pages of 4 KiB: 5 records per page */
    char key[16];

    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdp_init(&p, &f, on_drop, &d), KVR_OK);
    cr_assert_eq(kvr_ssdp_free_pages(&p), PAGES);
    for (int i = 0; i < 20; i++) { /* 4 pages' worth: no recycling yet */
        snprintf(key, sizeof(key), "k%05d", i);
        cr_assert_eq(add(&p, key, 200000, (uint8_t)i, &loc[i]), KVR_OK);
        cr_assert_eq(loc[i].page, (uint64_t)i / 5, "pages fill in order");
        cr_assert_eq(loc[i].version, (uint64_t)i / 5 + 1);
        cr_assert_eq(loc[i].span, span);
    }
    cr_assert_eq(d.n, 0);
    cr_assert_eq(p.st.sealed, 3);
    cr_assert_eq(kvr_ssdp_victim(&p), 0, "page 0 is the oldest sealed page");
    kvr_ssdp_forget(&p, 0, 1, span); /* live counts do not change the order: age does */
    cr_assert_eq(p.pg[0].live_records, 4);
    cr_assert_eq(kvr_ssdp_victim(&p), 0);

    for (int i = 20; i < 30; i++) { /* two more pages' worth: pages 0 and 1 are recycled, in that order */
        snprintf(key, sizeof(key), "k%05d", i);
        cr_assert_eq(add(&p, key, 200000, (uint8_t)i, &loc[i]), KVR_OK);
    }
    cr_assert_eq(d.n, 2);
    cr_assert(d.page[0] == 0 && d.version[0] == 1, "page 0 of version 1 went first");
    cr_assert(d.page[1] == 1 && d.version[1] == 2);
    cr_assert_eq(p.st.recycled_live, 4 + 5, "records still indexed when their page went");
    cr_assert_eq(loc[20].page, 0);
    cr_assert_eq(loc[20].version, 5);
    cr_assert_eq(loc[25].page, 1);
    cr_assert_eq(loc[25].version, 6);
    cr_assert_eq(kvr_ssdp_seal(&p), KVR_OK); /* a clean stop */
    for (int i = 10; i < 30; i++) {
        snprintf(key, sizeof(key), "k%05d", i);
        check_body(&f, &loc[i], key, 200000, (uint8_t)i);
    }
    /* an old pointer into a recycled page is stale, never another block */
    kvr_ssd_rec_t r;
    cr_assert_eq(kvr_ssdf_rec_read(&f, loc[0].page, loc[0].version, loc[0].off, &r), KVR_SSD_STALE);
    kvr_ssdp_free(&p);
    kvr_ssdf_close(&f);

    /* every page sealed with a summary: the scan reads them all from their summaries */
    seen_t s = {0};
    kvr_ssdf_scan_t st;
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdf_scan(&f, collect, &s, &st), KVR_OK);
    cr_assert_eq(st.pages_sealed, 4);
    cr_assert_eq(st.summaries, 4);
    cr_assert_eq(st.summaries_bad, 0);
    cr_assert_eq(st.records, 20);
    cr_assert_eq(st.max_version, 6);
    cr_assert_eq(st.max_seq, 30);
    for (int i = 10; i < 30; i++) {
        snprintf(key, sizeof(key), "k%05d", i);
        int j = find(&s, key);
        cr_assert_geq(j, 0, "%s found", key);
        cr_assert(s.page[j] == loc[i].page && s.off[j] == loc[i].off && s.version[j] == loc[i].version);
        cr_assert_eq(s.seq[j], (uint64_t)i + 1);
    }
    kvr_ssdf_close(&f);
}

Test(ssdpages, restart_continues_and_seals_the_open_page)
{
    kvr_ssdf_t f;
    kvr_ssdp_t p;
    kvr_ssdp_loc_t loc[8], more;
    char key[16];

    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdp_init(&p, &f, NULL, NULL), KVR_OK);
    for (int i = 0; i < 8; i++) { /* page 0 sealed (5), page 1 open with 3: then a "SIGKILL" */
        snprintf(key, sizeof(key), "r%05d", i);
        cr_assert_eq(add(&p, key, 200000, (uint8_t)(i + 100), &loc[i]), KVR_OK);
    }
    cr_assert_eq(kvr_ssdp_sync(&p), KVR_OK);
    kvr_ssdp_free(&p); /* no seal: what a killed writer leaves */
    kvr_ssdf_close(&f);

    seen_t s = {0};
    kvr_ssdf_scan_t st;
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdp_init(&p, &f, NULL, NULL), KVR_OK);
    s.feed = &p;
    cr_assert_eq(kvr_ssdf_scan(&f, collect, &s, &st), KVR_OK);
    cr_assert_eq(st.records, 8);
    cr_assert_eq(st.pages_open, 1);
    cr_assert_eq(kvr_ssdp_scan_done(&p, &st), KVR_OK);
    cr_assert_eq(p.pg[1].state, KVR_SSDP_SEALED, "the page open at the stop is sealed");
    cr_assert_eq(p.pg[1].used, loc[7].off + loc[7].span);
    cr_assert_eq(p.pg[0].live_records, 5);
    cr_assert_eq(p.pg[1].live_records, 3);
    cr_assert_eq(kvr_ssdp_free_pages(&p), 2);
    cr_assert_eq(add(&p, "after", 1000, 7, &more), KVR_OK);
    cr_assert_eq(more.page, 2, "appends start a fresh page");
    cr_assert_eq(more.version, 3, "versions continue");
    cr_assert_eq(kvr_ssdp_seal(&p), KVR_OK);
    kvr_ssdp_free(&p);
    kvr_ssdf_close(&f);

    seen_t s2 = {0};
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdf_scan(&f, collect, &s2, &st), KVR_OK);
    cr_assert_eq(st.pages_open, 0);
    cr_assert_eq(st.pages_sealed, 3);
    cr_assert_eq(st.summaries, 2, "pages 0 and 2 have summaries; page 1 was sealed without one");
    cr_assert_eq(st.records, 9);
    int j = find(&s2, "after");
    cr_assert_geq(j, 0);
    cr_assert_eq(s2.seq[j], 9, "sequences continue");
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof(key), "r%05d", i);
        check_body(&f, &loc[i], key, 200000, (uint8_t)(i + 100));
    }
    kvr_ssdf_close(&f);
}

Test(ssdpages, too_large_refused_and_summary_room_kept)
{
    kvr_ssdf_t f;
    kvr_ssdp_t p;
    kvr_ssdp_loc_t loc;
    char key[300];
    int n = 0;

    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdp_init(&p, &f, NULL, NULL), KVR_OK);
    cr_assert_eq(add(&p, "big", PAGE / 2, 1, &loc), KVR_EINVAL, "more than half a page");
    cr_assert_eq(p.open, KVR_SSDP_NONE, "nothing opened, nothing written");
    cr_assert_eq(p.st.appended, 0);

    /* Long keys and tiny payloads: 2 blocks of 4 KiB per record, each summary entry ~270 B.
     * Pages seal before the summary runs out of room, and every seal succeeds. */
    while (p.st.sealed < 3 && n < 1000) {
        memset(key, 'a' + n % 26, 200);
        snprintf(key + 200, sizeof(key) - 200, "%06d", n);
        cr_assert_eq(add(&p, key, 100, (uint8_t)n, &loc), KVR_OK);
        n++;
    }
    cr_assert_eq(p.st.sealed, 3);
    cr_assert_eq(kvr_ssdp_seal(&p), KVR_OK);
    kvr_ssdp_free(&p);
    kvr_ssdf_close(&f);

    uint64_t got = 0;
    kvr_ssdf_scan_t st;
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdf_scan(&f, count, &got, &st), KVR_OK);
    cr_assert_eq(st.summaries, 4);
    cr_assert_eq(st.summaries_bad, 0);
    cr_assert_eq(st.records, (uint64_t)n);
    cr_assert_eq(got, (uint64_t)n);
    kvr_ssdf_close(&f);
}

/* Reserves n records of 200000 bytes (5 fit a page) as slots 0..n-1, from key index first. */
static void reserve_n(kvr_ssdp_t *p, int first, int n, kvr_ssdp_loc_t *loc, uint8_t **bufs)
{
    char key[16];
    kvr_ssd_rec_t r;

    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "q%05d", first + i);
        bufs[i] = make(key, 200000, (uint8_t)(first + i), &r);
        cr_assert_eq(kvr_ssdp_reserve(p, &r, &(struct iovec){bufs[i], strlen(key) + 200000}, 1, &loc[i], (unsigned)i), KVR_OK,
                     "%s", key);
    }
}

/* Takes every completion of n slots: ok[slot]. */
static void complete_n(kvr_ssdp_t *p, int n, int *ok)
{
    unsigned slot;
    int got = 0, o;

    for (int i = 0; i < n; i++)
        ok[i] = -1;
    while (got < n && kvr_ssdp_next(p, 1, &slot, &o) == 1) {
        cr_assert_lt(slot, (unsigned)n);
        cr_assert_eq(ok[slot], -1, "slot %u completed twice", slot);
        ok[slot] = o;
        got++;
    }
    cr_assert_eq(got, n, "every write completed");
    cr_assert_eq(kvr_ssdp_next(p, 0, &slot, &o), 0, "nothing more");
}

Test(ssdpages, ring_writes_land_where_reserved_and_a_full_page_waits_for_them)
{
    kvr_ssdf_t f;
    kvr_ssdp_t p;
    kvr_ssdp_loc_t loc[8];
    uint8_t *bufs[8];
    int ok[8];
    char key[16];
    kvr_ssd_rec_t r;

    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdp_init(&p, &f, NULL, NULL), KVR_OK);
    cr_assert_not_null(p.ring, "the writer's ring");
    reserve_n(&p, 0, 5, loc, bufs);
    cr_assert_eq(p.inflight, 5);
    cr_assert_eq(p.inflight_bytes, 5 * loc[0].span);
    for (int i = 1; i < 5; i++)
        cr_assert(loc[i].page == 0 && loc[i].off == loc[i - 1].off + loc[i - 1].span, "contiguous");
    /* a sixth does not fit: the page is sealed only once nothing is in flight */
    uint8_t *b = make("q00005", 200000, 5, &r);
    cr_assert_eq(kvr_ssdp_reserve(&p, &r, &(struct iovec){b, 6 + 200000}, 1, &loc[5], 5), KVR_AGAIN);
    cr_assert_eq(kvr_ssdp_reserve(&p, &r, &(struct iovec){b, 6 + 200000}, 1, &loc[5], 0), KVR_EINVAL, "slot 0 is in use");
    cr_assert_eq(p.pg[0].state, KVR_SSDP_OPEN);
    cr_assert_eq(kvr_ssdp_append(&p, &r, &(struct iovec){b, 6 + 200000}, 1, &loc[5]), KVR_AGAIN,
                 "no synchronous append while writes are in flight");
    complete_n(&p, 5, ok);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(ok[i], 1);
        kvr_ssdp_settle(&p, (unsigned)i, &loc[i], 1);
        free(bufs[i]);
    }
    cr_assert_eq(p.inflight, 0);
    cr_assert_eq(p.inflight_bytes, 0);
    cr_assert_eq(kvr_ssdp_reserve(&p, &r, &(struct iovec){b, 6 + 200000}, 1, &loc[5], 0), KVR_OK, "slot 0 is free again");
    cr_assert_eq(loc[5].page, 1, "the full page sealed, the next opened");
    cr_assert_eq(p.pg[0].state, KVR_SSDP_SEALED);
    complete_n(&p, 1, ok);
    cr_assert_eq(ok[0], 1);
    kvr_ssdp_settle(&p, 0, &loc[5], 1);
    free(b);
    cr_assert_eq(kvr_ssdp_seal(&p), KVR_OK);
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof(key), "q%05d", i);
        check_body(&f, &loc[i], key, 200000, (uint8_t)i);
    }
    kvr_ssdp_free(&p);
    kvr_ssdf_close(&f);

    kvr_ssdf_scan_t st;
    uint64_t n = 0;
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdf_scan(&f, count, &n, &st), KVR_OK);
    cr_assert_eq(n, 6);
    cr_assert_eq(st.summaries, 2, "both pages sealed with their summaries");
    cr_assert_eq(st.summaries_bad, 0);
    kvr_ssdf_close(&f);
}

/* kvr_ssdp_full_for says when a record would open a page (as place decides), never for one
 * that no page takes; kvr_ssdp_turn seals and opens only with nothing in flight. */
Test(ssdpages, full_for_and_turn)
{
    kvr_ssdf_t f;
    kvr_ssdp_t p;
    kvr_ssdp_loc_t loc[8];
    uint8_t *bufs[8];
    int ok[8];
    kvr_ssd_rec_t r, big;
    char key[16];

    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdp_init(&p, &f, NULL, NULL), KVR_OK);
    uint8_t *b = make("q00009", 200000, 9, &r);
    uint8_t *bb = make("big", PAGE / 2, 1, &big);
    cr_assert(kvr_ssdp_full_for(&p, &r), "no page open yet");
    cr_assert_not(kvr_ssdp_full_for(&p, &big), "larger than half a page: no page would take it");
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof(key), "k%05d", i);
        cr_assert_eq(add(&p, key, 200000, (uint8_t)i, &loc[i]), KVR_OK);
        cr_assert_not(kvr_ssdp_full_for(&p, &r), "room for a fifth after %d", i + 1);
    }
    cr_assert_eq(add(&p, "k00004", 200000, 4, &loc[4]), KVR_OK);
    cr_assert(kvr_ssdp_full_for(&p, &r), "five fill the page: a sixth opens the next");
    cr_assert_not(kvr_ssdp_full_for(&p, &big));
    cr_assert_eq(add(&p, "big", PAGE / 2, 1, &loc[5]), KVR_EINVAL);
    cr_assert(p.open == 0 && p.st.sealed == 0, "the refused record sealed nothing");

    cr_assert_eq(kvr_ssdp_turn(&p), KVR_OK);
    cr_assert(p.open == 1 && p.pg[0].state == KVR_SSDP_SEALED && p.st.sealed == 1);
    cr_assert_not(kvr_ssdp_full_for(&p, &r), "the new page is empty");
    reserve_n(&p, 20, 2, loc, bufs);
    cr_assert_eq(kvr_ssdp_turn(&p), KVR_AGAIN, "writes in flight: not sealed under them");
    cr_assert_eq(p.open, 1);
    complete_n(&p, 2, ok);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ok[i], 1);
        kvr_ssdp_settle(&p, (unsigned)i, &loc[i], 1);
        free(bufs[i]);
    }
    cr_assert_eq(kvr_ssdp_turn(&p), KVR_OK);
    cr_assert(p.open == 2 && p.pg[1].state == KVR_SSDP_SEALED && p.st.sealed == 2);
    free(b);
    free(bb);
    cr_assert_eq(kvr_ssdp_seal(&p), KVR_OK);
    kvr_ssdp_free(&p);
    kvr_ssdf_close(&f);
}

/* The seal slots' bound (KVR_SSDP_SEALS_MAX): with no sync asked for, the 16th sealed page
 * waiting starts one on the ring without waiting for it, and every header gets written. */
Test(ssdpages, half_the_seal_slots_waiting_start_a_sync)
{
    enum { N = KVR_SSDP_SEALS_MAX / 2 + 2 };
    kvr_ssdf_t f;
    kvr_ssdp_t p;
    kvr_ssdp_loc_t loc;
    char key[16];
    int k = 0;

    cr_assert_eq(kvr_ssdf_open(&f, path, KVR_SSD_SUPER_BYTES + (N + 1) * PAGE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdp_init(&p, &f, NULL, NULL), KVR_OK);
    cr_assert_not_null(p.ring);
    while (p.st.sealed < KVR_SSDP_SEALS_MAX / 2 - 1) { /* 5 records of 200000 bytes a page */
        snprintf(key, sizeof(key), "s%05d", k);
        cr_assert_eq(add(&p, key, 200000, (uint8_t)k, &loc), KVR_OK);
        k++;
    }
    cr_assert_eq(p.st.syncs, 0, "15 sealed pages wait: no sync yet");
    while (p.st.sealed < KVR_SSDP_SEALS_MAX / 2) {
        snprintf(key, sizeof(key), "s%05d", k);
        cr_assert_eq(add(&p, key, 200000, (uint8_t)k, &loc), KVR_OK);
        k++;
    }
    cr_assert_eq(p.st.syncs, 1, "the 16th started one");
    cr_assert_eq(p.st.sync_waits, 0, "and nothing waited for it");
    cr_assert_eq(kvr_ssdp_seal(&p), KVR_OK);
    kvr_ssdp_free(&p);
    kvr_ssdf_close(&f);

    kvr_ssdf_scan_t st;
    uint64_t n = 0;
    cr_assert_eq(kvr_ssdf_open(&f, path, KVR_SSD_SUPER_BYTES + (N + 1) * PAGE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdf_scan(&f, count, &n, &st), KVR_OK);
    cr_assert_eq(n, (uint64_t)k);
    cr_assert_eq(st.pages_sealed, KVR_SSDP_SEALS_MAX / 2 + 1, "every page's header says sealed");
    kvr_ssdf_close(&f);
}

Test(ssdpages, a_failed_ring_write_cuts_its_page_back_and_gives_up_the_rest)
{
    kvr_ssdf_t f;
    kvr_ssdp_t p;
    kvr_ssdp_loc_t loc[4];
    uint8_t *bufs[4];
    int ok[4], bad = -1;
    char key[16];

    setenv("KVRELAY_SSD_FAULT", "write-eio:3", 1); /* the third write to complete fails */
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdp_init(&p, &f, NULL, NULL), KVR_OK);
    reserve_n(&p, 0, 4, loc, bufs);
    complete_n(&p, 4, ok);
    for (int i = 0; i < 4; i++) /* in reservation order, as the writer settles them */
        if (bad < 0 && !ok[i])
            bad = i;
    cr_assert_geq(bad, 0, "one write failed");
    for (int i = 0; i < 4; i++) {
        kvr_ssdp_settle(&p, (unsigned)i, &loc[i], i < bad);
        free(bufs[i]);
    }
    cr_assert_eq(p.pg[0].state, KVR_SSDP_SEALED, "sealed at the cut, nothing in flight");
    cr_assert_eq(p.pg[0].used, loc[bad].off);
    cr_assert_eq(p.pg[0].nrecords, (uint32_t)bad);
    cr_assert_eq(p.pg[0].live_records, (uint32_t)bad);
    cr_assert_eq(p.pg[0].live_bytes, (uint64_t)bad * loc[0].span);
    cr_assert_eq(kvr_ssdp_seal(&p), KVR_OK);
    kvr_ssdp_free(&p);
    kvr_ssdf_close(&f);
    unsetenv("KVRELAY_SSD_FAULT");

    seen_t s = {0};
    kvr_ssdf_scan_t st;
    cr_assert_eq(kvr_ssdf_open(&f, path, SIZE, PAGE, NULL), KVR_OK);
    cr_assert_eq(kvr_ssdf_scan(&f, collect, &s, &st), KVR_OK);
    cr_assert_eq(st.summaries_bad, 0, "the summary ends at the cut");
    cr_assert_eq(s.n, bad, "the records before the failed one, and only them");
    for (int i = 0; i < bad; i++) {
        snprintf(key, sizeof(key), "q%05d", i);
        cr_assert_geq(find(&s, key), 0, "%s", key);
    }
    kvr_ssdf_close(&f);
}
