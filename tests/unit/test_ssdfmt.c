/* The disk tier's on-disk headers (wire/ssdfmt.c): round trips, every bound refused, every
 * single flipped byte of a header refused, stale records told apart, and the body checksum
 * over pieces equal to the one-shot one. */
#include "wire/ssdfmt.h"

#include <criterion/criterion.h>
#include <string.h>
#include <xxhash.h>

#define PAGE (64ull << 20)

static uint8_t buf[KVR_SSD_ALIGN];

/* Rewrites a header's checksum after a test changed a field, so the field check is reached. */
static void reseal(uint8_t *b)
{
    uint64_t s = XXH3_64bits(b, KVR_SSD_ALIGN - 8);
    for (int i = 0; i < 8; i++)
        b[KVR_SSD_ALIGN - 8 + i] = (uint8_t)(s >> (8 * i));
}

static kvr_ssd_rec_t rec(const char *key, uint64_t length)
{
    kvr_ssd_rec_t r;

    memset(&r, 0, sizeof(r));
    r.version = 7;
    r.seq = 123456789;
    r.key_len = (uint16_t)strlen(key);
    memcpy(r.key, key, r.key_len);
    r.khash = XXH3_64bits(key, r.key_len);
    r.canon = 0xfeedfacecafebeefull;
    r.length = length;
    r.body_sum = 0x1122334455667788ull;
    r.written_ns = 42;
    r.ns_len = (uint8_t)strlen("tenant-a");
    memcpy(r.ns, "tenant-a", r.ns_len);
    r.model_len = (uint8_t)strlen("meta-llama/Llama-3-8B");
    memcpy(r.model, "meta-llama/Llama-3-8B", r.model_len);
    return r;
}

