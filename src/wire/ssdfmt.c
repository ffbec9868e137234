/*
 * ssdfmt.c — the disk tier's superblock, page and record headers (see ssdfmt.h for the rules,
 * docs/ssd-tier.md for the layout's reasons).
 *
 * Offsets, in every header's KVR_SSD_ALIGN bytes (all little-endian; bytes not named are zero
 * and checked to be zero; the last 8 bytes are the XXH3-64 of the 4088 before them):
 *   superblock  0 "KVRSSDSB", 8 layout u32, 16 page_size, 24 npages, 32 file_id, 40 created_ns
 *   page        0 "KVRSSDPG", 8 page, 16 version, 24 file_id, 32 opened_ns, 40 sealed u32,
 *               44 nrecords u32, 48 used, 56 summary_len, 64 summary_sum
 *   record      0 "KVRSSDRC", 8 version, 16 seq, 24 khash, 32 canon, 40 length, 48 body_sum,
 *               56 written_ns, 64 key_len u16, 66 ns_len u8, 67 model_len u8, 68 ns[32],
 *               100 model[128], 228 flags u32, 256 key[1024]
 *   summary entry (no checksum of its own: the page header has the summary's)
 *               0 off4k u32, 4 span4k u32, 8 seq, 16 khash, 24 canon, 32 length, 40 body_sum,
 *               48 written_ns, 56 key_len u16, 58 ns_len u8, 59 model_len u8, 60 flags u32,
 *               64 ns, model, key
 */
#include "wire/ssdfmt.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define SUM_AT    (KVR_SSD_ALIGN - 8)
#define REC_NS    68
#define REC_MODEL 100
#define REC_FLAGS 228
#define REC_KEY   256
#define REC_END   (REC_KEY + KVR_KEY_MAX)
#define SUPER_END 48
#define PAGE_END  72

static_assert(REC_END <= SUM_AT, "a record header holds its key");
static_assert(REC_MODEL - REC_NS == KVR_SSD_NS_NAME_MAX, "record layout");
static_assert(REC_MODEL + KVR_SSD_MODEL_MAX == REC_FLAGS, "record layout");
static_assert(REC_FLAGS + 4 <= REC_KEY, "record layout");

static const uint8_t MAGIC_SUPER[8] = {'K', 'V', 'R', 'S', 'S', 'D', 'S', 'B'};
static const uint8_t MAGIC_PAGE[8] = {'K', 'V', 'R', 'S', 'S', 'D', 'P', 'G'};
static const uint8_t MAGIC_REC[8] = {'K', 'V', 'R', 'S', 'S', 'D', 'R', 'C'};

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void seal(uint8_t *out)
{
    put64(out + SUM_AT, XXH3_64bits(out, SUM_AT));
}

static int zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            return 0;
    return 1;
}

/* The checks every header shares: empty, magic, checksum, and zero where nothing is written. */
static int check_header(const uint8_t *in, const uint8_t magic[8], size_t end, const uint8_t *gaps, size_t ngaps)
{
    if (zero(in, KVR_SSD_ALIGN))
        return KVR_SSD_EMPTY;
    if (memcmp(in, magic, 8) != 0)
        return KVR_SSD_BAD_MAGIC;
    if (get64(in + SUM_AT) != XXH3_64bits(in, SUM_AT))
        return KVR_SSD_BAD_SUM;
    if (!zero(in + end, SUM_AT - end))
        return KVR_SSD_BAD_FIELD;
    for (size_t i = 0; i + 1 < ngaps; i += 2)
        if (!zero(in + gaps[i], gaps[i + 1]))
            return KVR_SSD_BAD_FIELD;
    return KVR_SSD_OK;
}

void kvr_ssd_super_encode(const kvr_ssd_super_t *s, uint8_t *out)
{
    memset(out, 0, KVR_SSD_ALIGN);
    memcpy(out, MAGIC_SUPER, 8);
    put32(out + 8, s->layout);
    put64(out + 16, s->page_size);
    put64(out + 24, s->npages);
    put64(out + 32, s->file_id);
    put64(out + 40, s->created_ns);
    seal(out);
}

