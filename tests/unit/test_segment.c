/*
 * Unit tests of the shared segment (src/shm/segment.c): its layout and its backing (huge
 * pages and the fallback); warm restart (issue 13): re-attach of a sealed file with the store
 * repaired, refusal of another geometry, a corrupted header, another structure signature, a
 * file in use, a file on a disk filesystem; --segment-reset; an unsealed file starts empty.
 * The file's lock: a gone holder's lock is waited for, a live kvrelay refused at once, any
 * other holder waited for up to the bound (issue 20). The rule of the workers' accept turns
 * over their process slots (kvr_seg_accept_yield).
 */
#include "base/log.h"
#include "core/store.h"
#include "shm/segment.h"
#include "shm/segment_lock.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ the segment file */

static char path[128];

static void mkpath(const char *what)
{
    snprintf(path, sizeof(path), "/dev/shm/kvrelay-unit-%d-%s.seg", (int)getpid(), what);
    unlink(path);
}

/* A failed assertion ends the test early: the file goes anyway. */
static void rm_path(void)
{
    if (path[0] != '\0')
        unlink(path);
}

static kvr_seg_config_t cfg_of(uint64_t memory, int reset)
{
    kvr_seg_config_t c = {
        .memory = memory,
        .page_size = 4096,
        .max_blocks = 256,
        .ckf_buckets = 64,
        .hugepages = KVR_HUGEPAGES_AUTO,
        .path = path,
        .reset = reset,
    };
    return c;
}

/* Creates, formats, seals; PUTs n blocks; returns with the segment mapped (caller destroys). */
static void fresh(kvr_seg_t *seg, kvr_store_t *st, uint64_t memory, int n)
{
    kvr_seg_config_t c = cfg_of(memory, 0);
    char key[32], val[300];

    kvr_log_level = KVR_LOG_OFF;
    cr_assert_eq(kvr_seg_create(seg, &c), KVR_OK);
    cr_assert_eq(seg->attached, 0);
    cr_assert_eq(seg->hdr->magic, 0, "unsealed until the store is formatted");
    cr_assert_eq(kvr_store_format(seg, 0), KVR_OK);
    kvr_seg_seal(seg);
    cr_assert_geq(kvr_seg_proc_claim(seg, 0), 0);
    cr_assert_eq(kvr_store_open(st, seg), KVR_OK);
    cr_assert_eq(kvr_store_pool(st, KVR_NS_DEFAULT, "default", "kvrelay", 7, KVR_POOLS_MAX), 0);
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "blk-%d", i);
        memset(val, 'a' + i % 26, sizeof(val));
        cr_assert_eq(kvr_store_put(st, KVR_NS_DEFAULT, 0, key, strlen(key), val, 100 + (uint64_t)i, (uint64_t)i + 1), KVR_PUT_CREATED);
    }
}

