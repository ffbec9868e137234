/* Unit tests of the block store: every operation and outcome, eviction, pins, repair. */
#include "store_fixture.h"

#include "shm/changelog.h"

#include <sys/wait.h>
#include <unistd.h>

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

Test(store, put_get_roundtrip)
{
    fx_t f;
    kvr_store_stats_t s;

    fx_open(&f, 4 * MIB, 4096, 0, 0);
    cr_assert_eq(fx_put(&f, "meta-llama/Llama-3@000000ff@0@00010203", 100000), KVR_PUT_CREATED);
    cr_assert(fx_verify(&f.st, "meta-llama/Llama-3@000000ff@0@00010203", 100000));
    cr_assert_eq(fx_put(&f, "empty", 0), KVR_PUT_CREATED);
    cr_assert(fx_verify(&f.st, "empty", 0));
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.unique_blocks, 2);
    cr_assert_eq(s.resident_bytes, 100000);
    cr_assert_eq(s.put_new, 2);
    cr_assert_eq(s.get_hits, 2);
    cr_assert_eq(s.capacity_bytes, 4 * MIB);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

/* kvr_store_block_max: under the longest key a block of exactly that size fills the empty
 * arena; one byte more never fits (the supervisor clamps --max-block-size to it). */
Test(store, block_max_fits_an_empty_arena_under_any_key)
{
    fx_t f;
    char key[KVR_KEY_MAX];
    uint64_t max;
    kvr_put_txn_t txn;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    max = kvr_store_block_max(&f.st);
    cr_assert_eq(max, 1 * MIB - KVR_KEY_MAX);
    memset(key, 'k', sizeof(key));
    cr_assert_eq(kvr_store_put_begin(&f.st, KVR_NS_DEFAULT, 0, key, sizeof(key), max + 1, 1, &txn), KVR_ENOSPACE);
    cr_assert_eq(kvr_store_put_begin(&f.st, KVR_NS_DEFAULT, 0, key, sizeof(key), max, 1, &txn), KVR_OK);
    kvr_store_put_abort(&f.st, &txn);
    cr_assert_eq(kvr_store_put_begin(&f.st, KVR_NS_DEFAULT, 0, "k", 1, max, 1, &txn), KVR_OK);
    kvr_store_put_abort(&f.st, &txn);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

/* Dedup accounting (docs/http-contract.md, "Operations"): two PUTs of the same 100-byte block
 * under key "dup" store it once with two references. */
Test(store, dedup_accounting_matches_reference_example)
{
    fx_t f;
    kvr_store_stats_t s;
    uint8_t other[100];

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(fx_put(&f, "dup", 100), KVR_PUT_CREATED);
    /* Different bytes, same length: a dedup hit keeps the first writer's bytes. */
    memset(other, 0xee, sizeof(other));
    cr_assert_eq(kvr_store_put(&f.st, KVR_NS_DEFAULT, 0, "dup", 3, other, 100, 1), KVR_PUT_DEDUP);
    cr_assert(fx_verify(&f.st, "dup", 100));
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.unique_blocks, 1);
    cr_assert_eq(s.total_refs, 2);
    cr_assert_eq(s.resident_bytes, 100);
    cr_assert_eq(s.logical_bytes, 200);
    cr_assert_eq(s.dedup_savings_bytes, 100);
    cr_assert_eq(s.dedup_hits, 1);
    fx_close(&f);
}

Test(store, conflict_changes_nothing)
{
    fx_t f;
    kvr_store_stats_t before, after;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(fx_put(&f, "k", 5000), KVR_PUT_CREATED);
    kvr_store_stats(&f.st, &before);
    cr_assert_eq(fx_put(&f, "k", 5001), KVR_ECONFLICT);
    cr_assert(fx_verify(&f.st, "k", 5000));
    kvr_store_stats(&f.st, &after);
    cr_assert_eq(after.total_refs, before.total_refs);
    cr_assert_eq(after.resident_bytes, before.resident_bytes);
    cr_assert_eq(after.put_conflicts, 1);
    fx_close(&f);
}

