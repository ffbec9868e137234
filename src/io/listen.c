/* listen.c — see listen.h. */
#include "io/listen.h"

#include "core/config.h"
#include "base/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int kvr_listen_tcp(const char *hostport, uint16_t *port_inout, int backlog)
{
    char host[256], portstr[8];
    uint16_t port;
    struct addrinfo hints, *res = NULL;
    int fd = -1, on = 1, rc;

    if (kvr_config_split_hostport(hostport, host, sizeof(host), &port) != KVR_OK) {
        kvr_error("listen: bad address '%s'", hostport);
        return -1;
    }
    if (port_inout != NULL && *port_inout != 0)
        port = *port_inout;
    snprintf(portstr, sizeof(portstr), "%u", port);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    if ((rc = getaddrinfo(host, portstr, &hints, &res)) != 0) {
        kvr_error("listen: getaddrinfo(%s): %s", host, gai_strerror(rc));
        return -1;
    }
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        kvr_error("listen: socket: %s", strerror(errno));
        goto fail;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof(on)) < 0) {
        kvr_error("listen: SO_REUSEPORT: %s", strerror(errno));
        goto fail;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    if (bind(fd, res->ai_addr, res->ai_addrlen) < 0) {
        kvr_error("listen: bind %s: %s", hostport, strerror(errno));
        goto fail;
    }
    if (listen(fd, backlog) < 0) {
        kvr_error("listen: listen %s: %s", hostport, strerror(errno));
        goto fail;
    }
    if (port_inout != NULL) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        getsockname(fd, (struct sockaddr *)&ss, &sl);
        *port_inout = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                     : ((struct sockaddr_in *)&ss)->sin_port);
    }
    freeaddrinfo(res);
    return fd;

fail:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return -1;
}

void kvr_listen_name(int fd, char *buf, size_t n)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;

    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof(host));
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
            snprintf(buf, n, "[%s]:%u", host, port);
            return;
        }
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof(host));
        port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
    snprintf(buf, n, "%s:%u", host, port);
}
