/*
 * The publisher process against real subscribers, without gRPC: this process plays the
 * workers (PUT/DELETE through the store, subscriber slots read like a stream would) and
 * the consumer (every frame goes through the CBI1 mirror with its sequencing checks).
 */
#include "core/config.h"
#include "base/log.h"
#include "proc/publisher.h"
#include "core/relay_int.h"
#include "core/store.h"
#include "wire/cbi1.h"
#include "wire/mirror.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../wait_until.h"

typedef struct {
    kvr_config_t cfg;
    kvr_seg_t seg;
    kvr_store_t st;
    kvr_relay_t relay;
    kvr_relay_fds_t fds;
    pid_t pub;
    uint8_t *buf;
    size_t cap;
} rx_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void start_publisher(rx_t *x)
{
    x->pub = fork();
    cr_assert_geq(x->pub, 0);
    if (x->pub == 0)
        kvr_publisher_main(&x->cfg, &x->seg, 2, &x->fds);
}

static uint64_t wait_generation(rx_t *x, uint64_t above)
{
    uint64_t g;
    cr_assert(WAIT_UNTIL((g = atomic_load(&x->relay.sh->generation)) > above, 10000),
              "publisher did not start a new generation");
    return g;
}

static void rx_open_log(rx_t *x, uint64_t log_capacity)
{
    char *argv[] = {"t", NULL};
    kvr_seg_config_t sc = {
        .memory = 8 << 20,
        .page_size = 4096,
        .max_blocks = 512,
        .hugepages = KVR_HUGEPAGES_OFF,
        .log_capacity = log_capacity,
        .relay_pools = 4,
    };

    kvr_log_level = KVR_LOG_ERROR;
    cr_assert_eq(kvr_config_load(&x->cfg, 1, argv, stderr), KVR_OK);
    sc.ckf_buckets = kvr_relay_bucket_count(&x->cfg, 512);
    cr_assert_eq(kvr_seg_create(&x->seg, &sc), KVR_OK);
    cr_assert_eq(kvr_store_format(&x->seg, 0), KVR_OK);
    cr_assert_eq(kvr_seg_proc_claim_at(&x->seg, 0, 0), 0);
    cr_assert_eq(kvr_store_open(&x->st, &x->seg), KVR_OK);
    cr_assert_eq(kvr_store_pool(&x->st, KVR_NS_DEFAULT, "default", "kvrelay", 7, KVR_POOLS_MAX), 0, "pool 0, as the supervisor makes it");
    cr_assert_eq(kvr_relay_format(&x->relay, &x->seg, &x->cfg), KVR_OK);
    for (int i = 0; i < KVR_MAX_PROCS; i++)
        x->fds.worker[i] = -1;
    x->fds.publisher = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    x->fds.worker[0] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    kvr_relay_attach(&x->relay, &x->seg, &x->cfg, &x->fds);
    x->st.notify_fd = x->fds.publisher;
    x->cap = kvr_relay_chunk_msg_max(&x->relay) + (5u << 20);
    x->buf = malloc(x->cap);
    start_publisher(x);
    wait_generation(x, 0);
}

static void rx_open(rx_t *x)
{
    rx_open_log(x, 0);
}

static void rx_close(rx_t *x)
{
    int status;
    kill(x->pub, SIGKILL);
    waitpid(x->pub, &status, 0);
    kvr_seg_destroy(&x->seg);
    free(x->buf);
}

/* Unpacks a gRPC-framed FilterUpdate and feeds it to the mirror. */
static int feed(kvr_mirror_t *m, const uint8_t *msg, size_t len)
{
    Dynamo__Kvrelay__V1__FilterUpdate *fu;
    kvr_mirror_update_t u;
    int rc;

    cr_assert_geq(len, 5);
    cr_assert_eq(kvr_be32(msg + 1), len - 5);
    fu = dynamo__kvrelay__v1__filter_update__unpack(NULL, len - 5, msg + 5);
    cr_assert_not_null(fu);
    cr_assert_eq(fu->contract_marker, 0x4B565231u);
    cr_assert_eq(fu->protocol_version, 1);
    u.seed = fu->producer->ckf_format->seed;
    u.bucket_count = fu->producer->ckf_format->bucket_count;
    u.dc_id = fu->producer->pool_id->dc_id;
    u.base_sequence = fu->base_sequence;
    u.sequence = fu->sequence;
    u.kind = fu->kind;
    u.payload = fu->payload.data;
    u.payload_len = fu->payload.len;
    rc = kvr_mirror_apply(m, &u);
    dynamo__kvrelay__v1__filter_update__free_unpacked(fu, NULL);
    return rc;
}

