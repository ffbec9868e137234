/*
 * bench_lookup — POST /batch/lookup measured end to end against the real server.
 *
 * Starts build/kvrelay-supervisor on an ephemeral loopback port (stopped by PID at the end),
 * fills it with 8,192 small blocks PUT with X-KV-Sequence-Hash, then runs one closed-loop client
 * over one keep-alive HTTP/1.1 connection: each request asks for B hashes of which the first half
 * are held (a prefix of B/2) and the rest are not. Every answer is checked (its count and its
 * prefix). Prints "name value unit" lines, for B = 64 and B = 4,096:
 *
 *   lookup_B_requests_per_s   lookups (requests) per second
 *   lookup_B_hashes_per_s     hashes answered per second
 *   lookup_B_p50_us, _p99_us  a request's latency, from its first byte sent to its last read
 *
 * and the same for B = 0 (an empty body: the HTTP round trip and the route alone, the baseline
 * the hashes' cost adds to).
 *
 * Environment: KVRELAY_BIN (the server binary; default ../kvrelay-supervisor next to this
 * program), KVR_BENCH_SECONDS (per batch size, default 3), KVR_BENCH_WORKERS (default 1),
 * KVR_BENCH_PIN=1 (the server on CPU 0, this client on CPU 1). Unpinned, on a small machine the
 * scheduler sometimes lets the client and the worker share a core and sometimes not, and a small
 * request's round trip differs by 4x between the two (most likely the price of a wake-up across
 * cores on this VM); pinned, every run is of the cross-core kind. Compare B's figures with B = 0 of the same run.
 */
#include <errno.h>
#include <libgen.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NBLOCKS 8192
#define HBASE   0x6b76726c00000000ull /* held hashes: HBASE + i, i < NBLOCKS */
#define MBASE   0x6d69737300000000ull /* hashes nobody PUT */
#define NBODIES 32

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------ the server */

static char server_bin[4096], portfile[64], http[192];
static pid_t server_pid;

static int pinning;

/* With KVR_BENCH_PIN=1: this process (and what it forks) on one CPU. */
static void pin(int cpu)
{
    cpu_set_t set;

    if (!pinning)
        return;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        perror("bench_lookup: sched_setaffinity");
}

static void server_start(const char *workers)
{
    char *argv[] = {server_bin, "--http-bind", "127.0.0.1:0", "--grpc-bind", "off", "--port-file",
                    portfile, "--log-level", "warn", "--memory", "256M", "--workers",
                    (char *)workers, NULL};
    double end;

    snprintf(portfile, sizeof(portfile), "/tmp/kvrelay-bench-lookup-%d.ports", (int)getpid());
    unlink(portfile);
    server_pid = fork();
    if (server_pid == 0) {
        pin(0);
        execv(server_bin, argv);
        _exit(127);
    }
    end = now_s() + 10;
    http[0] = '\0';
    while (now_s() < end && http[0] == '\0') {
        FILE *f = fopen(portfile, "r");
        if (f != NULL) {
            char line[192];
            while (fgets(line, sizeof(line), f))
                if (!strncmp(line, "http=", 5)) {
                    line[strcspn(line, "\n")] = '\0';
                    snprintf(http, sizeof(http), "%s", line + 5);
                }
            fclose(f);
        }
        usleep(10000);
    }
    if (http[0] == '\0') {
        fprintf(stderr, "bench_lookup: the server did not start (%s)\n", server_bin);
        exit(1);
    }
}

static void server_stop(void)
{
    int status;

    kill(server_pid, SIGTERM);
    for (int i = 0; i < 100 && waitpid(server_pid, &status, WNOHANG) == 0; i++)
        usleep(50000);
    kill(server_pid, SIGKILL);
    waitpid(server_pid, &status, 0);
    unlink(portfile);
}

/* ------------------------------------------------------------------ HTTP/1.1 keep-alive */

static int http_connect(void)
{
    int port = atoi(strrchr(http, ':') + 1), fd = socket(AF_INET, SOCK_STREAM, 0), on = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};

    a.sin_addr.s_addr = htonl(0x7f000001);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        perror("bench_lookup: connect");
        exit(1);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    return fd;
}

static void send_all(int fd, const char *head, size_t hlen, const char *body, size_t blen)
{
    struct iovec iov[2] = {{(void *)head, hlen}, {(void *)body, blen}};
    int n = 2, k = 0;

    while (k < n) {
        ssize_t w = writev(fd, iov + k, n - k);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            perror("bench_lookup: write");
            exit(1);
        }
        while (k < n && (size_t)w >= iov[k].iov_len)
            w -= (ssize_t)iov[k++].iov_len;
        if (k < n) {
            iov[k].iov_base = (char *)iov[k].iov_base + w;
            iov[k].iov_len -= (size_t)w;
        }
    }
}

/* Reads one response into buf (cap bytes); returns its status, the body in *body and *blen. */
static int recv_response(int fd, char *buf, size_t cap, char **body, size_t *blen)
{
    size_t got = 0, need = 0;
    char *end = NULL;

    for (;;) {
        ssize_t n = read(fd, buf + got, cap - 1 - got);
        if (n <= 0) {
            fprintf(stderr, "bench_lookup: the connection ended\n");
            exit(1);
        }
        got += (size_t)n;
        buf[got] = '\0';
        if (end == NULL && (end = strstr(buf, "\r\n\r\n")) != NULL) {
            char *cl = strcasestr(buf, "content-length:");
            need = (size_t)(end + 4 - buf) + (cl != NULL && cl < end ? strtoul(cl + 15, NULL, 10) : 0);
            if (need >= cap) {
                fprintf(stderr, "bench_lookup: answer too large\n");
                exit(1);
            }
        }
        if (end != NULL && got >= need)
            break;
    }
    *body = end + 4;
    *blen = need - (size_t)(end + 4 - buf);
    return atoi(buf + 9);
}

