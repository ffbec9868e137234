/*
 * The index's canonical-hash chains (shm/index.c) and the store's lookup by canonical hash
 * (core/store_lookup.c): linked at commit, unlinked at DELETE and eviction, rebuilt by the
 * repair, verified by the check; answered lock-free and, when writers interfere, under the lock.
 * Also the inline key bytes, whose tail lost 4 bytes to the canon link (57 inline now).
 */
#include "store_fixture.h"

#include "shm/index.h"

#include <stdatomic.h>
#include <string.h>

static int put_canon(fx_t *f, uint16_t ns, uint32_t pool, const char *key, uint64_t len, uint64_t canon)
{
    uint8_t buf[256];

    cr_assert_leq(len, sizeof(buf));
    fx_fill(buf, len, key);
    return kvr_store_put(&f->st, ns, pool, key, strlen(key), buf, len, canon);
}

/* Both ways of asking, which must agree: lock-free (no writer runs here, so never KVR_AGAIN)
 * and locked (the store's batch call with one hash takes the lock-free path too, so the locked
 * walk is asked through the index directly, under the lock). */
static int held(fx_t *f, uint32_t pool, uint64_t canon)
{
    uint16_t ns = f->st.sh->pool[pool].ns;
    int lf = kvr_index_canon_lockfree(&f->st.ix, ns, pool, canon), lk;
    int dead;

    cr_assert_eq(kvr_shlock_lock(&f->st.sh->lock, f->st.slot, &dead), KVR_OK);
    lk = kvr_index_canon_locked(&f->st.ix, ns, pool, canon);
    kvr_shlock_unlock(&f->st.sh->lock);
    cr_assert_eq(lf, lk, "lock-free %d, locked %d for %llu in pool %u", lf, lk, (unsigned long long)canon, pool);
    return lf;
}

Test(index_canon, link_unlink_and_lookup)
{
    fx_t f;
    uint64_t h[4] = {11, 12, 13, 14};
    uint8_t out[4];

    fx_open(&f, 1 << 20, 4096, 64, 0);
    cr_assert_eq(put_canon(&f, 0, 0, "a", 10, 11), KVR_PUT_CREATED);
    cr_assert_eq(put_canon(&f, 0, 0, "b", 10, 12), KVR_PUT_CREATED);
    cr_assert_eq(put_canon(&f, 0, 0, "c", 10, 14), KVR_PUT_CREATED);
    cr_assert_eq(held(&f, 0, 11), 1);
    cr_assert_eq(held(&f, 0, 12), 1);
    cr_assert_eq(held(&f, 0, 13), 0, "a hash nobody put");
    cr_assert_eq(kvr_store_lookup_hashes(&f.st, 0, h, 4, out), 2, "prefix: 11 and 12, not 13");
    cr_assert_arr_eq(out, ((uint8_t[]){1, 1, 0, 1}), 4);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);

    cr_assert_eq(put_canon(&f, 0, 0, "a", 10, 11), KVR_PUT_DEDUP, "a dedup hit links nothing twice");
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    cr_assert_eq(kvr_store_release(&f.st, 0, "a", 1, NULL), KVR_OK);
    cr_assert_eq(held(&f, 0, 11), 1, "one reference left");
    cr_assert_eq(kvr_store_release(&f.st, 0, "a", 1, NULL), KVR_OK);
    cr_assert_eq(held(&f, 0, 11), 0, "gone at zero references");
    cr_assert_eq(kvr_store_release(&f.st, 0, "c", 1, NULL), KVR_OK);
    cr_assert_eq(kvr_store_lookup_hashes(&f.st, 0, h, 4, out), 0);
    cr_assert_arr_eq(out, ((uint8_t[]){0, 1, 0, 0}), 4);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(index_canon, two_keys_one_hash_held_until_both_are_gone)
{
    fx_t f;
    kvr_block_ref_t r;

    fx_open(&f, 1 << 20, 4096, 64, 0);
    /* more entries of one hash than one walk would see by luck: a long shared chain */
    for (int i = 0; i < 20; i++) {
        char k[8];
        snprintf(k, sizeof(k), "k%d", i);
        cr_assert_eq(put_canon(&f, 0, 0, k, 5, 77), KVR_PUT_CREATED);
    }
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    /* remove them in an order that takes entries from the chain's middle, head and tail */
    for (int i = 0; i < 20; i++) {
        char k[8];
        int j = (i * 7) % 20;
        snprintf(k, sizeof(k), "k%d", j);
        cr_assert_eq(held(&f, 0, 77), 1, "held while %d of 20 remain", 20 - i);
        if (j == 3) { /* a pinned one becomes a ZOMBIE: off the chains at once */
            cr_assert_eq(kvr_store_get(&f.st, 0, k, strlen(k), &r), KVR_OK);
            cr_assert_eq(kvr_store_release(&f.st, 0, k, strlen(k), NULL), KVR_OK);
            cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
            kvr_store_unpin(&f.st, &r);
        } else {
            cr_assert_eq(kvr_store_release(&f.st, 0, k, strlen(k), NULL), KVR_OK);
        }
        cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    }
    cr_assert_eq(held(&f, 0, 77), 0, "the last one gone");
    fx_close(&f);
}