/* Runs kvr_seg_create in a child (the parent may still hold the file's lock). */
static int create_in_child(kvr_seg_config_t c)
{
    pid_t pid = fork();
    int status;

    if (pid == 0) {
        kvr_seg_t s;
        kvr_log_level = KVR_LOG_OFF;
        _exit(kvr_seg_create(&s, &c) == KVR_OK ? 0 : 1);
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

Test(segment_file, reattach_repairs_reservations_and_pins_and_keeps_blocks, .fini = rm_path)
{
    kvr_seg_t seg, seg2;
    kvr_store_t st, st2, st3;
    kvr_put_txn_t txn;
    kvr_block_ref_t ref;
    kvr_store_stats_t s0, s1;
    kvr_seg_config_t c;
    char val[300];

    mkpath("reattach");
    fresh(&seg, &st, 8 << 20, 50);
    /* A second "process" leaves a reservation (half-written block) and a pin behind. */
    seg2 = seg;
    seg2.slot = -1;
    cr_assert_geq(kvr_seg_proc_claim(&seg2, 0), 0);
    cr_assert_eq(kvr_store_open(&st2, &seg2), KVR_OK);
    cr_assert_eq(kvr_store_put_begin(&st2, KVR_NS_DEFAULT, 0, "half", 4, 5000, 77, &txn), KVR_OK);
    cr_assert_eq(kvr_store_get(&st2, KVR_NS_DEFAULT, "blk-3", 5, &ref), KVR_OK);
    kvr_store_stats(&st, &s0);
    cr_assert_eq(s0.unique_blocks, 50);
    cr_assert_eq(s0.pinned_blocks, 1);
    uint64_t run1 = seg.hdr->run;
    kvr_seg_destroy(&seg); /* like SIGKILL of everything: nothing was cleaned up */

    c = cfg_of(8 << 20, 0);
    kvr_log_level = getenv("KVR_UNIT_LOG") ? KVR_LOG_DEBUG : KVR_LOG_OFF;
    cr_assert_eq(kvr_seg_create(&seg, &c), KVR_OK);
    cr_assert_eq(seg.attached, 1);
    cr_assert_eq(seg.hdr->run, run1 + 1, "the run counter moves");
    for (int i = 0; i < KVR_MAX_PROCS; i++)
        cr_assert_eq(atomic_load(&seg.procs[i].state), KVR_PROC_FREE);
    cr_assert_eq(kvr_store_attach(&seg, 0), KVR_OK);
    kvr_seg_seal(&seg);
    cr_assert_geq(kvr_seg_proc_claim(&seg, 0), 0);
    cr_assert_eq(kvr_store_open(&st3, &seg), KVR_OK);
    cr_assert_eq(kvr_store_check(&st3, &s1), KVR_OK, "the repaired store is consistent");
    kvr_store_stats(&st3, &s1);
    cr_assert_eq(s1.unique_blocks, 50);
    cr_assert_eq(s1.resident_bytes, s0.resident_bytes, "the reservation is dropped, nothing else");
    cr_assert_eq(s1.pinned_blocks, 0, "the dead process's pin is gone");
    cr_assert_eq(kvr_store_exists(&st3, KVR_NS_DEFAULT, "half", 4, NULL), 0);
    for (int i = 0; i < 50; i++) {
        char key[32];
        uint8_t got[300];
        snprintf(key, sizeof(key), "blk-%d", i);
        memset(val, 'a' + i % 26, sizeof(val));
        cr_assert_eq(kvr_store_get(&st3, KVR_NS_DEFAULT, key, strlen(key), &ref), KVR_OK, "%s", key);
        cr_assert_eq(ref.length, 100 + (uint64_t)i);
        cr_assert_eq(ref.canon, (uint64_t)i + 1);
        cr_assert_eq(kvr_store_read(&st3, &ref, 0, got, ref.length), KVR_OK);
        cr_assert_eq(memcmp(got, val, ref.length), 0);
        kvr_store_unpin(&st3, &ref);
    }
    /* The freed reservation's pages are usable again. */
    cr_assert_eq(kvr_store_put(&st3, KVR_NS_DEFAULT, 0, "half", 4, val, 200, 77), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_check(&st3, NULL), KVR_OK);
    kvr_seg_destroy(&seg);
    unlink(path);
}

Test(segment_file, geometry_mismatch_and_in_use_are_refused, .fini = rm_path)
{
    kvr_seg_t seg;
    kvr_store_t st;
    kvr_seg_config_t c;

    mkpath("geometry");
    fresh(&seg, &st, 8 << 20, 5);
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 0)), 1, "the file is locked while its run lives");
    kvr_seg_destroy(&seg);
    cr_assert_eq(create_in_child(cfg_of(16 << 20, 0)), 1, "another --memory is refused");
    c = cfg_of(8 << 20, 0);
    c.max_blocks = 512;
    cr_assert_eq(create_in_child(c), 1, "another --max-blocks is refused");
    c = cfg_of(8 << 20, 0);
    c.page_size = 8192;
    cr_assert_eq(create_in_child(c), 1, "another --page-size is refused");
    c = cfg_of(8 << 20, 0);
    c.ckf_buckets = 128;
    cr_assert_eq(create_in_child(c), 1, "another filter size is refused");
    c = cfg_of(8 << 20, 0);
    c.ssd_slots = 1000;
    cr_assert_eq(create_in_child(c), 1, "a disk index the file does not have is refused");
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 0)), 0, "the same geometry attaches");
    /* --segment-reset: the file is emptied and formatted again. */
    c = cfg_of(16 << 20, 1);
    kvr_log_level = KVR_LOG_OFF;
    cr_assert_eq(kvr_seg_create(&seg, &c), KVR_OK);
    cr_assert_eq(seg.attached, 0);
    cr_assert_eq(kvr_store_format(&seg, 0), KVR_OK);
    kvr_seg_seal(&seg);
    kvr_seg_destroy(&seg);
    cr_assert_eq(create_in_child(cfg_of(16 << 20, 0)), 0);
    unlink(path);
}

