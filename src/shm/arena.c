/* arena.c — see arena.h for the design. */
#include "shm/arena.h"

#include "base/dassert.h"

#define LEN(a, p)       ((a)->pages[p].len & ~KVR_PAGE_FREE)
#define BIT_TEST(bm, i) ((bm)[(i) >> 3] & (1u << ((i)&7)))
#define BIT_SET(bm, i)  ((bm)[(i) >> 3] |= (uint8_t)(1u << ((i)&7)))
#define BIT_CLR(bm, i)  ((bm)[(i) >> 3] &= (uint8_t) ~(1u << ((i)&7)))

/* The store lock is held by this process, or the arena is private (arena.h, "Locking"). */
KVR_DASSERT_FN static inline int arena_locked(const kvr_arena_t *a)
{
    return a->lock == NULL || kvr_shlock_held(a->lock);
}

static inline unsigned class_of(uint64_t len)
{
    return 63u - (unsigned)__builtin_clzll(len);
}

static inline void set_free_run(kvr_arena_t *a, uint32_t r, uint32_t len)
{
    a->pages[r].len = len | KVR_PAGE_FREE;
    a->pages[r + len - 1].tail = r | KVR_PAGE_FREE;
}

static inline void set_used_run(kvr_arena_t *a, uint32_t r, uint32_t len)
{
    a->pages[r].len = len;
    a->pages[r + len - 1].tail = r;
}

static void list_insert(kvr_arena_t *a, uint32_t r)
{
    kvr_arena_sh_t *sh = a->sh;
    unsigned c = class_of(LEN(a, r));
    uint32_t h = sh->class_head[c];

    a->pages[r].prev = KVR_NIL;
    a->pages[r].next = h;
    if (h != KVR_NIL)
        a->pages[h].prev = r;
    sh->class_head[c] = r;
    sh->class_bitmap |= 1u << c;
}

static void list_remove(kvr_arena_t *a, uint32_t r)
{
    kvr_arena_sh_t *sh = a->sh;
    unsigned c = class_of(LEN(a, r));
    uint32_t prev = a->pages[r].prev, next = a->pages[r].next;

    if (prev != KVR_NIL)
        a->pages[prev].next = next;
    else
        sh->class_head[c] = next;
    if (next != KVR_NIL)
        a->pages[next].prev = prev;
    if (sh->class_head[c] == KVR_NIL)
        sh->class_bitmap &= ~(1u << c);
}

void kvr_arena_format(kvr_arena_t *a)
{
    kvr_arena_sh_t *sh = a->sh;
    uint64_t p = 0;

    for (unsigned c = 0; c < KVR_ARENA_CLASSES; c++)
        sh->class_head[c] = KVR_NIL;
    sh->class_bitmap = 0;
    sh->high_water = 0;
    sh->free_pages = sh->npages;
    /* Runs are capped below 2^31 pages by KVR_PAGE_FREE; npages < 2^30 (segment.c). */
    while (p < sh->npages) {
        uint32_t len = (uint32_t)(sh->npages - p);
        set_free_run(a, (uint32_t)p, len);
        list_insert(a, (uint32_t)p);
        p += len;
    }
}

uint32_t kvr_arena_alloc_locked(kvr_arena_t *a, uint64_t n)
{
    kvr_arena_sh_t *sh = a->sh;
    uint32_t head = KVR_NIL, last = KVR_NIL;
    uint64_t need = n;

    KVR_DASSERT(arena_locked(a));
    if (n == 0 || sh->free_pages < n)
        return KVR_NIL;
    while (need > 0) {
        unsigned c0 = need == 1 ? 0 : 64u - (unsigned)__builtin_clzll(need - 1); /* ceil log2 */
        uint32_t fit = c0 >= 32 ? 0 : sh->class_bitmap & ~((1u << c0) - 1);
        uint32_t r, len, take;

        if (fit) /* every run of this list is >= need: one contiguous piece */
            r = sh->class_head[__builtin_ctz(fit)];
        else /* none long enough: take the longest there is and go on */
            r = sh->class_head[31 - __builtin_clz(sh->class_bitmap)];
        len = LEN(a, r);
        take = need < len ? (uint32_t)need : len;
        list_remove(a, r);
        if (len > take) {
            set_free_run(a, r + take, len - take);
            list_insert(a, r + take);
        }
        /* Tags first, then link: a crash leaves either an unlinked run (reclaimed by the
         * rebuild) or a complete chain prefix. */
        set_used_run(a, r, take);
        if (r + take > sh->high_water) /* our own stores, under the lock; read lock-free */
            kvr_atomic_store_relaxed(&sh->high_water, r + take);
        a->pages[r].next = KVR_NIL;
        a->pages[r].prev = KVR_NIL;
        if (last == KVR_NIL)
            head = r;
        else
            a->pages[last].next = r;
        last = r;
        need -= take;
        sh->free_pages -= take;
    }
    return head;
}

static void free_run(kvr_arena_t *a, uint32_t r, uint32_t len)
{
    kvr_arena_sh_t *sh = a->sh;
    uint32_t e;

    sh->free_pages += len;
    if (r > 0 && (a->pages[r - 1].tail & KVR_PAGE_FREE)) {
        uint32_t h = a->pages[r - 1].tail & ~KVR_PAGE_FREE;
        list_remove(a, h);
        len += r - h;
        r = h;
    }
    e = r + len;
    if (e < sh->npages && (a->pages[e].len & KVR_PAGE_FREE)) {
        uint32_t l2 = LEN(a, e);
        list_remove(a, e);
        len += l2;
    }
    set_free_run(a, r, len);
    list_insert(a, r);
}

