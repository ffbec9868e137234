/* Unit tests of the arena (page runs) and of segment creation (huge pages and fallback). */
#include "base/log.h"
#include "core/store.h"
#include "shm/arena.h"
#include "shm/segment.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    kvr_arena_sh_t sh;
    kvr_arena_t a;
    uint8_t *bm;
} ta_t;

static void ta_init(ta_t *t, uint64_t npages)
{
    memset(&t->sh, 0, sizeof(t->sh));
    t->sh.npages = npages;
    t->a.sh = &t->sh;
    t->a.pages = calloc(npages, sizeof(kvr_page_t));
    t->a.data = NULL;
    t->a.page_shift = 12;
    t->a.lock = NULL; /* a private arena: no store lock to hold */
    t->bm = calloc((npages + 7) / 8, 1);
    kvr_arena_format(&t->a);
}

static void ta_free(ta_t *t)
{
    free(t->a.pages);
    free(t->bm);
}

static uint64_t chain_pages(ta_t *t, uint32_t head)
{
    uint64_t n = 0;
    for (uint32_t r = head; r != KVR_NIL; r = t->a.pages[r].next)
        n += t->a.pages[r].len & ~KVR_PAGE_FREE;
    return n;
}

/* Marks every live chain in the bitmap and checks the free lists against it. */
static int ta_check(ta_t *t, uint32_t *heads, uint64_t *sizes, int n)
{
    memset(t->bm, 0, (t->sh.npages + 7) / 8);
    for (int i = 0; i < n; i++)
        if (heads[i] != KVR_NIL && !kvr_arena_claim_chain(&t->a, heads[i], sizes[i], t->bm))
            return 0;
    return kvr_arena_check_locked(&t->a, t->bm) == KVR_OK;
}

Test(arena, fresh_arena_is_one_run_and_full_alloc_is_contiguous)
{
    ta_t t;
    uint32_t h;

    ta_init(&t, 1000);
    cr_assert_eq(t.sh.free_pages, 1000);
    h = kvr_arena_alloc_locked(&t.a, 1000);
    cr_assert_neq(h, KVR_NIL);
    cr_assert_eq(kvr_arena_chain_runs(&t.a, h), 1);
    cr_assert_eq(t.sh.free_pages, 0);
    cr_assert_eq(kvr_arena_alloc_locked(&t.a, 1), KVR_NIL);
    kvr_arena_free_locked(&t.a, h);
    cr_assert_eq(t.sh.free_pages, 1000);
    cr_assert_eq(__builtin_popcount(t.sh.class_bitmap), 1, "coalesced back to one run");
    ta_free(&t);
}

Test(arena, fragmented_free_space_is_gathered)
{
    ta_t t;
    uint32_t h[512];
    uint64_t sz[512];
    uint32_t big;

    ta_init(&t, 512);
    for (int i = 0; i < 512; i++) {
        h[i] = kvr_arena_alloc_locked(&t.a, 1);
        sz[i] = 1;
    }
    for (int i = 0; i < 512; i += 2) {
        kvr_arena_free_locked(&t.a, h[i]);
        h[i] = KVR_NIL;
    }
    cr_assert_eq(t.sh.free_pages, 256);
    big = kvr_arena_alloc_locked(&t.a, 256); /* no run longer than 1: 256 runs */
    cr_assert_neq(big, KVR_NIL);
    cr_assert_eq(kvr_arena_chain_runs(&t.a, big), 256);
    cr_assert_eq(chain_pages(&t, big), 256);
    cr_assert_eq(t.sh.free_pages, 0);
    h[0] = big;
    sz[0] = 256;
    cr_assert(ta_check(&t, h, sz, 512));
    ta_free(&t);
}

