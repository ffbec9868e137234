/*
 * Unit tests of the I/O op API (src/io/uring.c) on both engines, over real loopback TCP
 * sockets: every scenario runs once on io_uring and once on epoll and must give the same
 * result, as the callers (src/io/h1.c, the gRPC relay) rely on it: MSG_WAITALL across
 * iovecs and pieces (one completion, the iovecs left as the caller made them), EOF after
 * partial progress, a send larger than the socket buffer, MSG_PEEK, MSG_TRUNC, accept,
 * cancel, a closed descriptor, a shutdown waking a pending op, a reused descriptor number, no
 * callback from inside a submission.
 */
#include "io/uring.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../wait_until.h"

typedef struct {
    kvr_uring_op_t op;
    int res;
    int calls;
} done_t;

static void on_done(kvr_uring_op_t *op, int res)
{
    done_t *d = op->data;
    d->res = res;
    d->calls++;
}

static void done_init(done_t *d)
{
    memset(d, 0, sizeof(*d));
    d->op.cb = on_done;
    d->op.data = d;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* One turn of a worker's loop: wait for efd (at most ms), process, flush. */
static void turn(kvr_uring_t *u, int ms)
{
    struct pollfd p = {.fd = u->efd, .events = POLLIN};

    kvr_uring_flush(u);
    if (poll(&p, 1, ms) > 0)
        kvr_uring_process(u);
    kvr_uring_flush(u);
}

/* Turns until d completed, at most 5 s. */
static void run_until(kvr_uring_t *u, done_t *d)
{
    uint64_t end = now_ms() + 5000;
    while (d->calls == 0 && now_ms() < end)
        turn(u, 10);
    cr_assert_eq(d->calls, 1, "the op completed %d times", d->calls);
}

static int listener(uint16_t *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    cr_assert(fd >= 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(fd, 16), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static int dial(uint16_t port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    cr_assert(fd >= 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* A connected pair: s is the server side (non-blocking, as accepted by the worker), c the peer. */
static void tcp_pair(int *s, int *c)
{
    uint16_t port;
    int l = listener(&port);
    struct pollfd p = {.fd = l, .events = POLLIN};

    *c = dial(port);
    cr_assert_eq(poll(&p, 1, 2000), 1);
    *s = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    cr_assert(*s >= 0);
    close(l);
}

/* Bytes waiting in fd's receive queue, unread (SIOCINQ). */
static int inq(int fd)
{
    int n = 0;
    cr_assert_eq(ioctl(fd, FIONREAD, &n), 0);
    return n;
}

static kvr_uring_t *start(const char *engine)
{
    static kvr_uring_t u;
    cr_assert_eq(kvr_uring_select(engine), KVR_OK);
    cr_assert_eq(kvr_uring_init(&u, 64), KVR_OK);
    cr_assert_eq(u.engine, !strcmp(engine, "epoll") ? KVR_IO_EPOLL : KVR_IO_URING);
    return &u;
}

static void fill(char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (char)((i * 131 + seed) >> 3);
}

#define BOTH(name) \
    static void name(const char *engine); \
    Test(uring_engines, name##_io_uring) \
    { \
        name("uring"); \
    } \
    Test(uring_engines, name##_epoll) \
    { \
        name("epoll"); \
    } \
    static void name(const char *engine)

/* MSG_WAITALL over three iovecs, the bytes sent in three pieces with loop turns between:
 * one completion with everything, the bytes in place, the iovecs unchanged. */
BOTH(waitall_recvmsg_across_iovecs_and_pieces)
{
    kvr_uring_t *u = start(engine);
    size_t sizes[3] = {100000, 1, 200000}, total = 300001;
    char *want = malloc(total), *got = calloc(1, total);
    struct iovec iov[3], orig[3];
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 3};
    done_t d;
    int s, c;

    tcp_pair(&s, &c);
    fill(want, total, 7);
    iov[0] = (struct iovec){got, sizes[0]};
    iov[1] = (struct iovec){got + sizes[0], sizes[1]};
    iov[2] = (struct iovec){got + sizes[0] + sizes[1], sizes[2]};
    memcpy(orig, iov, sizeof(iov));
    done_init(&d);
    cr_assert_eq(kvr_uring_recvmsg(u, s, &msg, MSG_WAITALL, &d.op), KVR_OK);
    turn(u, 0);
    for (size_t off = 0, piece = 99999; off < total; off += piece) {
        size_t n = off + piece > total ? total - off : piece;
        cr_assert_eq(write(c, want + off, n), (ssize_t)n);
        for (int i = 0; i < 5; i++)
            turn(u, 5);
        if (off + n < total)
            cr_assert_eq(d.calls, 0, "completed before all of it came");
    }
    run_until(u, &d);
    cr_assert_eq(d.res, (int)total);
    cr_assert(memcmp(want, got, total) == 0, "bytes differ");
    cr_assert(memcmp(orig, iov, sizeof(iov)) == 0, "the caller's iovecs were changed");
    close(c);
    close(s);
    kvr_uring_exit(u);
    free(want);
    free(got);
}

/* EOF after partial progress completes with the progress; the next read gets 0. */
BOTH(waitall_eof_after_partial)
{
    kvr_uring_t *u = start(engine);
    char buf[4096];
    struct iovec iov = {buf, sizeof(buf)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    done_t d;
    int s, c;

    tcp_pair(&s, &c);
    cr_assert_eq(write(c, buf, 1000), 1000);
    done_init(&d);
    cr_assert_eq(kvr_uring_recvmsg(u, s, &msg, MSG_WAITALL, &d.op), KVR_OK);
    for (int i = 0; i < 5; i++)
        turn(u, 5);
    cr_assert_eq(d.calls, 0);
    shutdown(c, SHUT_WR);
    run_until(u, &d);
    cr_assert_eq(d.res, 1000);
    done_init(&d);
    cr_assert_eq(kvr_uring_recv(u, s, buf, sizeof(buf), &d.op), KVR_OK);
    run_until(u, &d);
    cr_assert_eq(d.res, 0);
    close(c);
    close(s);
    kvr_uring_exit(u);
}

/* The waiting op's socket has SO_RCVLOWAT raised (as h1's --recv-lowat does): the peer's
 * 1000 bytes stay queued under the mark (no readiness), then its FIN comes with them as one
 * edge. The op must still complete with the 1000 bytes: a receive that took the short read as
 * "drained" and waited for another edge would wait for ever. */
BOTH(waitall_eof_with_bytes_under_a_raised_lowat)
{
    kvr_uring_t *u = start(engine);
    char buf[1 << 20];
    struct iovec iov = {buf, sizeof(buf)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    int lowat = 256 << 10;
    done_t d;
    int s, c;

    tcp_pair(&s, &c);
    cr_assert_eq(setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof(lowat)), 0);
    done_init(&d);
    cr_assert_eq(kvr_uring_recvmsg(u, s, &msg, MSG_WAITALL, &d.op), KVR_OK);
    for (int i = 0; i < 5; i++)
        turn(u, 5);
    memset(buf, 7, 1000);
    cr_assert_eq(write(c, buf, 1000), 1000);
    for (int i = 0; i < 10; i++)
        turn(u, 5);
    cr_assert_eq(d.calls, 0, "completed under the low-water mark");
    shutdown(c, SHUT_WR);
    run_until(u, &d);
    cr_assert_eq(d.res, 1000);
    close(c);
    close(s);
    kvr_uring_exit(u);
}

/* An 8 MiB sendmsg with MSG_WAITALL (far beyond the socket buffer), the peer reading as it
 * goes: one completion with all of it, the bytes intact. */
BOTH(waitall_sendmsg_beyond_the_socket_buffer)
{
    kvr_uring_t *u = start(engine);
    size_t total = 8u << 20, got = 0;
    char *src = malloc(total), *dst = malloc(total);
    struct iovec iov[2] = {{src, 3u << 20}, {src + (3u << 20), total - (3u << 20)}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    uint64_t end = now_ms() + 10000;
    done_t d;
    int s, c;

    tcp_pair(&s, &c);
    fcntl(c, F_SETFL, O_NONBLOCK);
    fill(src, total, 3);
    done_init(&d);
    cr_assert_eq(kvr_uring_sendmsg(u, s, &msg, MSG_WAITALL, &d.op), KVR_OK);
    while ((d.calls == 0 || got < total) && now_ms() < end) {
        ssize_t n = read(c, dst + got, total - got);
        if (n > 0)
            got += (size_t)n;
        turn(u, 1);
    }
    cr_assert_eq(d.calls, 1);
    cr_assert_eq(d.res, (int)total);
    cr_assert_eq(got, total);
    cr_assert(memcmp(src, dst, total) == 0, "bytes differ");
    close(c);
    close(s);
    kvr_uring_exit(u);
    free(src);
    free(dst);
}

/* MSG_PEEK sees the bytes without consuming them; MSG_TRUNC discards them uncopied. */
BOTH(peek_then_truncate)
{
    kvr_uring_t *u = start(engine);
    char buf[64] = {0}, scratch[8];
    done_t d;
    int s, c;

    tcp_pair(&s, &c);
    done_init(&d);
    cr_assert_eq(kvr_uring_recv_flags(u, s, buf, 24, MSG_PEEK, &d.op), KVR_OK);
    turn(u, 0);
    cr_assert_eq(write(c, "PRI * HTTP/2.0", 14), 14);
    run_until(u, &d);
    cr_assert_eq(d.res, 14);
    cr_assert(memcmp(buf, "PRI * HTTP/2.0", 14) == 0);
    {
        char *big = calloc(1, 10000);
        cr_assert_eq(write(c, big, 10000), 10000);
        free(big);
    }
    cr_assert(WAIT_UNTIL(inq(s) >= 10014, 5000), "all 10014 bytes arrive (%d)", inq(s));
    done_init(&d);
    cr_assert_eq(kvr_uring_recv_flags(u, s, scratch, 1u << 20, MSG_TRUNC, &d.op), KVR_OK);
    run_until(u, &d);
    cr_assert_eq(d.res, 10014, "MSG_TRUNC took %d", d.res);
    cr_assert_eq(recv(s, buf, sizeof(buf), MSG_DONTWAIT), -1);
    cr_assert_eq(errno, EAGAIN);
    close(c);
    close(s);
    kvr_uring_exit(u);
}

/* accept gives a non-blocking descriptor; an accept that waits is cancelled with -ECANCELED. */
BOTH(accept_and_cancel)
{
    kvr_uring_t *u = start(engine);
    uint16_t port;
    int l = listener(&port), c;
    done_t d;

    done_init(&d);
    cr_assert_eq(kvr_uring_accept(u, l, &d.op), KVR_OK);
    turn(u, 0);
    c = dial(port);
    run_until(u, &d);
    cr_assert(d.res >= 0, "accept: %d", d.res);
    cr_assert(fcntl(d.res, F_GETFL) & O_NONBLOCK);
    close(d.res);
    close(c);

    done_init(&d);
    cr_assert_eq(kvr_uring_accept(u, l, &d.op), KVR_OK);
    for (int i = 0; i < 3; i++)
        turn(u, 5);
    cr_assert_eq(d.calls, 0);
    cr_assert_eq(kvr_uring_cancel(u, &d.op), KVR_OK);
    run_until(u, &d);
    cr_assert_eq(d.res, -ECANCELED);
    for (int i = 0; i < 3; i++)
        turn(u, 5);
    cr_assert_eq(d.calls, 1, "a cancelled op completes once");
    close(l);
    kvr_uring_exit(u);
}

/* A pending recv cancelled; an op on a closed descriptor; a shutdown wakes a pending recv. */
BOTH(cancel_closed_fd_and_shutdown)
{
    kvr_uring_t *u = start(engine);
    char buf[16];
    done_t d;
    int s, c;

    tcp_pair(&s, &c);
    done_init(&d);
    cr_assert_eq(kvr_uring_recv(u, s, buf, sizeof(buf), &d.op), KVR_OK);
    turn(u, 5);
    cr_assert_eq(kvr_uring_cancel(u, &d.op), KVR_OK);
    run_until(u, &d);
    cr_assert_eq(d.res, -ECANCELED);

    done_init(&d);
    cr_assert_eq(kvr_uring_recv(u, s, buf, sizeof(buf), &d.op), KVR_OK);
    turn(u, 5);
    cr_assert_eq(d.calls, 0);
    shutdown(s, SHUT_RDWR); /* as h1's conn_close does */
    run_until(u, &d);
    cr_assert_eq(d.res, 0);

    done_init(&d);
    {
        int dead = dup(s);
        close(dead);
        cr_assert_eq(kvr_uring_send(u, dead, "x", 1, &d.op), KVR_OK);
    }
    run_until(u, &d);
    cr_assert_eq(d.res, -EBADF);
    close(c);
    close(s);
    kvr_uring_exit(u);
}

/* A descriptor number reused outside the engine's accept (h1's accept_queued calls accept4
 * itself): once announced with kvr_uring_fd_new, an op on it waits for the new socket's
 * readiness. The epoll engine's record of the closed socket says "in the epoll set", which the
 * kernel forgot at close; without the announcement the recv below never completes. */
BOTH(reused_descriptor_number_announced)
{
    kvr_uring_t *u = start(engine);
    char buf[16];
    done_t d;
    int s, c, s2, c2, hi, c2hi;

    tcp_pair(&s, &c);
    done_init(&d);
    cr_assert_eq(kvr_uring_recv(u, s, buf, sizeof(buf), &d.op), KVR_OK);
    turn(u, 5); /* nothing to read: it waits (epoll: s joins the set) */
    cr_assert_eq(d.calls, 0);
    cr_assert_eq(write(c, "a", 1), 1);
    run_until(u, &d);
    cr_assert_eq(d.res, 1);
    close(s); /* the kernel drops it from the epoll set; the number is free */
    close(c);

    tcp_pair(&s2, &c2); /* either may have taken s's number: both moved out of the way first */
    hi = fcntl(s2, F_DUPFD_CLOEXEC, 100);
    close(s2);
    c2hi = fcntl(c2, F_DUPFD_CLOEXEC, 100);
    close(c2);
    c2 = c2hi;
    cr_assert(hi >= 0 && c2 >= 0);
    cr_assert_eq(dup2(hi, s), s); /* a new socket under the old number, made outside the engine */
    close(hi);
    kvr_uring_fd_new(u, s);
    done_init(&d);
    cr_assert_eq(kvr_uring_recv(u, s, buf, sizeof(buf), &d.op), KVR_OK);
    turn(u, 5);
    cr_assert_eq(d.calls, 0);
    cr_assert_eq(write(c2, "bc", 2), 2);
    run_until(u, &d);
    cr_assert_eq(d.res, 2);
    cr_assert_eq(memcmp(buf, "bc", 2), 0);
    close(c2);
    close(s);
    kvr_uring_exit(u);
}

/* No callback from inside a submission or a flush: the caller marks its op busy after
 * submitting it, and the completion comes from kvr_uring_process. */
BOTH(no_callback_inside_submit)
{
    kvr_uring_t *u = start(engine);
    char buf[16];
    done_t d;
    int s, c;

    tcp_pair(&s, &c);
    cr_assert_eq(write(c, "abc", 3), 3);
    cr_assert(WAIT_UNTIL(inq(s) >= 3, 5000), "the bytes arrive");
    done_init(&d);
    cr_assert_eq(kvr_uring_recv(u, s, buf, sizeof(buf), &d.op), KVR_OK);
    cr_assert_eq(d.calls, 0);
    kvr_uring_flush(u);
    cr_assert_eq(d.calls, 0);
    run_until(u, &d);
    cr_assert_eq(d.res, 3);
    close(c);
    close(s);
    kvr_uring_exit(u);
}

/* The disk tier's read: a file opened O_DIRECT, read at an offset into two aligned iovecs; a
 * read that runs past the end completes with what there was. */
BOTH(preadv_reads_a_file_at_an_offset)
{
    kvr_uring_t *u = start(engine);
    char path[] = "/var/tmp/kvr-preadv-XXXXXX", *file = NULL, *a = NULL, *b = NULL;
    int wfd = mkstemp(path), fd;
    struct iovec iov[2];
    done_t d;

    cr_assert(wfd >= 0);
    cr_assert_eq(posix_memalign((void **)&file, 4096, 3 * 4096), 0);
    cr_assert_eq(posix_memalign((void **)&a, 4096, 4096), 0);
    cr_assert_eq(posix_memalign((void **)&b, 4096, 4096), 0);
    fill(file, 3 * 4096, 7);
    cr_assert_eq(write(wfd, file, 3 * 4096), 3 * 4096);
    close(wfd);
    fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    cr_assert(fd >= 0, "/var/tmp takes O_DIRECT");
    iov[0] = (struct iovec){a, 4096};
    iov[1] = (struct iovec){b, 4096};
    done_init(&d);
    cr_assert_eq(kvr_uring_preadv(u, fd, iov, 2, 4096, &d.op), KVR_OK);
    cr_assert_eq(d.calls, 0, "no callback inside the submission");
    run_until(u, &d);
    cr_assert_eq(d.res, 2 * 4096);
    cr_assert_eq(memcmp(a, file + 4096, 4096), 0);
    cr_assert_eq(memcmp(b, file + 2 * 4096, 4096), 0);

    done_init(&d);
    cr_assert_eq(kvr_uring_preadv(u, fd, iov, 2, 2 * 4096, &d.op), KVR_OK);
    run_until(u, &d);
    cr_assert_eq(d.res, 4096, "past the end: the bytes there were");
    cr_assert_eq(memcmp(a, file + 2 * 4096, 4096), 0);
    close(fd);
    unlink(path);
    free(file);
    free(a);
    free(b);
    kvr_uring_exit(u);
}

Test(uring_engines, select_refuses_unknown_names)
{
    cr_assert_eq(kvr_uring_select("kqueue"), KVR_ERR);
    cr_assert_eq(kvr_uring_select("epoll"), KVR_OK);
    cr_assert_eq(kvr_uring_engine(), KVR_IO_EPOLL);
}
