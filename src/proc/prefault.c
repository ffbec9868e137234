/* prefault.c — see prefault.h. */
#include "proc/prefault.h"

#include "base/clock.h"
#include "base/log.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older headers lack it */
#endif

#define STEP_BYTES (16ull << 20) /* one madvise: short, so that the mark is looked at often */
#define NAP_MIN_NS 1000000ull    /* the mark moved: look again soon */
#define NAP_MAX_NS 16000000ull   /* idle: at 3.5 GB/s a fill moves 56 MiB in this, under the lead */

typedef struct {
    const kvr_arena_t *arena;
    uint64_t lead_pages;
} prefault_t;

static void nap(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

static void *prefault_main(void *arg)
{
    const prefault_t *pf = arg;
    const kvr_arena_t *a = pf->arena;
    uint64_t npages = a->sh->npages, done = 0, nap_ns = NAP_MIN_NS, t0 = kvr_clock_ns();
    uint64_t step = STEP_BYTES >> a->page_shift;

    /* At the worker's own priority: each page mapped here is a fault a PUT would otherwise
     * take (about twice the CPU: 2 us a fault, 1 us a page here), so there is nothing to gain
     * by leaving this for later; niced, it got a tenth of a busy core and trailed a fill. */
    while (done < npages) {
        uint64_t target = kvr_arena_high_water(a) + pf->lead_pages, n;
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
        if (madvise(kvr_arena_page(a, (uint32_t)done), n << a->page_shift, MADV_POPULATE_WRITE) != 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            kvr_warn("arena prefault stops at page %llu of %llu: madvise(MADV_POPULATE_WRITE): %s (%s)",
                     (unsigned long long)done, (unsigned long long)npages, strerror(errno),
                     errno == EINVAL ? "a kernel before 5.14" : "writes there fault as before");
            return NULL;
        }
        done += n;
    }
    kvr_info("arena mapped into this worker's page tables (%llu MiB, %.1f s since start)",
             (unsigned long long)((npages << a->page_shift) >> 20), (double)(kvr_clock_ns() - t0) / 1e9);
    return NULL;
}

int kvr_prefault_start(const kvr_arena_t *arena, uint64_t lead)
{
    static prefault_t pf;
    pthread_attr_t attr;
    pthread_t tid;
    sigset_t all, old;
    int rc;

    if (lead == 0)
        return KVR_OK;
    pf.arena = arena;
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