int kvr_ssd_super_decode(const uint8_t *in, kvr_ssd_super_t *out)
{
    static const uint8_t gaps[] = {12, 4};
    int rc = check_header(in, MAGIC_SUPER, SUPER_END, gaps, sizeof(gaps));

    if (rc != KVR_SSD_OK)
        return rc;
    out->layout = get32(in + 8);
    out->page_size = get64(in + 16);
    out->npages = get64(in + 24);
    out->file_id = get64(in + 32);
    out->created_ns = get64(in + 40);
    if (out->layout != KVR_SSD_LAYOUT || out->page_size < KVR_SSD_PAGE_MIN || out->page_size > KVR_SSD_PAGE_MAX ||
        out->page_size % KVR_SSD_ALIGN != 0 || out->npages == 0 || out->npages > KVR_SSD_PAGES_MAX)
        return KVR_SSD_BAD_FIELD;
    return KVR_SSD_OK;
}

void kvr_ssd_page_encode(const kvr_ssd_page_t *p, uint8_t *out)
{
    memset(out, 0, KVR_SSD_ALIGN);
    memcpy(out, MAGIC_PAGE, 8);
    put64(out + 8, p->page);
    put64(out + 16, p->version);
    put64(out + 24, p->file_id);
    put64(out + 32, p->opened_ns);
    put32(out + 40, p->sealed);
    put32(out + 44, p->nrecords);
    put64(out + 48, p->used);
    put64(out + 56, p->summary_len);
    put64(out + 64, p->summary_sum);
    seal(out);
}

int kvr_ssd_page_decode(const uint8_t *in, uint64_t page, uint64_t file_id, uint64_t page_size, kvr_ssd_page_t *out)
{
    int rc = check_header(in, MAGIC_PAGE, PAGE_END, NULL, 0);

    if (rc != KVR_SSD_OK)
        return rc;
    out->page = get64(in + 8);
    out->version = get64(in + 16);
    out->file_id = get64(in + 24);
    out->opened_ns = get64(in + 32);
    out->sealed = get32(in + 40);
    out->nrecords = get32(in + 44);
    out->used = get64(in + 48);
    out->summary_len = get64(in + 56);
    out->summary_sum = get64(in + 64);
    if (out->page != page || out->file_id != file_id || out->version == 0 || out->sealed > 1)
        return KVR_SSD_BAD_FIELD;
    if (!out->sealed)
        return out->nrecords == 0 && out->used == 0 && out->summary_len == 0 && out->summary_sum == 0 ? KVR_SSD_OK
                                                                                                      : KVR_SSD_BAD_FIELD;
    /* sealed: records from the header to `used`, each at least two units (its header and one of
     * body), then the summary (when there is one): an entry per record, all inside the page */
    if (out->used < KVR_SSD_ALIGN || out->used % KVR_SSD_ALIGN != 0 || out->used > page_size ||
        out->nrecords > (out->used - KVR_SSD_ALIGN) / (2 * KVR_SSD_ALIGN) || out->summary_len > page_size - out->used ||
        (out->summary_len > 0 && (out->nrecords == 0 || out->summary_len < (uint64_t)out->nrecords * KVR_SSD_SUMENT_FIXED ||
                                  out->summary_len > (uint64_t)out->nrecords * KVR_SSD_SUMENT_MAX)) ||
        (out->summary_len == 0 && out->summary_sum != 0))
        return KVR_SSD_BAD_FIELD;
    return KVR_SSD_OK;
}

/* A name field: len printable ASCII bytes (no space, no control, no NUL), then zeroes. */
static int name_ok(const uint8_t *p, size_t len, size_t field)
{
    if (len == 0 || len > field)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (p[i] <= 0x20 || p[i] >= 0x7f)
            return 0;
    return zero(p + len, field - len);
}

/* Only known flags, and a tombstone carries no payload. */
static int flags_ok(const kvr_ssd_rec_t *r)
{
    return (r->flags & ~(uint32_t)KVR_SSD_REC_TOMBSTONE) == 0 && (!(r->flags & KVR_SSD_REC_TOMBSTONE) || r->length == 0);
}

