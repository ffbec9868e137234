/*
 * prefault.h — a worker's arena mapping thread.
 *
 * Workers are processes: each has page tables of its own, and a shared-memory page that
 * another worker filled is still unmapped here until this worker touches it, a minor fault
 * (about 2 us on our VM) inside the receive that copies a PUT body into the arena. Until every
 * worker has touched every page, that is most of a fill's pages, once per worker: a 16 KiB PUT
 * paid 0.8 faults on average right after a fill of 1.5x the arena (docs/dataplane.md).
 *
 * The thread started here maps the arena into this worker's page tables ahead of use, with
 * MADV_POPULATE_WRITE (Linux 5.14), up to `lead` bytes past the arena's high-water mark
 * (kvr_arena_high_water): a page below the mark is mapped in by its first fault elsewhere, or
 * is allocated here (the first worker there commits it, as the PUT about to land would). It
 * never writes a byte of data, takes no lock and touches no other shared state; it sleeps while
 * the mark stands still and exits once the whole arena is mapped. A kernel without the advice
 * logs once and leaves the faults as they were.
 *
 * With `collapse` (the segment is shmem of 4 KiB pages: no hugetlb pages were reserved), each
 * 2 MiB it has mapped is then collapsed into one transparent huge page (MADV_COLLAPSE, Linux
 * 6.1; it works whatever the kernel's shmem THP policy says, so no sysfs setting is needed).
 * The huge page lives in the shared file, so every worker maps it with one page-table entry
 * instead of 512: what reserved huge pages give (docs/dataplane.md, "Huge pages"). A range
 * another worker is collapsing at the same moment is skipped (EAGAIN: that worker's turn); any
 * other refusal logs once and leaves 4 KiB pages from there on.
 */
#ifndef KVR_PROC_PREFAULT_H
#define KVR_PROC_PREFAULT_H

#include "common.h"
#include "shm/arena.h"

/* Starts the thread (lead 0: does nothing, collapses nothing, and says so when asked to
 * collapse). Returns KVR_OK, or KVR_ERR when the thread cannot start (logged; the worker
 * serves on, with faults). The arena handle must outlive the process. */
int kvr_prefault_start(const kvr_arena_t *arena, uint64_t lead, int collapse);

#endif
