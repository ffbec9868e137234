/* The disk index (shm/dindex.c): put, move, remove and a full table; a worker's kill and the
 * writer's reaping; a kill never lands on a slot reused for another key (threads race it); and
 * lock-free readers never see a torn slot while the writer moves keys (threads, bounded). */
#include "base/atomics.h"
#include "shm/dindex.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define NSLOTS 64

static void *region;
static kvr_dindex_t dx;

static void setup(void)
{
    region = aligned_alloc(64, KVR_ALIGN_UP(kvr_dindex_bytes(NSLOTS), 64));
    cr_assert_not_null(region);
    memset(region, 0xa5, kvr_dindex_bytes(NSLOTS)); /* format must not rely on zeroes */
    kvr_dindex_map(&dx, region, NSLOTS);
    kvr_dindex_format(&dx);
}

static void teardown(void)
{
    free(region);
}

TestSuite(dindex, .init = setup, .fini = teardown);

/* A slot for key number k, placed at (page, off4k): fields derived from k so a reader can
 * check that what it copied is one moment's. */
static kvr_dslot_t slot_of(uint64_t k, uint32_t page)
{
    kvr_dslot_t v;

    memset(&v, 0, sizeof(v));
    kvr_dindex_hash(0x5eed, &k, sizeof(k), &v.h1, &v.h2);
    v.key_len = 40;
    v.ns = 3;
    v.length = v.h1 % 100000;
    v.canon = v.h2 ^ 77;
    v.page = page;
    v.off4k = page * 3 + 1;
    v.version = (uint64_t)page * 7 + 5;
    v.pool = 2;
    return v;
}

static int look(uint64_t k, kvr_dslot_t *out, uint32_t *id)
{
    kvr_dslot_t v = slot_of(k, 0);
    return kvr_dindex_lookup(&dx, v.ns, v.h1, v.h2, v.key_len, out, id);
}

Test(dindex, put_move_remove_and_full)
{
    kvr_dslot_t v, old, got;
    uint32_t id, id2;

    cr_assert_eq(look(1, &got, &id), 0, "empty");
    v = slot_of(1, 10);
    cr_assert_eq(kvr_dindex_put(&dx, &v, &id, &old), KVR_OK);
    cr_assert_eq(old.page, KVR_NIL, "a new slot");
    cr_assert_eq(look(1, &got, &id2), 1);
    cr_assert_eq(id2, id);
    cr_assert(got.page == 10 && got.off4k == 31 && got.version == 75 && got.length == v.length && got.canon == v.canon &&
              got.pool == 2);
    /* another namespace, another length: other keys */
    cr_assert_eq(kvr_dindex_lookup(&dx, 4, v.h1, v.h2, v.key_len, &got, &id2), 0);
    cr_assert_eq(kvr_dindex_lookup(&dx, 3, v.h1, v.h2, 41, &got, &id2), 0);
    cr_assert_eq(kvr_dindex_lookup(&dx, 3, v.h1, v.h2 ^ 1, 40, &got, &id2), 0, "the second hash is compared");

    v = slot_of(1, 20); /* moved (compaction, or written again) */
    cr_assert_eq(kvr_dindex_put(&dx, &v, &id2, &old), KVR_OK);
    cr_assert_eq(id2, id, "the same slot");
    cr_assert_eq(old.page, 10, "what it held is handed back");
    cr_assert_eq(dx.sh->live, 1);
    cr_assert_eq(look(1, &got, &id2), 1);
    cr_assert_eq(got.page, 20);

    kvr_dindex_remove(&dx, id);
    cr_assert_eq(look(1, &got, &id2), 0);
    cr_assert_eq(dx.sh->live, 0);
    cr_assert_eq(dx.sh->live_bytes, 0);

    for (uint64_t k = 100; k < 100 + NSLOTS; k++) {
        v = slot_of(k, (uint32_t)k);
        cr_assert_eq(kvr_dindex_put(&dx, &v, &id, &old), KVR_OK);
    }
    v = slot_of(999, 1);
    cr_assert_eq(kvr_dindex_put(&dx, &v, &id, &old), KVR_ENOSPACE, "every slot in use");
    for (uint64_t k = 100; k < 100 + NSLOTS; k++) {
        cr_assert_eq(look(k, &got, &id), 1, "key %llu", (unsigned long long)k);
        cr_assert_eq(got.page, (uint32_t)k);
    }
}

