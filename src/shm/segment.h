/*
 * segment.h — the one shared-memory segment every kvrelay process maps.
 *
 * The supervisor creates the segment (kvr_seg_create) before it forks; children inherit
 * the mapping and claim a process slot (kvr_seg_proc_claim). Everything inside is addressed
 * by offsets from the base; no absolute pointer is ever stored in it.
 *
 * Layout (offsets in the header; every region 64-byte aligned, the arena 2 MiB aligned):
 *
 *   header | proc table | store shared state | entries | buckets | canon buckets | page map | scratch bitmap
 *          | pin tables | change log | tenants table | relay state | filter | snapshot copies
 *          | frame ring | arena pages
 *
 * Backing: memfd_create(MFD_HUGETLB | MFD_HUGE_2MB) first. It succeeds even with no huge
 * pages reserved, but mmap then fails with ENOMEM; that is the trigger to fall back to a
 * normal memfd with MADV_HUGEPAGE (effective only when the kernel's shmem THP policy allows
 * it); where it does not, the workers collapse the arena into transparent huge pages as they
 * map it (proc/prefault.h), unless --hugepages off. kvr_seg_create logs which backing it got.
 * Every mapping starts on a 2 MiB boundary (map_fd), so a huge page is one page-table entry.
 *
 * Warm restart (--segment-path): the segment is a file on hugetlbfs (huge pages) or tmpfs
 * that outlives the processes. The supervisor holds flock(LOCK_EX) on it, inherited by every
 * child, so a file whose lock can be taken has no live process of an earlier run. A lock
 * still held by a run that is gone (the kernel releases it only once the killed processes'
 * last reference to the file is torn down) is waited for, bounded; one held by a live
 * kvrelay is refused at once (kvr_seg_lock_file). An
 * existing file is re-attached only when its header is sealed (magic and hdr_check, written
 * after the store was formatted), has this build's layout version and structure signature,
 * and describes exactly the geometry this configuration computes; anything else is refused
 * with the difference named (--segment-reset starts empty instead). The caller then repairs
 * the store (kvr_store_attach) instead of formatting it.
 */
#ifndef KVR_SHM_SEGMENT_H
#define KVR_SHM_SEGMENT_H

#include "base/barrier.h"
#include "base/dassert.h"
#include "common.h"

#include <stdatomic.h>
#include <sys/types.h>
#include <unistd.h>

#define KVR_SEG_MAGIC 0x314745535256564bULL /* "KVVRSEG1" little-endian */
/* Bumped with every change of a shared structure: a segment file of another version is refused
 * at a warm restart, with both versions named (segment.c, check_header). 2: the dead fields
 * publish_ns, live_worker_mask (relay state) and off_reserved_ (header) removed, the header's
 * generation renamed run. 3: the tenants table (off_tenants, shm/tenants_sh.h), an entry's
 * namespace, the store's per-namespace seeds and counters. 4: relay pools (the store's pool table,
 * an entry's pool id, a pool id in change-log events, the relay's per-pool state and filters,
 * hdr->relay_pools). 5: the canonical-hash chains of the index (an entry's canon_next, taken from
 * its inline key tail: KVR_KEY_TAIL 15 -> 11; the canon buckets at hdr->off_cbuckets), and stats
 * blocks of 4 KiB (the KV events' counters, shm/stats.h). 6: the disk tier's index (hdr->ssd_slots,
 * hdr->off_dindex, shm/dindex.h). 7: the disk tier's counters in the stats blocks. 8: its latency
 * histograms in the stats blocks. 9: the disk
 * index's chains by canonical hash (shm/dindex.h). */
#define KVR_SEG_LAYOUT_VERSION 9u
#define KVR_MAX_PROCS          64
#define KVR_HUGE_PAGE          (2u << 20)
#define KVR_SEG_LOCK_WAIT_MS   10000u /* the supervisor's bound on waiting for a gone run's lock */

enum kvr_hugepage_mode { KVR_HUGEPAGES_AUTO = 0,
                         KVR_HUGEPAGES_OFF = 1,
                         KVR_HUGEPAGES_REQUIRE = 2 };