void kvr_ssd_rec_encode(const kvr_ssd_rec_t *r, uint8_t *out)
{
    memset(out, 0, KVR_SSD_ALIGN);
    memcpy(out, MAGIC_REC, 8);
    put64(out + 8, r->version);
    put64(out + 16, r->seq);
    put64(out + 24, r->khash);
    put64(out + 32, r->canon);
    put64(out + 40, r->length);
    put64(out + 48, r->body_sum);
    put64(out + 56, r->written_ns);
    put16(out + 64, r->key_len);
    out[66] = r->ns_len;
    out[67] = r->model_len;
    memcpy(out + REC_NS, r->ns, r->ns_len <= KVR_SSD_NS_NAME_MAX ? r->ns_len : KVR_SSD_NS_NAME_MAX);
    memcpy(out + REC_MODEL, r->model, r->model_len <= KVR_SSD_MODEL_MAX ? r->model_len : KVR_SSD_MODEL_MAX);
    put32(out + REC_FLAGS, r->flags);
    memcpy(out + REC_KEY, r->key, r->key_len <= KVR_KEY_MAX ? r->key_len : KVR_KEY_MAX);
    seal(out);
}

int kvr_ssd_rec_decode(const uint8_t *in, uint64_t page_version, uint64_t off, uint64_t page_size, kvr_ssd_rec_t *out)
{
    static const uint8_t gaps[] = {REC_FLAGS + 4, REC_KEY - REC_FLAGS - 4};
    int rc = check_header(in, MAGIC_REC, REC_END, gaps, sizeof(gaps));
    uint64_t span;

    if (rc != KVR_SSD_OK)
        return rc;
    out->version = get64(in + 8);
    out->seq = get64(in + 16);
    out->khash = get64(in + 24);
    out->canon = get64(in + 32);
    out->length = get64(in + 40);
    out->body_sum = get64(in + 48);
    out->written_ns = get64(in + 56);
    out->key_len = get16(in + 64);
    out->ns_len = in[66];
    out->model_len = in[67];
    out->flags = get32(in + REC_FLAGS);
    if (!flags_ok(out) || out->key_len == 0 || out->key_len > KVR_KEY_MAX ||
        !zero(in + REC_KEY + out->key_len, KVR_KEY_MAX - out->key_len) ||
        !name_ok(in + REC_NS, out->ns_len, KVR_SSD_NS_NAME_MAX) ||
        !name_ok(in + REC_MODEL, out->model_len, KVR_SSD_MODEL_MAX) || out->length > page_size)
        return KVR_SSD_BAD_FIELD;
    span = kvr_ssd_rec_span(out->key_len, out->length);
    if (off < KVR_SSD_ALIGN || off % KVR_SSD_ALIGN != 0 || off > page_size || span > page_size - off)
        return KVR_SSD_BAD_FIELD;
    memcpy(out->ns, in + REC_NS, out->ns_len);
    out->ns[out->ns_len] = '\0';
    memcpy(out->model, in + REC_MODEL, out->model_len);
    out->model[out->model_len] = '\0';
    memcpy(out->key, in + REC_KEY, out->key_len);
    if (XXH3_64bits(out->key, out->key_len) != out->khash)
        return KVR_SSD_BAD_FIELD;
    return out->version == page_version ? KVR_SSD_OK : KVR_SSD_STALE;
}

size_t kvr_ssd_sument_encode(const kvr_ssd_rec_t *r, uint64_t off, uint8_t *out)
{
    uint8_t *p = out + KVR_SSD_SUMENT_FIXED;

    put32(out, (uint32_t)(off / KVR_SSD_ALIGN));
    put32(out + 4, (uint32_t)(kvr_ssd_rec_span(r->key_len, r->length) / KVR_SSD_ALIGN));
    put64(out + 8, r->seq);
    put64(out + 16, r->khash);
    put64(out + 24, r->canon);
    put64(out + 32, r->length);
    put64(out + 40, r->body_sum);
    put64(out + 48, r->written_ns);
    put16(out + 56, r->key_len);
    out[58] = r->ns_len;
    out[59] = r->model_len;
    put32(out + 60, r->flags);
    memcpy(p, r->ns, r->ns_len);
    p += r->ns_len;
    memcpy(p, r->model, r->model_len);
    p += r->model_len;
    memcpy(p, r->key, r->key_len);
    return KVR_SSD_SUMENT_FIXED + (size_t)r->ns_len + r->model_len + r->key_len;
}