/* Waits until the subscriber is admitted or closed; returns its state. */
static uint32_t wait_admitted(rx_t *x, int sub)
{
    uint32_t st;
    WAIT_UNTIL((st = atomic_load(&x->relay.sh->sub[sub].state)) != KVR_SUB_REQUESTED, 10000);
    return st;
}

static void read_snapshot(rx_t *x, int sub, kvr_mirror_t *m, uint64_t gen)
{
    uint32_t chunks = kvr_cbi1_chunk_count(x->relay.sh->bucket_count);

    (void)gen;
    for (uint32_t c = 0; c < chunks; c++) {
        size_t len = kvr_relay_sub_chunk(&x->relay, sub, c, x->buf, x->cap);
        cr_assert_gt(len, 0);
        cr_assert_eq(feed(m, x->buf, len), KVR_MIRROR_OK);
    }
}

/* Reads every published frame after the cursor; returns -1 if one is gone (lagged). */
static int drain_frames(rx_t *x, int sub, kvr_mirror_t *m)
{
    for (;;) {
        uint64_t c;
        ssize_t n = kvr_relay_sub_next_frame(&x->relay, sub, x->buf, x->cap, &c);
        if (n == 0)
            return 0;
        if (n < 0)
            return -1;
        cr_assert_eq(feed(m, x->buf, (size_t)n), KVR_MIRROR_OK, "frame %llu", (unsigned long long)c);
    }
}

#define QUIET_S 0.15 /* seconds; see quiesce */

/* The change log is empty and the published sequence is *last, the value of the previous look
 * (which this look updates); *since is when it last moved. */
static int quiet(rx_t *x, uint64_t *last, double *since)
{
    uint64_t h = atomic_load(&x->st.log->head), t = atomic_load(&x->st.log->tail);
    uint64_t seq = 0, prev = *last;

    for (int p = 0; p < 4; p++) /* every pool's: the sum moves with any of them */
        seq += atomic_load(&x->relay.sh->pool[p].published_seq);
    *last = seq;
    if (h != t || seq != prev)
        *since = now_s();
    return now_s() - *since >= QUIET_S;
}

/* Waits until the publisher has consumed the log and published everything: the log empty and
 * nothing published for QUIET_S. A publication waits for more events up to
 * --publication-coalesce-max (64) x --publication-delay (1 ms) while a subscriber is behind
 * (docs/relay-contract.md §5.3), and a test that reads its frames after the writes is behind. */
static void quiesce(rx_t *x)
{
    uint64_t last = ~0ull;
    double since = now_s();
    cr_assert(WAIT_UNTIL_EVERY(quiet(x, &last, &since), 10000, 20), "publisher did not quiesce");
}

static void put_pool(rx_t *x, uint32_t pool, int from, int to, uint64_t salt)
{
    char key[32];
    for (int i = from; i < to; i++) {
        snprintf(key, sizeof(key), "blk-%d", i);
        cr_assert_geq(kvr_store_put(&x->st, KVR_NS_DEFAULT, pool, key, strlen(key), "x", 1,
                                    (uint64_t)i * 0x9E3779B97F4A7C15ull + salt),
                      0);
    }
}

static void put_n(rx_t *x, int from, int to, uint64_t salt)
{
    put_pool(x, 0, from, to, salt);
}

static void assert_replica_exact(rx_t *x, kvr_mirror_t *m)
{
    /* every resident block's canonical hash is in the replica ... */
    for (uint64_t e = 0; e < x->seg.hdr->max_blocks; e++)
        if (x->st.ix.ent[e].state == KVR_ENT_LIVE)
            cr_assert(kvr_mirror_contains(m, x->st.ix.ent[e].canon), "entry %llu missing", (unsigned long long)e);
    /* ... and the replica equals the publisher's filter bucket for bucket */
    cr_assert_eq(memcmp(m->buckets, kvr_relay_filter(&x->relay, 0), x->relay.sh->bucket_count * 8), 0, "replica differs");
}