enum kvr_backing { KVR_BACKING_HUGETLB = 1,
                   KVR_BACKING_SHMEM_THP = 2,
                   KVR_BACKING_SHMEM = 3 };

/* Sizing inputs. Zero fields take their defaults (see kvr_seg_config_defaults). */
typedef struct {
    uint64_t memory;       /* arena payload capacity in bytes (like memcached's -m) */
    uint32_t page_size;    /* arena allocation granule, power of two, 4 KiB .. 2 MiB */
    uint64_t max_blocks;   /* index entries; default: one per arena page */
    uint64_t log_capacity; /* change-log events, power of two */
    uint32_t pin_slots;    /* per-process pin table slots, power of two */
    int hugepages;         /* enum kvr_hugepage_mode */
    uint64_t ckf_buckets;  /* relay filter buckets (power of two, 2..2^24); 0: no relay regions */
    uint32_t relay_pools;  /* relay pools, each with a filter of ckf_buckets (1..KVR_POOLS_MAX; 0: 1) */
    const char *path;      /* warm restart: keep the segment in this file (NULL: a memfd) */
    int reset;             /* with path: discard an existing file's contents */
    uint32_t lock_wait_ms; /* with path: how long to wait for a lock no live kvrelay holds (0: not at all) */
    uint64_t ssd_slots;    /* the disk index's slots (shm/dindex.h); 0: no disk tier, no region */
} kvr_seg_config_t;

/* Process slot states. */
enum { KVR_PROC_FREE = 0,
       KVR_PROC_ACTIVE = 1,
       KVR_PROC_DEAD = 2 };
enum { KVR_ROLE_SUPERVISOR = 0,
       KVR_ROLE_WORKER = 1,
       KVR_ROLE_PUBLISHER = 2 };

/*
 * One process slot, one cache line. pid/state are written by the claiming process (CAS
 * from FREE) and by the supervisor's reap; role is written by the claiming process before
 * it sets `ready` (kvr_seg_worker_load reads it after an acquire of ready; debug assertions
 * check owners by it). `ready` is set by the process once it serves and cleared by the
 * supervisor (reap, or a hang it detected).
 * `heartbeat` is advanced by the process every loop iteration (kvr_seg_heartbeat) and
 * sampled by the supervisor's watchdog; relaxed: only its movement matters. `conns` is the
 * number of client connections a worker holds, stored by that worker alone (relaxed) and read
 * by the other workers to take turns at the shared listener (kvr_seg_accept_yield).
 */
typedef struct {
    _Atomic int32_t pid;
    _Atomic uint32_t state;
    uint32_t role;
    _Atomic uint32_t ready;
    _Atomic uint64_t heartbeat;
    _Atomic uint32_t conns;
    uint32_t pad_[9];
} kvr_proc_sh_t;
static_assert(sizeof(kvr_proc_sh_t) == KVR_CACHELINE, "proc slot is one cache line");

/*
 * Supervisor status shared with every process (readiness, drain), read with relaxed loads:
 * a probe may see a value one event late. The supervisor writes all of it except the
 * running counts' increments: a worker adds itself to workers_running and the publisher
 * sets publisher_running once they serve; the supervisor takes them back (reap, or a hang
 * its watchdog found), guarded by the process slot's `ready` flag so each is undone once.
 * `late` has one bit per process slot whose heartbeat missed its deadline (half of
 * --hang-timeout); only the supervisor sets and clears it, and /readyz fails while any is set,
 * whichever worker answers (docs/concurrency.md, "Watchdog and readiness").
 */
typedef struct {
    _Atomic uint32_t draining;
    _Atomic uint32_t workers_expected;
    _Atomic uint32_t workers_running;
    _Atomic uint32_t publisher_expected;
    _Atomic uint32_t publisher_running;
    uint32_t pad0_;
    _Atomic uint64_t worker_restarts;
    _Atomic uint64_t publisher_restarts;
    _Atomic uint64_t started_unix_ms;
    _Atomic uint64_t hangs_killed; /* processes the watchdog found hung and killed */
    _Atomic uint64_t late;         /* bit = process slot: heartbeat late, until it moves or a replacement serves */
    uint64_t pad_[1];
} kvr_ctl_sh_t;
static_assert(sizeof(kvr_ctl_sh_t) == 72, "ctl layout");
static_assert(KVR_MAX_PROCS <= 64, "ctl.late has one bit per process slot");

