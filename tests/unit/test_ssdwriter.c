/* The disk writer thread (proc/ssdwriter.c) over a real segment and a file under /var/tmp: it
 * copies the admitted blocks and only those, restores the disk index at its next start without
 * writing them again, and turns a worker's delete into a tombstone that holds across restarts.
 * Every wait is bounded (5 s). */
#include "proc/ssdwriter.h"
#include "store_fixture.h"

#include <time.h>
#include <unistd.h>

#define BLK (100 * 1000)

static char dir[64], path[128];
static fx_t f;

static void setup(void)
{
    fx_open_ssd(&f, 4ull << 20, 256);
    strcpy(dir, "/var/tmp/kvr-ssdw-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/ssd", dir);
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
    fx_close(&f);
}

TestSuite(ssdwriter, .init = setup, .fini = teardown);

static const char *key_of(int k)
{
    static char key[32];
    snprintf(key, sizeof(key), "writer/%03d", k);
    return key;
}

static kvr_ssdw_t *start(void)
{
    kvr_ssdw_config_t c = {.path = path, .size = KVR_SSD_SUPER_BYTES + 8 * (1ull << 20), .page_size = 1ull << 20, .window = UINT64_MAX, .batch = 4, .interval_ms = 5, .sync_ms = 100};
    kvr_ssdw_t *w = kvr_ssdw_start(&c, &f.seg);
    struct timespec ts = {0, 5 * 1000 * 1000};

    cr_assert_not_null(w);
    for (int i = 0; i < 1000 && kvr_ssdw_state(w) == 0; i++)
        nanosleep(&ts, NULL);
    cr_assert_eq(kvr_ssdw_state(w), 1, "restored and serving");
    return w;
}

/* Waits up to 5 s for the writer's stats to satisfy cond. */
#define WAIT_STATS(w, s, cond) \
    do { \
        struct timespec ts_ = {0, 5 * 1000 * 1000}; \
        for (int i_ = 0; i_ < 1000; i_++) { \
            kvr_ssdw_stats((w), &(s)); \
            if (cond) \
                break; \
            nanosleep(&ts_, NULL); \
        } \
        kvr_ssdw_stats((w), &(s)); \
    } while (0)

static int on_disk(int k)
{
    const char *key = key_of(k);
    uint64_t h1, h2;
    kvr_dslot_t s;
    uint32_t id;

    kvr_dindex_hash(kvr_store_ns_seed(&f.st, KVR_NS_DEFAULT), key, strlen(key), &h1, &h2);
    return kvr_dindex_lookup(&f.st.dx, KVR_NS_DEFAULT, h1, h2, (uint16_t)strlen(key), &s, &id) == 1 && s.length == BLK;
}

Test(ssdwriter, copies_admitted_blocks_restores_and_keeps_deletes)
{
    kvr_ssdw_t *w;
    kvr_ssdw_stats_t s;
    kvr_store_stats_t ss;

    for (int k = 0; k < 20; k++)
        cr_assert_eq(fx_put(&f, key_of(k), BLK), KVR_PUT_CREATED);
    for (int k = 0; k < 10; k++)
        cr_assert(fx_verify(&f.st, key_of(k), BLK));

    w = start();
    WAIT_STATS(w, s, s.tier.demoted >= 10);
    cr_assert_eq(s.tier.demoted, 10, "the ten read blocks");
    cr_assert_gt(s.rounds, 1);
    for (int k = 0; k < 20; k++)
        cr_assert_eq(on_disk(k), k < 10, "block %d", k);
    kvr_store_stats(&f.st, &ss);
    kvr_ssdw_stop(w);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    kvr_store_stats(&f.st, &ss);
    cr_assert_eq(ss.pinned_blocks, 0, "the writer holds no pin once stopped");

    /* a new writer (the publisher restarted): the index comes back from the file, and the
     * blocks in RAM that are on disk already are not written again */
    w = start();
    WAIT_STATS(w, s, s.already_on_disk >= 10);
    cr_assert_eq(s.tier.restored, 10);
    cr_assert_eq(s.already_on_disk, 10);
    cr_assert_eq(s.tier.demoted, 0);
    for (int k = 0; k < 10; k++)
        cr_assert(on_disk(k), "block %d restored", k);

    /* a worker's DELETE: the RAM copy under the lock, then the disk copy's slot */
    uint32_t left;
    uint64_t h1, h2;
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, key_of(3), strlen(key_of(3)), &left), KVR_OK);
    kvr_dindex_hash(kvr_store_ns_seed(&f.st, KVR_NS_DEFAULT), key_of(3), strlen(key_of(3)), &h1, &h2);
    cr_assert_eq(kvr_dindex_kill(&f.st.dx, KVR_NS_DEFAULT, h1, h2, (uint16_t)strlen(key_of(3))), 1);
    cr_assert_eq(on_disk(3), 0, "a miss at once");
    WAIT_STATS(w, s, s.tier.tombstones >= 1);
    cr_assert_eq(s.tier.tombstones, 1);
    kvr_ssdw_stop(w);

    w = start();
    kvr_ssdw_stats(w, &s);
    cr_assert_eq(s.tier.restored, 9);
    cr_assert_eq(s.tier.restore_tombstoned, 1);
    cr_assert_eq(on_disk(3), 0, "the delete holds across the restart");
    kvr_ssdw_stop(w);
}