int kvr_ssd_sument_decode(const uint8_t *in, size_t avail, uint64_t version, uint64_t page_size, kvr_ssd_rec_t *r,
                          uint64_t *off, size_t *size)
{
    uint64_t off4k, span4k;
    size_t n;

    if (avail < KVR_SSD_SUMENT_FIXED)
        return KVR_SSD_BAD_FIELD;
    off4k = get32(in);
    span4k = get32(in + 4);
    r->version = version;
    r->seq = get64(in + 8);
    r->khash = get64(in + 16);
    r->canon = get64(in + 24);
    r->length = get64(in + 32);
    r->body_sum = get64(in + 40);
    r->written_ns = get64(in + 48);
    r->key_len = get16(in + 56);
    r->ns_len = in[58];
    r->model_len = in[59];
    r->flags = get32(in + 60);
    n = KVR_SSD_SUMENT_FIXED + (size_t)r->ns_len + r->model_len + r->key_len;
    if (n > avail || !flags_ok(r) || r->key_len == 0 || r->key_len > KVR_KEY_MAX || r->length > page_size ||
        !name_ok(in + KVR_SSD_SUMENT_FIXED, r->ns_len, r->ns_len) ||
        !name_ok(in + KVR_SSD_SUMENT_FIXED + r->ns_len, r->model_len, r->model_len) || r->ns_len > KVR_SSD_NS_NAME_MAX ||
        r->model_len > KVR_SSD_MODEL_MAX || off4k < 1 || span4k * KVR_SSD_ALIGN != kvr_ssd_rec_span(r->key_len, r->length) ||
        (off4k + span4k) * KVR_SSD_ALIGN > page_size)
        return KVR_SSD_BAD_FIELD;
    memcpy(r->ns, in + KVR_SSD_SUMENT_FIXED, r->ns_len);
    r->ns[r->ns_len] = '\0';
    memcpy(r->model, in + KVR_SSD_SUMENT_FIXED + r->ns_len, r->model_len);
    r->model[r->model_len] = '\0';
    memcpy(r->key, in + KVR_SSD_SUMENT_FIXED + r->ns_len + r->model_len, r->key_len);
    if (XXH3_64bits(r->key, r->key_len) != r->khash)
        return KVR_SSD_BAD_FIELD;
    *off = off4k * KVR_SSD_ALIGN;
    *size = n;
    return KVR_SSD_OK;
}

struct kvr_ssd_sum_s {
    XXH3_state_t *st;
};

kvr_ssd_sum_t *kvr_ssd_sum_new(void)
{
    kvr_ssd_sum_t *s = malloc(sizeof(*s));

    if (s == NULL)
        return NULL;
    s->st = XXH3_createState();
    if (s->st == NULL) {
        free(s);
        return NULL;
    }
    kvr_ssd_sum_reset(s);
    return s;
}

void kvr_ssd_sum_reset(kvr_ssd_sum_t *s)
{
    (void)XXH3_64bits_reset(s->st);
}

void kvr_ssd_sum_update(kvr_ssd_sum_t *s, const void *p, size_t n)
{
    (void)XXH3_64bits_update(s->st, p, n);
}

uint64_t kvr_ssd_sum_digest(const kvr_ssd_sum_t *s)
{
    return XXH3_64bits_digest(s->st);
}

void kvr_ssd_sum_free(kvr_ssd_sum_t *s)
{
    if (s == NULL)
        return;
    XXH3_freeState(s->st);
    free(s);
}

uint64_t kvr_ssd_sum(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

const char *kvr_ssd_strerror(int rc)
{
    switch (rc) {
    case KVR_SSD_OK: return "ok";
    case KVR_SSD_EMPTY: return "never written";
    case KVR_SSD_BAD_MAGIC: return "not a header of this kind";
    case KVR_SSD_BAD_SUM: return "checksum mismatch (torn or corrupted)";
    case KVR_SSD_BAD_FIELD: return "a field out of bounds";
    case KVR_SSD_STALE: return "left from an earlier use of its page";
    }
    return "unknown";
}