/*
 * The segment header. Written by the supervisor before it forks (at creation, or at a warm
 * re-attach: backing, run and ctl), read-only afterwards except ctl.
 *
 * `run` counts the runs that have served this segment: 1 when it is formatted, + 1 at every
 * warm re-attach (attach_reset); it is logged at the re-attach. It is not the relay's
 * generation (layout_generation, kvr_relay_sh_t.generation, which each new publisher bumps).
 */
typedef struct {
    uint64_t magic;
    uint32_t layout_version;
    uint32_t backing; /* enum kvr_backing */
    uint64_t total_size;
    uint64_t run; /* runs of this segment: 1 when formatted, + 1 per warm re-attach */

    uint32_t page_size;
    uint32_t page_shift;
    uint64_t npages;
    uint64_t max_blocks;
    uint64_t nbuckets;
    uint64_t log_capacity;
    uint32_t pin_slots;
    uint32_t relay_pools; /* --max-pools: pools the store may make, filters the relay holds */

    uint64_t off_procs;
    uint64_t off_store;
    uint64_t off_entries;
    uint64_t off_buckets;
    uint64_t off_cbuckets; /* the index's canon chains: nbuckets heads (shm/index.h) */
    uint64_t off_pages;
    uint64_t off_scratch;
    uint64_t off_pins;
    uint64_t off_log;
    uint64_t off_arena;
    uint64_t arena_bytes;
    uint64_t off_relay;   /* kvr_relay_sh_t */
    uint64_t off_filter;  /* the publisher's Cuckoo filters: relay_pools x ckf_buckets words */
    uint64_t off_snap;    /* KVR_RELAY_SNAPSHOTS copies of one filter (any pool's) */
    uint64_t off_ring;    /* the delta frame ring */
    uint64_t off_tenants; /* kvr_tenants_sh_t: namespace registry and token table */
    uint64_t ssd_slots;   /* the disk index's slots (0: no disk tier) */
    uint64_t off_dindex;  /* the disk index (shm/dindex.h), when ssd_slots > 0 */
    uint64_t ckf_buckets;
    uint64_t struct_sig; /* sizes of the shared structures (kvr_seg_struct_sig) */
    uint64_t hdr_check;  /* XXH3 of the immutable header fields; written by kvr_seg_seal */
    kvr_ctl_sh_t ctl;
    uint8_t pad_[4096 - 31 * 8 - sizeof(kvr_ctl_sh_t)];
} kvr_seg_hdr_t;
static_assert(sizeof(kvr_seg_hdr_t) == 4096, "header is one page");
static_assert(offsetof(kvr_seg_hdr_t, run) == 24, "header layout");
static_assert(offsetof(kvr_seg_hdr_t, max_blocks) == 48, "header layout (tests/e2e poke it)");
static_assert(offsetof(kvr_seg_hdr_t, ctl) == 31 * 8, "header layout");
static_assert(offsetof(kvr_seg_hdr_t, off_procs) == 80, "header layout");

/* A process's handle on the segment (process-local, never in shared memory). */
struct kvr_seg_s {
    uint8_t *base;
    uint64_t size;
    int fd;
    int slot; /* this process's proc slot, -1 before claim */
    kvr_seg_hdr_t *hdr;
    kvr_proc_sh_t *procs;
    int attached; /* an existing segment file was re-attached: repair, do not format */
};

void kvr_seg_config_defaults(kvr_seg_config_t *cfg);

/* Computes the layout into *hdr (sizes and offsets only). Returns KVR_OK or KVR_EINVAL. */
int kvr_seg_layout(const kvr_seg_config_t *cfg, kvr_seg_hdr_t *hdr);

/*
 * Creates, maps and initialises a segment (header, proc table, store state). The caller
 * becomes no process slot's owner; call kvr_seg_proc_claim. Returns KVR_OK or KVR_ERR.
 */
int kvr_seg_create(kvr_seg_t *seg, const kvr_seg_config_t *cfg);

/* kvr_seg_lock_file: shm/segment_lock.h */