Test(store, invalid_keys_rejected)
{
    fx_t f;
    char big[KVR_KEY_MAX + 1];
    uint8_t b = 1;
    kvr_block_ref_t ref;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    memset(big, 'a', sizeof(big));
    cr_assert_eq(kvr_store_put(&f.st, KVR_NS_DEFAULT, 0, "", 0, &b, 1, 0), KVR_EINVAL);
    cr_assert_eq(kvr_store_put(&f.st, KVR_NS_DEFAULT, 0, "a\0b", 3, &b, 1, 0), KVR_EINVAL);
    cr_assert_eq(kvr_store_put(&f.st, KVR_NS_DEFAULT, 0, big, KVR_KEY_MAX + 1, &b, 1, 0), KVR_EINVAL);
    cr_assert_eq(kvr_store_put(&f.st, KVR_NS_DEFAULT, 0, big, KVR_KEY_MAX, &b, 1, 0), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_get(&f.st, KVR_NS_DEFAULT, big, KVR_KEY_MAX + 1, &ref), KVR_EINVAL);
    cr_assert_eq(kvr_store_get(&f.st, KVR_NS_DEFAULT, big, KVR_KEY_MAX, &ref), KVR_OK);
    kvr_store_unpin(&f.st, &ref);
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, "", 0, NULL), KVR_EINVAL);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(store, release_counts_down_then_frees)
{
    fx_t f;
    uint32_t left = 99;
    kvr_store_stats_t s;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(fx_put(&f, "r", 10000), KVR_PUT_CREATED);
    cr_assert_eq(fx_put(&f, "r", 10000), KVR_PUT_DEDUP);
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, "r", 1, &left), KVR_OK);
    cr_assert_eq(left, 1);
    cr_assert(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "r", 1, NULL));
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, "r", 1, &left), KVR_OK);
    cr_assert_eq(left, 0);
    cr_assert_not(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "r", 1, NULL));
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, "r", 1, &left), KVR_ENOTFOUND);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.unique_blocks, 0);
    cr_assert_eq(s.free_pages, s.total_pages);
    cr_assert_eq(s.deletes, 2);
    fx_close(&f);
}

Test(store, get_miss_and_exists)
{
    fx_t f;
    kvr_block_ref_t ref;
    uint64_t len = 0;
    kvr_store_stats_t s;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(kvr_store_get(&f.st, KVR_NS_DEFAULT, "nope", 4, &ref), KVR_ENOTFOUND);
    cr_assert_eq(fx_put(&f, "yes", 777), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "yes", 3, &len), 1);
    cr_assert_eq(len, 777);
    cr_assert_eq(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "nope", 4, NULL), 0);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.get_misses, 1);
    fx_close(&f);
}

Test(store, nospace_when_block_exceeds_arena)
{
    fx_t f;
    kvr_store_stats_t s;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(fx_put(&f, "a", 200 * KIB), KVR_PUT_CREATED);
    cr_assert_eq(fx_put(&f, "huge", 2 * MIB), KVR_ENOSPACE);
    cr_assert(fx_verify(&f.st, "a", 200 * KIB)); /* nothing evicted for a hopeless put */
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.evictions, 0);
    cr_assert_eq(s.put_nospace, 1);
    fx_close(&f);
}