void kvr_arena_free_locked(kvr_arena_t *a, uint32_t head)
{
    uint32_t r = head;
    uint64_t guard = a->sh->npages;

    KVR_DASSERT(arena_locked(a));
    while (r != KVR_NIL && guard-- > 0) {
        uint32_t next = a->pages[r].next;
        free_run(a, r, LEN(a, r));
        r = next;
    }
}

uint32_t kvr_arena_chain_runs(const kvr_arena_t *a, uint32_t head)
{
    uint32_t n = 0, r = head;

    while (r != KVR_NIL) {
        if (r >= a->sh->npages || n >= a->sh->npages)
            return 0;
        n++;
        r = a->pages[r].next;
    }
    return n;
}

int kvr_arena_claim_chain(kvr_arena_t *a, uint32_t head, uint64_t expect, uint8_t *bm)
{
    uint64_t total = 0, npages = a->sh->npages;
    uint32_t r = head, bad = 0;

    KVR_DASSERT(arena_locked(a));
    /* First walk: validate and mark; a cycle or overlap shows up as an already-set bit. */
    while (r != KVR_NIL) {
        uint32_t len;
        if (r >= npages) {
            bad = 1;
            break;
        }
        len = LEN(a, r);
        if (len == 0 || (uint64_t)r + len > npages || total + len > expect) {
            bad = 1;
            break;
        }
        for (uint32_t i = 0; i < len; i++) {
            if (BIT_TEST(bm, r + i)) {
                /* unmark what this walk set in this run, then stop */
                for (uint32_t j = 0; j < i; j++)
                    BIT_CLR(bm, r + j);
                bad = 1;
                break;
            }
            BIT_SET(bm, r + i);
        }
        if (bad)
            break;
        total += len;
        r = a->pages[r].next;
    }
    if (!bad && total == expect) {
        for (r = head; r != KVR_NIL; r = a->pages[r].next)
            set_used_run(a, r, LEN(a, r));
        return 1;
    }
    /* Undo the marks of the complete runs walked before the failure. */
    for (uint32_t q = head, left = (uint32_t)total; q != KVR_NIL && left > 0; q = a->pages[q].next) {
        uint32_t len = LEN(a, q);
        for (uint32_t i = 0; i < len; i++)
            BIT_CLR(bm, q + i);
        left -= len;
    }
    return 0;
}

void kvr_arena_rebuild_locked(kvr_arena_t *a, const uint8_t *bm)
{
    kvr_arena_sh_t *sh = a->sh;
    uint64_t p = 0;

    KVR_DASSERT(arena_locked(a));
    for (unsigned c = 0; c < KVR_ARENA_CLASSES; c++)
        sh->class_head[c] = KVR_NIL;
    sh->class_bitmap = 0;
    sh->free_pages = 0;
    while (p < sh->npages) {
        uint64_t q = p;
        if (BIT_TEST(bm, p)) {
            p++;
            continue;
        }
        while (q < sh->npages && !BIT_TEST(bm, q))
            q++;
        set_free_run(a, (uint32_t)p, (uint32_t)(q - p));
        list_insert(a, (uint32_t)p);
        sh->free_pages += q - p;
        p = q;
    }
}

int kvr_arena_next_span(const kvr_arena_t *a, uint32_t *run, uint64_t *skip, uint8_t **ptr, uint64_t *len)
{
    uint32_t r = *run;
    uint64_t bytes;

    if (r == KVR_NIL || r >= a->sh->npages)
        return 0;
    /* Lock-free (arena.h, "Locking"): the caller keeps this chain, so its runs are in use. */
    KVR_DASSERT(!(a->pages[r].len & KVR_PAGE_FREE) && LEN(a, r) > 0);
    bytes = (uint64_t)LEN(a, r) << a->page_shift;
    if (*skip >= bytes) { /* skip spans a whole run (keys are shorter than a page) */
        *skip -= bytes;
        *run = a->pages[r].next;
        *len = 0;
        *ptr = NULL;
        return 1;
    }
    *ptr = kvr_arena_page(a, r) + *skip;
    *len = bytes - *skip;
    *skip = 0;
    *run = a->pages[r].next;
    return 1;
}

int kvr_arena_check_locked(const kvr_arena_t *a, const uint8_t *bm)
{
    const kvr_arena_sh_t *sh = a->sh;
    uint64_t free_total = 0, used = 0;

    KVR_DASSERT(arena_locked(a));
    for (unsigned c = 0; c < KVR_ARENA_CLASSES; c++) {
        uint32_t prev = KVR_NIL;
        int nonempty = sh->class_head[c] != KVR_NIL;
        if (nonempty != !!(sh->class_bitmap & (1u << c)))
            return KVR_ERR;
        for (uint32_t r = sh->class_head[c]; r != KVR_NIL; r = a->pages[r].next) {
            uint32_t len;
            if (r >= sh->npages || !(a->pages[r].len & KVR_PAGE_FREE))
                return KVR_ERR;
            len = LEN(a, r);
            if (len == 0 || r + len > sh->npages || class_of(len) != c)
                return KVR_ERR;
            if (a->pages[r].prev != prev || a->pages[r + len - 1].tail != (r | KVR_PAGE_FREE))
                return KVR_ERR;
            for (uint32_t i = 0; bm != NULL && i < len; i++)
                if (BIT_TEST(bm, r + i))
                    return KVR_ERR;
            free_total += len;
            if (free_total > sh->npages)
                return KVR_ERR;
            prev = r;
        }
    }
    if (free_total != sh->free_pages)
        return KVR_ERR;
    if (bm != NULL) {
        for (uint64_t p = 0; p < sh->npages; p++)
            used += BIT_TEST(bm, p) ? 1 : 0;
        if (used + free_total != sh->npages)
            return KVR_ERR;
    }
    return KVR_OK;
}
