/* The disk writer's side of the store (core/store_demote.c) with the real engine
 * (io/ssdtier.c) on a file under /var/tmp and the disk index in the segment: only blocks read
 * since they were stored are picked, within the window from the LRU tail; the picked blocks
 * stay pinned until committed; a block deleted between its copy and its commit is not indexed;
 * the writer's skip keeps a block from being picked twice; what went to disk reads back
 * byte-exact from the disk index. */
#include "io/ssdtier.h"
#include "store_fixture.h"

#include <unistd.h>

#define BLK   100000
#define PAGE  (1ull << 20)
#define SIZE  (KVR_SSD_SUPER_BYTES + 8 * PAGE)
#define SLOTS 128

static char dir[64], path[128];
static fx_t f;
static kvr_ssdt_t tier;

static int resolve(void *ctx, const kvr_ssd_rec_t *rec, uint16_t *ns, uint64_t *seed, uint8_t *pool)
{
    (void)rec;
    *ns = KVR_NS_DEFAULT;
    *seed = kvr_store_ns_seed(ctx, KVR_NS_DEFAULT);
    *pool = 0;
    return KVR_OK;
}

static void setup(void)
{
    fx_open_ssd(&f, 4ull << 20, SLOTS);
    strcpy(dir, "/var/tmp/kvr-demote-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/ssd", dir);
    cr_assert_eq(kvr_ssdt_open(&tier, path, SIZE, PAGE, &f.st.dx, resolve, &f.st), KVR_OK);
}

static void teardown(void)
{
    kvr_ssdt_close(&tier);
    unlink(path);
    rmdir(dir);
    fx_close(&f);
}

TestSuite(store_demote, .init = setup, .fini = teardown);

static const char *key_of(int k)
{
    static char key[32];
    snprintf(key, sizeof(key), "demote/%03d", k);
    return key;
}

/* What the writer does with one pick: copy the chain to disk, then commit it (index it) under
 * the store lock; `between` runs after the copy and before the commit. */
typedef struct {
    kvr_ssdt_blk_t b;
    kvr_ssdp_loc_t loc;
} put_ctx_t;

static int do_index(void *ctx)
{
    put_ctx_t *p = ctx;
    return kvr_ssdt_index(&tier, &p->b, &p->loc);
}

static int write_one(kvr_demote_t *d, void (*between)(void))
{
    struct iovec iov[64];
    size_t n = kvr_store_ref_chain_iov(&f.st, &d->ref, iov, 64);
    put_ctx_t p = {.b = {.ns = d->ns, .pool = d->pool, .seed = kvr_store_ns_seed(&f.st, d->ns), .key = iov[0].iov_base, .key_len = d->key_len, .length = d->ref.length, .canon = d->ref.canon, .ns_name = "default", .model = "kvrelay"}};
    int rc;

    cr_assert_gt(n, 0);
    cr_assert_eq(kvr_ssdt_write(&tier, &p.b, iov, (int)n, &p.loc), KVR_OK);
    if (between != NULL)
        between();
    rc = kvr_store_demote_commit(&f.st, d, do_index, &p);
    if (rc != KVR_OK)
        kvr_ssdt_unwrite(&tier, &p.loc);
    return rc;
}

/* Reads key k from the disk tier; 1 when it is there with the fixture's bytes. */
static int on_disk(int k)
{
    const char *key = key_of(k);
    size_t klen = strlen(key);
    uint64_t h1, h2;
    kvr_dslot_t s;
    uint32_t id;
    uint8_t *buf = NULL, *want = malloc(BLK);
    int ok;

    kvr_dindex_hash(kvr_store_ns_seed(&f.st, KVR_NS_DEFAULT), key, klen, &h1, &h2);
    if (kvr_dindex_lookup(&f.st.dx, KVR_NS_DEFAULT, h1, h2, (uint16_t)klen, &s, &id) != 1) {
        free(want);
        return 0;
    }
    cr_assert_eq(posix_memalign((void **)&buf, KVR_SSD_ALIGN, kvr_ssd_rec_span(klen, BLK)), 0);
    fx_fill(want, BLK, key);
    ok = kvr_ssdt_read(&tier, &s, key, klen, buf) == KVR_OK && memcmp(buf + klen, want, BLK) == 0;
    free(buf);
    free(want);
    return ok;
}

