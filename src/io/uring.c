/* uring.c — see uring.h. */
#include "io/uring.h"

#include "base/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* epoll engine bounds */
#define EP_EVENTS  128        /* readiness events taken per kvr_uring_process */
#define EP_ROUNDS  16         /* completion rounds per kvr_uring_process before the loop gets a turn */
#define EP_TRIES   8          /* syscalls per MSG_WAITALL op per readiness event */
#define EP_FDS_MAX (1u << 22) /* descriptor table bound (fd numbers), 24 bytes each */

enum { OP_ACCEPT = 1,
       OP_RECV,
       OP_SEND,
       OP_RECVMSG,
       OP_SENDMSG,
       OP_PREADV };
enum { ST_IDLE = 0,
       ST_QUEUED,
       ST_WAITING,
       ST_DONE };

struct kvr_uring_fd_s {
    kvr_uring_op_t *rd, *wr; /* ops waiting for readability / writability */
    uint8_t added;           /* in the epoll set (edge-triggered, in and out) */
};

/* The process's engine: chosen once by kvr_uring_select, inherited by forked workers. */
static int g_engine = KVR_IO_AUTO;
static int g_auto = 1;        /* chosen by auto: a ring that fails later still falls back */
static int g_fallback_logged; /* once per process */

const char *kvr_uring_engine_name(int engine)
{
    return engine == KVR_IO_URING ? "io_uring" : engine == KVR_IO_EPOLL ? "epoll"
                                                                        : "auto";
}

int kvr_uring_engine(void)
{
    return g_engine;
}

static int probe_uring(void)
{
    struct io_uring r;
    int rc = io_uring_queue_init(2, &r, 0);

    if (rc == 0)
        io_uring_queue_exit(&r);
    return rc;
}

int kvr_uring_select(const char *engine)
{
    int rc;

    if (!strcmp(engine, "epoll")) {
        g_engine = KVR_IO_EPOLL;
        g_auto = 0;
        kvr_info("io engine: epoll (--io-engine epoll)");
        return KVR_OK;
    }
    if (strcmp(engine, "auto") && strcmp(engine, "uring")) {
        kvr_error("--io-engine must be auto, uring or epoll");
        return KVR_ERR;
    }
    g_auto = !strcmp(engine, "auto");
    rc = probe_uring();
    if (rc == 0) {
        g_engine = KVR_IO_URING;
        kvr_info("io engine: io_uring (--io-engine %s)", engine);
        return KVR_OK;
    }
    if (!g_auto) {
        kvr_error("--io-engine uring: io_uring_setup fails: %s (a seccomp profile or kernel.io_uring_disabled "
                  "denies it); not starting: use --io-engine auto or epoll",
                  strerror(-rc));
        return KVR_ERR;
    }
    g_engine = KVR_IO_EPOLL;
    kvr_warn("io engine: epoll, because io_uring_setup fails: %s (a seccomp profile such as a container "
             "runtime's default, or kernel.io_uring_disabled, denies it); each op is a non-blocking syscall on readiness",
             strerror(-rc));
    return KVR_OK;
}

/* ------------------------------------------------------------------ io_uring engine */

static int ring_init(kvr_uring_t *u, unsigned entries)
{
    /* COOP_TASKRUN: completions are run when this worker enters the kernel anyway (it does so
     * every loop iteration) instead of interrupting it with an IPI; SINGLE_ISSUER: only this
     * process submits. 16 KiB GETs over 64 connections: ~15 % more requests/s in one A/B run
     * (docs/dataplane.md). Kernels before 6.0 refuse the flags: plain setup then. */
    int rc = io_uring_queue_init(entries, &u->ring, IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER);

    if (rc == -EINVAL)
        rc = io_uring_queue_init(entries, &u->ring, 0);

    if (rc < 0)
        return rc;
    u->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (u->efd < 0) {
        rc = -errno;
        kvr_error("eventfd: %s", strerror(errno));
        io_uring_queue_exit(&u->ring);
        return rc;
    }
    rc = io_uring_register_eventfd(&u->ring, u->efd);
    if (rc < 0) {
        kvr_error("io_uring_register_eventfd: %s", strerror(-rc));
        close(u->efd);
        io_uring_queue_exit(&u->ring);
        return rc;
    }
    u->engine = KVR_IO_URING;
    return KVR_OK;
}

