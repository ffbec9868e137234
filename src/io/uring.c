/* uring.c — see uring.h. */
#include "io/uring.h"

#include "core/log.h"

#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

int kvr_uring_init(kvr_uring_t *u, unsigned entries)
{
    int rc;

    memset(u, 0, sizeof(*u));
    rc = io_uring_queue_init(entries, &u->ring, 0);
    if (rc < 0) {
        kvr_error("io_uring_queue_init(%u): %s", entries, strerror(-rc));
        return rc;
    }
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
    return KVR_OK;
}

void kvr_uring_exit(kvr_uring_t *u)
{
    io_uring_queue_exit(&u->ring);
    close(u->efd);
}

void kvr_uring_flush(kvr_uring_t *u)
{
    if (u->unsubmitted > 0) {
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
        kvr_uring_flush(u);
        sqe = io_uring_get_sqe(&u->ring);
    }
    if (sqe != NULL)
        u->unsubmitted++;
    return sqe;
}

int kvr_uring_accept(kvr_uring_t *u, int fd, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe = get_sqe(u);
    if (sqe == NULL)
        return -EBUSY;
    io_uring_prep_accept(sqe, fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_recv(kvr_uring_t *u, int fd, void *buf, size_t len, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe = get_sqe(u);
    if (sqe == NULL)
        return -EBUSY;
    io_uring_prep_recv(sqe, fd, buf, len, 0);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_send(kvr_uring_t *u, int fd, const void *buf, size_t len, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe = get_sqe(u);
    if (sqe == NULL)
        return -EBUSY;
    io_uring_prep_send(sqe, fd, buf, len, MSG_NOSIGNAL);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_recv_flags(kvr_uring_t *u, int fd, void *buf, size_t len, int flags, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe = get_sqe(u);
    if (sqe == NULL)
        return -EBUSY;
    io_uring_prep_recv(sqe, fd, buf, len, flags);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_recvmsg(kvr_uring_t *u, int fd, struct msghdr *msg, int flags, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe = get_sqe(u);
    if (sqe == NULL)
        return -EBUSY;
    io_uring_prep_recvmsg(sqe, fd, msg, (unsigned)flags);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_sendmsg(kvr_uring_t *u, int fd, const struct msghdr *msg, int flags, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe = get_sqe(u);
    if (sqe == NULL)
        return -EBUSY;
    io_uring_prep_sendmsg(sqe, fd, msg, MSG_NOSIGNAL | (unsigned)flags);
    io_uring_sqe_set_data(sqe, op);
    return KVR_OK;
}

int kvr_uring_cancel(kvr_uring_t *u, kvr_uring_op_t *op)
{
    struct io_uring_sqe *sqe = get_sqe(u);
    if (sqe == NULL)
        return -EBUSY;
    io_uring_prep_cancel(sqe, op, 0);
    io_uring_sqe_set_data(sqe, NULL); /* the cancel's own completion is ignored */
    return KVR_OK;
}

unsigned kvr_uring_process(kvr_uring_t *u)
{
    struct io_uring_cqe *cqe;
    uint64_t v;
    unsigned n = 0;

    (void)!read(u->efd, &v, sizeof(v));
    while (io_uring_peek_cqe(&u->ring, &cqe) == 0 && cqe != NULL) {
        kvr_uring_op_t *op = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&u->ring, cqe);
        if (op != NULL && op->cb != NULL)
            op->cb(op, res);
        n++;
    }
    return n;
}
