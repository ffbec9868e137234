/* segment.c — see segment.h. */
#include "shm/segment.h"

#include "core/log.h"
#include "shm/arena.h"
#include "shm/changelog.h"
#include "shm/index.h"
#include "shm/relay_sh.h"
#include "shm/stats.h"
#include "shm/store_sh.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21u << 26)
#endif

void kvr_seg_config_defaults(kvr_seg_config_t *cfg)
{
    if (cfg->memory == 0)
        cfg->memory = 1ull << 30;
    if (cfg->page_size == 0)
        cfg->page_size = 4096;
    if (cfg->pin_slots == 0)
        cfg->pin_slots = 4096;
}

static uint64_t next_pow2(uint64_t v)
{
    uint64_t p = 1;
    while (p < v)
        p <<= 1;
    return p;
}

int kvr_seg_layout(const kvr_seg_config_t *in, kvr_seg_hdr_t *h)
{
    kvr_seg_config_t cfg = *in;
    uint64_t off;

    kvr_seg_config_defaults(&cfg);
    if (cfg.page_size < 4096 || cfg.page_size > KVR_HUGE_PAGE || (cfg.page_size & (cfg.page_size - 1)))
        return KVR_EINVAL;
    if (cfg.pin_slots & (cfg.pin_slots - 1))
        return KVR_EINVAL;

    memset(h, 0, sizeof(*h));
    h->magic = KVR_SEG_MAGIC;
    h->layout_version = KVR_SEG_LAYOUT_VERSION;
    h->page_size = cfg.page_size;
    h->page_shift = (uint32_t)__builtin_ctz(cfg.page_size);
    h->npages = KVR_ALIGN_UP(cfg.memory, (uint64_t)cfg.page_size) >> h->page_shift;
    if (h->npages < 16 || h->npages >= (1ull << 30))
        return KVR_EINVAL;
    /* Default: one entry per two pages (blocks average >= 8 KiB to fill the arena); the
     * index evicts too when it is full, so smaller blocks only lower the fill. */
    h->max_blocks = cfg.max_blocks ? cfg.max_blocks : h->npages / 2;
    if (h->max_blocks < 4 || h->max_blocks >= KVR_NIL)
        return KVR_EINVAL;
    h->nbuckets = next_pow2(h->max_blocks);
    h->log_capacity = cfg.log_capacity ? next_pow2(cfg.log_capacity) : next_pow2(h->max_blocks * 2 < 4096 ? 4096 : h->max_blocks * 2);
    h->pin_slots = cfg.pin_slots;

    off = sizeof(kvr_seg_hdr_t);
    h->off_procs = off;
    off += KVR_MAX_PROCS * sizeof(kvr_proc_sh_t);
    h->off_store = off;
    off += KVR_ALIGN_UP(sizeof(kvr_store_sh_t), 64);
    off = KVR_ALIGN_UP(off, 128);
    h->off_entries = off;
    off += KVR_ALIGN_UP(h->max_blocks * sizeof(kvr_entry_t), 64);
    h->off_buckets = off;
    off += KVR_ALIGN_UP(h->nbuckets * sizeof(uint32_t), 64);
    h->off_pages = off;
    off += KVR_ALIGN_UP(h->npages * sizeof(kvr_page_t), 64);
    h->off_scratch = off;
    off += KVR_ALIGN_UP((h->npages + 7) / 8 + (h->max_blocks + 7) / 8, 64);
    h->off_pins = off;
    off += KVR_ALIGN_UP((uint64_t)KVR_MAX_PROCS * h->pin_slots * sizeof(kvr_pin_t), 64);
    h->off_log = off;
    off += KVR_ALIGN_UP(sizeof(kvr_log_sh_t) + h->log_capacity * sizeof(kvr_log_event_t), 64);
    if (cfg.ckf_buckets != 0) {
        if (cfg.ckf_buckets < 2 || cfg.ckf_buckets > (1u << 24) || (cfg.ckf_buckets & (cfg.ckf_buckets - 1)))
            return KVR_EINVAL;
        h->ckf_buckets = cfg.ckf_buckets;
        h->off_relay = off;
        off += KVR_ALIGN_UP(sizeof(kvr_relay_sh_t), 4096);
        h->off_filter = off;
        off += KVR_ALIGN_UP(h->ckf_buckets * 8, 4096);
        h->off_snap = off;
        off += KVR_RELAY_SNAPSHOTS * KVR_ALIGN_UP(h->ckf_buckets * 8, 4096);
        h->off_ring = off;
        off += KVR_RELAY_RING_BYTES;
    }
    off = KVR_ALIGN_UP(off, (uint64_t)KVR_HUGE_PAGE);
    h->off_arena = off;
    h->arena_bytes = h->npages << h->page_shift;
    off += KVR_ALIGN_UP(h->arena_bytes, (uint64_t)KVR_HUGE_PAGE);
    h->total_size = off;
    return KVR_OK;
}