Test(arena, alloc_fails_cleanly_when_short)
{
    ta_t t;
    uint32_t a;

    ta_init(&t, 100);
    a = kvr_arena_alloc_locked(&t.a, 60);
    cr_assert_eq(kvr_arena_alloc_locked(&t.a, 41), KVR_NIL);
    cr_assert_eq(t.sh.free_pages, 40);
    cr_assert_eq(kvr_arena_alloc_locked(&t.a, 0), KVR_NIL);
    cr_assert(ta_check(&t, &a, (uint64_t[]){60}, 1));
    ta_free(&t);
}

Test(arena, random_churn_keeps_every_invariant)
{
    enum { N = 200 };
    ta_t t;
    uint32_t h[N];
    uint64_t sz[N];
    unsigned seed = 7;

    ta_init(&t, 4096);
    for (int i = 0; i < N; i++)
        h[i] = KVR_NIL;
    for (int op = 0; op < 50000; op++) {
        int i = rand_r(&seed) % N;
        if (h[i] == KVR_NIL) {
            uint64_t n = 1 + rand_r(&seed) % 97;
            h[i] = kvr_arena_alloc_locked(&t.a, n);
            sz[i] = n;
            if (h[i] != KVR_NIL)
                cr_assert_eq(chain_pages(&t, h[i]), n);
        } else {
            kvr_arena_free_locked(&t.a, h[i]);
            h[i] = KVR_NIL;
        }
        if (op % 1000 == 0)
            cr_assert(ta_check(&t, h, sz, N), "op %d", op);
    }
    cr_assert(ta_check(&t, h, sz, N));
    /* A rebuild from the bitmap gives the same free total and a valid structure. */
    {
        uint64_t free_before = t.sh.free_pages;
        kvr_arena_rebuild_locked(&t.a, t.bm);
        cr_assert_eq(t.sh.free_pages, free_before);
        cr_assert(ta_check(&t, h, sz, N));
    }
    for (int i = 0; i < N; i++)
        if (h[i] != KVR_NIL)
            kvr_arena_free_locked(&t.a, h[i]);
    cr_assert_eq(t.sh.free_pages, 4096);
    cr_assert_eq(__builtin_popcount(t.sh.class_bitmap), 1);
    ta_free(&t);
}

Test(arena, claim_rejects_bad_chains)
{
    ta_t t;
    uint32_t a, b;

    ta_init(&t, 64);
    a = kvr_arena_alloc_locked(&t.a, 8);
    b = kvr_arena_alloc_locked(&t.a, 8);
    cr_assert(kvr_arena_claim_chain(&t.a, a, 8, t.bm));
    cr_assert_not(kvr_arena_claim_chain(&t.a, a, 8, t.bm), "overlap with itself");
    cr_assert_not(kvr_arena_claim_chain(&t.a, b, 7, t.bm), "wrong length");
    t.a.pages[b].next = b; /* a cycle */
    cr_assert_not(kvr_arena_claim_chain(&t.a, b, 16, t.bm));
    cr_assert_not(kvr_arena_claim_chain(&t.a, 9999, 1, t.bm), "out of range");
    ta_free(&t);
}

/* ------------------------------------------------------------------ segment */

Test(segment, layout_is_aligned_and_sized_on_top_of_memory)
{
    kvr_seg_config_t cfg = {.memory = 64ull << 20};
    kvr_seg_hdr_t h;

    cr_assert_eq(kvr_seg_layout(&cfg, &h), KVR_OK);
    cr_assert_eq(h.arena_bytes, 64ull << 20);
    cr_assert_eq(h.off_arena % KVR_HUGE_PAGE, 0);
    cr_assert_eq(h.total_size % KVR_HUGE_PAGE, 0);
    cr_assert_gt(h.total_size, h.arena_bytes);
    cr_assert_eq(h.max_blocks, h.npages / 2);
    cr_assert_eq(h.off_entries % 64, 0);
    cr_assert_eq(h.off_log % 64, 0);
    cfg.page_size = 3000;
    cr_assert_eq(kvr_seg_layout(&cfg, &h), KVR_EINVAL);
    cfg.page_size = 4096;
    cfg.memory = 4096;
    cr_assert_eq(kvr_seg_layout(&cfg, &h), KVR_EINVAL, "too small to be useful");
}