/*
 * Marks a formatted (or repaired) segment complete: header checksum, then the magic. A file
 * whose creator died before this is refused at the next start, never half-read.
 */
void kvr_seg_seal(kvr_seg_t *seg);

/* This build's signature of the shared structures' sizes (a header field). */
uint64_t kvr_seg_struct_sig(void);

/* Unmaps and closes. Safe on a zeroed handle. */
void kvr_seg_destroy(kvr_seg_t *seg);

/* Claims a free process slot for getpid() with the given role. Returns the slot or -1. */
int kvr_seg_proc_claim(kvr_seg_t *seg, uint32_t role);

/* Claims the given slot (the supervisor assigns slots to its children before fork). */
int kvr_seg_proc_claim_at(kvr_seg_t *seg, int slot, uint32_t role);

/* Finds the slot of pid (ACTIVE or DEAD), or -1. */
int kvr_seg_proc_find(const kvr_seg_t *seg, pid_t pid);

/* Debug check (KVR_DASSERT) of a supervisor-only entry point: this process holds a process
 * slot with the supervisor's role. */
KVR_DASSERT_FN static inline int kvr_seg_am_supervisor(const kvr_seg_t *seg)
{
    return seg->slot >= 0 && seg->procs[seg->slot].role == KVR_ROLE_SUPERVISOR &&
           kvr_atomic_load_relaxed(&seg->procs[seg->slot].pid) == (int32_t)getpid();
}

/* The calling process is alive and looping: advance its heartbeat (workers, publisher).
 * Relaxed: the supervisor's watchdog only compares samples (its relaxed loads pair with
 * nothing); only the slot's owner adds. */
static inline void kvr_seg_heartbeat(kvr_seg_t *seg)
{
    if (seg->slot < 0)
        return;
    KVR_DASSERT(kvr_atomic_load_relaxed(&seg->procs[seg->slot].pid) == (int32_t)getpid()); /* its owner */
    kvr_atomic_fetch_add_relaxed(&seg->procs[seg->slot].heartbeat, 1);
}

static inline void *kvr_seg_at(const kvr_seg_t *seg, uint64_t off)
{
    return seg->base + off;
}

const char *kvr_seg_backing_name(uint32_t backing);

/* A copy of what the request layer reports about the processes and the segment (readiness,
 * /metrics, the relay's RPCs), so that src/io reads no shared struct itself. Each field is
 * one relaxed load: a status, not a consistent snapshot. */
typedef struct {
    uint32_t draining;
    uint32_t workers_expected;
    uint32_t workers_running;
    uint32_t publisher_expected;
    uint32_t publisher_running;
    uint64_t late; /* process slots whose heartbeat is late (ctl.late) */
    uint64_t worker_restarts;
    uint64_t publisher_restarts;
    uint64_t hangs_killed;    /* children the watchdog killed (ctl.hangs_killed) */
    uint64_t started_unix_ms; /* when the supervisor started serving (ctl.started_unix_ms) */
    uint64_t max_blocks;
    uint64_t ckf_buckets;
    int hugetlb;
} kvr_seg_status_t;

void kvr_seg_status(const kvr_seg_t *seg, kvr_seg_status_t *out);

/* 1 while a publisher is running (the relay's RPCs and metrics ask this per request). */
int kvr_seg_publisher_up(const kvr_seg_t *seg);

/*
 * Accept turns. Every worker accepts from the one HTTP listener while it holds at most
 * `slack` connections more than the least loaded other worker that serves; past that it
 * stops accepting and wakes that worker instead (docs/concurrency.md, "Accept turns").
 *
 * kvr_seg_set_conns publishes the calling worker's connection count. kvr_seg_accept_yield
 * returns -1 when the caller, holding `mine`, should go on accepting, or else the process slot
 * of the least loaded serving worker. kvr_seg_worker_load gives slot's count and heartbeat and
 * returns 1 if slot is a worker that serves (ready), 0 otherwise.
 */
void kvr_seg_set_conns(kvr_seg_t *seg, uint32_t n);
int kvr_seg_accept_yield(const kvr_seg_t *seg, uint32_t mine, uint32_t slack);
int kvr_seg_worker_load(const kvr_seg_t *seg, int slot, uint32_t *conns, uint64_t *heartbeat);

#endif