/* Lookups by (pool, canonical hash): a hash held by several keys, a move to another hash, a
 * DEAD slot, a removal and a page dropped; small counters as hashes share buckets with nothing
 * wrong (the chains compare both fields). */
Test(dindex, canonical_chains_follow_every_put_move_kill_and_removal)
{
    kvr_dslot_t v, old;
    uint32_t id[8];

    for (uint64_t k = 0; k < 8; k++) {
        v = slot_of(k, 1 + (uint32_t)(k % 2));
        v.canon = 100 + k / 2; /* keys 2j and 2j+1 hold the same canonical hash */
        v.pool = (uint8_t)(k < 6 ? 2 : 5);
        cr_assert_eq(kvr_dindex_put(&dx, &v, &id[k], &old), KVR_OK);
    }
    cr_assert_eq(kvr_dindex_has_canon(&dx, 2, 100), 1);
    cr_assert_eq(kvr_dindex_has_canon(&dx, 2, 102), 1);
    cr_assert_eq(kvr_dindex_has_canon(&dx, 2, 103), 0, "held by pool 5 only");
    cr_assert_eq(kvr_dindex_has_canon(&dx, 5, 103), 1);
    cr_assert_eq(kvr_dindex_has_canon(&dx, 5, 100), 0, "another pool's hash");
    cr_assert_eq(kvr_dindex_has_canon(&dx, 2, 99), 0);

    kvr_dindex_remove(&dx, id[0]); /* one of two keys of 100 goes: still held */
    cr_assert_eq(kvr_dindex_has_canon(&dx, 2, 100), 1);
    kvr_dindex_get(&dx, id[1], &v);
    cr_assert_eq(kvr_dindex_kill_seen(&dx, id[1], v.sw), 1); /* a DELETE: DEAD is not held */
    cr_assert_eq(kvr_dindex_has_canon(&dx, 2, 100), 0);

    v = slot_of(2, 3); /* key 2 written again with another canonical hash: moved chains */
    v.canon = 777;
    cr_assert_eq(kvr_dindex_put(&dx, &v, &id[2], &old), KVR_OK);
    cr_assert_eq(old.canon, 101);
    cr_assert_eq(kvr_dindex_has_canon(&dx, 2, 777), 1);
    cr_assert_eq(kvr_dindex_has_canon(&dx, 2, 101), 1, "key 3 still holds 101");
    kvr_dindex_remove(&dx, id[3]);
    cr_assert_eq(kvr_dindex_has_canon(&dx, 2, 101), 0, "moved away and removed");

    /* page 2 (keys 1, DEAD, 5 and 7) recycled: 102 keeps key 4 (page 1), 103 key 6 (page 1) */
    cr_assert_eq(kvr_dindex_drop_page(&dx, 2, 2 * 7 + 5, NULL, NULL), 3);
    cr_assert_eq(kvr_dindex_has_canon(&dx, 2, 102), 1);
    cr_assert_eq(kvr_dindex_has_canon(&dx, 5, 103), 1);
    kvr_dindex_remove(&dx, id[6]);
    cr_assert_eq(kvr_dindex_has_canon(&dx, 5, 103), 0);

    /* every slot taken and freed again: the chains end empty */
    for (uint64_t k = 100; k < 100 + NSLOTS; k++) {
        v = slot_of(k, 9);
        v.canon = k % 3;
        if (kvr_dindex_put(&dx, &v, &id[0], &old) != KVR_OK)
            break;
    }
    kvr_dindex_format(&dx);
    for (uint64_t c = 0; c < 3; c++)
        cr_assert_eq(kvr_dindex_has_canon(&dx, 2, c), 0, "a format empties the canonical chains");
}