Test(relay, subscriber_converges_and_laggard_is_cut, .timeout = 60)
{
    rx_t x;
    kvr_mirror_t m;
    int sub, lazy;
    uint64_t gen;

    rx_open(&x);
    gen = atomic_load(&x.relay.sh->generation);
    put_n(&x, 0, 50, 0);
    quiesce(&x);
    cr_assert_eq(kvr_mirror_init(&m, x.relay.sh->seed, x.relay.sh->bucket_count, x.relay.sh->dc_id), KVR_OK);
    sub = kvr_relay_sub_open(&x.relay, 0, gen, 0);
    cr_assert_geq(sub, 0);
    cr_assert_eq(wait_admitted(&x, sub), KVR_SUB_LIVE);
    read_snapshot(&x, sub, &m, gen);
    lazy = kvr_relay_sub_open(&x.relay, 0, gen, 0);
    cr_assert_eq(wait_admitted(&x, lazy), KVR_SUB_LIVE);
    /* traffic: inserts, dedups, deletes, with the reader keeping up */
    for (int round = 0; round < 40; round++) {
        char key[32];
        uint64_t seq = atomic_load(&x.relay.sh->pool[0].published_seq);
        put_n(&x, 50 + round * 5, 55 + round * 5, 0);
        snprintf(key, sizeof(key), "blk-%d", round);
        kvr_store_release(&x.st, KVR_NS_DEFAULT, key, strlen(key), NULL);
        /* each round's new hashes are a delta of their own: the lazy reader falls behind */
        cr_assert(WAIT_UNTIL(atomic_load(&x.relay.sh->pool[0].published_seq) > seq, 10000), "round %d published nothing", round);
        cr_assert_eq(drain_frames(&x, sub, &m), 0);
    }
    quiesce(&x);
    cr_assert_eq(drain_frames(&x, sub, &m), 0);
    cr_assert_gt(atomic_load(&x.relay.sh->pool[0].published_seq), 16, "too few deltas to lag anyone");
    assert_replica_exact(&x, &m);
    /* the subscriber that never read was cut for lag; the reader was not */
    cr_assert_eq(atomic_load(&x.relay.sh->sub[lazy].state), KVR_SUB_CLOSED);
    cr_assert_eq(atomic_load(&x.relay.sh->sub[lazy].close_reason), 7 /* SUBSCRIBER_LAGGED */);
    cr_assert_eq(atomic_load(&x.relay.sh->sub[sub].state), KVR_SUB_LIVE);
    kvr_mirror_destroy(&m);
    rx_close(&x);
}

Test(relay, publisher_crash_starts_a_new_generation, .timeout = 60)
{
    rx_t x;
    kvr_mirror_t m;
    int sub, stale, fresh, status;
    uint64_t g1, g2, rev;

    rx_open(&x);
    g1 = atomic_load(&x.relay.sh->generation);
    rev = atomic_load(&x.relay.sh->catalog_revision);
    put_n(&x, 0, 100, 7);
    quiesce(&x);
    sub = kvr_relay_sub_open(&x.relay, 0, g1, 0);
    cr_assert_eq(wait_admitted(&x, sub), KVR_SUB_LIVE);
    kill(x.pub, SIGKILL);
    waitpid(x.pub, &status, 0);
    cr_assert_eq(kvr_store_reap_slot(&x.st, 2), KVR_OK);
    put_n(&x, 100, 120, 7); /* while no publisher runs */
    start_publisher(&x);
    g2 = wait_generation(&x, g1);
    cr_assert_gt(atomic_load(&x.relay.sh->catalog_revision), rev, "the catalog revision moves");
    /* the old generation's stream is ended */
    cr_assert_eq(atomic_load(&x.relay.sh->sub[sub].state), KVR_SUB_CLOSED);
    cr_assert_eq(atomic_load(&x.relay.sh->sub[sub].close_reason), 9 /* PUBLICATION_UNAVAILABLE */);
    kvr_relay_sub_close(&x.relay, sub);
    /* a subscription to the old producer is refused; the new one converges */
    stale = kvr_relay_sub_open(&x.relay, 0, g1, 0);
    cr_assert_eq(wait_admitted(&x, stale), KVR_SUB_CLOSED);
    cr_assert_eq(atomic_load(&x.relay.sh->sub[stale].close_reason), 5 /* PRODUCER_CHANGED */);
    kvr_relay_sub_close(&x.relay, stale);
    cr_assert_eq(kvr_mirror_init(&m, x.relay.sh->seed, x.relay.sh->bucket_count, x.relay.sh->dc_id), KVR_OK);
    fresh = kvr_relay_sub_open(&x.relay, 0, g2, 0);
    cr_assert_eq(wait_admitted(&x, fresh), KVR_SUB_LIVE);
    read_snapshot(&x, fresh, &m, g2);
    put_n(&x, 120, 130, 7);
    quiesce(&x);
    cr_assert_eq(drain_frames(&x, fresh, &m), 0);
    assert_replica_exact(&x, &m);
    kvr_mirror_destroy(&m);
    rx_close(&x);
}

