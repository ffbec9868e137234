/*
 * The frame ring's seqlock (docs/concurrency.md, "The relay ring and its frames"), with both
 * real sides: a child process plays the publisher and publishes frames through
 * kvr_relay_put_frame as fast as it can, each 320 KiB to 960 KiB, so that a reader a few
 * dozen frames behind finds both its ring bytes (32 MiB hold about 50 frames) and its index
 * entry (64 of them) being overwritten; this process reads old sequences through
 * kvr_relay_read_frame meanwhile. Every frame the reader accepts must be exactly the one
 * written as that sequence, in length and in every word: a torn read fails the test.
 *
 * It fails when the reader drops its re-check of ring_tail (here about one accepted frame
 * in five came out torn) or the writer stores bytes before it moves the tail. The index
 * entry's own window (a few stores) is too short to hit reliably, and a missing fence shows
 * only on a CPU (or with a compiler) that reorders there.
 */
#include "base/barrier.h"
#include "base/log.h"
#include "core/config.h"
#include "core/relay_int.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUN_S 3.0

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Frame seq: frame_len(seq) bytes, every 64-bit word seq ^ a constant. */
static size_t frame_len(uint64_t seq)
{
    return 8 * (size_t)(40960 + (seq * 2654435761u) % 81920);
}

static uint64_t frame_word(uint64_t seq)
{
    return seq ^ 0x5DEECE66Dull;
}

static void writer(kvr_relay_t *r, uint64_t *msg)
{
    double end = now_s() + RUN_S;

    kvr_atomic_store_seq_cst(&r->sh->publisher_pid, (uint32_t)getpid()); /* as new_generation */
    for (uint64_t seq = 1; now_s() < end; seq++) {
        size_t len = frame_len(seq);
        for (size_t i = 0; i < len / 8; i++)
            msg[i] = frame_word(seq);
        kvr_relay_put_frame(r, 0, seq, (const uint8_t *)msg, len, len);
    }
    _exit(0);
}

Test(relay_ring, torn_frames_are_rejected, .timeout = 60)
{
    char *argv[] = {"t", NULL};
    kvr_seg_config_t sc = {.memory = 8 << 20, .page_size = 4096, .max_blocks = 512, .hugepages = KVR_HUGEPAGES_OFF};
    kvr_config_t cfg;
    kvr_seg_t seg;
    kvr_relay_t relay;
    size_t cap = frame_len(0) + 8 * 81920;
    uint64_t *buf = malloc(cap), accepted = 0, rejected = 0, torn = 0;
    pid_t pid;
    int status;

    cr_assert_not_null(buf);
    kvr_log_level = KVR_LOG_ERROR;
    cr_assert_eq(kvr_config_load(&cfg, 1, argv, stderr), KVR_OK);
    sc.ckf_buckets = kvr_relay_bucket_count(&cfg, 512);
    cr_assert_eq(kvr_seg_create(&seg, &sc), KVR_OK);
    cr_assert_eq(kvr_seg_proc_claim_at(&seg, 0, KVR_ROLE_SUPERVISOR), 0);
    cr_assert_eq(kvr_relay_format(&relay, &seg, &cfg), KVR_OK);
    kvr_relay_attach(&relay, &seg, &cfg, NULL);
    kvr_atomic_store_seq_cst(&relay.sh->generation, 1);

    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        writer(&relay, buf);
    srand(1);
    while (waitpid(pid, &status, WNOHANG) == 0) {
        uint64_t top = kvr_atomic_load_acquire(&relay.sh->pool[0].published_seq), seq, back = (uint64_t)rand() % 64;
        ssize_t n;
        if (top <= back)
            continue;
        seq = top - back;
        n = kvr_relay_read_frame(&relay, 0, 1, seq, (uint8_t *)buf, cap);
        if (n < 0) {
            rejected++;
            continue;
        }
        if (n == 0)
            continue;
        accepted++;
        if ((size_t)n != frame_len(seq)) {
            torn++;
            continue;
        }
        for (size_t i = 0; i < (size_t)n / 8; i++)
            if (buf[i] != frame_word(seq)) {
                torn++;
                break;
            }
    }
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer failed");
    cr_log_info("frame ring: %llu accepted, %llu rejected, %llu torn", (unsigned long long)accepted,
                (unsigned long long)rejected, (unsigned long long)torn);
    cr_assert_eq(torn, 0, "%llu of %llu accepted frames were torn", (unsigned long long)torn,
                 (unsigned long long)accepted);
    cr_assert_gt(accepted, 100, "the reader accepted only %llu frames", (unsigned long long)accepted);
    cr_assert_gt(rejected, 0, "the reader never met an overwritten frame");
    kvr_seg_destroy(&seg);
    free(buf);
}