Test(dindex, kill_reap_and_revive)
{
    kvr_dslot_t v = slot_of(5, 1), old, got;
    uint32_t id, dead;
    uint64_t cursor = 0;

    cr_assert_eq(kvr_dindex_put(&dx, &v, &id, &old), KVR_OK);
    cr_assert_eq(kvr_dindex_next_dead(&dx, &cursor), KVR_NIL);
    cr_assert_eq(kvr_dindex_kill(&dx, v.ns, v.h1, v.h2, v.key_len), 1);
    cr_assert_eq(look(5, &got, &dead), 0, "a killed key is a miss at once");
    cr_assert_eq(kvr_dindex_kill(&dx, v.ns, v.h1, v.h2, v.key_len), 0, "nothing left to kill");
    dead = kvr_dindex_next_dead(&dx, &cursor);
    cr_assert_eq(dead, id, "the writer finds it");

    /* written again before the reap (a PUT after the DELETE, demoted again): LIVE again */
    v = slot_of(5, 2);
    cr_assert_eq(kvr_dindex_put(&dx, &v, &id, &old), KVR_OK);
    cr_assert_eq(id, dead);
    cr_assert_eq(look(5, &got, &dead), 1);
    cr_assert_eq(got.page, 2);
    cursor = 0;
    cr_assert_eq(kvr_dindex_next_dead(&dx, &cursor), KVR_NIL);

    cr_assert_eq(kvr_dindex_kill(&dx, v.ns, v.h1, v.h2, v.key_len), 1);
    dead = kvr_dindex_next_dead(&dx, &cursor);
    kvr_dindex_remove(&dx, dead);
    cr_assert_eq(dx.sh->live, 0);
    cr_assert_eq(kvr_dindex_next_dead(&dx, &cursor), KVR_NIL);
}

/* The reaper's cue and its bounded scan: each kill counts once, and a scan of `limit` slots
 * stops there, to go on from where it stopped. */
/* A compaction's move (kvr_dindex_move_live): it moves the LIVE word it read, and never a
 * slot a worker killed since (that one stays DEAD, where it was, for the reaper's tombstone);
 * the per-namespace gauges follow puts and removals. */
Test(dindex, a_compaction_move_loses_to_a_kill)
{
    kvr_dslot_t v, old, got;
    uint32_t id, id2;

    v = slot_of(8, 1);
    cr_assert_eq(kvr_dindex_put(&dx, &v, &id, &old), KVR_OK);
    cr_assert_eq(kvr_dindex_ns_live(&dx, v.ns), 1);
    cr_assert_eq(kvr_dindex_ns_bytes(&dx, v.ns), v.length);
    kvr_dindex_get(&dx, id, &got);
    kvr_dslot_t to = got;
    to.page = 5, to.off4k = 16, to.version = 40;
    cr_assert_eq(kvr_dindex_move_live(&dx, id, got.sw, &to), 1);
    cr_assert_eq(look(8, &got, &id2), 1);
    cr_assert(got.page == 5 && got.off4k == 16 && got.version == 40 && id2 == id);
    cr_assert_eq(kvr_dindex_has_canon(&dx, v.pool, v.canon), 1);
    cr_assert_eq(kvr_dindex_kill(&dx, v.ns, v.h1, v.h2, v.key_len), 1);
    to.page = 6;
    cr_assert_eq(kvr_dindex_move_live(&dx, id, got.sw, &to), 0, "killed since it was read");
    cr_assert_eq(KVR_DSLOT_STATE(dx.slot[id].sw), KVR_DSLOT_DEAD);
    cr_assert_eq(dx.slot[id].page, 5, "not moved");
    kvr_dindex_remove(&dx, id); /* the reaper */
    cr_assert_eq(kvr_dindex_ns_live(&dx, v.ns), 0);
    cr_assert_eq(kvr_dindex_ns_bytes(&dx, v.ns), 0);
    cr_assert_eq(kvr_dindex_has_canon(&dx, v.pool, v.canon), 0);
}