Test(index_canon, pools_and_namespaces_are_apart)
{
    fx_t f;
    int p1, p2;
    uint64_t h = 99;
    uint8_t out;

    fx_open(&f, 1 << 20, 4096, 64, 0);
    p1 = kvr_store_pool(&f.st, 0, "default", "m2", 2, KVR_POOLS_MAX); /* another model of default */
    p2 = kvr_store_pool(&f.st, 5, "t5", "kvrelay", 7, KVR_POOLS_MAX); /* namespace 5, pool 0's model */
    cr_assert(p1 > 0 && p2 > p1);
    cr_assert_eq(put_canon(&f, 0, 0, "x", 8, 99), KVR_PUT_CREATED);
    cr_assert_eq(held(&f, 0, 99), 1);
    cr_assert_eq(held(&f, (uint32_t)p1, 99), 0, "another model's pool holds nothing of pool 0");
    cr_assert_eq(held(&f, (uint32_t)p2, 99), 0, "another namespace holds nothing of default's");
    cr_assert_eq(put_canon(&f, 5, (uint32_t)p2, "x", 8, 99), KVR_PUT_CREATED, "the same key in namespace 5");
    cr_assert_eq(held(&f, (uint32_t)p2, 99), 1);
    cr_assert_eq(kvr_store_release(&f.st, 0, "x", 1, NULL), KVR_OK);
    cr_assert_eq(held(&f, 0, 99), 0);
    cr_assert_eq(held(&f, (uint32_t)p2, 99), 1, "namespace 5's block stays");
    cr_assert_eq(kvr_store_lookup_hashes(&f.st, 200, &h, 1, &out), 0, "a pool that does not exist");
    cr_assert_eq(out, 0);
    cr_assert_eq(kvr_store_pool_find(&f.st, 0, "m2", 2), p1);
    cr_assert_eq(kvr_store_pool_find(&f.st, 0, "m3", 2), KVR_ENOTFOUND);
    cr_assert_eq(kvr_store_pool_find(&f.st, 0, "m 3", 3), KVR_EINVAL);
    cr_assert_eq(kvr_store_pool_count(&f.st), 3, "finding made no pool");
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

Test(index_canon, eviction_unlinks)
{
    fx_t f;

    /* 8 entries: the ninth PUT evicts the least recently used */
    fx_open(&f, 1 << 20, 4096, 8, 0);
    for (int i = 0; i < 9; i++) {
        char k[8];
        snprintf(k, sizeof(k), "e%d", i);
        cr_assert_eq(put_canon(&f, 0, 0, k, 16, 1000 + (uint64_t)i), KVR_PUT_CREATED);
    }
    cr_assert_eq(held(&f, 0, 1000), 0, "evicted");
    for (int i = 1; i < 9; i++)
        cr_assert_eq(held(&f, 0, 1000 + (uint64_t)i), 1);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

/* The repair rebuilds the canon chains from the LIVE entries, and the check sees chains that
 * are wrong. */
Test(index_canon, repair_rebuilds_and_check_verifies)
{
    fx_t f;
    kvr_seg_t seg2;
    kvr_store_t st2;
    uint64_t nb;

    fx_open(&f, 1 << 20, 4096, 64, 0);
    for (int i = 0; i < 30; i++) {
        char k[8];
        snprintf(k, sizeof(k), "r%d", i);
        cr_assert_eq(put_canon(&f, 0, 0, k, 16, (uint64_t)(i % 10)), KVR_PUT_CREATED);
    }
    nb = f.st.sh->index.nbuckets;
    /* empty every canon chain: the check must notice, the lookups must miss */
    for (uint64_t b = 0; b < nb; b++)
        atomic_store(&f.st.ix.cbuckets[b], KVR_NIL);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_ERR, "LIVE entries missing from their canon chains");
    cr_assert_eq(held(&f, 0, 3), 0);
    /* a reap runs the full repair */
    fx_second(&f, &seg2, &st2);
    cr_assert_eq(kvr_store_reap_slot(&f.st, seg2.slot), KVR_OK);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    for (uint64_t c = 0; c < 10; c++)
        cr_assert_eq(held(&f, 0, c), 1, "hash %llu rebuilt", (unsigned long long)c);
    cr_assert_eq(held(&f, 0, 10), 0);

    /* an entry also heading a chain that is not its own: the check refuses it */
    for (uint64_t b = 0; b < nb; b++) {
        uint32_t i = atomic_load(&f.st.ix.cbuckets[b]);
        if (i == KVR_NIL)
            continue;
        for (uint64_t b2 = 0; b2 < nb; b2++) {
            if (atomic_load(&f.st.ix.cbuckets[b2]) != KVR_NIL)
                continue;
            atomic_store(&f.st.ix.cbuckets[b2], i);
            cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_ERR, "an entry on another bucket's chain");
            atomic_store(&f.st.ix.cbuckets[b2], KVR_NIL);
            break;
        }
        break;
    }
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

/* While a writer is inside a section (seq odd), the lock-free walk gives up with KVR_AGAIN and
 * the store answers those hashes under the lock. */
Test(index_canon, writer_in_section_falls_back_to_the_lock)
{
    fx_t f;
    uint64_t h[3] = {5, 6, 7};
    uint8_t out[3];

    fx_open(&f, 1 << 20, 4096, 64, 0);
    cr_assert_eq(put_canon(&f, 0, 0, "five", 4, 5), KVR_PUT_CREATED);
    cr_assert_eq(put_canon(&f, 0, 0, "six", 4, 6), KVR_PUT_CREATED);
    atomic_fetch_add(&f.st.sh->index.seq, 1); /* odd: "a writer is relinking" */
    cr_assert_eq(kvr_index_canon_lockfree(&f.st.ix, 0, 0, 5), KVR_AGAIN);
    cr_assert_eq(kvr_store_lookup_hashes(&f.st, 0, h, 3, out), 2);
    cr_assert_arr_eq(out, ((uint8_t[]){1, 1, 0}), 3);
    atomic_fetch_add(&f.st.sh->index.seq, 1);
    cr_assert_eq(kvr_index_canon_lockfree(&f.st.ix, 0, 0, 5), 1);
    fx_close(&f);
}

/* Keys around the inline bounds (46 bytes on the first line, 57 in all): two keys that differ
 * only in their last byte are two blocks, found apart by GET and by the lock-free exists. */
Test(index_canon, keys_around_the_inline_bounds)
{
    static const size_t lens[] = {45, 46, 47, 56, 57, 58, 59, 100};
    fx_t f;
    char a[128], b[128];

    fx_open(&f, 4 << 20, 4096, 128, 0);
    for (size_t t = 0; t < sizeof(lens) / sizeof(lens[0]); t++) {
        size_t n = lens[t];
        memset(a, 'k', n);
        memcpy(b, a, n);
        a[n - 1] = 'A';
        b[n - 1] = 'B';
        a[n] = b[n] = '\0';
        a[0] = b[0] = (char)('a' + t); /* apart from the other lengths' keys */
        cr_assert_eq(kvr_store_put(&f.st, 0, 0, a, n, "1", 1, 1), KVR_PUT_CREATED, "len %zu", n);
        cr_assert_eq(kvr_store_exists(&f.st, 0, b, n, NULL), 0, "len %zu: the last byte tells them apart", n);
        cr_assert_eq(kvr_store_put(&f.st, 0, 0, b, n, "22", 2, 2), KVR_PUT_CREATED, "len %zu", n);
        cr_assert_eq(kvr_store_exists(&f.st, 0, a, n, NULL), 1);
        cr_assert_eq(kvr_store_exists(&f.st, 0, b, n, NULL), 1);
        b[n - 1] = 'C';
        cr_assert_eq(kvr_store_exists(&f.st, 0, b, n, NULL), 0, "len %zu", n);
        b[n - 1] = 'B';
        cr_assert_eq(kvr_store_put(&f.st, 0, 0, a, n, "1", 1, 1), KVR_PUT_DEDUP, "len %zu", n);
        cr_assert_eq(kvr_store_put(&f.st, 0, 0, b, n, "1", 1, 2), KVR_ECONFLICT, "len %zu: b is 2 bytes", n);
    }
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}
