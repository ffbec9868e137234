/*
 * ssdfault.c — the disk tier's fault hook (see ssdfault.h).
 */
#include "io/ssdfault.h"

#include "base/log.h"
#include "common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { F_UNREAD = 0,
       F_NONE,
       F_READ_EIO,
       F_READ_EOF,
       F_READ_SHORT,
       F_WRITE_EIO,
       F_WRITE_SHORT };

static const char *const names[] = {
    [F_READ_EIO] = "read-eio",
    [F_READ_EOF] = "read-eof",
    [F_READ_SHORT] = "read-short",
    [F_WRITE_EIO] = "write-eio",
    [F_WRITE_SHORT] = "write-short",
};

/* One hook per process, read from the environment at its first I/O. Record reads run on a
 * worker's one thread, writes on the publisher's disk writer: each op's counter has one thread. */
static int fault = F_UNREAD;
static unsigned long every = 1, nread, nwrite;

static int hook(void)
{
    if (KVR_LIKELY(fault != F_UNREAD))
        return fault;
    const char *v = getenv("KVRELAY_SSD_FAULT");
    int f = F_NONE;
    if (v != NULL && *v != '\0') {
        size_t len = strcspn(v, ":");
        for (int i = F_READ_EIO; i <= F_WRITE_SHORT; i++)
            if (strlen(names[i]) == len && memcmp(v, names[i], len) == 0)
                f = i;
        if (v[len] == ':') {
            char *end;
            unsigned long n = strtoul(v + len + 1, &end, 10);
            every = *end == '\0' && n > 0 ? n : 0;
        }
        if (f == F_NONE || every == 0) {
            kvr_warn("ssd: KVRELAY_SSD_FAULT=%s is not <fault>[:N] (docs/ssd-tier.md, \"Faults\"): ignored", v);
            f = F_NONE;
        } else {
            kvr_warn("ssd: KVRELAY_SSD_FAULT=%s: every %lu record %s fails on purpose (a test hook)", v, every,
                     f >= F_WRITE_EIO ? "write" : "read");
        }
    }
    fault = f;
    return f;
}

/* The first fault a process makes is logged, so that a test can tell the hook fired. */
static void first(const char *op)
{
    static int told;

    if (!told++)
        kvr_warn("ssd: KVRELAY_SSD_FAULT: the first %s made to fail on purpose", op);
}

ssize_t kvr_ssd_fault_read(ssize_t res)
{
    int f = hook();

    if (f < F_READ_EIO || f > F_READ_SHORT || res <= 0 || ++nread % every != 0)
        return res;
    first("read");
    if (f == F_READ_EIO)
        return -EIO;
    if (f == F_READ_EOF)
        return 0;
    /* half, in whole 4 KiB blocks as O_DIRECT moves them (a short read of a device ends on one) */
    return res >= 8192 ? (res / 2) & ~(ssize_t)4095 : res;
}

ssize_t kvr_ssd_fault_write(ssize_t res, size_t want)
{
    int f = hook();

    if (f < F_WRITE_EIO || res < 0 || ++nwrite % every != 0)
        return res;
    first("write");
    if (f == F_WRITE_EIO) {
        errno = EIO;
        return -1;
    }
    return (ssize_t)(want / 2);
}