const char *kvr_seg_backing_name(uint32_t backing)
{
    switch (backing) {
    case KVR_BACKING_HUGETLB:
        return "hugetlb 2 MiB pages";
    case KVR_BACKING_SHMEM_THP:
        return "shmem with transparent huge pages";
    default:
        return "shmem with normal pages";
    }
}

/* Reads the kernel's shmem THP policy: MADV_HUGEPAGE only helps with always/within_size/advise. */
static int shmem_thp_allowed(void)
{
    char buf[256];
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    int ok = 0;

    if (f == NULL)
        return 0;
    if (fgets(buf, sizeof(buf), f) != NULL)
        ok = strstr(buf, "[always]") || strstr(buf, "[within_size]") || strstr(buf, "[advise]") ||
             strstr(buf, "[force]");
    fclose(f);
    return ok;
}

static void *map_fd(int fd, uint64_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

int kvr_seg_create(kvr_seg_t *seg, const kvr_seg_config_t *cfg)
{
    kvr_seg_config_t c = *cfg;
    kvr_seg_hdr_t layout;
    uint32_t backing = 0;
    void *base = NULL;
    int fd = -1;

    memset(seg, 0, sizeof(*seg));
    seg->fd = -1;
    seg->slot = -1;
    kvr_seg_config_defaults(&c);
    if (kvr_seg_layout(&c, &layout) != KVR_OK) {
        kvr_error("segment: invalid sizing (memory %llu, page size %u, max blocks %llu)",
                  (unsigned long long)c.memory, c.page_size, (unsigned long long)c.max_blocks);
        return KVR_ERR;
    }

    if (c.hugepages != KVR_HUGEPAGES_OFF) {
        fd = memfd_create("kvrelay", MFD_CLOEXEC | MFD_HUGETLB | MFD_HUGE_2MB);
        if (fd < 0) {
            kvr_info("segment: memfd_create(MFD_HUGETLB): %s", strerror(errno));
        } else if (ftruncate(fd, (off_t)layout.total_size) < 0) {
            kvr_info("segment: ftruncate on hugetlb memfd: %s", strerror(errno));
        } else if ((base = map_fd(fd, layout.total_size)) == NULL) {
            /* ENOMEM here means not enough huge pages are reserved (vm.nr_hugepages). */
            kvr_info("segment: mmap of %llu bytes of huge pages: %s",
                     (unsigned long long)layout.total_size, strerror(errno));
        } else {
            backing = KVR_BACKING_HUGETLB;
        }
        if (base == NULL && fd >= 0) {
            close(fd);
            fd = -1;
        }
        if (base == NULL && c.hugepages == KVR_HUGEPAGES_REQUIRE) {
            kvr_error("segment: huge pages required but not available");
            return KVR_ERR;
        }
    }

    if (base == NULL) {
        fd = memfd_create("kvrelay", MFD_CLOEXEC);
        if (fd < 0) {
            kvr_error("segment: memfd_create: %s", strerror(errno));
            return KVR_ERR;
        }
        if (ftruncate(fd, (off_t)layout.total_size) < 0) {
            kvr_error("segment: ftruncate(%llu): %s", (unsigned long long)layout.total_size,
                      strerror(errno));
            goto fail;
        }
        base = map_fd(fd, layout.total_size);
        if (base == NULL) {
            kvr_error("segment: mmap(%llu): %s", (unsigned long long)layout.total_size,
                      strerror(errno));
            goto fail;
        }
        backing = KVR_BACKING_SHMEM;
        if (shmem_thp_allowed() && madvise(base, layout.total_size, MADV_HUGEPAGE) == 0)
            backing = KVR_BACKING_SHMEM_THP;
    }

    seg->base = base;
    seg->size = layout.total_size;
    seg->fd = fd;
    seg->hdr = base;
    memcpy(seg->hdr, &layout, sizeof(layout));
    seg->hdr->backing = backing;
    atomic_store_explicit(&seg->hdr->generation, 1, memory_order_relaxed);
    seg->procs = kvr_seg_at(seg, layout.off_procs);
    for (int i = 0; i < KVR_MAX_PROCS; i++) {
        atomic_store_explicit(&seg->procs[i].pid, 0, memory_order_relaxed);
        atomic_store_explicit(&seg->procs[i].state, KVR_PROC_FREE, memory_order_relaxed);
    }
    kvr_info("segment: %llu bytes (arena %llu in %llu pages of %u, index %llu entries) on %s%s",
             (unsigned long long)layout.total_size, (unsigned long long)layout.arena_bytes,
             (unsigned long long)layout.npages, layout.page_size,
             (unsigned long long)layout.max_blocks, kvr_seg_backing_name(backing),
             backing == KVR_BACKING_HUGETLB ? "" : " (no huge pages reserved: fell back)");
    return KVR_OK;

fail:
    if (fd >= 0)
        close(fd);
    return KVR_ERR;
}

void kvr_seg_destroy(kvr_seg_t *seg)
{
    if (seg->base != NULL)
        munmap(seg->base, seg->size);
    if (seg->fd >= 0)
        close(seg->fd);
    seg->base = NULL;
    seg->hdr = NULL;
    seg->procs = NULL;
    seg->fd = -1;
    seg->slot = -1;
}

int kvr_seg_proc_claim(kvr_seg_t *seg, uint32_t role)
{
    int32_t me = (int32_t)getpid();

    for (int i = 0; i < KVR_MAX_PROCS; i++) {
        uint32_t expect = KVR_PROC_FREE;
        if (atomic_compare_exchange_strong(&seg->procs[i].state, &expect, KVR_PROC_ACTIVE)) {
            atomic_store_explicit(&seg->procs[i].pid, me, memory_order_release);
            atomic_store_explicit(&seg->procs[i].ready, 0, memory_order_relaxed);
            seg->procs[i].role = role;
            seg->slot = i;
            return i;
        }
    }
    kvr_error("segment: no free process slot (max %d)", KVR_MAX_PROCS);
    return -1;
}

int kvr_seg_proc_claim_at(kvr_seg_t *seg, int slot, uint32_t role)
{
    uint32_t expect = KVR_PROC_FREE;

    if (slot < 0 || slot >= KVR_MAX_PROCS ||
        !atomic_compare_exchange_strong(&seg->procs[slot].state, &expect, KVR_PROC_ACTIVE)) {
        kvr_error("segment: process slot %d is not free", slot);
        return -1;
    }
    atomic_store_explicit(&seg->procs[slot].pid, (int32_t)getpid(), memory_order_release);
    atomic_store_explicit(&seg->procs[slot].ready, 0, memory_order_relaxed);
    seg->procs[slot].role = role;
    seg->slot = slot;
    return slot;
}

int kvr_seg_proc_find(const kvr_seg_t *seg, pid_t pid)
{
    for (int i = 0; i < KVR_MAX_PROCS; i++)
        if (atomic_load(&seg->procs[i].pid) == pid &&
            atomic_load(&seg->procs[i].state) != KVR_PROC_FREE)
            return i;
    return -1;
}
