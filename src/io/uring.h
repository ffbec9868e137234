/*
 * uring.h — the worker's io_uring engine: one ring per worker, created after fork, its
 * completions announced on an eventfd that joins the worker's h2o event loop.
 *
 * Every submission carries a kvr_uring_op_t (the caller embeds it in its own object); on
 * completion its callback runs with the result (bytes, a new fd, or -errno). Submissions
 * are batched: they go to the kernel at kvr_uring_flush, which the loop calls once per
 * iteration, and whenever the submission queue is full.
 */
#ifndef KVR_IO_URING_H
#define KVR_IO_URING_H

#include "common.h"

#include <liburing.h>

typedef struct kvr_uring_op_s kvr_uring_op_t;
typedef void (*kvr_uring_cb)(kvr_uring_op_t *op, int res);

struct kvr_uring_op_s {
    kvr_uring_cb cb;
    void *data;
};

typedef struct {
    struct io_uring ring;
    int efd;
    unsigned unsubmitted;
} kvr_uring_t;

/* Creates the ring and its completion eventfd. KVR_OK or -errno (logged). */
int kvr_uring_init(kvr_uring_t *u, unsigned entries);
void kvr_uring_exit(kvr_uring_t *u);

int kvr_uring_accept(kvr_uring_t *u, int fd, kvr_uring_op_t *op);
int kvr_uring_recv(kvr_uring_t *u, int fd, void *buf, size_t len, kvr_uring_op_t *op);
int kvr_uring_send(kvr_uring_t *u, int fd, const void *buf, size_t len, kvr_uring_op_t *op);
/* recv with MSG_* flags (MSG_PEEK to look without consuming, MSG_TRUNC with buf NULL to discard). */
int kvr_uring_recv_flags(kvr_uring_t *u, int fd, void *buf, size_t len, int flags, kvr_uring_op_t *op);
/* Scatter/gather: msg (and its iovecs) must stay valid until the completion. With MSG_WAITALL
 * the kernel retries short transfers itself and completes once, with everything or an error. */
int kvr_uring_recvmsg(kvr_uring_t *u, int fd, struct msghdr *msg, int flags, kvr_uring_op_t *op);
int kvr_uring_sendmsg(kvr_uring_t *u, int fd, const struct msghdr *msg, int flags, kvr_uring_op_t *op);
/* Asks the kernel to cancel the submission carrying op (its completion still arrives). */
int kvr_uring_cancel(kvr_uring_t *u, kvr_uring_op_t *op);

/* Pushes queued submissions to the kernel. */
void kvr_uring_flush(kvr_uring_t *u);

/* Clears the eventfd and runs the callbacks of every completion there is. Returns the count. */
unsigned kvr_uring_process(kvr_uring_t *u);

#endif