Test(store, no_evict_mode_answers_nospace)
{
    fx_t f;

    fx_open(&f, 1 * MIB, 4096, 0, 1);
    cr_assert_eq(fx_put(&f, "a", 600 * KIB), KVR_PUT_CREATED);
    cr_assert_eq(fx_put(&f, "b", 600 * KIB), KVR_ENOSPACE);
    cr_assert(fx_verify(&f.st, "a", 600 * KIB));
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(store, nospace_when_everything_pinned)
{
    fx_t f;
    kvr_block_ref_t ra, rb;
    kvr_store_stats_t s;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(fx_put(&f, "a", 400 * KIB), KVR_PUT_CREATED);
    cr_assert_eq(fx_put(&f, "b", 400 * KIB), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_get(&f.st, KVR_NS_DEFAULT, "a", 1, &ra), KVR_OK);
    cr_assert_eq(kvr_store_get(&f.st, KVR_NS_DEFAULT, "b", 1, &rb), KVR_OK);
    cr_assert_eq(fx_put(&f, "c", 400 * KIB), KVR_ENOSPACE);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.evictions, 0);
    kvr_store_unpin(&f.st, &ra);
    cr_assert_eq(fx_put(&f, "c", 400 * KIB), KVR_PUT_CREATED); /* evicts a, the unpinned LRU */
    cr_assert_not(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "a", 1, NULL));
    cr_assert(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "b", 1, NULL));
    kvr_store_unpin(&f.st, &rb);
    cr_assert(fx_verify(&f.st, "b", 400 * KIB));
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(store, eviction_is_lru_and_get_refreshes)
{
    fx_t f;
    kvr_block_ref_t r;
    kvr_store_stats_t s;

    /* 256 pages; each block is 60 pages. */
    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(fx_put(&f, "A", 60 * 4096 - 1), KVR_PUT_CREATED);
    cr_assert_eq(fx_put(&f, "B", 60 * 4096 - 1), KVR_PUT_CREATED);
    cr_assert_eq(fx_put(&f, "C", 60 * 4096 - 1), KVR_PUT_CREATED);
    cr_assert_eq(fx_put(&f, "D", 60 * 4096 - 1), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_get(&f.st, KVR_NS_DEFAULT, "A", 1, &r), KVR_OK); /* A becomes most recent */
    kvr_store_unpin(&f.st, &r);
    cr_assert_eq(fx_put(&f, "B", 60 * 4096 - 1), KVR_PUT_DEDUP);   /* so does B */
    cr_assert_eq(fx_put(&f, "E", 60 * 4096 - 1), KVR_PUT_CREATED); /* evicts C */
    cr_assert_not(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "C", 1, NULL));
    cr_assert_eq(fx_put(&f, "F", 60 * 4096 - 1), KVR_PUT_CREATED); /* evicts D */
    cr_assert_not(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "D", 1, NULL));
    cr_assert(fx_verify(&f.st, "A", 60 * 4096 - 1));
    cr_assert(fx_verify(&f.st, "B", 60 * 4096 - 1));
    cr_assert(fx_verify(&f.st, "E", 60 * 4096 - 1));
    cr_assert(fx_verify(&f.st, "F", 60 * 4096 - 1));
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.evictions, 2);
    cr_assert_eq(s.evicted_bytes, 2 * (60 * 4096 - 1));
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(store, eviction_when_index_full)
{
    fx_t f;

    fx_open(&f, 1 * MIB, 4096, 4, 0); /* only four entries */
    cr_assert_eq(fx_put(&f, "1", 10), KVR_PUT_CREATED);
    cr_assert_eq(fx_put(&f, "2", 10), KVR_PUT_CREATED);
    cr_assert_eq(fx_put(&f, "3", 10), KVR_PUT_CREATED);
    cr_assert_eq(fx_put(&f, "4", 10), KVR_PUT_CREATED);
    cr_assert_eq(fx_put(&f, "5", 10), KVR_PUT_CREATED);
    cr_assert_not(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "1", 1, NULL));
    cr_assert(fx_verify(&f.st, "5", 10));
    fx_close(&f);
}

Test(store, delete_of_pinned_block_defers_free)
{
    fx_t f;
    kvr_block_ref_t r, r2;
    kvr_store_stats_t s;
    uint8_t *want = malloc(300 * KIB), *got = malloc(300 * KIB);

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(fx_put(&f, "z", 300 * KIB), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_get(&f.st, KVR_NS_DEFAULT, "z", 1, &r), KVR_OK);
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, "z", 1, NULL), KVR_OK);
    /* Gone for everyone else at once... */
    cr_assert_eq(kvr_store_get(&f.st, KVR_NS_DEFAULT, "z", 1, &r2), KVR_ENOTFOUND);
    cr_assert_not(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "z", 1, NULL));
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.unique_blocks, 0);
    cr_assert_eq(s.zombie_blocks, 1);
    cr_assert_lt(s.free_pages, s.total_pages);
    /* ...its memory is not reused while pinned: a PUT that needs it gets no space. */
    cr_assert_eq(fx_put(&f, "y", 800 * KIB), KVR_ENOSPACE);
    fx_fill(want, 300 * KIB, "z");
    cr_assert_eq(kvr_store_read(&f.st, &r, 0, got, 300 * KIB), KVR_OK);
    cr_assert_eq(memcmp(want, got, 300 * KIB), 0);
    kvr_store_unpin(&f.st, &r);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.zombie_blocks, 0);
    cr_assert_eq(s.free_pages, s.total_pages);
    cr_assert_eq(fx_put(&f, "y", 800 * KIB), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    free(want);
    free(got);
    fx_close(&f);
}

