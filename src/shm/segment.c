/* segment.c — see segment.h. */
#include "shm/segment.h"

#include "base/barrier.h"
#include "base/clock.h"
#include "base/dassert.h"
#include "base/log.h"
#include "shm/arena.h"
#include "shm/changelog.h"
#include "shm/dindex.h"
#include "shm/index.h"
#include "shm/relay_sh.h"
#include "shm/segment_lock.h"
#include "shm/stats.h"
#include "shm/store_sh.h"
#include "shm/tenants_sh.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <xxhash.h>

#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21u << 26)
#endif

/* The change log's floor: 131072 events of 24 bytes (3 MiB), 0.8 s of the top rate this project
 * measured (82k PUT/s of 16 KiB blocks into a full store on 2 vCPUs: 164k events a second). */
#define LOG_MIN_EVENTS (1ull << 17)

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
    /* Two events per block, and never under LOG_MIN_EVENTS: a PUT of a new key into a full
     * store appends two, and a publisher that a busy machine leaves off its CPU for a moment
     * must not overflow the ring (every subscriber then takes a new snapshot). */
    h->log_capacity = cfg.log_capacity ? next_pow2(cfg.log_capacity)
                                       : next_pow2(h->max_blocks * 2 < LOG_MIN_EVENTS ? LOG_MIN_EVENTS : h->max_blocks * 2);
    h->pin_slots = cfg.pin_slots;
    h->relay_pools = cfg.relay_pools ? cfg.relay_pools : 1;
    if (h->relay_pools > KVR_POOLS_MAX)
        return KVR_EINVAL;

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
    h->off_cbuckets = off;
    off += KVR_ALIGN_UP(h->nbuckets * sizeof(uint32_t), 64);
    h->off_pages = off;
    off += KVR_ALIGN_UP(h->npages * sizeof(kvr_page_t), 64);
    h->off_scratch = off;
    off += KVR_ALIGN_UP((h->npages + 7) / 8 + (h->max_blocks + 7) / 8, 64);
    h->off_pins = off;
    off += KVR_ALIGN_UP((uint64_t)KVR_MAX_PROCS * h->pin_slots * sizeof(kvr_pin_t), 64);
    h->off_log = off;
    off += KVR_ALIGN_UP(sizeof(kvr_chlog_sh_t) + h->log_capacity * sizeof(kvr_chlog_event_t), 64);
    off = KVR_ALIGN_UP(off, 4096);
    h->off_tenants = off;
    off += KVR_ALIGN_UP(sizeof(kvr_tenants_sh_t), 4096);
    if (cfg.ssd_slots != 0) {
        if (cfg.ssd_slots >= KVR_NIL)
            return KVR_EINVAL;
        h->ssd_slots = cfg.ssd_slots;
        h->off_dindex = off;
        off += KVR_ALIGN_UP(kvr_dindex_bytes(h->ssd_slots), 4096);
    }
    if (cfg.ckf_buckets != 0) {
        if (cfg.ckf_buckets < 2 || cfg.ckf_buckets > (1u << 24) || (cfg.ckf_buckets & (cfg.ckf_buckets - 1)))
            return KVR_EINVAL;
        h->ckf_buckets = cfg.ckf_buckets;
        h->off_relay = off;
        off += KVR_ALIGN_UP(sizeof(kvr_relay_sh_t), 4096);
        h->off_filter = off;
        off += h->relay_pools * KVR_ALIGN_UP(h->ckf_buckets * 8, 4096);
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

/* Maps the whole segment at a 2 MiB boundary: the arena sits at a 2 MiB offset in it, and only
 * an aligned mapping can map its huge pages (hugetlb, or shmem collapsed by the workers'
 * prefault: proc/prefault.h) with one page-table entry each. The kernel aligns hugetlb by
 * itself but not shmem; so reserve 2 MiB more address space, place the file in it, give the
 * rest back. */
static void *map_fd(int fd, uint64_t size)
{
    const uintptr_t align = KVR_HUGE_PAGE;
    uint8_t *r = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    uint8_t *p;
    size_t head;

    if (r == MAP_FAILED)
        return NULL;
    p = (uint8_t *)(((uintptr_t)r + align - 1) & ~(align - 1));
    head = (size_t)(p - r); /* under align: the slack before p; align - head of it is after */
    if (mmap(p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        munmap(r, size + align);
        return NULL;
    }
    if (head > 0)
        munmap(r, head);
    munmap(p + size, align - head);
    return p;
}

/* ------------------------------------------------------------------ warm restart */

uint64_t kvr_seg_struct_sig(void)
{
    /* Every structure a re-attach reads in place; a build that changes one refuses old files. */
    const uint64_t sizes[] = {
        KVR_SEG_LAYOUT_VERSION,
        sizeof(kvr_seg_hdr_t),
        offsetof(kvr_seg_hdr_t, ctl),
        sizeof(kvr_ctl_sh_t),
        sizeof(kvr_proc_sh_t),
        sizeof(kvr_store_sh_t),
        sizeof(kvr_entry_t),
        sizeof(kvr_page_t),
        sizeof(kvr_pin_t),
        sizeof(kvr_chlog_sh_t),
        sizeof(kvr_chlog_event_t),
        sizeof(kvr_relay_sh_t),
        sizeof(kvr_stats_block_t),
        sizeof(kvr_tenants_sh_t),
        sizeof(kvr_dindex_sh_t),
        sizeof(kvr_dslot_t),
        sizeof(kvr_ns_sh_t),
        sizeof(kvr_tok_sh_t),
        KVR_NS_MAX,
        KVR_TENANTS_SH_TOKENS,
        sizeof(pthread_mutex_t),
        KVR_MAX_PROCS,
        KVR_KEY_MAX,
        KVR_RELAY_RING_BYTES,
        KVR_RELAY_SNAPSHOTS,
    };
    return XXH3_64bits(sizes, sizeof(sizes));
}

/* Checksum of the fields fixed at creation (not backing, run, ctl or itself). */
static uint64_t hdr_checksum(const kvr_seg_hdr_t *h)
{
    kvr_seg_hdr_t c;

    memcpy(&c, h, offsetof(kvr_seg_hdr_t, ctl));
    c.magic = KVR_SEG_MAGIC; /* sealing writes it after the checksum */
    c.backing = 0;
    c.run = 0;
    c.hdr_check = 0;
    return XXH3_64bits(&c, offsetof(kvr_seg_hdr_t, ctl));
}

void kvr_seg_seal(kvr_seg_t *seg)
{
    kvr_seg_hdr_t *h = seg->hdr;

    /* The supervisor, before it claims its process slot: before any fork, so that no other
     * process maps the segment yet (a re-attach's file lock keeps the last run's out). */
    KVR_DASSERT(seg->slot < 0);
    h->struct_sig = kvr_seg_struct_sig();
    h->hdr_check = hdr_checksum(h);
    /* Release: the magic is the seal, stored after everything it vouches for. What it pairs
     * with is the next run's check_header, in another process after this one is gone (its
     * mapping of the file is the hand-off): the order matters for a crash between the stores. */
    kvr_atomic_store_release(&h->magic, KVR_SEG_MAGIC);
}

/* Appends "; what: file F, configured C (flag)" to buf when the two differ. */
static void diff_field(char *buf, size_t n, const char *what, uint64_t file, uint64_t want)
{
    size_t l = strlen(buf);

    if (file != want && l < n)
        snprintf(buf + l, n - l, "%s%s %llu in the file, %llu configured", l ? "; " : "", what,
                 (unsigned long long)file, (unsigned long long)want);
}

/*
 * Checks an existing segment file's header against the layout this configuration computes.
 * Returns KVR_OK, KVR_ENOTFOUND for a file that was never sealed (nothing in it was ever
 * served), or KVR_ERR after logging what differs.
 */
static int check_header(const char *path, const kvr_seg_hdr_t *h, uint64_t file_size, const kvr_seg_hdr_t *want)
{
    char d[768] = "";

    if (h->magic == 0 && h->hdr_check == 0)
        return KVR_ENOTFOUND;
    if (h->magic != KVR_SEG_MAGIC) {
        kvr_error("segment file %s: not a kvrelay segment or its header is corrupted (magic %016llx); "
                  "refusing it (--segment-reset starts empty)",
                  path, (unsigned long long)h->magic);
        return KVR_ERR;
    }
    if (h->layout_version != KVR_SEG_LAYOUT_VERSION) {
        /* A file of another build (older or newer): its structures cannot be read in place. */
        kvr_error("segment file %s: layout version %u, this build reads version %u; refusing it "
                  "(--segment-reset starts empty)",
                  path, h->layout_version, KVR_SEG_LAYOUT_VERSION);
        return KVR_ERR;
    }
    if (h->struct_sig != kvr_seg_struct_sig()) {
        kvr_error("segment file %s: written by a build with other shared structures (signature %016llx, "
                  "this build %016llx); refusing it (--segment-reset starts empty)",
                  path,
                  (unsigned long long)h->struct_sig, (unsigned long long)kvr_seg_struct_sig());
        return KVR_ERR;
    }
    if (h->hdr_check != hdr_checksum(h)) {
        kvr_error("segment file %s: header is corrupted (checksum %016llx, computed %016llx); refusing it "
                  "(--segment-reset starts empty)",
                  path, (unsigned long long)h->hdr_check,
                  (unsigned long long)hdr_checksum(h));
        return KVR_ERR;
    }
    diff_field(d, sizeof(d), "page size (--page-size)", h->page_size, want->page_size);
    diff_field(d, sizeof(d), "arena bytes (--memory)", h->npages * h->page_size, want->npages * want->page_size);
    diff_field(d, sizeof(d), "index entries (--max-blocks)", h->max_blocks, want->max_blocks);
    diff_field(d, sizeof(d), "change-log events", h->log_capacity, want->log_capacity);
    diff_field(d, sizeof(d), "pin slots", h->pin_slots, want->pin_slots);
    diff_field(d, sizeof(d), "relay filter buckets (--expected-unique-blocks)", h->ckf_buckets, want->ckf_buckets);
    diff_field(d, sizeof(d), "relay pools (--max-pools)", h->relay_pools, want->relay_pools);
    diff_field(d, sizeof(d), "disk index slots", h->ssd_slots, want->ssd_slots);
    if (d[0] == '\0' && memcmp(&h->off_procs, &want->off_procs,
                               offsetof(kvr_seg_hdr_t, struct_sig) - offsetof(kvr_seg_hdr_t, off_procs)) != 0)
        snprintf(d, sizeof(d), "region offsets differ with equal sizes");
    diff_field(d, sizeof(d), "total bytes", h->total_size, want->total_size);
    if (d[0] != '\0') {
        kvr_error("segment file %s: geometry differs from this configuration: %s; refusing it (start with the "
                  "file's settings, or --segment-reset to start empty)",
                  path, d);
        return KVR_ERR;
    }
    if (file_size != h->total_size) {
        kvr_error("segment file %s: %llu bytes, its header says %llu: truncated or corrupted; refusing it "
                  "(--segment-reset starts empty)",
                  path, (unsigned long long)file_size,
                  (unsigned long long)h->total_size);
        return KVR_ERR;
    }
    return KVR_OK;
}

/* Opens (or creates) and locks the segment file; decides its backing from its filesystem. */
static int open_seg_file(const kvr_seg_config_t *c, uint32_t *backing)
{
    struct statfs sfs;
    int fd = open(c->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);

    if (fd < 0) {
        kvr_error("segment file %s: %s", c->path, strerror(errno));
        return -1;
    }
    /* The lock is inherited by every child: taking it proves the previous run is gone. */
    if (kvr_seg_lock_file(fd, c->path, c->lock_wait_ms) != KVR_OK)
        goto fail;
    if (fstatfs(fd, &sfs) < 0) {
        kvr_error("segment file %s: fstatfs: %s", c->path, strerror(errno));
        goto fail;
    }
    if ((unsigned long)sfs.f_type == (unsigned long)HUGETLBFS_MAGIC) {
        *backing = KVR_BACKING_HUGETLB;
        if (c->hugepages == KVR_HUGEPAGES_OFF) {
            kvr_error("segment file %s is on hugetlbfs but --hugepages is off", c->path);
            goto fail;
        }
    } else if ((unsigned long)sfs.f_type == (unsigned long)TMPFS_MAGIC) {
        *backing = KVR_BACKING_SHMEM;
        if (c->hugepages == KVR_HUGEPAGES_REQUIRE) {
            kvr_error("segment file %s is on tmpfs but --hugepages require asks for hugetlbfs", c->path);
            goto fail;
        }
    } else {
        /* A disk file would be written back page by page under load: memory only. */
        kvr_error("segment file %s must be on tmpfs or hugetlbfs (filesystem type 0x%lx)", c->path,
                  (unsigned long)sfs.f_type);
        goto fail;
    }
    return fd;
fail:
    close(fd);
    return -1;
}

/*
 * The file-backed segment: re-attaches a matching file, or sizes an empty (or reset) one.
 * Returns KVR_OK with seg->base/fd set and seg->attached telling which, or KVR_ERR.
 */
static int create_file(kvr_seg_t *seg, const kvr_seg_config_t *c, const kvr_seg_hdr_t *layout, uint32_t *backing)
{
    struct stat st;
    void *base;
    int fd = open_seg_file(c, backing), rc;

    if (fd < 0)
        return KVR_ERR;
    if (fstat(fd, &st) < 0) {
        kvr_error("segment file %s: fstat: %s", c->path, strerror(errno));
        goto fail;
    }
    if (st.st_size > 0 && c->reset) {
        kvr_warn("segment file %s: --segment-reset: discarding its %llu bytes", c->path,
                 (unsigned long long)st.st_size);
        st.st_size = 0;
        if (ftruncate(fd, 0) < 0)
            goto fail_errno;
    }
    if (st.st_size > 0) {
        if ((uint64_t)st.st_size < sizeof(kvr_seg_hdr_t)) {
            kvr_error("segment file %s: %llu bytes, smaller than a header: corrupted or not a kvrelay segment; "
                      "refusing it (--segment-reset starts empty)",
                      c->path, (unsigned long long)st.st_size);
            goto fail;
        }
        if ((base = map_fd(fd, (uint64_t)st.st_size)) == NULL) {
            kvr_error("segment file %s: mmap(%llu): %s", c->path, (unsigned long long)st.st_size, strerror(errno));
            goto fail;
        }
        rc = check_header(c->path, base, (uint64_t)st.st_size, layout);
        if (rc == KVR_OK) {
            seg->base = base;
            seg->fd = fd;
            seg->attached = 1;
            return KVR_OK;
        }
        munmap(base, (size_t)st.st_size);
        if (rc != KVR_ENOTFOUND)
            goto fail;
        kvr_warn("segment file %s was never sealed (its creator stopped during start-up): starting empty", c->path);
        if (ftruncate(fd, 0) < 0)
            goto fail_errno;
    }
    if (ftruncate(fd, (off_t)layout->total_size) < 0)
        goto fail_errno;
    if ((base = map_fd(fd, layout->total_size)) == NULL) {
        kvr_error("segment file %s: mmap of %llu bytes: %s%s", c->path, (unsigned long long)layout->total_size,
                  strerror(errno), *backing == KVR_BACKING_HUGETLB ? " (not enough 2 MiB huge pages)" : "");
        (void)!ftruncate(fd, 0); /* leave no unsealed file behind */
        goto fail;
    }
    seg->base = base;
    seg->fd = fd;
    return KVR_OK;

fail_errno:
    kvr_error("segment file %s: ftruncate: %s", c->path, strerror(errno));
fail:
    close(fd);
    return KVR_ERR;
}

/* Re-attach: every process of the previous run is gone (we hold the file lock), and none of
 * this run is forked yet: relaxed stores that fork publishes, nothing pairs with them. */
static void attach_reset(kvr_seg_t *seg, uint32_t backing)
{
    kvr_seg_hdr_t *h = seg->hdr;

    h->backing = backing;
    h->run++;
    memset(&h->ctl, 0, sizeof(h->ctl));
    for (int i = 0; i < KVR_MAX_PROCS; i++) {
        kvr_atomic_store_relaxed(&seg->procs[i].pid, 0);
        kvr_atomic_store_relaxed(&seg->procs[i].ready, 0);
        kvr_atomic_store_relaxed(&seg->procs[i].conns, 0);
        kvr_atomic_store_relaxed(&seg->procs[i].state, KVR_PROC_FREE);
    }
}

/* ------------------------------------------------------------------ create */

static int create_memfd(const kvr_seg_config_t *c, const kvr_seg_hdr_t *layout, uint32_t *backing, void **basep)
{
    void *base = NULL;
    int fd = -1;

    if (c->hugepages != KVR_HUGEPAGES_OFF) {
        fd = memfd_create("kvrelay", MFD_CLOEXEC | MFD_HUGETLB | MFD_HUGE_2MB);
        if (fd < 0) {
            kvr_info("segment: memfd_create(MFD_HUGETLB): %s", strerror(errno));
        } else if (ftruncate(fd, (off_t)layout->total_size) < 0) {
            kvr_info("segment: ftruncate on hugetlb memfd: %s", strerror(errno));
        } else if ((base = map_fd(fd, layout->total_size)) == NULL) {
            /* ENOMEM here means not enough huge pages are reserved (vm.nr_hugepages). */
            kvr_info("segment: mmap of %llu bytes of huge pages: %s",
                     (unsigned long long)layout->total_size, strerror(errno));
        } else {
            *backing = KVR_BACKING_HUGETLB;
        }
        if (base == NULL && fd >= 0) {
            close(fd);
            fd = -1;
        }
        if (base == NULL && c->hugepages == KVR_HUGEPAGES_REQUIRE) {
            kvr_error("segment: huge pages required but not available");
            return -1;
        }
    }

    if (base == NULL) {
        fd = memfd_create("kvrelay", MFD_CLOEXEC);
        if (fd < 0) {
            kvr_error("segment: memfd_create: %s", strerror(errno));
            return -1;
        }
        if (ftruncate(fd, (off_t)layout->total_size) < 0) {
            kvr_error("segment: ftruncate(%llu): %s", (unsigned long long)layout->total_size,
                      strerror(errno));
            close(fd);
            return -1;
        }
        base = map_fd(fd, layout->total_size);
        if (base == NULL) {
            kvr_error("segment: mmap(%llu): %s", (unsigned long long)layout->total_size,
                      strerror(errno));
            close(fd);
            return -1;
        }
        *backing = KVR_BACKING_SHMEM;
    }
    *basep = base;
    return fd;
}

int kvr_seg_create(kvr_seg_t *seg, const kvr_seg_config_t *cfg)
{
    kvr_seg_config_t c = *cfg;
    kvr_seg_hdr_t layout;
    uint32_t backing = 0;

    memset(seg, 0, sizeof(*seg));
    seg->fd = -1;
    seg->slot = -1;
    kvr_seg_config_defaults(&c);
    if (kvr_seg_layout(&c, &layout) != KVR_OK) {
        kvr_error("segment: invalid sizing (memory %llu, page size %u, max blocks %llu)",
                  (unsigned long long)c.memory, c.page_size, (unsigned long long)c.max_blocks);
        return KVR_ERR;
    }
    layout.struct_sig = kvr_seg_struct_sig();

    if (c.path != NULL && c.path[0] != '\0') {
        if (create_file(seg, &c, &layout, &backing) != KVR_OK)
            return KVR_ERR;
    } else {
        void *base = NULL;
        if ((seg->fd = create_memfd(&c, &layout, &backing, &base)) < 0)
            return KVR_ERR;
        seg->base = base;
    }
    if (backing == KVR_BACKING_SHMEM && shmem_thp_allowed() && madvise(seg->base, layout.total_size, MADV_HUGEPAGE) == 0)
        backing = KVR_BACKING_SHMEM_THP;

    seg->size = layout.total_size;
    seg->hdr = (kvr_seg_hdr_t *)seg->base;
    seg->procs = kvr_seg_at(seg, layout.off_procs);
    if (seg->attached) {
        attach_reset(seg, backing);
        kvr_info("segment: re-attached %s (%llu bytes, arena %llu in %llu pages of %u, index %llu entries, run %llu) on %s",
                 c.path, (unsigned long long)layout.total_size, (unsigned long long)layout.arena_bytes,
                 (unsigned long long)layout.npages, layout.page_size, (unsigned long long)layout.max_blocks,
                 (unsigned long long)seg->hdr->run, kvr_seg_backing_name(backing));
        return KVR_OK;
    }
    memcpy(seg->hdr, &layout, sizeof(layout));
    /* A file stays unsealed (magic 0) until the store is formatted: see kvr_seg_seal. */
    if (c.path != NULL && c.path[0] != '\0')
        seg->hdr->magic = 0;
    seg->hdr->backing = backing;
    seg->hdr->run = 1;
    /* Before any fork: relaxed, fork publishes them. */
    for (int i = 0; i < KVR_MAX_PROCS; i++) {
        kvr_atomic_store_relaxed(&seg->procs[i].pid, 0);
        kvr_atomic_store_relaxed(&seg->procs[i].state, KVR_PROC_FREE);
    }
    kvr_info("segment: %llu bytes (arena %llu in %llu pages of %u, index %llu entries) on %s%s%s%s%s",
             (unsigned long long)layout.total_size, (unsigned long long)layout.arena_bytes,
             (unsigned long long)layout.npages, layout.page_size,
             (unsigned long long)layout.max_blocks, kvr_seg_backing_name(backing),
             backing == KVR_BACKING_HUGETLB || c.path ? "" : " (no huge pages reserved: fell back)",
             c.path ? ", new file " : "", c.path ? c.path : "",
             backing == KVR_BACKING_SHMEM && c.hugepages != KVR_HUGEPAGES_OFF
                 ? "; the workers collapse the arena into transparent huge pages as they map it"
                 : "");
    return KVR_OK;
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

/* A claimed slot's own fields, written by its new owner right after its CAS of state. */
static void claim_fields(kvr_proc_sh_t *p, int32_t pid, uint32_t role)
{
    /* Release: pairs with the acquire/seq_cst loads of pid by whoever checks an owner
     * (kvr_seg_proc_find, the publisher's owner_alive, debug owner checks). */
    kvr_atomic_store_release(&p->pid, pid);
    /* Relaxed: the slot's readers look at ready only once it is set again (acquire, after
     * role below), and at conns only for a ready worker. */
    kvr_atomic_store_relaxed(&p->ready, 0);
    kvr_atomic_store_relaxed(&p->conns, 0);
    p->role = role; /* plain: published by the owner's later release store of ready */
}

int kvr_seg_proc_claim(kvr_seg_t *seg, uint32_t role)
{
    int32_t me = (int32_t)getpid();

    for (int i = 0; i < KVR_MAX_PROCS; i++) {
        uint32_t expect = KVR_PROC_FREE;
        /* The claim: a CAS from FREE, so two claimers never share a slot; pairs with the
         * reap's seq_cst store of FREE (kvr_store_reap_slot), made after it cleared pid. */
        if (kvr_atomic_cas_seq_cst(&seg->procs[i].state, &expect, KVR_PROC_ACTIVE)) {
            claim_fields(&seg->procs[i], me, role);
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

    /* The claim CAS, as in kvr_seg_proc_claim. */
    if (slot < 0 || slot >= KVR_MAX_PROCS ||
        !kvr_atomic_cas_seq_cst(&seg->procs[slot].state, &expect, KVR_PROC_ACTIVE)) {
        kvr_error("segment: process slot %d is not free", slot);
        return -1;
    }
    claim_fields(&seg->procs[slot], (int32_t)getpid(), role);
    seg->slot = slot;
    return slot;
}

int kvr_seg_proc_find(const kvr_seg_t *seg, pid_t pid)
{
    /* seq_cst as ever: pid pairs with the claim's release store of it, state with the claim
     * CAS and the reap's stores (pid is cleared before state turns FREE). */
    for (int i = 0; i < KVR_MAX_PROCS; i++)
        if (kvr_atomic_load_seq_cst(&seg->procs[i].pid) == pid &&
            kvr_atomic_load_seq_cst(&seg->procs[i].state) != KVR_PROC_FREE)
            return i;
    return -1;
}

void kvr_seg_status(const kvr_seg_t *seg, kvr_seg_status_t *out)
{
    const kvr_ctl_sh_t *c = &seg->hdr->ctl;

    /* Status, each field on its own (segment.h, kvr_seg_status_t): relaxed, pairs with
     * nothing; a probe may see a value one event late. */
    out->draining = kvr_atomic_load_relaxed(&c->draining);
    out->workers_expected = kvr_atomic_load_relaxed(&c->workers_expected);
    out->workers_running = kvr_atomic_load_relaxed(&c->workers_running);
    out->publisher_expected = kvr_atomic_load_relaxed(&c->publisher_expected);
    out->publisher_running = kvr_atomic_load_relaxed(&c->publisher_running);
    out->late = kvr_atomic_load_relaxed(&c->late);
    out->worker_restarts = kvr_atomic_load_relaxed(&c->worker_restarts);
    out->publisher_restarts = kvr_atomic_load_relaxed(&c->publisher_restarts);
    out->hangs_killed = kvr_atomic_load_relaxed(&c->hangs_killed);
    out->started_unix_ms = kvr_atomic_load_relaxed(&c->started_unix_ms);
    out->max_blocks = seg->hdr->max_blocks;
    out->ckf_buckets = seg->hdr->ckf_buckets;
    out->hugetlb = seg->hdr->backing == KVR_BACKING_HUGETLB;
}

int kvr_seg_publisher_up(const kvr_seg_t *seg)
{
    /* A status (seq_cst as ever): pairs with the publisher's and the supervisor's seq_cst
     * stores of publisher_running; a request may see it one event late. */
    return kvr_atomic_load_seq_cst(&seg->hdr->ctl.publisher_running) != 0;
}

void kvr_seg_set_conns(kvr_seg_t *seg, uint32_t n)
{
    if (seg->slot < 0)
        return;
    /* Only the slot's owner writes its count. */
    KVR_DASSERT(kvr_atomic_load_relaxed(&seg->procs[seg->slot].pid) == (int32_t)getpid());
    /* Relaxed: a hint for the next accept turn, read relaxed by kvr_seg_worker_load. */
    kvr_atomic_store_relaxed(&seg->procs[seg->slot].conns, n);
}

int kvr_seg_worker_load(const kvr_seg_t *seg, int slot, uint32_t *conns, uint64_t *heartbeat)
{
    const kvr_proc_sh_t *p = &seg->procs[slot];

    /* role is written before ready is released (kvr_seg_proc_claim_at, then the worker's
     * store of ready), so an acquired ready makes it safe to read: pairs with that release
     * store (proc/worker.c once it serves; the supervisor's give_readiness stores it seq_cst) */
    if (!kvr_atomic_load_acquire(&p->ready) || p->role != KVR_ROLE_WORKER)
        return 0;
    /* Hints (relaxed, pair with nothing): a count one event late moves one turn, and only the
     * heartbeat's movement is looked at. */
    *conns = kvr_atomic_load_relaxed(&p->conns);
    *heartbeat = kvr_atomic_load_relaxed(&p->heartbeat);
    return 1;
}

int kvr_seg_accept_yield(const kvr_seg_t *seg, uint32_t mine, uint32_t slack)
{
    uint32_t least = UINT32_MAX, n;
    uint64_t hb;
    int to = -1;

    for (int i = 0; i < KVR_MAX_PROCS; i++)
        if (i != seg->slot && kvr_seg_worker_load(seg, i, &n, &hb) && n < least) {
            least = n;
            to = i;
        }
    if (to < 0 || (uint64_t)mine <= (uint64_t)least + slack)
        return -1;
    return to;
}