/* The change log overflows while the publisher is stopped: it must rebuild from the index
 * (a new generation) instead of guessing, and a new subscription must converge. */
Test(relay, change_log_overflow_rebuilds_from_the_index, .timeout = 60)
{
    rx_t x;
    kvr_mirror_t m;
    int sub, fresh;
    uint64_t g1, g2;

    rx_open_log(&x, 16);
    g1 = atomic_load(&x.relay.sh->generation);
    sub = kvr_relay_sub_open(&x.relay, 0, g1, 0);
    cr_assert_eq(wait_admitted(&x, sub), KVR_SUB_LIVE);
    kill(x.pub, SIGSTOP);
    put_n(&x, 0, 100, 3); /* 100 events into a ring of 16 */
    cr_assert_eq(atomic_load(&x.st.log->overflow), 1);
    kill(x.pub, SIGCONT);
    kvr_relay_wake(x.fds.publisher);
    g2 = wait_generation(&x, g1);
    cr_assert_eq(atomic_load(&x.st.log->overflow), 0);
    cr_assert_eq(atomic_load(&x.relay.sh->sub[sub].state), KVR_SUB_CLOSED, "the old generation's stream ends");
    kvr_relay_sub_close(&x.relay, sub);
    cr_assert_eq(kvr_mirror_init(&m, x.relay.sh->seed, x.relay.sh->bucket_count, x.relay.sh->dc_id), KVR_OK);
    fresh = kvr_relay_sub_open(&x.relay, 0, g2, 0);
    cr_assert_eq(wait_admitted(&x, fresh), KVR_SUB_LIVE);
    read_snapshot(&x, fresh, &m, g2);
    quiesce(&x);
    cr_assert_eq(drain_frames(&x, fresh, &m), 0);
    assert_replica_exact(&x, &m); /* all 100 blocks, none of them guessed */
    kvr_mirror_destroy(&m);
    rx_close(&x);
}

/* ------------------------------------------------------------------ slot protocol (issue 11) */

#define STORM_CHILDREN 6
#define STORM_SECONDS  6.0

static uint32_t sub_state(rx_t *x, int i)
{
    return atomic_load(&x->relay.sh->sub[i].state);
}

/* One play-worker of the storm: opens subscriptions and ends them at every point of their
 * life — while waiting for admission, mid-snapshot, after a cut, after reading deltas —
 * the way cancelled gRPC streams do. Every open is closed exactly once. */
static void storm_child(rx_t *x, int slot, uint64_t gen, unsigned seed, const char *actions)
{
    uint32_t chunks = kvr_cbi1_chunk_count(x->relay.sh->bucket_count);
    double end = now_s() + STORM_SECONDS;

    if (kvr_seg_proc_claim_at(&x->seg, slot, KVR_ROLE_WORKER) != slot)
        _exit(3);
    while (now_s() < end) {
        kvr_relay_sub_view_t v;
        int sub = kvr_relay_sub_open(&x->relay, slot, gen, 0);
        int action = actions[rand_r(&seed) % strlen(actions)] - '0';
        double until = now_s() + 1.0;
        if (sub < 0) { /* not synchronisation: every slot is taken; back off before trying again */
            usleep(200);
            continue;
        }
        if (action == 0) /* give up while the publisher may be deciding (a random moment) */
            usleep(rand_r(&seed) % 500);
        if (action > 0) /* wait for the publisher's verdict, bounded */
            while (kvr_relay_sub_poll(&x->relay, sub, &v) == KVR_SUBP_WAITING && now_s() < until)
                ;
        if (action >= 2 && kvr_relay_sub_poll(&x->relay, sub, &v) == KVR_SUBP_LIVE) {
            uint32_t take = action == 2 ? (uint32_t)(rand_r(&seed) % (chunks + 1)) : chunks;
            for (uint32_t c = 0; c < take; c++)
                if (kvr_relay_sub_chunk(&x->relay, sub, c, x->buf, x->cap) == 0)
                    _exit(4);
            if (action == 3) {
                uint64_t seq;
                for (int k = 0; k < 8 && kvr_relay_sub_next_frame(&x->relay, sub, x->buf, x->cap, &seq) > 0; k++)
                    ;
            }
            usleep(rand_r(&seed) % 3000); /* not synchronisation: a stream lives a random while */
        }
        kvr_relay_sub_close(&x->relay, sub);
    }
    _exit(0);
}

