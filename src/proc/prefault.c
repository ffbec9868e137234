/* prefault.c — see prefault.h. */
#include "proc/prefault.h"

#include "base/clock.h"
#include "base/log.h"
#include "shm/segment.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older headers lack it */
#endif

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif

#define HUGE_BYTES KVR_HUGE_PAGE
#define STEP_BYTES (16ull << 20) /* one madvise: short, so that the mark is looked at often */
#define NAP_MIN_NS 1000000ull    /* the mark moved: look again soon */
#define NAP_MAX_NS 16000000ull   /* idle: at 3.5 GB/s a fill moves 56 MiB in this, under the lead */

typedef struct {
    const kvr_arena_t *arena;
    uint64_t lead_pages;
    int collapse; /* also collapse each mapped 2 MiB into one huge page */
} prefault_t;

static void nap(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

/* MADV_POPULATE_WRITE of n pages from page `from`: 0, or -1 (logged) when the kernel refuses. */
static int populate(const kvr_arena_t *a, uint64_t from, uint64_t n, uint64_t npages)
{
    while (madvise(kvr_arena_page(a, (uint32_t)from), n << a->page_shift, MADV_POPULATE_WRITE) != 0) {
        if (errno == EINTR || errno == EAGAIN)
            continue;
        kvr_warn("arena prefault stops at page %llu of %llu: madvise(MADV_POPULATE_WRITE): %s (%s)",
                 (unsigned long long)from, (unsigned long long)npages, strerror(errno),
                 errno == EINVAL ? "a kernel before 5.14" : "writes there fault as before");
        return -1;
    }
    return 0;
}

static void *prefault_main(void *arg)
{
    const prefault_t *pf = arg;
    const kvr_arena_t *a = pf->arena;
    uint64_t npages = a->sh->npages, done = 0, nap_ns = NAP_MIN_NS, t0 = kvr_clock_ns();
    uint64_t step = STEP_BYTES >> a->page_shift, huge = HUGE_BYTES >> a->page_shift;
    uint64_t collapsed = 0, busy = 0;
    int collapse = pf->collapse;

    /* At the worker's own priority: each page mapped here is a fault a PUT would otherwise
     * take (about twice the CPU: 2 us a fault, 1 us a page here), so there is nothing to gain
     * by leaving this for later; niced, it got a tenth of a busy core and trailed a fill. */
    while (done < npages) {
        uint64_t target = kvr_arena_high_water(a) + pf->lead_pages, n;
        if (collapse)
            target = (target + huge - 1) / huge * huge; /* steps end on a 2 MiB boundary */
        if (target > npages)
            target = npages;
        if (done >= target) {
            nap(nap_ns);
            if (nap_ns < NAP_MAX_NS)
                nap_ns *= 2;
            continue;
        }
        nap_ns = NAP_MIN_NS;
        n = target - done < step ? target - done : step;
        /* Collapsing: one page of each 2 MiB first (the kernel builds a huge page only from a
         * range that has a page; the rest it fills with zeros), then the range: 2.4x faster
         * than mapping its 512 pages, and 4x faster than collapsing them once mapped. */
        for (uint64_t q = done; collapse && q + huge <= done + n; q += huge) {
            if (populate(a, q, 1, npages) != 0)
                return NULL;
            if (madvise(kvr_arena_page(a, (uint32_t)q), HUGE_BYTES, MADV_COLLAPSE) == 0) {
                collapsed++;
            } else if (errno == EAGAIN) {
                busy++; /* the other worker collapsing the same range, or a page in use: its turn */
            } else {
                kvr_info("arena: no transparent huge pages from here on: madvise(MADV_COLLAPSE): %s (%s)",
                         strerror(errno), errno == EINVAL ? "a kernel before 6.1" : "4 KiB pages as before");
                collapse = 0;
            }
        }
        if (populate(a, done, n, npages) != 0) /* maps what is there: one entry per huge page */
            return NULL;
        done += n;
    }
    kvr_info("arena mapped into this worker's page tables (%llu MiB, %.1f s since start)%s",
             (unsigned long long)((npages << a->page_shift) >> 20), (double)(kvr_clock_ns() - t0) / 1e9,
             pf->collapse ? "" : ", 4 KiB pages");
    if (pf->collapse)
        kvr_info("arena: this worker collapsed %llu of %llu 2 MiB ranges into transparent huge pages "
                 "(%llu busy: left to another worker or to the kernel)",
                 (unsigned long long)collapsed, (unsigned long long)(npages / huge), (unsigned long long)busy);
    return NULL;
}

static int huge_fits(const kvr_arena_t *a)
{
    return ((uintptr_t)kvr_arena_page(a, 0) & (HUGE_BYTES - 1)) == 0 && (1ull << a->page_shift) <= HUGE_BYTES;
}

int kvr_prefault_start(const kvr_arena_t *arena, uint64_t lead, int collapse)
{
    static prefault_t pf;
    pthread_attr_t attr;
    pthread_t tid;
    sigset_t all, old;
    int rc;

    if (lead == 0) {
        if (collapse) /* the supervisor's segment line said they would be collapsed */
            kvr_info("arena: --arena-prefault 0: nothing maps the arena ahead, so it stays in 4 KiB pages");
        return KVR_OK;
    }
    pf.arena = arena;
    /* the segment is mapped at a 2 MiB boundary (shm/segment.c, map_fd); a huge page needs one */
    pf.collapse = collapse && huge_fits(arena);
    pf.lead_pages = (lead + (1ull << arena->page_shift) - 1) >> arena->page_shift;
    /* Every signal stays with the worker's main thread (SIGTERM drains it). */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 << 10); /* room for a sanitizer build */
    rc = pthread_create(&tid, &attr, prefault_main, &pf);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        kvr_warn("arena prefault thread: %s; writes into the arena fault as they come", strerror(rc));
        return KVR_ERR;
    }
    return KVR_OK;
}
