/*
 * segment_lock.c — the segment file's lock (kvr_seg_lock_file, shm/segment_lock.h): who holds it,
 * and whether a start waits for it or is refused.
 */
#include "shm/segment_lock.h"

#include "common.h"

#include "base/clock.h"
#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/*
 * The segment file's lock. flock is released when the last reference to the open file goes,
 * and after a SIGKILL of a whole run that is not when its processes die: the kernel still
 * tears their io_uring rings and mappings down for a few to some tens of milliseconds (seen:
 * a restart right after the kill refused in one of five tries). So a start that finds the
 * lock taken asks who took it, and waits unless that is a live kvrelay.
 */
enum { HOLDER_UNKNOWN,
       HOLDER_GONE,
       HOLDER_EXITING,
       HOLDER_KVRELAY,
       HOLDER_OTHER };

/* The pid /proc/locks names for the flock on fd's file, or 0 when none is listed (a lock
 * released in the meantime, a holder in another pid namespace, no /proc). */
static pid_t flock_holder(int fd)
{
    struct stat st;
    char line[256], kind[16];
    unsigned maj, min;
    unsigned long long ino;
    pid_t pid = 0;
    int p;
    FILE *f;

    if (fstat(fd, &st) < 0 || (f = fopen("/proc/locks", "re")) == NULL)
        return 0;
    /* "1: FLOCK  ADVISORY  WRITE 4242 00:1b:2 0 EOF"; a blocked waiter's line has "->" */
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, "->") != NULL ||
            sscanf(line, "%*d: %15s %*s %*s %d %x:%x:%llu", kind, &p, &maj, &min, &ino) != 5)
            continue;
        if (!strcmp(kind, "FLOCK") && maj == major(st.st_dev) && min == minor(st.st_dev) &&
            ino == (unsigned long long)st.st_ino) {
            pid = p;
            break;
        }
    }
    fclose(f);
    return pid;
}

/* What pid is, from /proc: its state, flags and pending signals, and its name into comm. */
static int holder_state(pid_t pid, char *comm, size_t n)
{
    char path[64], buf[512], exe[256], *l, *r;
    unsigned long flags = 0;
    unsigned long long pend;
    char state = '?';
    ssize_t len;
    int fd, rc;
    FILE *f;

    comm[0] = '\0';
    if (pid <= 0)
        return HOLDER_UNKNOWN;
    if (pid == getpid())
        return HOLDER_GONE; /* its pid, reused: whoever holds the lock is not this process */
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return HOLDER_GONE;
    len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (len <= 0)
        return HOLDER_GONE;
    buf[len] = '\0';
    /* "pid (comm) S ppid pgrp session tty tpgid flags ...": comm may hold spaces and ')' */
    if ((l = strchr(buf, '(')) == NULL || (r = strrchr(buf, ')')) == NULL || r < l)
        return HOLDER_UNKNOWN;
    snprintf(comm, n, "%.*s", (int)(r - l - 1), l + 1);
    if (sscanf(r + 1, " %c %*d %*d %*d %*d %*d %lu", &state, &flags) != 2)
        return HOLDER_UNKNOWN;
    if (state == 'Z' || state == 'X')
        return HOLDER_GONE;
    if (flags & 0x4) /* PF_EXITING */
        return HOLDER_EXITING;
    /* kill(2) of a process queues SIGKILL in its shared pending set until it is reaped: it
     * shows there before the process has run far enough to set PF_EXITING */
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    if ((f = fopen(path, "re")) != NULL) {
        rc = HOLDER_OTHER;
        while (fgets(buf, sizeof(buf), f) != NULL)
            if ((sscanf(buf, "ShdPnd: %llx", &pend) == 1 || sscanf(buf, "SigPnd: %llx", &pend) == 1) &&
                (pend & (1ull << (SIGKILL - 1))))
                rc = HOLDER_EXITING;
        fclose(f);
        if (rc == HOLDER_EXITING)
            return rc;
    }
    /* kvrelay's processes title themselves "kvr <role>" (base/proctitle.c); before that, the
     * comm is the binary's name, cut to 15 bytes */
    if (!strncmp(comm, "kvr ", 4) || !strncmp(comm, "kvrelay", 7))
        return HOLDER_KVRELAY;
    snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
    if ((len = readlink(path, exe, sizeof(exe) - 1)) > 0) {
        exe[len] = '\0';
        l = strrchr(exe, '/');
        if (!strncmp(l != NULL ? l + 1 : exe, "kvrelay", 7))
            return HOLDER_KVRELAY;
    }
    return HOLDER_OTHER;
}

static const char *holder_name(int st)
{
    switch (st) {
    case HOLDER_GONE:
        return "gone";
    case HOLDER_EXITING:
        return "exiting";
    case HOLDER_KVRELAY:
        return "a live kvrelay";
    case HOLDER_OTHER:
        return "alive, not a kvrelay";
    default:
        return "unknown";
    }
}

int kvr_seg_lock_file(int fd, const char *path, uint32_t wait_ms)
{
    uint64_t t0 = kvr_clock_ms(), waited;
    char comm[64], who[128];
    int waiting = 0, st;
    pid_t pid;

    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            if (waiting)
                kvr_info("segment file %s: got its lock after %llu ms", path,
                         (unsigned long long)(kvr_clock_ms() - t0));
            return KVR_OK;
        }
        if (errno != EWOULDBLOCK && errno != EINTR) {
            kvr_error("segment file %s: flock: %s", path, strerror(errno));
            return KVR_ERR;
        }
        pid = flock_holder(fd);
        st = holder_state(pid, comm, sizeof(comm));
        if (st == HOLDER_KVRELAY) {
            kvr_error("segment file %s is in use by another running kvrelay (pid %d, %s); refusing it", path,
                      (int)pid, comm);
            return KVR_ERR;
        }
        snprintf(who, sizeof(who), "holder pid %d%s%s%s: %s", (int)pid, comm[0] ? " (" : "", comm,
                 comm[0] ? ")" : "", holder_name(st));
        waited = kvr_clock_ms() - t0;
        if (waited >= wait_ms) {
            kvr_error("segment file %s is still locked after %llu ms (%s); refusing it", path,
                      (unsigned long long)waited, who);
            return KVR_ERR;
        }
        if (!waiting) {
            waiting = 1;
            kvr_warn("segment file %s is locked (%s): waiting up to %u ms for its lock (a killed run holds it "
                     "until the kernel has torn its processes down)",
                     path, who, wait_ms);
        }
        usleep(20000);
    }
}