Test(dindex, kills_are_counted_and_a_scan_is_bounded)
{
    kvr_dslot_t a = slot_of(7, 1), b = slot_of(8, 1), old;
    uint32_t ia, ib, got;
    uint64_t cursor, scanned, k0 = kvr_dindex_kills(&dx); /* a count only ever compared: never reset */

    cr_assert_eq(kvr_dindex_put(&dx, &a, &ia, &old), KVR_OK);
    cr_assert_eq(kvr_dindex_put(&dx, &b, &ib, &old), KVR_OK);
    cr_assert_eq(kvr_dindex_kill(&dx, b.ns, b.h1, b.h2, b.key_len), 1);
    cr_assert_eq(kvr_dindex_kill(&dx, b.ns, b.h1, b.h2, b.key_len), 0);
    cr_assert_eq(kvr_dindex_kills(&dx), k0 + 1, "a failed kill is not counted");

    /* a scan that stops short of the dead slot says so, and the next one finds it */
    cursor = (ib + 1) % NSLOTS;
    got = kvr_dindex_scan_dead(&dx, &cursor, NSLOTS - 1, &scanned);
    cr_assert_eq(got, KVR_NIL);
    cr_assert_eq(scanned, NSLOTS - 1);
    cr_assert_eq(cursor, ib, "it stopped right before the dead slot");
    got = kvr_dindex_scan_dead(&dx, &cursor, 1, &scanned);
    cr_assert_eq(got, ib);
    cr_assert_eq(scanned, 1);
    cr_assert_eq(cursor, (ib + 1) % NSLOTS);
    cr_assert_eq(kvr_dindex_scan_dead(&dx, &cursor, 5 * NSLOTS, &scanned), ib, "a limit past the table wraps once");
    cr_assert_eq(scanned, NSLOTS);
    cr_assert_eq(kvr_dindex_kill(&dx, a.ns, a.h1, a.h2, a.key_len), 1);
    cr_assert_eq(kvr_dindex_kills(&dx), k0 + 2);
}

/* The race a DELETE runs with the writer, one step at a time: a worker looks A up, the writer
 * frees A's slot and fills it with B, then the worker's kill lands: it must fail, B stays. */
Test(dindex, a_kill_of_a_reused_slot_fails)
{
    kvr_dslot_t a = slot_of(1, 1), b = slot_of(2, 2), old, got;
    uint32_t ia, ib, seen_id;

    cr_assert_eq(kvr_dindex_put(&dx, &a, &ia, &old), KVR_OK);
    cr_assert_eq(look(1, &got, &seen_id), 1);
    kvr_dindex_remove(&dx, ia);
    cr_assert_eq(kvr_dindex_put(&dx, &b, &ib, &old), KVR_OK);
    cr_assert_eq(ib, ia, "the slot was reused");
    cr_assert_eq(kvr_dindex_kill_seen(&dx, seen_id, got.sw), 0, "a stale generation kills nothing");
    cr_assert_eq(look(2, &got, &ib), 1, "B is still there");

    /* moved in place (same key, new record): a kill seen before the move fails too */
    cr_assert_eq(look(2, &got, &seen_id), 1);
    b = slot_of(2, 3);
    cr_assert_eq(kvr_dindex_put(&dx, &b, &ib, &old), KVR_OK);
    cr_assert_eq(kvr_dindex_kill_seen(&dx, seen_id, got.sw), 0);
    cr_assert_eq(look(2, &got, &seen_id), 1);
    cr_assert_eq(kvr_dindex_kill_seen(&dx, seen_id, got.sw), 1, "the current generation is killed");
    cr_assert_eq(look(2, &got, &seen_id), 0);
}

/* ------------------------------------------------------------------ threads */

static atomic_int stop;
static atomic_ulong bad;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *killer(void *arg)
{
    kvr_dslot_t a = slot_of(1, 0);
    unsigned long *kills = arg;

    while (!atomic_load(&stop))
        if (kvr_dindex_kill(&dx, a.ns, a.h1, a.h2, a.key_len) == 1)
            (*kills)++;
    return NULL;
}

/* The writer reuses one slot for key 1 (A) and key 2 (B) in turn (the free list hands the
 * last freed slot back first) while another thread kills A as fast as it can: B must never be
 * found DEAD. Until 1,000 kills of A over at least 1,000 rounds; bounded: 200,000 rounds or 5 s. */