/* ------------------------------------------------------------------ fill and measure */

static void fill(int fd)
{
    char head[256], buf[4096], *body;
    size_t blen;

    for (int i = 0; i < NBLOCKS; i++) {
        int n = snprintf(head, sizeof(head),
                         "PUT /kv/bench-lookup-%05d HTTP/1.1\r\nHost: x\r\nX-KV-Sequence-Hash: %llu\r\n"
                         "Content-Length: 64\r\n\r\n",
                         i, (unsigned long long)(HBASE + (uint64_t)i));
        send_all(fd, head, (size_t)n, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 64);
        if (recv_response(fd, buf, sizeof(buf), &body, &blen) != 201) {
            fprintf(stderr, "bench_lookup: a PUT of the fill failed\n");
            exit(1);
        }
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* NBODIES request bodies of b hashes: b/2 held ones (a run from a random start), then b/2 that
 * are not; each in decimal, one per line. */
static char *make_bodies(int b, size_t *lens)
{
    size_t cap = (size_t)b * 22 + 1;
    char *all = malloc(cap * NBODIES);
    unsigned seed = 12345;

    for (int k = 0; k < NBODIES; k++) {
        char *p = all + (size_t)k * cap;
        size_t len = 0;
        int start = rand_r(&seed) % (NBLOCKS - b / 2);
        for (int j = 0; j < b; j++) {
            uint64_t h = j < b / 2 ? HBASE + (uint64_t)(start + j) : MBASE + (uint64_t)rand_r(&seed);
            len += (size_t)snprintf(p + len, cap - len, "%llu\n", (unsigned long long)h);
        }
        lens[k] = len;
    }
    return all;
}

static void measure(int fd, int b, double seconds)
{
    size_t lens[NBODIES], cap = (size_t)b * 22 + 1, nlat = 0, caplat = 1 << 16, blen;
    char *bodies = make_bodies(b, lens), head[256], *buf = malloc(64 + (size_t)b * 6 + 4096), *body, want[64];
    double *lat = malloc(caplat * sizeof(double)), t0, end, total;
    uint64_t reqs = 0;

    snprintf(want, sizeof(want), "\"count\":%d,", b);
    for (int phase = 0; phase < 2; phase++) { /* 0: a warm-up of a third of the time */
        t0 = now_s();
        end = t0 + (phase == 0 ? seconds / 3 : seconds);
        reqs = 0;
        nlat = 0;
        while (now_s() < end) {
            int k = (int)(reqs % NBODIES);
            int n = snprintf(head, sizeof(head), "POST /batch/lookup HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n",
                             lens[k]);
            double s = now_s();
            char *pfx;
            send_all(fd, head, (size_t)n, bodies + (size_t)k * cap, lens[k]);
            if (recv_response(fd, buf, 64 + (size_t)b * 6 + 4096, &body, &blen) != 200 || strstr(body, want) == NULL ||
                (pfx = strstr(body, "\"prefix\":")) == NULL || atoi(pfx + 9) != b / 2) {
                fprintf(stderr, "bench_lookup: a wrong answer for %d hashes: %.200s\n", b, body);
                exit(1);
            }
            if (nlat == caplat)
                lat = realloc(lat, (caplat *= 2) * sizeof(double));
            lat[nlat++] = now_s() - s;
            reqs++;
        }
        total = now_s() - t0;
    }
    qsort(lat, nlat, sizeof(double), cmp_double);
    printf("lookup_%d_requests_per_s %.0f req/s\n", b, (double)reqs / total);
    if (b > 0)
        printf("lookup_%d_hashes_per_s %.0f hashes/s\n", b, (double)reqs * b / total);
    printf("lookup_%d_p50_us %.1f us\n", b, lat[nlat / 2] * 1e6);
    printf("lookup_%d_p99_us %.1f us\n", b, lat[(size_t)((double)nlat * 0.99)] * 1e6);
    free(lat);
    free(buf);
    free(bodies);
}

int main(void)
{
    const char *env = getenv("KVRELAY_BIN"), *secs = getenv("KVR_BENCH_SECONDS"), *workers = getenv("KVR_BENCH_WORKERS");
    double seconds = secs != NULL ? atof(secs) : 3.0;
    int fd;

    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    if (env != NULL) {
        snprintf(server_bin, sizeof(server_bin), "%s", env);
    } else {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        self[n > 0 ? n : 0] = '\0';
        snprintf(server_bin, sizeof(server_bin), "%s/../kvrelay-supervisor", dirname(self));
    }
    pinning = getenv("KVR_BENCH_PIN") != NULL && atoi(getenv("KVR_BENCH_PIN")) == 1;
    server_start(workers != NULL ? workers : "1");
    pin(1);
    fd = http_connect();
    fill(fd);
    measure(fd, 0, seconds);
    measure(fd, 64, seconds);
    measure(fd, 4096, seconds);
    close(fd);
    server_stop();
    return 0;
}
