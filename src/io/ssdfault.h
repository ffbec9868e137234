/*
 * ssdfault.h — a fault-injecting test hook for the disk tier's I/O (docs/ssd-tier.md, "Faults").
 *
 * KVRELAY_SSD_FAULT=<fault>[:N] makes every Nth record read or record write (every one without
 * N) fail as a device would, so that the tests can see what a client gets from a failing disk.
 * Faults: read-eio (the read fails with EIO), read-eof (it returns 0 bytes: the end of the file),
 * read-short (it returns half of what it read in whole 4 KiB blocks, as O_DIRECT
 * would: the reader must go on from there),
 * write-eio (the write fails with EIO), write-short (it writes half: what a full device does).
 * Unset, each call costs a load and a branch. The variable is read once per process, and a
 * process that has it says so in its log: it is not for production.
 */
#ifndef KVR_IO_SSDFAULT_H
#define KVR_IO_SSDFAULT_H

#include <sys/types.h>

/* A record read's result (bytes, or -errno) as the hook makes it. */
ssize_t kvr_ssd_fault_read(ssize_t res);
/* A record write's result: the bytes written of `want`, or -1 with errno; as the hook makes it. */
ssize_t kvr_ssd_fault_write(ssize_t res, size_t want);

#endif