/* A segment with a disk tier: the store maps the disk index, the format empties it, and a
 * warm re-attach empties it again (its disk writer restores it from the file). */
Test(segment_file, the_disk_index_is_mapped_and_emptied_at_attach, .fini = rm_path)
{
    kvr_seg_t seg;
    kvr_store_t st;
    kvr_seg_config_t c = cfg_of(8 << 20, 0);
    kvr_dslot_t v = {.h1 = 11, .h2 = 22, .key_len = 5, .length = 100, .page = 1, .version = 3}, old, got;
    uint32_t id;

    mkpath("dindex");
    c.ssd_slots = 500;
    kvr_log_level = KVR_LOG_OFF;
    cr_assert_eq(kvr_seg_create(&seg, &c), KVR_OK);
    cr_assert_eq(kvr_store_format(&seg, 0), KVR_OK);
    kvr_seg_seal(&seg);
    cr_assert_geq(kvr_seg_proc_claim(&seg, 0), 0);
    cr_assert_eq(kvr_store_open(&st, &seg), KVR_OK);
    cr_assert_not_null(st.dx.sh);
    cr_assert_eq(st.dx.nslots, 500);
    cr_assert_eq(kvr_dindex_lookup(&st.dx, 0, 11, 22, 5, &got, &id), 0, "formatted empty");
    cr_assert_eq(kvr_dindex_put(&st.dx, &v, &id, &old), KVR_OK);
    cr_assert_eq(kvr_dindex_lookup(&st.dx, 0, 11, 22, 5, &got, &id), 1);
    kvr_seg_destroy(&seg);

    cr_assert_eq(kvr_seg_create(&seg, &c), KVR_OK);
    cr_assert_eq(seg.attached, 1);
    cr_assert_eq(kvr_store_attach(&seg, 0), KVR_OK);
    kvr_seg_seal(&seg);
    cr_assert_geq(kvr_seg_proc_claim(&seg, 0), 0);
    cr_assert_eq(kvr_store_open(&st, &seg), KVR_OK);
    cr_assert_eq(kvr_dindex_lookup(&st.dx, 0, 11, 22, 5, &got, &id), 0, "emptied at the re-attach");
    cr_assert_eq(kvr_dindex_live(&st.dx), 0);
    kvr_seg_destroy(&seg);

    c.ssd_slots = 0; /* a segment without a disk tier maps none */
    c.reset = 1;
    cr_assert_eq(kvr_seg_create(&seg, &c), KVR_OK);
    cr_assert_eq(kvr_store_format(&seg, 0), KVR_OK);
    kvr_seg_seal(&seg);
    cr_assert_geq(kvr_seg_proc_claim(&seg, 0), 0);
    cr_assert_eq(kvr_store_open(&st, &seg), KVR_OK);
    cr_assert_null(st.dx.sh);
    kvr_seg_destroy(&seg);
}

