/*
 * engine.h — lean_client's types and its engine (engine.c): blocks, connections, the three
 * protocols, one epoll loop per thread, statistics. main.c has the options and the results,
 * and its head comment the design.
 */
#ifndef LEAN_ENGINE_H
#define LEAN_ENGINE_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define RBUF_CAP  (256u << 10)
#define HBUF_CAP  2048
#define KEY_CAP   240
#define NBUCK     (256 + 56 * 128)
#define POOL_SPAN (4096u * 8)

enum { P_HTTP,
       P_MC,
       P_RESP };
enum { W_GET,
       W_PUT };
enum { EK_STATUS,
       EK_MISS,
       EK_LENGTH,
       EK_CORRUPT,
       EK_SHORT,
       EK_CONNECT,
       EK_TIMEOUT,
       EK_PROTOCOL,
       EK_N };
extern const char *const ek_name[EK_N], *const proto_name[], *const wl_name[];

enum { CS_DOWN,
       CS_CONNECTING,
       CS_IDLE,
       CS_BUSY };
enum { R_HEAD,
       R_BODY,
       R_TRAIL };

typedef struct opts {
    int proto, workload, conns, threads, preload, quiet, verify, round_robin, keys_set;
    uint64_t size, keys, requests;
    double duration, timeout;
    const char *target, *prefix, *json, *size_spec;
    char prefix_buf[64];
    struct sockaddr_storage addr;
    socklen_t addrlen;
    int argc;
    char **argv;
} opts_t;
extern opts_t O; /* the options: main.c fills them, engine.c reads them */

typedef struct run {
    uint8_t *pool;
    uint64_t issued, pre_next, put_next; /* shared counters (__atomic) */
    int phase;                           /* 0 preload, 1 measured */
    uint64_t start_ns, end_ns;           /* end_ns 0: no time limit */
    double cpu0_u, cpu0_s;
    pthread_barrier_t bar;
} run_t;
extern run_t G; /* the run's shared state */

typedef struct stats {
    uint64_t ok, err[EK_N], bytes, misses, hn, hsum, hmax;
    uint64_t status[600];
    uint64_t hist[NBUCK];
} stats_t;

typedef struct conn {
    int fd, state, op, sending, rstate, pend, close_after, status;
    uint64_t t0, retry_at, h, off, body_len, body_got, trail_got;
    const char *trail;
    size_t trail_len, hlen;
    uint64_t smp[3][2]; /* sampled byte ranges [lo, hi) of a GET body */
    int nsmp;
    char key[KEY_CAP];
    int klen;
    uint8_t stamp[16];
    char req[KEY_CAP + 160];
    struct iovec iov[4];
    int iov_i, iov_n;
    char hbuf[HBUF_CAP + 1];
} conn_t;

typedef struct thr {
    int id, ep, nconn, busy, down;
    conn_t *conns;
    pthread_t tid;
    uint64_t rng, rr, last_ns, last_scan;
    stats_t st[2];
    char sample[EK_N][200];
    uint8_t *rbuf;
} thr_t;

uint64_t now_ns(void);
uint64_t mix64(uint64_t x);
void pool_init(void);
double quantile_ns(const stats_t *s, double q);
void stats_add(stats_t *to, const stats_t *from);
uint64_t errs_of(const stats_t *s);
thr_t *setup_threads(void);
/* Closes every connection and frees what setup_threads made (a clean exit under LeakSanitizer). */
void free_threads(thr_t *ts);
void *thread_main(void *arg);

#endif