Test(segment, runs_without_huge_pages)
{
    kvr_seg_t seg;
    kvr_seg_config_t cfg = {.memory = 8ull << 20, .hugepages = KVR_HUGEPAGES_OFF};

    kvr_log_level = KVR_LOG_ERROR;
    cr_assert_eq(kvr_seg_create(&seg, &cfg), KVR_OK);
    cr_assert_neq(seg.hdr->backing, KVR_BACKING_HUGETLB);
    cr_assert_eq(seg.hdr->magic, KVR_SEG_MAGIC);
    cr_assert_eq(seg.hdr->layout_version, KVR_SEG_LAYOUT_VERSION);
    kvr_seg_destroy(&seg);
}

static long read_long(const char *path)
{
    FILE *f = fopen(path, "r");
    long v = -1;
    if (f != NULL) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static int write_long(const char *path, long v)
{
    FILE *f = fopen(path, "w");
    int ok;
    if (f == NULL)
        return 0;
    ok = fprintf(f, "%ld\n", v) > 0;
    return fclose(f) == 0 && ok;
}

/* With too few huge pages reserved, AUTO falls back and still works; with enough, it uses them. */
Test(segment, uses_huge_pages_when_reserved_else_falls_back, .timeout = 60)
{
    const char *nr = "/proc/sys/vm/nr_hugepages";
    kvr_seg_config_t cfg = {.memory = 16ull << 20, .hugepages = KVR_HUGEPAGES_AUTO};
    kvr_seg_hdr_t h;
    kvr_seg_t seg;
    long orig = read_long(nr), free_now = read_long("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages") -
                                  read_long("/sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages");
    long need;
    kvr_store_t st;

    kvr_log_level = KVR_LOG_ERROR;
    cr_assert_eq(kvr_seg_layout(&cfg, &h), KVR_OK);
    need = (long)(h.total_size / KVR_HUGE_PAGE);

    if (free_now < need) {
        /* Fallback path: not enough reserved. */
        cr_assert_eq(kvr_seg_create(&seg, &cfg), KVR_OK);
        cr_assert_neq(seg.hdr->backing, KVR_BACKING_HUGETLB);
        kvr_seg_destroy(&seg);
        cfg.hugepages = KVR_HUGEPAGES_REQUIRE;
        cr_assert_eq(kvr_seg_create(&seg, &cfg), KVR_ERR, "REQUIRE fails without pages");
        cfg.hugepages = KVR_HUGEPAGES_AUTO;
    }

    /* Hugetlb path: reserve pages if we may (root), else skip saying why. */
    if (orig < 0 || (free_now < need && !write_long(nr, orig + need))) {
        cr_skip_test("cannot reserve %ld huge pages via %s (not root?): hugetlb path not exercised", need, nr);
    }
    /* free pages that other processes have reserved are not ours to take */
    if (read_long("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages") -
            read_long("/sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages") <
        need) {
        write_long(nr, orig);
        cr_skip_test("kernel granted fewer than %ld free huge pages: hugetlb path not exercised", need);
    }
    cr_assert_eq(kvr_seg_create(&seg, &cfg), KVR_OK);
    cr_expect_eq(seg.hdr->backing, KVR_BACKING_HUGETLB);
    cr_expect_eq(kvr_store_format(&seg, 0), KVR_OK);
    cr_expect_geq(kvr_seg_proc_claim(&seg, 0), 0);
    cr_expect_eq(kvr_store_open(&st, &seg), KVR_OK);
    cr_expect_eq(kvr_store_put(&st, "hp", 2, "bytes", 5, 0), KVR_PUT_CREATED);
    cr_expect_eq(kvr_store_exists(&st, "hp", 2, NULL), 1);
    kvr_seg_destroy(&seg);
    if (free_now < need)
        write_long(nr, orig);
}