static void poke(off_t off, const void *b, size_t n)
{
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, b, n, off), (ssize_t)n);
    close(fd);
}

Test(segment_file, corrupted_header_version_signature_and_size_are_refused, .fini = rm_path)
{
    kvr_seg_t seg;
    kvr_store_t st;
    uint64_t junk = 0x1234, zero = 0;
    uint32_t v2 = KVR_SEG_LAYOUT_VERSION + 1;

    mkpath("corrupt");
    fresh(&seg, &st, 8 << 20, 5);
    kvr_seg_destroy(&seg);
    /* one flipped byte in a geometry field: the checksum catches it before the comparison */
    poke(offsetof(kvr_seg_hdr_t, max_blocks), &junk, 1);
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 0)), 1, "a corrupted header is refused");
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 1)), 0, "--segment-reset starts over");

    mkpath("corrupt");
    fresh(&seg, &st, 8 << 20, 5);
    kvr_seg_destroy(&seg);
    poke(offsetof(kvr_seg_hdr_t, layout_version), &v2, sizeof(v2));
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 0)), 1, "another layout version is refused");

    mkpath("corrupt");
    fresh(&seg, &st, 8 << 20, 5);
    kvr_seg_destroy(&seg);
    poke(0, &junk, sizeof(junk));
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 0)), 1, "a wrong magic is refused");

    mkpath("corrupt");
    fresh(&seg, &st, 8 << 20, 5);
    kvr_seg_destroy(&seg);
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 0)), 0, "an untouched file attaches");
    junk = kvr_seg_struct_sig() ^ 1;
    poke(offsetof(kvr_seg_hdr_t, struct_sig), &junk, sizeof(junk));
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 0)), 1, "a file of a build with other structures is refused");
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 1)), 0);
    mkpath("corrupt");
    fresh(&seg, &st, 8 << 20, 5);
    kvr_seg_destroy(&seg);
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 0)), 0, "an untouched file still attaches");
    cr_assert_eq(truncate(path, 4 << 20), 0);
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 0)), 1, "a truncated file is refused");
    cr_assert_eq(truncate(path, 100), 0);
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 0)), 1, "a file smaller than a header is refused");
    /* an unsealed file (its creator died during start-up) starts empty */
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 1)), 0);
    cr_assert_eq(truncate(path, 0), 0);
    {
        kvr_seg_config_t c = cfg_of(8 << 20, 0);
        kvr_log_level = KVR_LOG_OFF;
        cr_assert_eq(kvr_seg_create(&seg, &c), KVR_OK); /* never sealed */
        kvr_seg_destroy(&seg);
    }
    poke(offsetof(kvr_seg_hdr_t, hdr_check), &zero, sizeof(zero));
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 0)), 0, "an unsealed file starts empty");
    unlink(path);
}