Test(ssdfmt, super_round_trip_and_bounds)
{
    kvr_ssd_super_t s = {.layout = KVR_SSD_LAYOUT, .page_size = PAGE, .npages = 16, .file_id = 99, .created_ns = 5}, d;

    memset(buf, 0, sizeof(buf));
    cr_assert_eq(kvr_ssd_super_decode(buf, &d), KVR_SSD_EMPTY);
    kvr_ssd_super_encode(&s, buf);
    cr_assert_eq(kvr_ssd_super_decode(buf, &d), KVR_SSD_OK);
    cr_assert(d.layout == s.layout && d.page_size == PAGE && d.npages == 16 && d.file_id == 99 && d.created_ns == 5);
    buf[0] = 'X';
    cr_assert_eq(kvr_ssd_super_decode(buf, &d), KVR_SSD_BAD_MAGIC);
    kvr_ssd_super_encode(&s, buf);
    buf[20] ^= 1;
    cr_assert_eq(kvr_ssd_super_decode(buf, &d), KVR_SSD_BAD_SUM, "a flipped page size");

    const kvr_ssd_super_t bad[] = {
        {.layout = 2, .page_size = PAGE, .npages = 1},
        {.layout = KVR_SSD_LAYOUT, .page_size = PAGE + 512, .npages = 1},
        {.layout = KVR_SSD_LAYOUT, .page_size = KVR_SSD_PAGE_MIN / 2, .npages = 1},
        {.layout = KVR_SSD_LAYOUT, .page_size = KVR_SSD_PAGE_MAX * 2, .npages = 1},
        {.layout = KVR_SSD_LAYOUT, .page_size = PAGE, .npages = 0},
        {.layout = KVR_SSD_LAYOUT, .page_size = PAGE, .npages = KVR_SSD_PAGES_MAX + 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvr_ssd_super_encode(&bad[i], buf);
        cr_assert_eq(kvr_ssd_super_decode(buf, &d), KVR_SSD_BAD_FIELD, "case %zu", i);
    }
    kvr_ssd_super_encode(&s, buf);
    buf[13] = 1; /* the reserved word after the layout */
    reseal(buf);
    cr_assert_eq(kvr_ssd_super_decode(buf, &d), KVR_SSD_BAD_FIELD, "a reserved byte set");
}

Test(ssdfmt, page_open_and_sealed)
{
    kvr_ssd_page_t p = {.page = 3, .version = 11, .file_id = 99, .opened_ns = 8}, d;

    kvr_ssd_page_encode(&p, buf);
    cr_assert_eq(kvr_ssd_page_decode(buf, 3, 99, PAGE, &d), KVR_SSD_OK);
    cr_assert(d.page == 3 && d.version == 11 && !d.sealed && d.nrecords == 0);
    cr_assert_eq(kvr_ssd_page_decode(buf, 4, 99, PAGE, &d), KVR_SSD_BAD_FIELD, "another page's header");
    cr_assert_eq(kvr_ssd_page_decode(buf, 3, 98, PAGE, &d), KVR_SSD_BAD_FIELD, "another file's page");

    p.nrecords = 1; /* an open page says nothing of its records */
    kvr_ssd_page_encode(&p, buf);
    cr_assert_eq(kvr_ssd_page_decode(buf, 3, 99, PAGE, &d), KVR_SSD_BAD_FIELD);

    p = (kvr_ssd_page_t){.page = 3, .version = 11, .file_id = 99, .sealed = 1, .nrecords = 2, .used = 5 * KVR_SSD_ALIGN, .summary_len = 200, .summary_sum = 77};
    kvr_ssd_page_encode(&p, buf);
    cr_assert_eq(kvr_ssd_page_decode(buf, 3, 99, PAGE, &d), KVR_SSD_OK);
    cr_assert(d.sealed && d.nrecords == 2 && d.used == 5 * KVR_SSD_ALIGN && d.summary_len == 200 && d.summary_sum == 77);
    p.summary_len = p.summary_sum = 0; /* sealed without a summary: the scan walks the headers */
    kvr_ssd_page_encode(&p, buf);
    cr_assert_eq(kvr_ssd_page_decode(buf, 3, 99, PAGE, &d), KVR_SSD_OK);

    const kvr_ssd_page_t bad[] = {
        {.page = 3, .version = 0, .file_id = 99},                                               /* version 0 */
        {.page = 3, .version = 1, .file_id = 99, .sealed = 2},                                  /* sealed not 0/1 */
        {.page = 3, .version = 1, .file_id = 99, .sealed = 1, .used = 100},                     /* unaligned used */
        {.page = 3, .version = 1, .file_id = 99, .sealed = 1, .used = PAGE + 4096},             /* past the page */
        {.page = 3, .version = 1, .file_id = 99, .sealed = 1, .nrecords = 3, .used = 5 * 4096}, /* 3 records in 4 units */
        {.page = 3, .version = 1, .file_id = 99, .sealed = 1, .nrecords = 1, .used = PAGE - 4096, .summary_len = 8192},
        {.page = 3, .version = 1, .file_id = 99, .sealed = 1, .nrecords = 2, .used = 5 * 4096, .summary_len = 119},
        {.page = 3, .version = 1, .file_id = 99, .sealed = 1, .nrecords = 1, .used = 3 * 4096, .summary_len = KVR_SSD_SUMENT_MAX + 1},
        {.page = 3, .version = 1, .file_id = 99, .sealed = 1, .nrecords = 0, .used = 4096, .summary_len = 60},
        {.page = 3, .version = 1, .file_id = 99, .sealed = 1, .nrecords = 1, .used = 3 * 4096, .summary_sum = 5},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvr_ssd_page_encode(&bad[i], buf);
        cr_assert_eq(kvr_ssd_page_decode(buf, 3, 99, PAGE, &d), KVR_SSD_BAD_FIELD, "case %zu", i);
    }
}

Test(ssdfmt, record_round_trip)
{
    kvr_ssd_rec_t r = rec("prefix/0001/layer-07", 2u << 20);
    static kvr_ssd_rec_t d;

    kvr_ssd_rec_encode(&r, buf);
    cr_assert_eq(kvr_ssd_rec_decode(buf, 7, KVR_SSD_ALIGN, PAGE, &d), KVR_SSD_OK);
    cr_assert(d.version == 7 && d.seq == r.seq && d.khash == r.khash && d.canon == r.canon && d.length == r.length &&
              d.body_sum == r.body_sum && d.written_ns == 42 && d.key_len == r.key_len);
    cr_assert_str_eq(d.ns, "tenant-a");
    cr_assert_str_eq(d.model, "meta-llama/Llama-3-8B");
    cr_assert(memcmp(d.key, r.key, r.key_len) == 0);
    cr_assert_eq(kvr_ssd_rec_decode(buf, 8, KVR_SSD_ALIGN, PAGE, &d), KVR_SSD_STALE, "the page was recycled since");

    /* the longest key and names fit */
    memset(r.key, 'k', KVR_KEY_MAX);
    r.key_len = KVR_KEY_MAX;
    r.khash = XXH3_64bits(r.key, KVR_KEY_MAX);
    memset(r.ns, 'n', KVR_SSD_NS_NAME_MAX);
    r.ns_len = KVR_SSD_NS_NAME_MAX;
    memset(r.model, 'm', KVR_SSD_MODEL_MAX);
    r.model_len = KVR_SSD_MODEL_MAX;
    kvr_ssd_rec_encode(&r, buf);
    cr_assert_eq(kvr_ssd_rec_decode(buf, 7, KVR_SSD_ALIGN, PAGE, &d), KVR_SSD_OK);
    cr_assert_eq(d.key_len, KVR_KEY_MAX);
    cr_assert_eq(strlen(d.model), KVR_SSD_MODEL_MAX);
    cr_assert_eq(d.flags, 0);

    /* a tombstone: no payload; with one it is refused */
    r = rec("deleted/key", 0);
    r.flags = KVR_SSD_REC_TOMBSTONE;
    kvr_ssd_rec_encode(&r, buf);
    cr_assert_eq(kvr_ssd_rec_decode(buf, 7, KVR_SSD_ALIGN, PAGE, &d), KVR_SSD_OK);
    cr_assert_eq(d.flags, KVR_SSD_REC_TOMBSTONE);
    cr_assert_eq(kvr_ssd_rec_span(d.key_len, d.length), 2 * KVR_SSD_ALIGN);
    r.length = 1;
    kvr_ssd_rec_encode(&r, buf);
    cr_assert_eq(kvr_ssd_rec_decode(buf, 7, KVR_SSD_ALIGN, PAGE, &d), KVR_SSD_BAD_FIELD, "a tombstone with a payload");
}

Test(ssdfmt, record_bounds)
{
    static kvr_ssd_rec_t d;
    kvr_ssd_rec_t r = rec("k", 100);
    uint64_t span = kvr_ssd_rec_span(1, 100);

    cr_assert_eq(span, 2 * KVR_SSD_ALIGN);
    cr_assert_eq(kvr_ssd_rec_span(100, 4096 - 100), 2 * KVR_SSD_ALIGN, "key and payload share the padding");
    cr_assert_eq(kvr_ssd_rec_span(100, 4096 - 99), 3 * KVR_SSD_ALIGN);

    kvr_ssd_rec_encode(&r, buf);
    cr_assert_eq(kvr_ssd_rec_decode(buf, 7, PAGE - span, PAGE, &d), KVR_SSD_OK, "the last record of a page");
    cr_assert_eq(kvr_ssd_rec_decode(buf, 7, PAGE - span + KVR_SSD_ALIGN, PAGE, &d), KVR_SSD_BAD_FIELD, "past the page");
    cr_assert_eq(kvr_ssd_rec_decode(buf, 7, 0, PAGE, &d), KVR_SSD_BAD_FIELD, "over the page header");
    cr_assert_eq(kvr_ssd_rec_decode(buf, 7, KVR_SSD_ALIGN + 512, PAGE, &d), KVR_SSD_BAD_FIELD, "unaligned");

    r.length = PAGE; /* cannot fit with its header */
    kvr_ssd_rec_encode(&r, buf);
    cr_assert_eq(kvr_ssd_rec_decode(buf, 7, KVR_SSD_ALIGN, PAGE, &d), KVR_SSD_BAD_FIELD);

    r = rec("k", 100);
    r.khash ^= 1; /* the key does not hash to khash */
    kvr_ssd_rec_encode(&r, buf);
    cr_assert_eq(kvr_ssd_rec_decode(buf, 7, KVR_SSD_ALIGN, PAGE, &d), KVR_SSD_BAD_FIELD);

    struct {
        size_t at;
        uint8_t v;
        const char *what;
    } bad[] = {
        {64, 0, "key_len 0"},
        {65, 0x05, "key_len past KVR_KEY_MAX"},
        {66, 0, "ns_len 0"},
        {66, 33, "ns_len past 32"},
        {67, 0, "model_len 0"},
        {67, 129, "model_len past 128"},
        {68, ' ', "a space in ns"},
        {100, 0x07, "a control byte in model"},
        {228, 2, "an unknown flag"},
        {231, 0x80, "an unknown flag, high bit"},
        {240, 1, "the gap after the flags"},
        {256 + 1, 'x', "past the key"},
        {1300, 1, "past the key field"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvr_ssd_rec_encode(&r, buf);
        buf[bad[i].at] = bad[i].v;
        reseal(buf);
        cr_assert_eq(kvr_ssd_rec_decode(buf, 7, KVR_SSD_ALIGN, PAGE, &d), KVR_SSD_BAD_FIELD, "%s", bad[i].what);
    }
}

/* Any one byte of a header changed, checksum included, and the decoder refuses it. */
Test(ssdfmt, every_flipped_byte_is_refused)
{
    static kvr_ssd_rec_t d;
    kvr_ssd_rec_t r = rec("blk-1", 32u << 20);
    kvr_ssd_page_t p = {.page = 1, .version = 7, .file_id = 99, .sealed = 1, .nrecords = 1, .used = 3 * KVR_SSD_ALIGN, .summary_len = 100, .summary_sum = 3};
    kvr_ssd_page_t dp;
    static uint8_t good[KVR_SSD_ALIGN];

    kvr_ssd_rec_encode(&r, good);
    for (size_t i = 0; i < KVR_SSD_ALIGN; i++) {
        memcpy(buf, good, sizeof(buf));
        buf[i] ^= 0x5a;
        cr_assert_neq(kvr_ssd_rec_decode(buf, 7, KVR_SSD_ALIGN, PAGE, &d), KVR_SSD_OK, "record byte %zu", i);
    }
    kvr_ssd_page_encode(&p, good);
    for (size_t i = 0; i < KVR_SSD_ALIGN; i++) {
        memcpy(buf, good, sizeof(buf));
        buf[i] ^= 0x01;
        cr_assert_neq(kvr_ssd_page_decode(buf, 1, 99, PAGE, &dp), KVR_SSD_OK, "page byte %zu", i);
    }
}

Test(ssdfmt, summary_entries)
{
    static uint8_t e[2 * KVR_SSD_SUMENT_MAX];
    static kvr_ssd_rec_t d;
    kvr_ssd_rec_t r = rec("prefix/0001/layer-07", 2u << 20), r2 = rec("k2", 10);
    uint64_t off;
    size_t n, n1, n2;

    n1 = kvr_ssd_sument_encode(&r, KVR_SSD_ALIGN, e);
    cr_assert_eq(n1, KVR_SSD_SUMENT_FIXED + 8 + 21 + 20);
    n2 = kvr_ssd_sument_encode(&r2, KVR_SSD_ALIGN + kvr_ssd_rec_span(r.key_len, r.length), e + n1);
    cr_assert_eq(kvr_ssd_sument_decode(e, n1 + n2, 9, PAGE, &d, &off, &n), KVR_SSD_OK);
    cr_assert(n == n1 && off == KVR_SSD_ALIGN && d.version == 9, "an entry takes its page's version");
    cr_assert(d.seq == r.seq && d.khash == r.khash && d.canon == r.canon && d.length == r.length &&
              d.body_sum == r.body_sum && d.written_ns == r.written_ns && d.key_len == r.key_len);
    cr_assert_str_eq(d.ns, "tenant-a");
    cr_assert_str_eq(d.model, "meta-llama/Llama-3-8B");
    cr_assert(memcmp(d.key, r.key, r.key_len) == 0);
    cr_assert_eq(kvr_ssd_sument_decode(e + n1, n2, 9, PAGE, &d, &off, &n), KVR_SSD_OK);
    cr_assert(n == n2 && off == KVR_SSD_ALIGN + 514 * KVR_SSD_ALIGN && d.key_len == 2);

    cr_assert_eq(kvr_ssd_sument_decode(e, n1 - 1, 9, PAGE, &d, &off, &n), KVR_SSD_BAD_FIELD, "cut short");
    cr_assert_eq(kvr_ssd_sument_decode(e, 10, 9, PAGE, &d, &off, &n), KVR_SSD_BAD_FIELD, "shorter than its fixed part");
    cr_assert_eq(kvr_ssd_sument_decode(e, n1, 9, 2u << 20, &d, &off, &n), KVR_SSD_BAD_FIELD, "past a smaller page");
    struct {
        size_t at;
        uint8_t v;
        const char *what;
    } bad[] = {
        {0, 0, "over the page header"},
        {4, 7, "a span its lengths do not make"},
        {16, 1, "the key does not hash to khash"},
        {56, 0, "key_len 0"},
        {58, 0, "ns_len 0"},
        {60, 2, "an unknown flag"},
        {64, ' ', "a space in ns"},
        {72, 0x01, "a control byte in model"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvr_ssd_sument_encode(&r, KVR_SSD_ALIGN, e);
        e[bad[i].at] = bad[i].v;
        cr_assert_eq(kvr_ssd_sument_decode(e, n1, 9, PAGE, &d, &off, &n), KVR_SSD_BAD_FIELD, "%s", bad[i].what);
    }
}

Test(ssdfmt, body_checksum_in_pieces)
{
    static uint8_t body[300000];
    kvr_ssd_sum_t *s = kvr_ssd_sum_new();

    cr_assert_not_null(s);
    for (size_t i = 0; i < sizeof(body); i++)
        body[i] = (uint8_t)(i * 2654435761u >> 13);
    kvr_ssd_sum_update(s, body, 5);
    kvr_ssd_sum_update(s, body + 5, 4091);
    kvr_ssd_sum_update(s, body + 4096, sizeof(body) - 4096);
    cr_assert_eq(kvr_ssd_sum_digest(s), kvr_ssd_sum(body, sizeof(body)));
    kvr_ssd_sum_reset(s);
    kvr_ssd_sum_update(s, body, 1);
    cr_assert_neq(kvr_ssd_sum_digest(s), kvr_ssd_sum(body, sizeof(body)));
    uint64_t before = kvr_ssd_sum(body, sizeof(body));
    body[123456] ^= 1;
    cr_assert_neq(kvr_ssd_sum(body, sizeof(body)), before, "one flipped bit of a body changes its sum");
    kvr_ssd_sum_free(s);
}