static unsigned pinned(void)
{
    kvr_store_stats_t s;
    kvr_store_stats(&f.st, &s);
    return (unsigned)s.pinned_blocks;
}

static void delete_3(void)
{
    uint32_t left;
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, key_of(3), strlen(key_of(3)), &left), KVR_OK);
}

/* The writer's record of what it wrote: entry -> generation. */
static uint32_t wrote_gen[1 << 12];
static int wrote(void *ctx, uint32_t entry, uint32_t gen)
{
    (void)ctx;
    return entry < (1u << 12) && wrote_gen[entry] == gen + 1;
}

Test(store_demote, admitted_blocks_are_pinned_copied_and_indexed)
{
    kvr_demote_t d[16];
    unsigned n;

    for (int k = 0; k < 10; k++)
        cr_assert_eq(fx_put(&f, key_of(k), BLK), KVR_PUT_CREATED);
    for (int k = 0; k < 5; k++) /* read: admitted */
        cr_assert(fx_verify(&f.st, key_of(k), BLK));
    cr_assert_eq(fx_put(&f, key_of(6), BLK), KVR_PUT_DEDUP, "a PUT again admits too");

    n = kvr_store_demote_pick(&f.st, UINT64_MAX, d, 16, NULL, NULL, NULL);
    cr_assert_eq(n, 6, "the five read and the one PUT again");
    cr_assert_eq(pinned(), 6, "picked blocks are pinned: eviction leaves them");
    for (unsigned i = 0; i < n; i++)
        cr_assert_eq(write_one(&d[i], NULL), KVR_OK);
    cr_assert_eq(pinned(), 0, "every pick released once committed");
    for (int k = 0; k < 10; k++)
        cr_assert_eq(on_disk(k), k < 5 || k == 6, "block %d", k);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
}

/* The same, one step at a time, with the delete between copy and commit of block 3. */
Test(store_demote, a_block_deleted_during_its_copy_is_not_indexed)
{
    kvr_demote_t d[16];
    unsigned n;
    int committed = 0, refused = 0;

    for (int k = 0; k < 6; k++) {
        cr_assert_eq(fx_put(&f, key_of(k), BLK), KVR_PUT_CREATED);
        cr_assert(fx_verify(&f.st, key_of(k), BLK));
    }
    n = kvr_store_demote_pick(&f.st, UINT64_MAX, d, 16, NULL, NULL, NULL);
    cr_assert_eq(n, 6);
    for (unsigned i = 0; i < n; i++) {
        struct iovec iov[4];
        cr_assert_gt(kvr_store_ref_chain_iov(&f.st, &d[i].ref, iov, 4), 0);
        int is3 = memcmp(iov[0].iov_base, key_of(3), d[i].key_len) == 0;
        int rc = write_one(&d[i], is3 ? delete_3 : NULL);
        if (is3) {
            cr_assert_eq(rc, KVR_ENOTFOUND, "deleted meanwhile: not indexed");
            refused++;
        } else {
            cr_assert_eq(rc, KVR_OK);
            committed++;
        }
    }
    cr_assert(committed == 5 && refused == 1);
    cr_assert_eq(pinned(), 0);
    for (int k = 0; k < 6; k++)
        cr_assert_eq(on_disk(k), k != 3, "block %d", k);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
}