Test(store, same_key_may_be_stored_again_while_zombie_pinned)
{
    fx_t f;
    kvr_block_ref_t r;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(fx_put(&f, "k", 1000), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_get(&f.st, KVR_NS_DEFAULT, "k", 1, &r), KVR_OK);
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, "k", 1, NULL), KVR_OK);
    cr_assert_eq(fx_put(&f, "k", 2000), KVR_PUT_CREATED); /* a new block, new length is fine */
    cr_assert(fx_verify(&f.st, "k", 2000));
    kvr_store_unpin(&f.st, &r);
    cr_assert(fx_verify(&f.st, "k", 2000));
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(store, two_phase_put_race_resolves_to_dedup_or_conflict)
{
    fx_t f;
    kvr_put_txn_t t1, t2, t3;
    uint8_t buf[4000];

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    fx_fill(buf, sizeof(buf), "race");
    cr_assert_eq(kvr_store_put_begin(&f.st, KVR_NS_DEFAULT, 0, "race", 4, 4000, 7, &t1), KVR_OK);
    cr_assert_eq(kvr_store_put_begin(&f.st, KVR_NS_DEFAULT, 0, "race", 4, 4000, 7, &t2), KVR_OK);
    cr_assert_eq(kvr_store_put_begin(&f.st, KVR_NS_DEFAULT, 0, "race", 4, 3999, 7, &t3), KVR_OK);
    /* Not visible before commit. */
    cr_assert_not(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "race", 4, NULL));
    cr_assert_eq(kvr_store_put_write(&f.st, &t1, 0, buf, 4000), KVR_OK);
    cr_assert_eq(kvr_store_put_write(&f.st, &t1, 1, buf, 4000), KVR_EINVAL);
    cr_assert_eq(kvr_store_put_commit(&f.st, &t1), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_put_commit(&f.st, &t2), KVR_PUT_DEDUP);
    cr_assert_eq(kvr_store_put_commit(&f.st, &t3), KVR_ECONFLICT);
    cr_assert(fx_verify(&f.st, "race", 4000));
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(store, abort_returns_everything)
{
    fx_t f;
    kvr_put_txn_t t;
    kvr_store_stats_t s;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(kvr_store_put_begin(&f.st, KVR_NS_DEFAULT, 0, "ab", 2, 500 * KIB, 0, &t), KVR_OK);
    kvr_store_put_abort(&f.st, &t);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.free_pages, s.total_pages);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(store, change_log_first_in_last_out)
{
    fx_t f;
    kvr_chlog_event_t ev[16];
    size_t n;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(kvr_store_put(&f.st, KVR_NS_DEFAULT, 0, "x", 1, "1", 1, 0xabc), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_put(&f.st, KVR_NS_DEFAULT, 0, "x", 1, "1", 1, 0xabc), KVR_PUT_DEDUP);
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, "x", 1, NULL), KVR_OK);
    n = kvr_chlog_consume(f.st.log, ev, 16);
    cr_assert_eq(n, 1, "dedup and a non-final release log nothing");
    cr_assert_eq(kvr_chlog_op(&ev[0]), KVR_EV_INSERT);
    cr_assert_eq(ev[0].canon, 0xabc);
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, "x", 1, NULL), KVR_OK);
    n = kvr_chlog_consume(f.st.log, ev, 16);
    cr_assert_eq(n, 1);
    cr_assert_eq(kvr_chlog_op(&ev[0]), KVR_EV_REMOVE);
    cr_assert_eq(ev[0].canon, 0xabc);
    fx_close(&f);
}

static void count_cb(void *ctx, uint32_t e, uint32_t g, uint64_t c, uint32_t pool)
{
    (void)e;
    (void)g;
    (void)c;
    ++*(int *)ctx;
}

Test(store, change_log_overflow_is_flagged_and_resync_clears_it)
{
    fx_t f;
    kvr_seg_config_t cfg = {.memory = 1 * MIB, .page_size = 4096, .log_capacity = 4, .hugepages = KVR_HUGEPAGES_OFF};
    int seen = 0;
    char k[8];

    kvr_log_level = KVR_LOG_ERROR;
    cr_assert_eq(kvr_seg_create(&f.seg, &cfg), KVR_OK);
    cr_assert_eq(kvr_store_format(&f.seg, 0), KVR_OK);
    cr_assert_geq(kvr_seg_proc_claim(&f.seg, 0), 0);
    cr_assert_eq(kvr_store_open(&f.st, &f.seg), KVR_OK);
    cr_assert_eq(kvr_store_pool(&f.st, KVR_NS_DEFAULT, "default", "kvrelay", 7, KVR_POOLS_MAX), 0);
    for (int i = 0; i < 6; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        cr_assert_eq(fx_put(&f, k, 10), KVR_PUT_CREATED);
    }
    cr_assert_eq(atomic_load(&f.st.log->overflow), 1);
    cr_assert_eq(atomic_load(&f.st.log->dropped), 2);
    kvr_store_resync(&f.st, count_cb, &seen);
    cr_assert_eq(seen, 6);
    cr_assert_eq(atomic_load(&f.st.log->overflow), 0);
    fx_close(&f);
}