Test(dindex, a_kill_never_lands_on_a_reused_slot)
{
    pthread_t t;
    unsigned long kills = 0, rounds = 0, a_killed = 0;
    double end = mono() + 5;
    kvr_dslot_t a = slot_of(1, 1), b = slot_of(2, 2), old;
    uint32_t ia, ib;

    atomic_store(&stop, 0);
    cr_assert_eq(pthread_create(&t, NULL, killer, &kills), 0);
    while (rounds < 200000 && mono() < end && (rounds < 1000 || a_killed < 1000)) {
        cr_assert_eq(kvr_dindex_put(&dx, &a, &ia, &old), KVR_OK);
        for (int spin = 0; spin < 1000; spin++) /* A lives a while: the killer gets it often */
            kvr_cpu_relax();
        a_killed += KVR_DSLOT_STATE(atomic_load(&dx.slot[ia].sw)) == KVR_DSLOT_DEAD;
        kvr_dindex_remove(&dx, ia);
        cr_assert_eq(kvr_dindex_put(&dx, &b, &ib, &old), KVR_OK);
        cr_assert_eq(ib, ia, "the slot is reused");
        for (int spin = 0; spin < 50; spin++)
            kvr_cpu_relax();
        cr_assert_eq(KVR_DSLOT_STATE(atomic_load(&dx.slot[ib].sw)), KVR_DSLOT_LIVE, "B killed in round %lu", rounds);
        kvr_dindex_remove(&dx, ib);
        rounds++;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    cr_log_info("dindex: %lu rounds, %lu kills of A, A seen dead %lu times", rounds, kills, a_killed);
    cr_assert_gt(rounds, 1000);
    cr_assert_gt(a_killed, 0, "the killer got some kills in: the race was run");
}

static void *reader(void *arg)
{
    unsigned long *looks = arg;
    kvr_dslot_t got;
    uint32_t id;

    while (!atomic_load(&stop)) {
        for (uint64_t k = 0; k < 16; k++) {
            kvr_dslot_t want = slot_of(k, 0);
            int rc = kvr_dindex_lookup(&dx, want.ns, want.h1, want.h2, want.key_len, &got, &id);
            if (rc == 1 && (got.length != want.length || got.canon != want.canon || got.version != (uint64_t)got.page * 7 + 5 ||
                            got.off4k != got.page * 3 + 1))
                atomic_fetch_add(&bad, 1);
            (*looks)++;
        }
        /* key 100 stays put: its hash is always held; a hash nobody holds never is */
        if (kvr_dindex_has_canon(&dx, 2, slot_of(100, 0).canon) == 0 || kvr_dindex_has_canon(&dx, 2, 12345) == 1)
            atomic_fetch_add(&bad, 1);
    }
    return NULL;
}

/* Two readers look up 16 keys while the writer moves them between pages, removes and puts
 * them back: every slot a reader copies is one moment's (its fields agree), and a 17th key's
 * canonical hash, never moved, is never missed by a lookup by hash. 2 s. */
Test(dindex, readers_never_see_a_torn_slot)
{
    pthread_t t[2];
    unsigned long looks[2] = {0, 0}, moves = 0;
    double end = mono() + 2;
    kvr_dslot_t v, old;
    uint32_t id[16];

    atomic_store(&stop, 0);
    atomic_store(&bad, 0);
    for (uint64_t k = 0; k < 16; k++) {
        v = slot_of(k, 1);
        cr_assert_eq(kvr_dindex_put(&dx, &v, &id[k], &old), KVR_OK);
    }
    v = slot_of(100, 1);
    cr_assert_eq(kvr_dindex_put(&dx, &v, &id[0], &old), KVR_OK);
    v = slot_of(0, 1);
    cr_assert_eq(kvr_dindex_put(&dx, &v, &id[0], &old), KVR_OK); /* id[0] is key 0's again */
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, reader, &looks[i]), 0);
    while (mono() < end) {
        uint64_t k = moves % 16;
        v = slot_of(k, (uint32_t)(moves % 1000 + 1));
        if (moves % 5 == 0)
            kvr_dindex_remove(&dx, id[k]);
        cr_assert_eq(kvr_dindex_put(&dx, &v, &id[k], &old), KVR_OK);
        moves++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    cr_log_info("dindex: %lu moves, %lu + %lu lookups", moves, looks[0], looks[1]);
    cr_assert_gt(moves, 1000);
    cr_assert_gt(looks[0] + looks[1], 1000);
    cr_assert_eq(atomic_load(&bad), 0, "torn slots seen");
}
