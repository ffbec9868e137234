/*
 * listen.h — listening sockets.
 */
#ifndef KVR_IO_LISTEN_H
#define KVR_IO_LISTEN_H

#include "common.h"

/*
 * Binds a non-blocking TCP listener to "host:port" with SO_REUSEPORT (so that each worker
 * can own one socket of a group on the same port). If port_inout points at 0, the kernel
 * picks the port and it is written back. Returns the fd or -1 (logged).
 */
int kvr_listen_tcp(const char *hostport, uint16_t *port_inout, int backlog);

/* Formats host:port of a bound socket into buf. */
void kvr_listen_name(int fd, char *buf, size_t n);

#endif