/* Wakes the publisher (it reclaims slots when it runs) and counts the slots not yet free. */
static int busy_slots(rx_t *x)
{
    int busy = 0;
    kvr_relay_wake(x->fds.publisher);
    for (int i = 0; i < KVR_RELAY_MAX_SUBS; i++)
        busy += sub_state(x, i) != KVR_SUB_FREE || atomic_load(&x->relay.sh->sub[i].owner) != 0;
    return busy;
}

/*
 * Many subscribers open and cancel while the publisher admits, publishes (one delta per
 * event) and cuts laggards. With plain stores, a worker's release could be overwritten by
 * the publisher's LIVE or CLOSED and the slot was never reclaimed. Every slot must come back
 * FREE with no snapshot reference held, and a new subscriber must still converge.
 * `actions` picks the play-workers' behaviours (the digits of storm_child's cases).
 */
static void slot_storm(const char *actions)
{
    rx_t x;
    kvr_mirror_t m;
    pid_t kids[STORM_CHILDREN];
    uint64_t gen;
    int fresh, busy = 0, n = 0;
    double end;

    /* one delta per event; a filter of 2 MiB, so that taking a snapshot copy (between the
     * publisher's look at a slot and its verdict) takes a while, as in production */
    setenv("KVRELAY_PUBLICATION_THRESHOLD", "1", 1);
    setenv("KVRELAY_EXPECTED_UNIQUE_BLOCKS", "1000000", 1);
    rx_open(&x);
    gen = atomic_load(&x.relay.sh->generation);
    put_n(&x, 0, 40, 11);
    quiesce(&x);
    for (int i = 0; i < STORM_CHILDREN; i++) {
        kids[i] = fork();
        cr_assert_geq(kids[i], 0);
        if (kids[i] == 0)
            storm_child(&x, 3 + i, gen, 1234u + (unsigned)i, actions);
    }
    /* deltas all along: every PUT and DELETE of a new hash is one publication */
    end = now_s() + STORM_SECONDS;
    while (now_s() < end) {
        char key[32];
        snprintf(key, sizeof(key), "storm-%d", n % 300);
        if (n % 600 < 300)
            kvr_store_put(&x.st, KVR_NS_DEFAULT, 0, key, strlen(key), "s", 1, 0xABC000ull + (uint64_t)(n % 300));
        else
            kvr_store_release(&x.st, KVR_NS_DEFAULT, key, strlen(key), NULL);
        n++;
        usleep(300); /* not synchronisation: paces the traffic over the storm's seconds */
    }
    for (int i = 0; i < STORM_CHILDREN; i++) {
        int status;
        cr_assert_eq(waitpid(kids[i], &status, 0), kids[i]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "storm child %d: status %d", i, status);
    }
    cr_assert_gt(atomic_load(&x.relay.sh->pool[0].published_seq), 100, "too few deltas to cut anyone");
    /* The children closed everything they opened and their process slots still look alive,
     * so nothing here relies on dead-owner repair: every slot must be freed by protocol. */
    WAIT_UNTIL_EVERY((busy = busy_slots(&x)) == 0, 5000, 20);
    for (int i = 0; i < KVR_RELAY_MAX_SUBS && busy > 0; i++)
        if (sub_state(&x, i) != KVR_SUB_FREE)
            cr_log_error("slot %d left in state %u", i, sub_state(&x, i));
    cr_assert_eq(busy, 0, "%d subscriber slots never came back after the storm", busy);
    for (int k = 0; k < KVR_RELAY_SNAPSHOTS; k++)
        cr_assert_eq(x.relay.sh->snap[k].refs, 0, "snapshot copy %d still referenced", k);
    /* and the relay still serves: a new subscriber gets a whole snapshot and converges */
    cr_assert_eq(kvr_mirror_init(&m, x.relay.sh->seed, x.relay.sh->bucket_count, x.relay.sh->dc_id), KVR_OK);
    fresh = kvr_relay_sub_open(&x.relay, 0, gen, 0);
    cr_assert_geq(fresh, 0);
    cr_assert_eq(wait_admitted(&x, fresh), KVR_SUB_LIVE);
    read_snapshot(&x, fresh, &m, gen);
    put_n(&x, 40, 50, 11);
    quiesce(&x);
    cr_assert_eq(drain_frames(&x, fresh, &m), 0);
    assert_replica_exact(&x, &m);
    kvr_relay_sub_close(&x.relay, fresh);
    kvr_mirror_destroy(&m);
    for (int i = 0; i < STORM_CHILDREN; i++)
        kvr_store_reap_slot(&x.st, 3 + i);
    rx_close(&x);
}

