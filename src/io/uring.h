/*
 * uring.h — the worker's I/O engine: one per worker (created after fork), its completions
 * announced on a descriptor (efd) that joins the worker's h2o event loop, or (the HTTP/1.1
 * ring, kvr_uring_own_wait) reaped by the loop itself, which waits in the ring.
 *
 * Two engines behind one op API (docs/dataplane.md, "I/O engines"):
 *   io_uring — the ring does each op in the kernel; efd is the ring's completion eventfd.
 *   epoll    — for where io_uring_setup is denied (a container runtime's default seccomp
 *              profile, kernel.io_uring_disabled): each op is the equivalent non-blocking
 *              syscall, tried at once and again when its descriptor is ready; efd is an
 *              epoll fd holding the descriptors that wait and a wake-up eventfd.
 *
 * Every submission carries a kvr_uring_op_t (the caller embeds it in its own object); on
 * completion its callback runs with the result (bytes, a new fd, or -errno), always from
 * kvr_uring_process or kvr_uring_wait, never from inside the submitting call. Submissions are
 * batched: they go to the kernel (io_uring) or are tried (epoll) at kvr_uring_flush, which the
 * loop calls once per iteration, or at kvr_uring_wait, and whenever the submission queue is
 * full.
 */
#ifndef KVR_IO_URING_H
#define KVR_IO_URING_H

#include "common.h"

#include <liburing.h>
#include <sys/socket.h>

typedef struct kvr_uring_op_s kvr_uring_op_t;
typedef void (*kvr_uring_cb)(kvr_uring_op_t *op, int res);

struct kvr_uring_op_s {
    kvr_uring_cb cb;
    void *data;
    /* the epoll engine's record of the op: private to uring.c */
    kvr_uring_op_t *next;
    void *buf;
    struct msghdr *msg;
    size_t len;              /* bytes asked for (the iovecs' sum for msg ops) */
    size_t done;             /* MSG_WAITALL: bytes moved so far */
    size_t iov_idx, iov_off; /* MSG_WAITALL: where `done` is in msg's iovecs */
    int fd;
    int flags;
    int res; /* the result, from completion to callback */
    uint8_t kind;
    uint8_t state;
    uint8_t cancel;
};

enum { KVR_IO_AUTO = 0,
       KVR_IO_URING,
       KVR_IO_EPOLL };

typedef struct kvr_uring_fd_s kvr_uring_fd_t;

typedef struct {
    int engine; /* KVR_IO_URING or KVR_IO_EPOLL once initialised */
    int efd;    /* the loop watches this for readability (-1: kvr_uring_own_wait) */
    /* io_uring */
    struct io_uring ring;
    unsigned unsubmitted;
    /* epoll */
    int wakefd; /* eventfd in the epoll set: completions that no socket event announces */
    int woken;  /* wakefd written and not read yet */
    int in_process;
    kvr_uring_op_t *sq, **sq_tail; /* submitted, not tried yet */
    kvr_uring_op_t *cq, **cq_tail; /* completed, callback not run yet */
    kvr_uring_fd_t *fds;           /* per descriptor: the ops waiting for it to be ready */
    unsigned nfds;
} kvr_uring_t;

/*
 * Chooses the engine for this process and its future children, once, before any fork:
 * "auto" (io_uring when io_uring_setup works, else epoll), "uring" (fails when io_uring is
 * denied) or "epoll". Probes io_uring_setup and logs the choice and why. KVR_OK, or KVR_ERR
 * (logged) for "uring" where io_uring is denied or an unknown name.
 */
int kvr_uring_select(const char *engine);
/* The engine selected (KVR_IO_AUTO when kvr_uring_select was not called) and its name. */
int kvr_uring_engine(void);
const char *kvr_uring_engine_name(int engine);

/* Creates the engine and its efd. KVR_OK or -errno (logged). Without kvr_uring_select,
 * io_uring is tried and epoll taken when io_uring_setup is denied (EPERM/EACCES/ENOSYS). */