static void ring_flush(kvr_uring_t *u)
{
    /* io_uring_sq_ready: also what an earlier submit left queued (the kernel took fewer) */
    if (u->unsubmitted > 0 || io_uring_sq_ready(&u->ring) > 0) {
        int rc = io_uring_submit(&u->ring);
        if (rc < 0)
            KVR_LOG_RATELIMITED(KVR_LOG_ERROR, "io_uring_submit: %s", strerror(-rc));
        u->unsubmitted = 0;
    }
}

static struct io_uring_sqe *get_sqe(kvr_uring_t *u)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (sqe == NULL) { /* full: push what is queued and retry once */
        ring_flush(u);
        sqe = io_uring_get_sqe(&u->ring);
    }
    if (sqe != NULL)
        u->unsubmitted++;
    return sqe;
}

static unsigned ring_process(kvr_uring_t *u)
{
    struct io_uring_cqe *cqe;
    uint64_t v;
    unsigned n = 0;

    if (u->efd >= 0)
        (void)!read(u->efd, &v, sizeof(v));
    while (io_uring_peek_cqe(&u->ring, &cqe) == 0 && cqe != NULL) {
        kvr_uring_op_t *op = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        unsigned flags = cqe->flags;
        io_uring_cqe_seen(&u->ring, cqe);
        if (op != NULL && (flags & IORING_CQE_F_MORE)) { /* a zero-copy send's result */
            op->res = res;                               /* delivered with the notification, when the kernel lets go of the pages */
            continue;
        }
        if (op != NULL && (flags & IORING_CQE_F_NOTIF))
            res = op->res;
        if (op != NULL && op->cb != NULL)
            op->cb(op, res);
        n++;
    }
    return n;
}

/* ------------------------------------------------------------------ epoll engine */

static int ep_init(kvr_uring_t *u)
{
    struct epoll_event ev = {.events = EPOLLIN};
    int rc;

    u->efd = epoll_create1(EPOLL_CLOEXEC);
    if (u->efd < 0) {
        rc = -errno;
        kvr_error("epoll_create1: %s", strerror(errno));
        return rc;
    }
    u->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ev.data.fd = u->wakefd;
    if (u->wakefd < 0 || epoll_ctl(u->efd, EPOLL_CTL_ADD, u->wakefd, &ev) < 0) {
        rc = -errno;
        kvr_error("epoll wake-up eventfd: %s", strerror(errno));
        if (u->wakefd >= 0)
            close(u->wakefd);
        close(u->efd);
        return rc;
    }
    u->sq_tail = &u->sq;
    u->cq_tail = &u->cq;
    u->engine = KVR_IO_EPOLL;
    return KVR_OK;
}

static void ep_exit(kvr_uring_t *u)
{
    close(u->wakefd);
    close(u->efd);
    free(u->fds);
    u->fds = NULL;
    u->nfds = 0;
}

/* Makes the loop call kvr_uring_process: completions are queued that no socket announces. */
static void ep_wake(kvr_uring_t *u)
{
    uint64_t one = 1;

    if (u->woken)
        return;
    u->woken = 1;
    (void)!write(u->wakefd, &one, sizeof(one));
}

static void ep_complete(kvr_uring_t *u, kvr_uring_op_t *op, int res)
{
    op->state = ST_DONE;
    op->res = res;
    op->next = NULL;
    *u->cq_tail = op;
    u->cq_tail = &op->next;
    if (!u->in_process)
        ep_wake(u);
}

static int ep_submit(kvr_uring_t *u, kvr_uring_op_t *op, int kind, int fd, void *buf, size_t len,
                     struct msghdr *msg, int flags)
{
    if (op->state == ST_QUEUED || op->state == ST_WAITING)
        return -EBUSY; /* one submission per op at a time, as the callers use them */
    op->kind = (uint8_t)kind;
    op->fd = fd;
    op->buf = buf;
    op->len = len;
    op->msg = msg;
    op->flags = flags;
    op->done = 0;
    op->iov_idx = op->iov_off = 0;
    op->cancel = 0;
    if (msg != NULL) {
        op->len = 0;
        for (size_t i = 0; i < msg->msg_iovlen; i++)
            op->len += msg->msg_iov[i].iov_len;
    }
    op->state = ST_QUEUED;
    op->next = NULL;
    *u->sq_tail = op;
    u->sq_tail = &op->next;
    return KVR_OK;
}

/* One non-blocking syscall for a msg op from where `done` left it: the iovec `done` falls in
 * is trimmed for the call and restored after, so the caller's iovecs are as it made them. */