Test(store, default_canonical_hash)
{
    cr_assert_eq(kvr_store_default_canon("00000000000000ff", 16), 0xff);
    cr_assert_eq(kvr_store_default_canon("DEADBEEFcafebabe", 16), 0xdeadbeefcafebabeull);
    /* not 16 hex digits: XXH3 of the bytes */
    cr_assert_neq(kvr_store_default_canon("0000000000000g00", 16), 0);
    cr_assert_eq(kvr_store_default_canon("abc", 3), kvr_store_default_canon("abc", 3));
}

Test(store, reap_drops_pins_and_reservations_of_dead_slot)
{
    fx_t f;
    kvr_seg_t seg2;
    kvr_store_t st2;
    kvr_block_ref_t r;
    kvr_put_txn_t t;
    kvr_store_stats_t s;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    fx_second(&f, &seg2, &st2);
    cr_assert_eq(fx_put(&f, "p", 100 * KIB), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_get(&st2, KVR_NS_DEFAULT, "p", 1, &r), KVR_OK);
    cr_assert_eq(kvr_store_get(&st2, KVR_NS_DEFAULT, "p", 1, &r), KVR_OK);
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, "p", 1, NULL), KVR_OK); /* zombie, pinned twice by slot 2 */
    cr_assert_eq(kvr_store_put_begin(&st2, KVR_NS_DEFAULT, 0, "q", 1, 200 * KIB, 0, &t), KVR_OK);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.zombie_blocks, 1);
    cr_assert_eq(kvr_store_reap_slot(&f.st, seg2.slot), KVR_OK);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.zombie_blocks, 0);
    cr_assert_eq(s.pinned_blocks, 0);
    cr_assert_eq(s.free_pages, s.total_pages);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

/* A reap folds the dead slot's counters into the retired block and zeroes its levels: what a
 * dead worker held (reservations, waiting PUTs) is not left on /metrics. */
Test(store, reap_folds_counters_and_zeroes_levels)
{
    fx_t f;
    kvr_seg_t seg2;
    kvr_store_t st2;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    fx_second(&f, &seg2, &st2);
    kvr_stat_add(st2.my_stats, KVR_ST_PUT_BUDGET_WAITS, 3);
    kvr_stat_add(st2.my_stats, KVR_ST_PUT_RESERVATIONS, 2);
    kvr_stat_add(st2.my_stats, KVR_ST_PUT_RESERVED_BYTES, 300);
    kvr_stat_sub(st2.my_stats, KVR_ST_PUT_RESERVED_BYTES, 100);
    kvr_stat_add(f.st.my_stats, KVR_ST_PUT_RESERVATIONS, 1);
    cr_assert_eq(kvr_store_counter(&f.st, KVR_ST_PUT_RESERVATIONS), 3);
    cr_assert_eq(kvr_store_counter(&f.st, KVR_ST_PUT_RESERVED_BYTES), 200);
    cr_assert_eq(kvr_store_reap_slot(&f.st, seg2.slot), KVR_OK);
    cr_assert_eq(kvr_store_counter(&f.st, KVR_ST_PUT_BUDGET_WAITS), 3, "a counter never goes back");
    cr_assert_eq(kvr_store_counter(&f.st, KVR_ST_PUT_RESERVATIONS), 1, "the dead slot's level went");
    cr_assert_eq(kvr_store_counter(&f.st, KVR_ST_PUT_RESERVED_BYTES), 0);
    fx_close(&f);
}