int kvr_uring_init(kvr_uring_t *u, unsigned entries);
/* Ops still in flight never complete. */
void kvr_uring_exit(kvr_uring_t *u);

int kvr_uring_accept(kvr_uring_t *u, int fd, kvr_uring_op_t *op);
/* A descriptor the caller made outside the engine (accept4, dup2): its number may be a closed
 * descriptor's, of which the epoll engine still keeps a record ("in the epoll set", while the
 * kernel dropped it at close), and an op on it would wait for readiness that is never
 * reported. Call it before the descriptor's first op; an accept through the engine does. */
void kvr_uring_fd_new(kvr_uring_t *u, int fd);
int kvr_uring_recv(kvr_uring_t *u, int fd, void *buf, size_t len, kvr_uring_op_t *op);
int kvr_uring_send(kvr_uring_t *u, int fd, const void *buf, size_t len, kvr_uring_op_t *op);
/* recv with MSG_* flags (MSG_PEEK to look without consuming, MSG_TRUNC with buf NULL to discard). */
int kvr_uring_recv_flags(kvr_uring_t *u, int fd, void *buf, size_t len, int flags, kvr_uring_op_t *op);
/* Scatter/gather: msg (and its iovecs) must stay valid until the completion. With MSG_WAITALL
 * the engine retries short transfers itself and completes once, with everything, or with the
 * bytes moved before EOF or an error (the error itself when nothing moved). */
int kvr_uring_recvmsg(kvr_uring_t *u, int fd, struct msghdr *msg, int flags, kvr_uring_op_t *op);
int kvr_uring_sendmsg(kvr_uring_t *u, int fd, const struct msghdr *msg, int flags, kvr_uring_op_t *op);
/* The same with IORING_OP_SENDMSG_ZC: the kernel sends from the caller's pages without
 * copying them to the socket (a NIC then DMAs from them; loopback copies them at delivery).
 * The callback runs once, with the send's result, after the kernel's notification that it no
 * longer uses the pages: the buffers (a pinned block) must stay put until then. On the epoll
 * engine, a plain sendmsg. */
int kvr_uring_sendmsg_zc(kvr_uring_t *u, int fd, const struct msghdr *msg, int flags, kvr_uring_op_t *op);
/* Reads a file at offset off into iovecs (which must stay valid until the completion): the
 * disk tier's reads. io_uring reads in the kernel, asynchronously; the epoll engine has no
 * readiness for a file and calls preadv at the flush, which blocks this worker for the read.
 * A short read completes with the bytes read: the caller decides. */
int kvr_uring_preadv(kvr_uring_t *u, int fd, const struct iovec *iov, int iovcnt, uint64_t off, kvr_uring_op_t *op);
/* Cancels the submission carrying op: it completes with -ECANCELED unless it completed
 * already (its completion still arrives either way). */
int kvr_uring_cancel(kvr_uring_t *u, kvr_uring_op_t *op);

/* Pushes queued submissions to the kernel (io_uring), or tries them (epoll). */
void kvr_uring_flush(kvr_uring_t *u);

/* The worker's loop waits in this ring instead of on efd (io_uring only; KVR_ERR otherwise):
 * the eventfd is unregistered and closed (efd -1), so a completion no longer signals one, and
 * the caller reaps with kvr_uring_wait. */
int kvr_uring_own_wait(kvr_uring_t *u);
/* One readiness report (IORING_OP_POLL_ADD, POLLIN, one shot) of fd: op's callback gets the
 * poll mask or -errno. io_uring only (KVR_ERR otherwise). */
int kvr_uring_poll_in(kvr_uring_t *u, int fd, kvr_uring_op_t *op);
/* Submits what is queued, waits up to max_ms (not at all for 0) for a completion, then runs
 * the callbacks of every completion there is: one system call, or none when completions wait
 * and nothing is queued. Returns the count run. io_uring only. */
unsigned kvr_uring_wait(kvr_uring_t *u, int32_t max_ms);

/* Clears efd and runs the callbacks of every completion there is. Returns the count. */
unsigned kvr_uring_process(kvr_uring_t *u);

#endif