/* Like create_in_child, with the child's log lines (errors) in msg. */
static int create_in_child_msg(kvr_seg_config_t c, char *msg, size_t n)
{
    char tmpl[] = "/tmp/kvr-unit-msg-XXXXXX";
    int fd = mkstemp(tmpl), status;
    pid_t pid;
    ssize_t got;

    cr_assert_geq(fd, 0);
    unlink(tmpl);
    pid = fork();
    if (pid == 0) {
        kvr_seg_t s;
        dup2(fd, STDERR_FILENO);
        kvr_log_level = KVR_LOG_ERROR;
        _exit(kvr_seg_create(&s, &c) == KVR_OK ? 0 : 1);
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    got = pread(fd, msg, n - 1, 0);
    msg[got > 0 ? got : 0] = '\0';
    close(fd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

/* A file written by a build of the layout version before this one: refused at the
 * warm restart, naming both versions; --segment-reset starts empty instead. */
Test(segment_file, a_segment_of_the_old_layout_is_refused_naming_both_versions, .fini = rm_path)
{
    kvr_seg_t seg;
    kvr_store_t st;
    uint32_t old = KVR_SEG_LAYOUT_VERSION - 1; /* the segment an earlier build left behind */
    char msg[2048], want[128];

    mkpath("oldlayout");
    fresh(&seg, &st, 8 << 20, 5);
    kvr_seg_destroy(&seg);
    poke(offsetof(kvr_seg_hdr_t, layout_version), &old, sizeof(old));
    cr_assert_eq(create_in_child_msg(cfg_of(8 << 20, 0), msg, sizeof(msg)), 1, "an old layout is refused");
    snprintf(want, sizeof(want), "layout version %u, this build reads version %u; refusing it", old,
             KVR_SEG_LAYOUT_VERSION);
    cr_assert(strstr(msg, want) != NULL, "the refusal names both versions: %s", msg);
    cr_assert(strstr(msg, "--segment-reset starts empty") != NULL, "and the way out: %s", msg);
    cr_assert_eq(create_in_child(cfg_of(8 << 20, 1)), 0, "--segment-reset starts over");
    unlink(path);
}

Test(segment_file, a_disk_filesystem_is_refused)
{
    char dir[] = "/var/tmp/kvrelay-unit-XXXXXX";
    kvr_seg_config_t c;

    struct statfs sfs;

    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(statfs(dir, &sfs), 0);
    if (sfs.f_type == TMPFS_MAGIC || sfs.f_type == HUGETLBFS_MAGIC) {
        rmdir(dir);
        cr_skip_test("/var/tmp is a memory filesystem here: no disk to refuse");
    }
    snprintf(path, sizeof(path), "%s/seg", dir);
    c = cfg_of(8 << 20, 0);
    cr_assert_eq(create_in_child(c), 1, "a segment file on a disk filesystem is refused");
    unlink(path);
    rmdir(dir);
}

/* ------------------------------------------------------------------ the file's lock (issue 20) */

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * Forks a process that takes the lock on path under the name comm, then holds it for hold_ms
 * (0: until killed). orphan: it forks again and exits at once, leaving the lock (one open file
 * description) to its child, so /proc/locks names a pid that is gone, as after a SIGKILL of a
 * run whose rings the kernel has not torn down yet. Returns the pid that took the lock (reaped
 * already when orphan), once the lock is held.
 */
static pid_t hold_lock(const char *comm, int hold_ms, int orphan)
{
    int p[2], status;
    pid_t pid;
    char b;

    cr_assert_eq(pipe(p), 0);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(path, O_RDWR | O_CREAT, 0600);
        prctl(PR_SET_NAME, comm);
        if (fd < 0 || flock(fd, LOCK_EX) < 0)
            _exit(1);
        if (orphan && fork() != 0)
            _exit(0);
        (void)!write(p[1], "h", 1);
        if (hold_ms == 0)
            for (;;)
                pause();
        /* not synchronisation: holding the lock this long is the scenario under test */
        usleep((useconds_t)hold_ms * 1000);
        _exit(0);
    }
    close(p[1]);
    cr_assert_eq(read(p[0], &b, 1), 1, "the holder took the lock");
    close(p[0]);
    if (orphan) {
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    return pid;
}

static void stop_holder(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

Test(segment_lock, a_gone_holders_lock_is_waited_for, .fini = rm_path)
{
    int fd;
    uint64_t t0;

    mkpath("lock-gone");
    kvr_log_level = KVR_LOG_OFF;
    hold_lock("holder", 300, 1);
    fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    t0 = mono_ms();
    cr_assert_eq(kvr_seg_lock_file(fd, path, 5000), KVR_OK, "the lock comes free once the last holder goes");
    cr_assert_geq(mono_ms() - t0, 200, "and not before");
    cr_assert_lt(mono_ms() - t0, 4000);
    close(fd);
    unlink(path);
}

Test(segment_lock, a_live_kvrelay_is_refused_at_once, .fini = rm_path)
{
    pid_t holder;
    int fd;
    uint64_t t0;

    mkpath("lock-live");
    kvr_log_level = KVR_LOG_OFF;
    holder = hold_lock("kvr worker 0", 0, 0);
    fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    t0 = mono_ms();
    cr_assert_eq(kvr_seg_lock_file(fd, path, 5000), KVR_ERR);
    cr_assert_lt(mono_ms() - t0, 1000, "no wait for a live kvrelay");
    stop_holder(holder);
    cr_assert_eq(kvr_seg_lock_file(fd, path, 5000), KVR_OK, "the lock of a killed holder (reaped) is free");
    close(fd);
    unlink(path);
}

Test(segment_lock, another_live_holder_is_waited_for_up_to_the_bound, .fini = rm_path)
{
    pid_t holder;
    int fd;
    uint64_t t0;

    mkpath("lock-other");
    kvr_log_level = KVR_LOG_OFF;
    holder = hold_lock("not-ours", 0, 0);
    fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    t0 = mono_ms();
    cr_assert_eq(kvr_seg_lock_file(fd, path, 300), KVR_ERR, "still held after the bound");
    cr_assert_geq(mono_ms() - t0, 300);
    cr_assert_lt(mono_ms() - t0, 3000);
    t0 = mono_ms();
    cr_assert_eq(kvr_seg_lock_file(fd, path, 0), KVR_ERR, "no bound: refused at once");
    cr_assert_lt(mono_ms() - t0, 1000);
    stop_holder(holder);
    close(fd);
    unlink(path);
}

/* ------------------------------------------------------------------ layout and backing */

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
    cr_assert_eq(h.log_capacity, 1ull << 17, "8192 entries: the change log's floor, not 2 x 8192");
    cr_assert_eq(h.ssd_slots, 0);
    cr_assert_eq(h.off_dindex, 0, "no disk tier, no region");

    /* the disk index's region: aligned, sized, before the arena */
    kvr_seg_hdr_t d;
    cfg.ssd_slots = 100000;
    cr_assert_eq(kvr_seg_layout(&cfg, &d), KVR_OK);
    cr_assert_eq(d.ssd_slots, 100000);
    cr_assert_eq(d.off_dindex % 4096, 0);
    cr_assert_geq(d.off_dindex, d.off_tenants + sizeof(kvr_tenants_sh_t));
    cr_assert_leq(d.off_dindex + kvr_dindex_bytes(100000), d.off_arena);
    cr_assert_geq(d.total_size - h.total_size + KVR_HUGE_PAGE, kvr_dindex_bytes(100000), "the segment grew by it");
    cfg.ssd_slots = KVR_NIL;
    cr_assert_eq(kvr_seg_layout(&cfg, &d), KVR_EINVAL, "slot numbers are 32-bit");
    cfg.ssd_slots = 0;

    kvr_seg_hdr_t l;
    cfg.max_blocks = 100000;
    cr_assert_eq(kvr_seg_layout(&cfg, &l), KVR_OK);
    cr_assert_eq(l.log_capacity, 1ull << 18, "over the floor: two events per entry, to a power of two");
    cfg.max_blocks = 0;
    cfg.log_capacity = 4000;
    cr_assert_eq(kvr_seg_layout(&cfg, &l), KVR_OK);
    cr_assert_eq(l.log_capacity, 4096, "--change-log-events, to a power of two");
    cfg.log_capacity = 0;

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
    cr_assert_eq((uintptr_t)seg.base % KVR_HUGE_PAGE, 0, "mapped at a 2 MiB boundary, for huge pages");
    cr_assert_eq(seg.hdr->magic, KVR_SEG_MAGIC);
    cr_assert_eq(seg.hdr->layout_version, KVR_SEG_LAYOUT_VERSION);
    kvr_seg_destroy(&seg);
}

static long read_long(const char *file)
{
    FILE *f = fopen(file, "r");
    long v = -1;
    if (f != NULL) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static int write_long(const char *file, long v)
{
    FILE *f = fopen(file, "w");
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
    cr_expect_eq(kvr_store_pool(&st, KVR_NS_DEFAULT, "default", "kvrelay", 7, KVR_POOLS_MAX), 0);
    cr_expect_eq(kvr_store_put(&st, KVR_NS_DEFAULT, 0, "hp", 2, "bytes", 5, 0), KVR_PUT_CREATED);
    cr_expect_eq(kvr_store_exists(&st, KVR_NS_DEFAULT, "hp", 2, NULL), 1);
    kvr_seg_destroy(&seg);
    if (free_now < need)
        write_long(nr, orig);
}

/* ------------------------------------------------------------------ accept turns */

/* A handle on f's segment claiming `slot` as a worker (a simulated process), ready or not. */
static void as_worker(const kvr_seg_t *f, kvr_seg_t *h, int slot, uint32_t role, int ready, uint32_t conns)
{
    *h = *f;
    h->slot = -1;
    cr_assert_eq(kvr_seg_proc_claim_at(h, slot, role), slot);
    kvr_seg_set_conns(h, conns);
    atomic_store(&h->procs[slot].ready, (uint32_t)ready);
}

Test(accept_turns, yield_to_the_least_loaded_serving_worker_past_the_slack)
{
    kvr_seg_config_t sc = {0};
    kvr_seg_t seg, w1, w2, w3, pub;
    uint32_t conns;
    uint64_t hb;

    kvr_log_level = KVR_LOG_ERROR;
    sc.memory = 4 << 20;
    sc.page_size = 64 << 10;
    sc.max_blocks = 64;
    sc.hugepages = KVR_HUGEPAGES_OFF;
    cr_assert_eq(kvr_seg_create(&seg, &sc), KVR_OK);
    cr_assert_eq(kvr_store_format(&seg, 0), KVR_OK);
    as_worker(&seg, &w1, 1, KVR_ROLE_WORKER, 1, 0);
    cr_assert_eq(kvr_seg_accept_yield(&w1, 100, 1), -1, "the only serving worker always accepts");

    as_worker(&seg, &w2, 2, KVR_ROLE_WORKER, 1, 3);
    as_worker(&seg, &w3, 3, KVR_ROLE_WORKER, 1, 5);
    as_worker(&seg, &pub, 4, KVR_ROLE_PUBLISHER, 1, 0);
    cr_assert_eq(kvr_seg_worker_load(&w1, 2, &conns, &hb), 1);
    cr_assert_eq(conns, 3, "kvr_seg_set_conns is read back by another process");
    cr_assert_eq(kvr_seg_worker_load(&w1, 4, &conns, &hb), 0, "the publisher is no worker");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 4, 1), -1, "one more than the least loaded (3): still ours");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 5, 1), 2, "two more: the turn goes to slot 2, not the publisher");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 3, 0), -1, "slack 0: level is still ours");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 4, 0), 2);

    atomic_store(&w2.procs[2].ready, 0); /* hung or dead: out of every decision */
    cr_assert_eq(kvr_seg_worker_load(&w1, 2, &conns, &hb), 0);
    cr_assert_eq(kvr_seg_accept_yield(&w1, 6, 1), -1, "5 + 1 without slot 2");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 7, 1), 3);
    kvr_seg_set_conns(&w3, 0);
    cr_assert_eq(kvr_seg_accept_yield(&w3, 0, 1), -1, "a worker never yields to itself");
    cr_assert_eq(kvr_seg_accept_yield(&w1, 2, 1), 3, "a new count moves the turn at once");
    kvr_seg_destroy(&seg);
}