/* Cancellations before admission racing the publisher's verdict, and streams that send
 * their whole snapshot and then end: no snapshot is abandoned half-way. */
Test(relay, slot_storm_admission_race, .timeout = 120)
{
    slot_storm("03");
}

/* Every way a stream can end, including mid-snapshot and after a cut. */
Test(relay, slot_storm_every_slot_comes_back, .timeout = 120)
{
    slot_storm("0123");
}

/*
 * publish() must never lose a delta: with the allocation of its message buffer failing
 * once (the second allocation publish() makes: images, then the message), the consumer
 * either stays exact (the delta is retried) or sees a new generation — never a mirror that
 * is silently behind.
 */
Test(relay, publish_allocation_failure_loses_no_delta, .timeout = 60)
{
    rx_t x;
    kvr_mirror_t m;
    int sub;
    uint64_t gen;

    kvr_pub_fail_alloc_at = 2; /* inherited by the publisher forked in rx_open */
    rx_open(&x);
    kvr_pub_fail_alloc_at = 0;
    gen = atomic_load(&x.relay.sh->generation);
    cr_assert_eq(kvr_mirror_init(&m, x.relay.sh->seed, x.relay.sh->bucket_count, x.relay.sh->dc_id), KVR_OK);
    sub = kvr_relay_sub_open(&x.relay, 0, gen, 0); /* admitted at 0, before any allocation */
    cr_assert_eq(wait_admitted(&x, sub), KVR_SUB_LIVE);
    read_snapshot(&x, sub, &m, gen);
    put_n(&x, 0, 30, 5); /* the first delta's buffers are allocated now: one fails */
    quiesce(&x);
    if (atomic_load(&x.relay.sh->generation) != gen) {
        /* the other allowed outcome: a new generation, and a resubscription converges */
        kvr_relay_sub_close(&x.relay, sub);
        kvr_mirror_destroy(&m);
        gen = atomic_load(&x.relay.sh->generation);
        cr_assert_eq(kvr_mirror_init(&m, x.relay.sh->seed, x.relay.sh->bucket_count, x.relay.sh->dc_id), KVR_OK);
        sub = kvr_relay_sub_open(&x.relay, 0, gen, 0);
        cr_assert_eq(wait_admitted(&x, sub), KVR_SUB_LIVE);
        read_snapshot(&x, sub, &m, gen);
    }
    cr_assert_eq(drain_frames(&x, sub, &m), 0);
    assert_replica_exact(&x, &m);
    kvr_relay_sub_close(&x.relay, sub);
    kvr_mirror_destroy(&m);
    rx_close(&x);
}

/* Two pools of one store publish apart: each subscriber's replica is its own pool's filter,
 * holding its blocks' hashes and none of the other's, each pool has its own identity and
 * sequence, and traffic in one pool publishes nothing in the other (docs/tenancy.md, "Pools"). */