/* A process that dies holding the store lock: the next locker repairs. */
Test(store, lock_holder_death_is_repaired)
{
    fx_t f;
    pid_t pid;
    int status;
    kvr_store_stats_t s;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(fx_put(&f, "keep", 3000), KVR_PUT_CREATED);
    pid = fork();
    if (pid == 0) {
        kvr_seg_t seg2 = f.seg;
        kvr_store_t st2;
        kvr_put_txn_t t;
        int dead;
        seg2.slot = -1;
        kvr_seg_proc_claim(&seg2, 0);
        kvr_store_open(&st2, &seg2);
        kvr_store_put_begin(&st2, KVR_NS_DEFAULT, 0, "half", 4, 50000, 0, &t);
        kvr_shlock_lock(&st2.sh->lock, seg2.slot, &dead);
        /* half-done relink: odd seqlock, a DYING entry */
        atomic_fetch_add(&st2.sh->index.seq, 1);
        _exit(0);
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(fx_verify(&f.st, "keep", 3000)); /* takes the lock: EOWNERDEAD, repair */
    kvr_store_stats(&f.st, &s);
    cr_assert_geq(s.repairs, 1);
    /* the dead child's slot is still ACTIVE until the supervisor reaps it */
    cr_assert_eq(kvr_store_reap(&f.st, pid), KVR_OK);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.unique_blocks, 1);
    cr_assert_eq(s.free_pages, s.total_pages - 1);
    cr_assert_eq(kvr_store_exists(&f.st, KVR_NS_DEFAULT, "keep", 4, NULL), 1); /* lock-free path works again */
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

/* ---------------------------------------------------------------- reference model */

#define MODEL_KEYS 48

typedef struct {
    char key[16];
    int resident;
    uint64_t len;
    uint32_t refs;
    uint64_t atime;
} mkey_t;

typedef struct {
    mkey_t k[MODEL_KEYS];
    uint64_t clock, npages, page, free_pages, nentries, max_entries;
    uint64_t dedup, hits, misses, evictions, put_new, conflicts, deletes;
} model_t;

static uint64_t m_pages(const model_t *m, const mkey_t *k, uint64_t len)
{
    return (strlen(k->key) + len + m->page - 1) / m->page;
}

static int m_put(model_t *m, mkey_t *k, uint64_t len)
{
    uint64_t need = m_pages(m, k, len), avail;
    if (k->resident) {
        if (k->len != len) {
            m->conflicts++;
            return KVR_ECONFLICT;
        }
        k->refs++;
        k->atime = ++m->clock;
        m->dedup++;
        return KVR_PUT_DEDUP;
    }
    avail = m->free_pages;
    for (int i = 0; i < MODEL_KEYS; i++)
        if (m->k[i].resident)
            avail += m_pages(m, &m->k[i], m->k[i].len);
    if (need > avail)
        return KVR_ENOSPACE;
    while (m->free_pages < need || m->nentries >= m->max_entries) {
        mkey_t *v = NULL;
        for (int i = 0; i < MODEL_KEYS; i++)
            if (m->k[i].resident && (v == NULL || m->k[i].atime < v->atime))
                v = &m->k[i];
        v->resident = 0;
        m->free_pages += m_pages(m, v, v->len);
        m->nentries--;
        m->evictions++;
    }
    k->resident = 1;
    k->len = len;
    k->refs = 1;
    k->atime = ++m->clock;
    m->free_pages -= need;
    m->nentries++;
    m->put_new++;
    return KVR_PUT_CREATED;
}

Test(store, random_operations_match_reference_model, .timeout = 60)
{
    fx_t f;
    model_t m = {0};
    kvr_store_stats_t s;
    unsigned seed = 12345;
    static const uint64_t lens[] = {1, 100, 4000, 4096, 5000, 9000, 20000, 60000, 131072};

    fx_open(&f, 256 * KIB, 4096, 24, 0);
    m.npages = m.free_pages = 64;
    m.page = 4096;
    m.max_entries = 24;
    for (int i = 0; i < MODEL_KEYS; i++)
        snprintf(m.k[i].key, sizeof(m.k[i].key), "key-%d", i * 7919);
    for (int op = 0; op < 20000; op++) {
        mkey_t *k = &m.k[rand_r(&seed) % MODEL_KEYS];
        int r = rand_r(&seed) % 10;
        if (r < 5) {
            /* each key mostly keeps one length; sometimes another (conflict path) */
            uint64_t len = lens[(strlen(k->key) + (rand_r(&seed) % 8 == 0 ? rand_r(&seed) : 0)) % KVR_ARRAY_SIZE(lens)];
            int want = m_put(&m, k, len);
            int got = fx_put(&f, k->key, len);
            cr_assert_eq(got, want, "op %d put %s len %llu: got %d want %d", op, k->key, (unsigned long long)len, got, want);
        } else if (r < 8) {
            int got = fx_verify(&f.st, k->key, k->len);
            cr_assert_eq(got, k->resident, "op %d get %s", op, k->key);
            if (k->resident) {
                k->atime = ++m.clock;
                m.hits++;
            } else {
                m.misses++;
            }
        } else {
            uint32_t left;
            int got = kvr_store_release(&f.st, KVR_NS_DEFAULT, k->key, strlen(k->key), &left);
            cr_assert_eq(got, k->resident ? KVR_OK : KVR_ENOTFOUND, "op %d delete %s", op, k->key);
            if (k->resident) {
                m.deletes++;
                cr_assert_eq(left, k->refs - 1);
                if (--k->refs == 0) {
                    k->resident = 0;
                    m.free_pages += m_pages(&m, k, k->len);
                    m.nentries--;
                }
            }
        }
        if (op % 500 == 0)
            cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK, "op %d", op);
    }
    kvr_store_stats(&f.st, &s);
    {
        uint64_t ub = 0, tr = 0, rb = 0, lb = 0;
        for (int i = 0; i < MODEL_KEYS; i++)
            if (m.k[i].resident) {
                ub++;
                tr += m.k[i].refs;
                rb += m.k[i].len;
                lb += m.k[i].len * m.k[i].refs;
            }
        cr_assert_eq(s.unique_blocks, ub);
        cr_assert_eq(s.total_refs, tr);
        cr_assert_eq(s.resident_bytes, rb);
        cr_assert_eq(s.logical_bytes, lb);
    }
    cr_assert_eq(s.dedup_hits, m.dedup);
    cr_assert_eq(s.get_hits, m.hits);
    cr_assert_eq(s.get_misses, m.misses);
    cr_assert_eq(s.evictions, m.evictions);
    cr_assert_eq(s.put_new, m.put_new);
    cr_assert_eq(s.put_conflicts, m.conflicts);
    cr_assert_eq(s.deletes, m.deletes);
    cr_assert_eq(s.free_pages, m.free_pages);
    cr_assert_gt(m.evictions, 100, "the sequence must exercise eviction");
    cr_assert_gt(m.conflicts, 10, "the sequence must exercise conflicts");
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

/* Deferred unpins: the pin holds (no eviction, a DELETE leaves a zombie) until the flush, which
 * releases every queued pin in one lock; a full batch flushes itself. */
Test(store, unpin_later_holds_until_flush)
{
    fx_t f;
    kvr_store_stats_t s;
    kvr_block_ref_t ref;
    uint32_t left;

    fx_open(&f, 1 * MIB, 4096, 0, 0);
    cr_assert_eq(fx_put(&f, "held", 5000), KVR_PUT_CREATED);
    cr_assert_eq(kvr_store_get(&f.st, KVR_NS_DEFAULT, "held", 4, &ref), KVR_OK);
    kvr_store_unpin_later(&f.st, &ref);
    cr_assert_eq(ref.entry, KVR_NIL);
    cr_assert_eq(kvr_store_release(&f.st, KVR_NS_DEFAULT, "held", 4, &left), KVR_OK);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.pinned_blocks, 1, "the queued pin still holds the block");
    cr_assert_eq(s.zombie_blocks, 1, "deleted while pinned: a zombie until the flush");
    kvr_store_unpin_flush(&f.st);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.pinned_blocks, 0);
    cr_assert_eq(s.zombie_blocks, 0);
    cr_assert_eq(s.unique_blocks, 0);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);

    /* KVR_STORE_UNPIN_BATCH + 1 pins: the last call flushes the full batch first */
    cr_assert_eq(fx_put(&f, "many", 100), KVR_PUT_CREATED);
    for (int i = 0; i <= KVR_STORE_UNPIN_BATCH; i++) {
        cr_assert_eq(kvr_store_get(&f.st, KVR_NS_DEFAULT, "many", 4, &ref), KVR_OK);
        kvr_store_unpin_later(&f.st, &ref);
    }
    cr_assert_eq(f.st.unpin_n, 1);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.pinned_blocks, 1);
    kvr_store_unpin_flush(&f.st);
    kvr_store_stats(&f.st, &s);
    cr_assert_eq(s.pinned_blocks, 0);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}