static ssize_t ep_msg_call(kvr_uring_op_t *op)
{
    struct msghdr m = *op->msg;
    struct iovec *v = &op->msg->msg_iov[op->iov_idx];
    struct iovec saved = *v;
    int fl = (op->flags & ~MSG_WAITALL) | MSG_DONTWAIT;
    ssize_t n;

    v->iov_base = (char *)v->iov_base + op->iov_off;
    v->iov_len -= op->iov_off;
    m.msg_iov = v;
    m.msg_iovlen = op->msg->msg_iovlen - op->iov_idx;
    n = op->kind == OP_RECVMSG ? recvmsg(op->fd, &m, fl) : sendmsg(op->fd, &m, fl | MSG_NOSIGNAL);
    *v = saved;
    return n;
}

static void ep_msg_advance(kvr_uring_op_t *op, size_t n)
{
    struct iovec *iov = op->msg->msg_iov;

    op->done += n;
    n += op->iov_off;
    while (op->iov_idx < op->msg->msg_iovlen && n >= iov[op->iov_idx].iov_len) {
        n -= iov[op->iov_idx].iov_len;
        op->iov_idx++;
    }
    op->iov_off = n;
}

/* Performs op now. Returns its result, or -EAGAIN: wait until the descriptor is ready. */
static int ep_try(kvr_uring_op_t *op)
{
    ssize_t n;

    switch (op->kind) {
    case OP_ACCEPT:
        n = accept4(op->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        return n >= 0 ? (int)n : -errno;
    case OP_RECV:
        do /* MSG_TRUNC discards in the kernel: TCP writes nothing to buf, whatever it returns.
            * The raw syscall, so that a sanitizer's recv() does not take the count as written. */
            n = op->flags & MSG_TRUNC
                  ? syscall(SYS_recvfrom, op->fd, op->buf, op->len, op->flags | MSG_DONTWAIT, NULL, NULL)
                  : recv(op->fd, op->buf, op->len, op->flags | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        return n >= 0 ? (int)(n > INT32_MAX ? INT32_MAX : n) : -errno;
    case OP_SEND:
        do
            n = send(op->fd, op->buf, op->len, op->flags | MSG_DONTWAIT | MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        return n >= 0 ? (int)n : -errno;
    case OP_PREADV: /* a file: no readiness to wait for, the call blocks (buf: the iovecs,
                     * len: their count, iov_off: the file offset) */
        do
            n = preadv(op->fd, op->buf, (int)op->len, (off_t)op->iov_off);
        while (n < 0 && errno == EINTR);
        return n >= 0 ? (int)(n > INT32_MAX ? INT32_MAX : n) : -errno;
    default: /* OP_RECVMSG, OP_SENDMSG */
        break;
    }
    if (!(op->flags & MSG_WAITALL) || op->len == 0) {
        do
            n = ep_msg_call(op);
        while (n < 0 && errno == EINTR);
        return n >= 0 ? (int)n : -errno;
    }
    /* MSG_WAITALL: as io_uring does, keep going until all of it moved, then complete once; EOF
     * or an error after some progress completes with the progress. A short send means the
     * socket's buffer is full: wait for the next readiness instead of calling again for the
     * EAGAIN. A short receive does not prove the buffer drained: the peer's FIN may have come
     * with the data (edge-triggered, no edge follows it), so the next call must run to see the
     * EOF, or the op would wait for an edge that never comes. */
    for (int i = 0; i < EP_TRIES; i++) {
        size_t want = op->len - op->done;
        n = ep_msg_call(op);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return -EAGAIN;
        if (n < 0)
            return op->done > 0 ? (int)op->done : -errno;
        if (n == 0)
            return (int)op->done;
        ep_msg_advance(op, (size_t)n);
        if (op->done >= op->len)
            return (int)op->done;
        if ((size_t)n < want && op->kind == OP_SENDMSG)
            return -EAGAIN;
    }
    return -EAGAIN;
}

static int ep_is_read(const kvr_uring_op_t *op)
{
    return op->kind == OP_ACCEPT || op->kind == OP_RECV || op->kind == OP_RECVMSG;
}

static kvr_uring_fd_t *ep_slot(kvr_uring_t *u, int fd)
{
    if (fd < 0)
        return NULL;
    if ((unsigned)fd >= u->nfds) {
        unsigned n = u->nfds ? u->nfds : 256;
        kvr_uring_fd_t *p;
        while (n <= (unsigned)fd && n < EP_FDS_MAX)
            n *= 2;
        if (n <= (unsigned)fd)
            return NULL;
        p = realloc(u->fds, (size_t)n * sizeof(*p));
        if (p == NULL)
            return NULL;
        memset(p + u->nfds, 0, (size_t)(n - u->nfds) * sizeof(*p));
        u->fds = p;
        u->nfds = n;
    }
    return &u->fds[fd];
}

/* Parks op until its descriptor is ready. The descriptor joins the epoll set once, edge-
 * triggered for both directions: every op waits only after a call found nothing to do, so
 * an edge after that call is the one it needs, and adding reports what is ready already. */
static void ep_wait(kvr_uring_t *u, kvr_uring_op_t *op)
{
    kvr_uring_fd_t *s = ep_slot(u, op->fd);
    kvr_uring_op_t **head;

    if (s == NULL) {
        ep_complete(u, op, -ENOMEM);
        return;
    }
    if (!s->added) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.fd = op->fd};
        if (epoll_ctl(u->efd, EPOLL_CTL_ADD, op->fd, &ev) < 0 && errno != EEXIST) {
            ep_complete(u, op, -errno);
            return;
        }
        s->added = 1;
    }
    head = ep_is_read(op) ? &s->rd : &s->wr;
    op->next = *head;
    *head = op;
    op->state = ST_WAITING;
}

static void ep_unlink(kvr_uring_t *u, kvr_uring_op_t *op)
{
    kvr_uring_fd_t *s = &u->fds[op->fd];
    kvr_uring_op_t **pp = ep_is_read(op) ? &s->rd : &s->wr;

    while (*pp != NULL && *pp != op)
        pp = &(*pp)->next;
    if (*pp == op)
        *pp = op->next;
    op->next = NULL;
}

static void ep_run(kvr_uring_t *u, kvr_uring_op_t *op)
{
    int res = op->cancel ? -ECANCELED : ep_try(op);

    if (res == -EAGAIN || res == -EWOULDBLOCK)
        ep_wait(u, op);
    else
        ep_complete(u, op, res);
}

/* Tries every queued submission: what can be done now completes, the rest waits. */
static void ep_flush(kvr_uring_t *u)
{
    while (u->sq != NULL) {
        kvr_uring_op_t *op = u->sq;
        u->sq = op->next;
        if (u->sq == NULL)
            u->sq_tail = &u->sq;
        ep_run(u, op);
    }
}

/* Takes a direction's waiting ops off the descriptor and tries each again (one that would
 * still block waits anew). */
static void ep_run_list(kvr_uring_t *u, kvr_uring_op_t **head)
{
    kvr_uring_op_t *list = *head;

    *head = NULL;
    while (list != NULL) {
        kvr_uring_op_t *op = list;
        list = op->next;
        ep_run(u, op);
    }
}

/* A descriptor is ready: its waiting ops of that direction are tried again. */
static void ep_ready(kvr_uring_t *u, int fd, uint32_t events)
{
    kvr_uring_fd_t *s;

    if (fd < 0 || (unsigned)fd >= u->nfds)
        return;
    s = &u->fds[fd];
    if (s->rd == NULL && s->wr == NULL) {
        /* Nothing of ours waits on it (a connection handed to h2o, one between requests):
         * out of the set until an op waits again, so its traffic does not wake us. */
        epoll_ctl(u->efd, EPOLL_CTL_DEL, fd, NULL);
        s->added = 0;
        return;
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
        ep_run_list(u, &s->rd);
    if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
        ep_run_list(u, &s->wr);
}

/* A descriptor our accept returned is new: whatever the table says of that number is about
 * a closed socket (epoll dropped it when it closed). Ops parked on it were ops on a closed
 * descriptor: as with io_uring, they never complete. */
static void ep_fresh_fd(kvr_uring_t *u, int fd)
{
    if (fd >= 0 && (unsigned)fd < u->nfds) {
        kvr_uring_fd_t *s = &u->fds[fd];
        for (kvr_uring_op_t *op = s->rd; op != NULL; op = op->next)
            op->state = ST_IDLE;
        for (kvr_uring_op_t *op = s->wr; op != NULL; op = op->next)
            op->state = ST_IDLE;
        memset(s, 0, sizeof(*s));
    }
}

static unsigned ep_process(kvr_uring_t *u)
{
    struct epoll_event evs[EP_EVENTS];
    unsigned n = 0;
    int ne;

    u->in_process = 1;
    ne = epoll_wait(u->efd, evs, EP_EVENTS, 0);
    for (int i = 0; i < ne; i++) {
        if (evs[i].data.fd == u->wakefd) {
            uint64_t v;
            (void)!read(u->wakefd, &v, sizeof(v));
            u->woken = 0;
            continue;
        }
        ep_ready(u, evs[i].data.fd, evs[i].events);
    }
    /* Callbacks submit the next ops; those are tried here too, and what completes at once
     * runs in the next round, so a request/response exchange costs no wake-up. Bounded: a
     * pipelining client does not keep the loop from its timers and other sockets. */
    for (int round = 0; round < EP_ROUNDS && u->cq != NULL; round++) {
        kvr_uring_op_t *list = u->cq;
        u->cq = NULL;
        u->cq_tail = &u->cq;
        while (list != NULL) {
            kvr_uring_op_t *op = list;
            int res = op->res;
            list = op->next;
            op->next = NULL;
            op->state = ST_IDLE;
            if (op->kind == OP_ACCEPT && res >= 0)
                ep_fresh_fd(u, res);
            if (op->cb != NULL)
                op->cb(op, res);
            n++;
        }
        ep_flush(u);
    }
    u->in_process = 0;
    if (u->cq != NULL)
        ep_wake(u);
    return n;
}

static int ep_cancel(kvr_uring_t *u, kvr_uring_op_t *op)
{
    if (op->state == ST_QUEUED) {
        op->cancel = 1; /* completes with -ECANCELED at the flush, in submission order */
    } else if (op->state == ST_WAITING) {
        ep_unlink(u, op);
        ep_complete(u, op, -ECANCELED);
    }
    return KVR_OK;
}

/* ------------------------------------------------------------------ the API */

int kvr_uring_init(kvr_uring_t *u, unsigned entries)
{
    int rc;

    memset(u, 0, sizeof(*u));
    u->efd = u->wakefd = -1;
    if (g_engine == KVR_IO_EPOLL)
        return ep_init(u);
    rc = ring_init(u, entries);
    if (rc == 0)
        return KVR_OK;
    if (!g_auto || (g_engine == KVR_IO_AUTO && rc != -EPERM && rc != -EACCES && rc != -ENOSYS)) {
        kvr_error("io_uring_queue_init(%u): %s", entries, strerror(-rc));
        return rc;
    }
    if (!g_fallback_logged) {
        g_fallback_logged = 1;
        kvr_warn("io engine: epoll, because io_uring_queue_init(%u) fails here: %s", entries, strerror(-rc));
    }
    return ep_init(u);
}

void kvr_uring_exit(kvr_uring_t *u)
{
    if (u->engine == KVR_IO_EPOLL) {
        ep_exit(u);
        return;
    }
    io_uring_queue_exit(&u->ring);
    if (u->efd >= 0)
        close(u->efd);
}

int kvr_uring_own_wait(kvr_uring_t *u)
{
    if (u->engine != KVR_IO_URING || u->efd < 0)
        return KVR_ERR;
    if (io_uring_unregister_eventfd(&u->ring) < 0)
        return KVR_ERR;
    close(u->efd);
    u->efd = -1;
    return KVR_OK;
}

int kvr_uring_poll_in(kvr_uring_t *u, int fd, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe;

    if (u->engine != KVR_IO_URING)
        return KVR_ERR;
    if ((sqe = get_sqe(u)) == NULL)
        return -EBUSY;
    io_uring_prep_poll_add(sqe, fd, POLLIN);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

unsigned kvr_uring_wait(kvr_uring_t *u, int32_t max_ms)
{
    struct io_uring_cqe *cqe;
    int rc;

    if (max_ms <= 0) {
        ring_flush(u);
        return ring_process(u);
    }
    /* Submits and waits in one io_uring_enter; none at all when a completion is there already
     * and nothing is queued (liburing peeks first). -ETIME: the time passed; -EINTR: a signal
     * (SIGTERM: the caller's loop sees it). Whatever the submit left queued stays in the
     * submission ring and goes with the next enter. */
    rc = io_uring_submit_and_wait_timeout(&u->ring, &cqe, 1,
                                          &(struct __kernel_timespec){.tv_sec = max_ms / 1000, .tv_nsec = (long long)(max_ms % 1000) * 1000000},
                                          NULL);
    u->unsubmitted = 0;
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN)
        KVR_LOG_RATELIMITED(KVR_LOG_ERROR, "io_uring_submit_and_wait_timeout: %s", strerror(-rc));
    return ring_process(u);
}

void kvr_uring_flush(kvr_uring_t *u)
{
    if (u->engine == KVR_IO_EPOLL) {
        ep_flush(u);
        return;
    }
    ring_flush(u);
}

int kvr_uring_accept(kvr_uring_t *u, int fd, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe;

    if (u->engine == KVR_IO_EPOLL)
        return ep_submit(u, op, OP_ACCEPT, fd, NULL, 0, NULL, 0);
    if ((sqe = get_sqe(u)) == NULL)
        return -EBUSY;
    io_uring_prep_accept(sqe, fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

void kvr_uring_fd_new(kvr_uring_t *u, int fd)
{
    if (u->engine == KVR_IO_EPOLL)
        ep_fresh_fd(u, fd);
}

int kvr_uring_recv(kvr_uring_t *u, int fd, void *buf, size_t len, kvr_uring_op_t *op)
{
    return kvr_uring_recv_flags(u, fd, buf, len, 0, op);
}

int kvr_uring_send(kvr_uring_t *u, int fd, const void *buf, size_t len, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe;

    if (u->engine == KVR_IO_EPOLL)
        return ep_submit(u, op, OP_SEND, fd, (void *)buf, len, NULL, 0);
    if ((sqe = get_sqe(u)) == NULL)
        return -EBUSY;
    io_uring_prep_send(sqe, fd, buf, len, MSG_NOSIGNAL);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_recv_flags(kvr_uring_t *u, int fd, void *buf, size_t len, int flags, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe;

    if (u->engine == KVR_IO_EPOLL)
        return ep_submit(u, op, OP_RECV, fd, buf, len, NULL, flags);
    if ((sqe = get_sqe(u)) == NULL)
        return -EBUSY;
    io_uring_prep_recv(sqe, fd, buf, len, flags);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_recvmsg(kvr_uring_t *u, int fd, struct msghdr *msg, int flags, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe;

    if (u->engine == KVR_IO_EPOLL)
        return ep_submit(u, op, OP_RECVMSG, fd, NULL, 0, msg, flags);
    if ((sqe = get_sqe(u)) == NULL)
        return -EBUSY;
    io_uring_prep_recvmsg(sqe, fd, msg, (unsigned)flags);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_sendmsg(kvr_uring_t *u, int fd, const struct msghdr *msg, int flags, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe;

    if (u->engine == KVR_IO_EPOLL) /* the iovecs are trimmed and restored around each call */
        return ep_submit(u, op, OP_SENDMSG, fd, NULL, 0, (struct msghdr *)msg, flags);
    if ((sqe = get_sqe(u)) == NULL)
        return -EBUSY;
    io_uring_prep_sendmsg(sqe, fd, msg, MSG_NOSIGNAL | (unsigned)flags);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_sendmsg_zc(kvr_uring_t *u, int fd, const struct msghdr *msg, int flags, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe;

    if (u->engine == KVR_IO_EPOLL) /* no zero-copy here: a plain sendmsg */
        return kvr_uring_sendmsg(u, fd, msg, flags, op);
    if ((sqe = get_sqe(u)) == NULL)
        return -EBUSY;
    io_uring_prep_sendmsg_zc(sqe, fd, msg, MSG_NOSIGNAL | (unsigned)flags);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_preadv(kvr_uring_t *u, int fd, const struct iovec *iov, int iovcnt, uint64_t off, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe;
    int rc;

    if (u->engine == KVR_IO_EPOLL) {
        if ((rc = ep_submit(u, op, OP_PREADV, fd, (void *)iov, (size_t)iovcnt, NULL, 0)) == KVR_OK)
            op->iov_off = (size_t)off; /* after ep_submit, which clears it */
        return rc;
    }
    if ((sqe = get_sqe(u)) == NULL)
        return -EBUSY;
    io_uring_prep_readv(sqe, fd, iov, (unsigned)iovcnt, off);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_cancel(kvr_uring_t *u, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe;

    if (u->engine == KVR_IO_EPOLL)
        return ep_cancel(u, op);
    if ((sqe = get_sqe(u)) == NULL)
        return -EBUSY;
    io_uring_prep_cancel(sqe, op, 0);
    io_uring_sqe_set_data(sqe, NULL); /* the cancel's own completion is ignored */
    return KVR_OK;
}

unsigned kvr_uring_process(kvr_uring_t *u)
{
    return u->engine == KVR_IO_EPOLL ? ep_process(u) : ring_process(u);
}