Test(relay, pools_publish_apart, .timeout = 60)
{
    rx_t x;
    kvr_mirror_t m0, m1;
    int s0, s1;
    uint64_t gen, seq0;
    kvr_relay_ident_t id0, id1;

    rx_open(&x);
    cr_assert_eq(kvr_store_pool(&x.st, KVR_NS_DEFAULT, "default", "m2", 2, KVR_POOLS_MAX), 1);
    put_pool(&x, 0, 0, 40, 0);
    put_pool(&x, 1, 40, 80, 0);
    quiesce(&x);
    cr_assert_eq(kvr_relay_pools_ready(&x.relay), 2, "the publisher took the new pool on");
    gen = atomic_load(&x.relay.sh->generation);
    kvr_relay_ident(&x.relay, 0, gen, &id0);
    kvr_relay_ident(&x.relay, 1, gen, &id1);
    cr_assert_neq(memcmp(id0.cache.digest.data, id1.cache.digest.data, 16), 0, "another model, another cache digest");
    cr_assert_eq(memcmp(id0.routing.digest.data, id1.routing.digest.data, 16), 0, "one namespace, one endpoint");
    cr_assert_eq(kvr_mirror_init(&m0, x.relay.sh->seed, x.relay.sh->bucket_count, x.relay.sh->dc_id), KVR_OK);
    cr_assert_eq(kvr_mirror_init(&m1, x.relay.sh->seed, x.relay.sh->bucket_count, x.relay.sh->dc_id), KVR_OK);
    s0 = kvr_relay_sub_open(&x.relay, 0, gen, 0);
    s1 = kvr_relay_sub_open(&x.relay, 0, gen, 1);
    cr_assert_eq(wait_admitted(&x, s0), KVR_SUB_LIVE);
    cr_assert_eq(wait_admitted(&x, s1), KVR_SUB_LIVE);
    read_snapshot(&x, s0, &m0, gen);
    read_snapshot(&x, s1, &m1, gen);
    for (int i = 0; i < 80; i++) {
        uint64_t h = (uint64_t)i * 0x9E3779B97F4A7C15ull;
        cr_assert_eq(kvr_mirror_contains(&m0, h), i < 40, "hash %d in pool 0's replica", i);
        cr_assert_eq(kvr_mirror_contains(&m1, h), i >= 40, "hash %d in pool 1's replica", i);
    }
    /* traffic in pool 1 only: deltas for its subscriber, nothing for pool 0's */
    seq0 = atomic_load(&x.relay.sh->pool[0].published_seq);
    put_pool(&x, 1, 80, 100, 0);
    quiesce(&x);
    cr_assert_eq(atomic_load(&x.relay.sh->pool[0].published_seq), seq0, "pool 0 published nothing");
    cr_assert_eq(drain_frames(&x, s0, &m0), 0);
    cr_assert_eq(drain_frames(&x, s1, &m1), 0);
    for (int i = 80; i < 100; i++) {
        uint64_t h = (uint64_t)i * 0x9E3779B97F4A7C15ull;
        cr_assert(kvr_mirror_contains(&m1, h), "new hash %d in pool 1's replica", i);
        cr_assert_not(kvr_mirror_contains(&m0, h), "new hash %d in pool 0's replica", i);
    }
    cr_assert_eq(memcmp(m0.buckets, kvr_relay_filter(&x.relay, 0), x.relay.sh->bucket_count * 8), 0);
    cr_assert_eq(memcmp(m1.buckets, kvr_relay_filter(&x.relay, 1), x.relay.sh->bucket_count * 8), 0);
    kvr_relay_sub_close(&x.relay, s0);
    kvr_relay_sub_close(&x.relay, s1);
    kvr_mirror_destroy(&m0);
    kvr_mirror_destroy(&m1);
    rx_close(&x);
}

/* A pool made while no publisher runs: the replacement publisher takes it on (identity,
 * filter rebuilt from the index with the other pools), the catalog's pool count moves, and a
 * subscriber of the new pool gets exactly its blocks. */
Test(relay, a_replacement_publisher_takes_on_a_pool_made_while_it_was_down, .timeout = 60)
{
    rx_t x;
    kvr_mirror_t m;
    int sub, status;
    uint64_t g1, g2;

    rx_open(&x);
    g1 = atomic_load(&x.relay.sh->generation);
    put_pool(&x, 0, 0, 20, 3);
    quiesce(&x);
    cr_assert_eq(kvr_relay_pools_ready(&x.relay), 1);
    kill(x.pub, SIGKILL);
    waitpid(x.pub, &status, 0);
    cr_assert_eq(kvr_store_reap_slot(&x.st, 2), KVR_OK);
    cr_assert_eq(kvr_store_pool(&x.st, KVR_NS_DEFAULT, "default", "m-late", 6, KVR_POOLS_MAX), 1);
    put_pool(&x, 1, 20, 50, 3); /* while no publisher runs */
    start_publisher(&x);
    g2 = wait_generation(&x, g1);
    cr_assert_eq(kvr_relay_pools_ready(&x.relay), 2, "the new publisher took the pool on");
    cr_assert_eq(kvr_mirror_init(&m, x.relay.sh->seed, x.relay.sh->bucket_count, x.relay.sh->dc_id), KVR_OK);
    sub = kvr_relay_sub_open(&x.relay, 0, g2, 1);
    cr_assert_eq(wait_admitted(&x, sub), KVR_SUB_LIVE);
    read_snapshot(&x, sub, &m, g2);
    for (int i = 0; i < 50; i++)
        cr_assert_eq(kvr_mirror_contains(&m, (uint64_t)i * 0x9E3779B97F4A7C15ull + 3), i >= 20, "hash %d", i);
    cr_assert_eq(memcmp(m.buckets, kvr_relay_filter(&x.relay, 1), x.relay.sh->bucket_count * 8), 0);
    kvr_relay_sub_close(&x.relay, sub);
    kvr_mirror_destroy(&m);
    rx_close(&x);
}

