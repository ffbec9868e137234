/* Unit tests of the arena (src/shm/arena.c): page runs, allocation, claims of chains. */
#include "shm/arena.h"

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

Test(arena, high_water_rises_with_fresh_pages_and_never_falls)
{
    ta_t t;
    uint32_t a, b;

    ta_init(&t, 1000);
    cr_assert_eq(kvr_arena_high_water(&t.a), 0);
    a = kvr_arena_alloc_locked(&t.a, 10);
    cr_assert_eq(a, 0, "a fresh arena is cut from its low end");
    cr_assert_eq(kvr_arena_high_water(&t.a), 10);
    b = kvr_arena_alloc_locked(&t.a, 30);
    cr_assert_eq(kvr_arena_high_water(&t.a), 40);
    kvr_arena_free_locked(&t.a, a);
    kvr_arena_free_locked(&t.a, b);
    cr_assert_eq(kvr_arena_high_water(&t.a), 40, "frees leave the mark");
    a = kvr_arena_alloc_locked(&t.a, 5);
    cr_assert_eq(kvr_arena_high_water(&t.a), 40, "reused pages below the mark leave it");
    b = kvr_arena_alloc_locked(&t.a, 995);
    cr_assert_neq(b, KVR_NIL);
    cr_assert_eq(kvr_arena_high_water(&t.a), 1000);
    ta_free(&t);
}