Test(store_demote, window_and_skip_bound_the_picks)
{
    kvr_demote_t d[16];
    unsigned n;

    for (int k = 0; k < 8; k++) {
        cr_assert_eq(fx_put(&f, key_of(k), BLK), KVR_PUT_CREATED);
        cr_assert(fx_verify(&f.st, key_of(k), BLK)); /* each read in PUT order: LRU order kept */
    }
    n = kvr_store_demote_pick(&f.st, 3 * BLK, d, 16, NULL, NULL, NULL);
    cr_assert_eq(n, 3, "the window covers the three least recently used");
    for (unsigned i = 0; i < n; i++) {
        struct iovec iov[4];
        cr_assert_gt(kvr_store_ref_chain_iov(&f.st, &d[i].ref, iov, 4), 0);
        cr_assert_eq(memcmp(iov[0].iov_base, "demote/00", 9), 0);
        char c = ((char *)iov[0].iov_base)[9];
        cr_assert(c >= '0' && c <= '2', "block %c is not among the oldest three", c);
        cr_assert_eq(write_one(&d[i], NULL), KVR_OK);
        wrote_gen[d[i].ref.entry] = d[i].ref.gen + 1;
    }
    n = kvr_store_demote_pick(&f.st, 3 * BLK, d, 16, wrote, NULL, NULL);
    cr_assert_eq(n, 0, "what the writer wrote is not picked again");
    n = kvr_store_demote_pick(&f.st, UINT64_MAX, d, 2, wrote, NULL, NULL);
    cr_assert_eq(n, 2, "cap");
    for (unsigned i = 0; i < n; i++)
        kvr_store_demote_release(&f.st, &d[i]);
    cr_assert_eq(pinned(), 0);
    for (int k = 0; k < 3; k++)
        cr_assert(on_disk(k), "block %d", k);
    cr_assert_eq(on_disk(5), 0);
}

/* The writer's record of blocks the pick found on disk already. */
static unsigned found;
static int found_on_disk(void *ctx, uint32_t entry, uint32_t gen)
{
    (void)ctx;
    found++;
    cr_assert_lt(entry, 1u << 12);
    wrote_gen[entry] = gen + 1;
    return 1;
}

/* A block back in RAM with a copy on disk (a promotion: a new entry, so the writer's record of
 * the old one does not name it) is not pinned by the pick: a small arena full of promoted
 * blocks would otherwise be pinned whole while the writer drops them one by one, and a
 * promotion meanwhile would find no room. */
Test(store_demote, a_block_already_on_disk_is_not_pinned)
{
    kvr_demote_t d[16];
    uint32_t left;
    unsigned n;

    for (int k = 0; k < 4; k++) {
        cr_assert_eq(fx_put(&f, key_of(k), BLK), KVR_PUT_CREATED);
        cr_assert(fx_verify(&f.st, key_of(k), BLK));
    }
    n = kvr_store_demote_pick(&f.st, UINT64_MAX, d, 16, wrote, found_on_disk, NULL);
    cr_assert_eq(n, 4);
    for (unsigned i = 0; i < n; i++)
        cr_assert_eq(write_one(&d[i], NULL), KVR_OK);
    for (int k = 0; k < 3; k++) { /* evicted from RAM (the disk copy stays), then promoted */
        cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, key_of(k), strlen(key_of(k)), &left), KVR_OK);
        cr_assert_eq(fx_put(&f, key_of(k), BLK), KVR_PUT_CREATED);
        cr_assert(fx_verify(&f.st, key_of(k), BLK));
    }
    cr_assert_eq(fx_put(&f, key_of(9), BLK), KVR_PUT_CREATED); /* no disk copy: still picked */
    cr_assert(fx_verify(&f.st, key_of(9), BLK));
    found = 0;
    n = kvr_store_demote_pick(&f.st, UINT64_MAX, d, 16, wrote, found_on_disk, NULL);
    cr_assert_eq(found, 4, "the three promoted and the one never released, found without a pin");
    cr_assert_eq(n, 1, "only the block without a copy is picked");
    cr_assert_eq(pinned(), 1);
    cr_assert_eq(write_one(&d[0], NULL), KVR_OK);
    wrote_gen[d[0].ref.entry] = d[0].ref.gen + 1; /* as the writer records a copy it made */
    cr_assert_eq(pinned(), 0);
    found = 0;
    n = kvr_store_demote_pick(&f.st, UINT64_MAX, d, 16, wrote, found_on_disk, NULL);
    cr_assert(n == 0 && found == 0, "what was found is recorded: no lookup again (%u, %u)", n, found);
    for (int k = 0; k < 4; k++)
        cr_assert(on_disk(k), "block %d", k);
    cr_assert(on_disk(9));
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
}
