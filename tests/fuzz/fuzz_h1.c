/*
 * libFuzzer driver for the io_uring HTTP/1.1 data plane (io/h1.c): the input is what one
 * client sends on one connection — request heads, bodies, chunked framing, pipelined requests,
 * garbage — delivered over a real loopback TCP connection to the real worker stack (request
 * layer, store over a real segment, the h2o side for connections it hands over). The driver
 * writes the input, half-closes, and runs the worker's loop until the server has closed the
 * connection (bounded). After every input: the store's full consistency check passes and no
 * pin or reservation outlives the connection. A crash, a sanitizer report or a failed check
 * is a bug.
 *
 * Inputs whose first byte is odd are sent in pieces of (byte 0 / 2 + 1) bytes with the loop
 * run in between, so that partial heads and bodies split at every place are exercised.
 *
 * An input whose first byte is 0xFF chooses its own split points instead: byte 1 gives their
 * count (byte 1 % 8 + 1), the big-endian 16-bit numbers after it the offsets (modulo the
 * length of the rest), and the rest is the stream, cut there. The loop runs a few times
 * between pieces so that each tends to arrive in a read of its own: a piece may end anywhere,
 * e.g. inside the chunk that ends a body, with the next request's first bytes right behind.
 */
#include "core/config.h"
#include "base/log.h"
#include "core/relay_int.h"
#include "core/store.h"
#include "io/api.h"
#include "io/h1.h"
#include "io/http.h"
#include "io/listen.h"
#include "fuzz_worker.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static kvr_config_t cfg;
static kvr_seg_t seg;
static kvr_store_t store;
static kvr_relay_t relay;
static kvr_relay_fds_t fds;
static kvr_api_t api;
static kvr_http_t *http;
static kvr_h1_t *h1;
static uint16_t port;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char *args[] = {"fuzz", "--memory", "4M", "--max-block-size", "1M", "--io-timeout", "200ms", NULL};
    int lfd;

    fuzz_worker_setup(7, args, &cfg, &seg, &store, &relay, &fds);
    port = 0;
    lfd = kvr_listen_tcp("127.0.0.1:0", &port, 64);
    if (lfd < 0)
        abort();
    if (kvr_api_init(&api, &cfg, &seg, &store, &relay) != KVR_OK)
        abort();
    http = kvr_http_create(&cfg, &api);
    h1 = http != NULL ? kvr_h1_create(&cfg, &api, http, lfd, fds.accept) : NULL;
    if (h1 == NULL)
        abort();
    /* a resident block, so that GET, HEAD, dedup and conflicts have something to hit */
    if (kvr_store_put(&store, KVR_NS_DEFAULT, 0, "a", 1, "hello", 5, 1) != KVR_PUT_CREATED)
        abort();
    return 0;
}

static void run_loop(int ms)
{
    if (kvr_h1_waits(h1)) /* as the worker's loop does (proc/worker.c) */
        kvr_h1_turn(h1, ms);
    else
        kvr_http_run_once(http, ms);
    kvr_h1_tick(h1);
    kvr_h1_flush(h1);
}

#define SPLIT_MAX 8

/* An 0xFF input's cuts: fills cut[] (sorted ends of the pieces, the last one size) and moves
 * *data / *size past the header. Returns the number of pieces. */
static size_t split_points(const uint8_t **data, size_t *size, size_t *cut)
{
    const uint8_t *d = *data;
    size_t n, len, k = 0;

    if (*size < 2)
        return 0;
    n = (size_t)d[1] % SPLIT_MAX + 1;
    if (*size < 2 + 2 * n)
        return 0;
    len = *size - 2 - 2 * n;
    for (size_t i = 0; i < n; i++) {
        size_t at = len > 0 ? ((size_t)d[2 + 2 * i] << 8 | d[3 + 2 * i]) % len : 0, j = k;
        while (j > 0 && cut[j - 1] > at) { /* insertion sort: at most 8 */
            cut[j] = cut[j - 1];
            j--;
        }
        cut[j] = at;
        k++;
    }
    cut[k++] = len;
    *data = d + 2 + 2 * n;
    *size = len;
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    size_t piece = size > 0 && (data[0] & 1) ? (size_t)(data[0] / 2 + 1) : size, off = 0;
    size_t cut[SPLIT_MAX + 1], ncut = 0, next = 0;
    int fd, closed = 0, one = 1;
    kvr_store_stats_t scan;

    if (size > 0 && data[0] == 0xFF) {
        ncut = split_points(&data, &size, cut);
        if (ncut == 0)
            return 0;
        piece = size;
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        abort();
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    while (off < size) {
        size_t n = size - off < piece ? size - off : piece;
        ssize_t w;
        while (next < ncut && cut[next] <= off)
            next++;
        if (next < ncut)
            n = cut[next] - off; /* up to the next cut */
        w = send(fd, data + off, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN)
            break; /* the server closed on us */
        if (w > 0)
            off += (size_t)w;
        for (int i = 0; i < (ncut > 0 ? 3 : 1); i++)
            run_loop(0);
        drain_client(fd);
    }
    shutdown(fd, SHUT_WR);
    /* The server closes after EOF, at the latest at --io-timeout or its 2 s linger. */
    for (uint64_t t0 = kvr_clock_us(); !closed && kvr_clock_us() - t0 < 3000000;) {
        run_loop(1);
        closed = drain_client(fd);
    }
    close(fd);
    for (int i = 0; i < 200 && kvr_h1_connections(h1) + kvr_http_connections(http) > 0; i++)
        run_loop(1);
    if (!closed || kvr_h1_connections(h1) + kvr_http_connections(http) > 0) {
        fprintf(stderr, "fuzz_h1: connection not ended (client saw close %d, h1 %llu, h2o %llu)\n", closed,
                (unsigned long long)kvr_h1_connections(h1), (unsigned long long)kvr_http_connections(http));
        abort(); /* a connection the server never ended */
    }
    kvr_store_unpin_flush(&store); /* as the worker's loop does before it blocks */
    if (kvr_store_check(&store, &scan) != KVR_OK || scan.pinned_blocks != 0 || scan.reserved_blocks != 0 ||
        api.inflight != 0)
        abort();
    return 0;
}