/* docs/relay-contract.md §5.3: a subscriber more than 4 frames behind stretches the publication
 * boundary (up to --publication-coalesce-max, 64, delays); one that never reads is still cut at
 * the 17th publication after its admission, within 17 stretched delays; the reader keeps every
 * delta in order, and once nobody lags the stretch comes back to 1. */
Test(relay, deltas_coalesce_while_a_subscriber_lags_and_it_is_still_cut, .timeout = 60)
{
    rx_t x;
    kvr_mirror_t m;
    int sub, lazy, round;
    uint64_t gen, seq0, seq, m_max = 0, coalesced;
    double t0;

    rx_open(&x);
    gen = atomic_load(&x.relay.sh->generation);
    cr_assert_eq(kvr_mirror_init(&m, x.relay.sh->seed, x.relay.sh->bucket_count, x.relay.sh->dc_id), KVR_OK);
    sub = kvr_relay_sub_open(&x.relay, 0, gen, 0);
    cr_assert_eq(wait_admitted(&x, sub), KVR_SUB_LIVE);
    read_snapshot(&x, sub, &m, gen);
    lazy = kvr_relay_sub_open(&x.relay, 0, gen, 0);
    cr_assert_eq(wait_admitted(&x, lazy), KVR_SUB_LIVE);
    cr_assert_eq(kvr_store_counter(&x.st, KVR_ST_RELAY_COALESCE), 1, "nobody behind yet");
    seq0 = atomic_load(&x.relay.sh->sub[lazy].snap_seq);
    t0 = now_s();
    /* rounds of 16 new hashes (a threshold's worth), each waited for until published */
    for (round = 0; round < 40 && atomic_load(&x.relay.sh->sub[lazy].state) == KVR_SUB_LIVE; round++) {
        seq = atomic_load(&x.relay.sh->pool[0].published_seq);
        put_n(&x, round * 16, round * 16 + 16, 0x77);
        cr_assert(WAIT_UNTIL(atomic_load(&x.relay.sh->pool[0].published_seq) > seq, 10000), "round %d published nothing",
                  round);
        cr_assert_eq(drain_frames(&x, sub, &m), 0);
        if (kvr_store_counter(&x.st, KVR_ST_RELAY_COALESCE) > m_max)
            m_max = kvr_store_counter(&x.st, KVR_ST_RELAY_COALESCE);
    }
    seq = atomic_load(&x.relay.sh->pool[0].published_seq);
    cr_assert_eq(atomic_load(&x.relay.sh->sub[lazy].state), KVR_SUB_CLOSED, "never cut after %d rounds", round);
    cr_assert_eq(atomic_load(&x.relay.sh->sub[lazy].close_reason), 7 /* SUBSCRIBER_LAGGED */);
    cr_assert_geq(seq - seq0, 17, "cut after %llu publications: the bound is 16 unread frames",
                  (unsigned long long)(seq - seq0));
    cr_assert_leq(seq - seq0, 20, "cut only after %llu publications", (unsigned long long)(seq - seq0));
    cr_assert_lt(now_s() - t0, 17 * 0.064 + 3.0, "17 publications at most 64 ms apart took %.2f s", now_s() - t0);
    cr_assert_eq(m_max, 64, "the stretch reached %llu, not --publication-coalesce-max", (unsigned long long)m_max);
    coalesced = kvr_store_counter(&x.st, KVR_ST_RELAY + KVR_RC_COALESCED);
    cr_assert_gt(coalesced, 0);
    /* the reader kept up, so with the laggard gone the boundary comes back (slot scans) */
    cr_assert(WAIT_UNTIL(kvr_store_counter(&x.st, KVR_ST_RELAY_COALESCE) == 1, 10000), "the stretch stays at %llu",
              (unsigned long long)kvr_store_counter(&x.st, KVR_ST_RELAY_COALESCE));
    cr_assert_eq(atomic_load(&x.relay.sh->sub[sub].state), KVR_SUB_LIVE);
    put_n(&x, 1000, 1016, 0x77);
    quiesce(&x);
    cr_assert_eq(drain_frames(&x, sub, &m), 0);
    assert_replica_exact(&x, &m);
    cr_assert_eq(kvr_store_counter(&x.st, KVR_ST_RELAY + KVR_RC_COALESCED), coalesced, "nobody behind: no coalescing");
    kvr_relay_sub_close(&x.relay, lazy);
    kvr_relay_sub_close(&x.relay, sub);
    kvr_mirror_destroy(&m);
    rx_close(&x);
}
