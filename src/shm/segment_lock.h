/*
 * segment_lock.h — the segment file's lock, taken before a segment file is mapped.
 */
#ifndef KVR_SHM_SEGMENT_LOCK_H
#define KVR_SHM_SEGMENT_LOCK_H

#include <stdint.h>

/*
 * Takes flock(LOCK_EX) on the segment file fd (path only names it in the log). While the lock
 * is held elsewhere, /proc/locks names the process that took it: a live kvrelay (titled
 * "kvr ..." or still named after a kvrelay binary) is refused at once. Any other holder is
 * waited for: above all one that is gone, exiting or has SIGKILL pending (a killed run whose
 * last reference to the file the kernel has not released yet), but also another program or
 * one that cannot be told. flock is polled every 20 ms for up to wait_ms, logged when the
 * wait starts and when the lock is taken. Returns KVR_OK with the lock held, or KVR_ERR after
 * logging why not.
 */
int kvr_seg_lock_file(int fd, const char *path, uint32_t wait_ms);

#endif
