/*
 * Unit tests of the KV events' wire form (src/wire/kvev.c): each format's batch decoded back
 * with msgpack-c's own unpacker, field by field in vLLM's order, and the replay request's limits.
 */
#include "wire/kvev.h"

#include <criterion/criterion.h>
#include <string.h>

static msgpack_object unpack(msgpack_unpacked *u, kvr_kvev_enc_t *e)
{
    const uint8_t *d;
    size_t n, off = 0;

    cr_assert_eq(kvr_kvev_end(e, &d, &n), KVR_OK);
    msgpack_unpacked_init(u);
    cr_assert_eq(msgpack_unpack_next(u, (const char *)d, n, &off), MSGPACK_UNPACK_SUCCESS);
    cr_assert_eq(off, n, "one object, nothing after it");
    return u->data;
}

static int str_is(msgpack_object o, const char *s)
{
    return o.type == MSGPACK_OBJECT_STR && o.via.str.size == strlen(s) && memcmp(o.via.str.ptr, s, o.via.str.size) == 0;
}

static msgpack_object map_get(msgpack_object m, const char *k)
{
    msgpack_object none = {.type = MSGPACK_OBJECT_NIL};

    cr_assert_eq(m.type, MSGPACK_OBJECT_MAP);
    for (uint32_t i = 0; i < m.via.map.size; i++)
        if (str_is(m.via.map.ptr[i].key, k))
            return m.via.map.ptr[i].val;
    cr_assert_fail("no key %s", k);
    return none;
}

static void check_hashes(msgpack_object a, const uint64_t *h, size_t n)
{
    cr_assert_eq(a.type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(a.via.array.size, n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(a.via.array.ptr[i].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
        cr_assert_eq(a.via.array.ptr[i].via.u64, h[i]);
    }
}

/* [ts, [events], 0] with n events; returns the events. */
static msgpack_object batch(msgpack_object b, double ts, uint32_t n)
{
    cr_assert_eq(b.type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(b.via.array.size, 3, "EventBatch: ts, events, data_parallel_rank");
    cr_assert_eq(b.via.array.ptr[0].type, MSGPACK_OBJECT_FLOAT64);
    cr_assert_float_eq(b.via.array.ptr[0].via.f64, ts, 1e-9);
    cr_assert_eq(b.via.array.ptr[1].type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(b.via.array.ptr[1].via.array.size, n);
    cr_assert_eq(b.via.array.ptr[2].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    cr_assert_eq(b.via.array.ptr[2].via.u64, 0);
    return b.via.array.ptr[1];
}

Test(kvev, vllm_arrays_in_vllms_field_order)
{
    kvr_kvev_enc_t e;
    msgpack_unpacked u;
    uint64_t big = UINT64_MAX - 5, rm[3] = {1, 2, UINT64_MAX};
    msgpack_object ev, s, r;

    kvr_kvev_enc_init(&e, KVR_KVEV_VLLM, 256, "pod-1");
    kvr_kvev_begin(&e, 1700000000.25, 3, "default", "llama");
    kvr_kvev_cleared(&e);
    kvr_kvev_stored(&e, big, KVR_KVEV_CPU);
    kvr_kvev_removed(&e, rm, 3, KVR_KVEV_CPU);
    ev = batch(unpack(&u, &e), 1700000000.25, 3);
    cr_assert_eq(ev.via.array.ptr[0].via.array.size, 1);
    cr_assert(str_is(ev.via.array.ptr[0].via.array.ptr[0], "AllBlocksCleared"));
    s = ev.via.array.ptr[1];
    cr_assert_eq(s.via.array.size, 8, "tag + block_hashes, parent, token_ids, block_size, lora_id, medium, lora_name");
    cr_assert(str_is(s.via.array.ptr[0], "BlockStored"));
    check_hashes(s.via.array.ptr[1], &big, 1);
    cr_assert_eq(s.via.array.ptr[2].type, MSGPACK_OBJECT_NIL);
    cr_assert_eq(s.via.array.ptr[3].type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(s.via.array.ptr[3].via.array.size, 0);
    cr_assert_eq(s.via.array.ptr[4].via.u64, 256);
    cr_assert_eq(s.via.array.ptr[5].type, MSGPACK_OBJECT_NIL);
    cr_assert(str_is(s.via.array.ptr[6], "CPU"));
    cr_assert_eq(s.via.array.ptr[7].type, MSGPACK_OBJECT_NIL);
    r = ev.via.array.ptr[2];
    cr_assert_eq(r.via.array.size, 3);
    cr_assert(str_is(r.via.array.ptr[0], "BlockRemoved"));
    check_hashes(r.via.array.ptr[1], rm, 3);
    cr_assert(str_is(r.via.array.ptr[2], "CPU"));
    msgpack_unpacked_destroy(&u);
    kvr_kvev_enc_destroy(&e);
}

Test(kvev, vllm_maps_tagged_by_type)
{
    kvr_kvev_enc_t e;
    msgpack_unpacked u;
    uint64_t h = 42;
    msgpack_object ev;

    kvr_kvev_enc_init(&e, KVR_KVEV_VLLM_MAP, 16, "pod-1");
    kvr_kvev_begin(&e, 2.5, 3, "default", "m");
    kvr_kvev_stored(&e, h, KVR_KVEV_CPU);
    kvr_kvev_removed(&e, &h, 1, KVR_KVEV_CPU);
    kvr_kvev_cleared(&e);
    ev = batch(unpack(&u, &e), 2.5, 3);
    cr_assert(str_is(map_get(ev.via.array.ptr[0], "type"), "BlockStored"));
    check_hashes(map_get(ev.via.array.ptr[0], "block_hashes"), &h, 1);
    cr_assert_eq(map_get(ev.via.array.ptr[0], "block_size").via.u64, 16);
    cr_assert(str_is(map_get(ev.via.array.ptr[0], "medium"), "CPU"));
    cr_assert_eq(map_get(ev.via.array.ptr[0], "parent_block_hash").type, MSGPACK_OBJECT_NIL);
    cr_assert(str_is(map_get(ev.via.array.ptr[1], "type"), "BlockRemoved"));
    check_hashes(map_get(ev.via.array.ptr[1], "block_hashes"), &h, 1);
    cr_assert(str_is(map_get(ev.via.array.ptr[2], "type"), "AllBlocksCleared"));
    cr_assert_eq(ev.via.array.ptr[2].via.map.size, 1);
    msgpack_unpacked_destroy(&u);
    kvr_kvev_enc_destroy(&e);
}

Test(kvev, rfc1527_envelope_with_the_vllm_aliases)
{
    kvr_kvev_enc_t e;
    msgpack_unpacked u;
    uint64_t h[2] = {7, 8};
    msgpack_object ev;

    kvr_kvev_enc_init(&e, KVR_KVEV_RFC1527, 32, "node-a");
    kvr_kvev_begin(&e, 3.0, 2, "team-x", "qwen");
    kvr_kvev_stored(&e, h[0], KVR_KVEV_CPU);
    kvr_kvev_removed(&e, h, 2, KVR_KVEV_CPU);
    ev = batch(unpack(&u, &e), 3.0, 2);
    cr_assert(str_is(map_get(ev.via.array.ptr[0], "event_type"), "stored"));
    cr_assert(str_is(map_get(ev.via.array.ptr[0], "type"), "BlockStored"));
    cr_assert(str_is(map_get(ev.via.array.ptr[0], "backend_id"), "node-a"));
    cr_assert(str_is(map_get(ev.via.array.ptr[0], "tenant_id"), "team-x"));
    cr_assert(str_is(map_get(ev.via.array.ptr[0], "model_name"), "qwen"));
    check_hashes(map_get(ev.via.array.ptr[0], "seq_hashes"), h, 1);
    check_hashes(map_get(ev.via.array.ptr[0], "block_hashes"), h, 1);
    cr_assert_eq(map_get(ev.via.array.ptr[0], "block_size").via.u64, 32);
    cr_assert(str_is(map_get(ev.via.array.ptr[1], "event_type"), "removed"));
    check_hashes(map_get(ev.via.array.ptr[1], "seq_hashes"), h, 2);
    msgpack_unpacked_destroy(&u);
    kvr_kvev_enc_destroy(&e);
}

Test(kvev, a_batch_whose_count_is_wrong_is_refused)
{
    kvr_kvev_enc_t e;
    const uint8_t *d;
    size_t n;

    kvr_kvev_enc_init(&e, KVR_KVEV_VLLM, 16, "p");
    kvr_kvev_begin(&e, 1.0, 2, "default", "m");
    kvr_kvev_cleared(&e);
    cr_assert_eq(kvr_kvev_end(&e, &d, &n), KVR_ERR, "one event written of two announced");
    kvr_kvev_begin(&e, 1.0, 1, "default", "m"); /* the encoder is reusable */
    kvr_kvev_cleared(&e);
    cr_assert_eq(kvr_kvev_end(&e, &d, &n), KVR_OK);
    kvr_kvev_enc_destroy(&e);
}

Test(kvev, formats_by_name)
{
    kvr_kvev_format_t f;

    cr_assert_eq(kvr_kvev_format("vllm", &f), KVR_OK);
    cr_assert_eq(f, KVR_KVEV_VLLM);
    cr_assert_eq(kvr_kvev_format("vllm-map", &f), KVR_OK);
    cr_assert_eq(f, KVR_KVEV_VLLM_MAP);
    cr_assert_eq(kvr_kvev_format("rfc1527", &f), KVR_OK);
    cr_assert_eq(f, KVR_KVEV_RFC1527);
    cr_assert_eq(kvr_kvev_format("json", &f), KVR_EINVAL);
}

static int parse(size_t n, const char *f0, size_t l0, const char *f1, size_t l1, const char *f2, size_t l2,
                 uint64_t *from, size_t *tlen)
{
    const uint8_t *fr[3] = {(const uint8_t *)f0, (const uint8_t *)f1, (const uint8_t *)f2};
    size_t len[3] = {l0, l1, l2};
    const uint8_t *t;

    return kvr_kvev_parse_replay(n, fr, len, from, &t, tlen);
}

Test(kvev, replay_request_each_limit)
{
    uint64_t from = 0;
    size_t tl = 99;
    static const char big[KVR_KVEV_TOPIC_MAX + 1];

    cr_assert_eq(parse(2, "", 0, "\0\0\0\0\0\0\1\2", 8, NULL, 0, &from, &tl), KVR_OK, "vLLM's form");
    cr_assert_eq(from, 0x102);
    cr_assert_eq(tl, 0);
    cr_assert_eq(parse(3, "", 0, "\xff\0\0\0\0\0\0\1", 8, "kv@a@m", 6, &from, &tl), KVR_OK, "with a topic");
    cr_assert_eq(from, 0xff00000000000001ull);
    cr_assert_eq(tl, 6);
    cr_assert_eq(parse(1, "", 0, NULL, 0, NULL, 0, &from, &tl), KVR_EINVAL, "too few frames");
    cr_assert_eq(parse(4, "", 0, "12345678", 8, "t", 1, &from, &tl), KVR_EINVAL, "too many frames");
    cr_assert_eq(parse(2, "x", 1, "12345678", 8, NULL, 0, &from, &tl), KVR_EINVAL, "the delimiter is empty");
    cr_assert_eq(parse(2, "", 0, "1234567", 7, NULL, 0, &from, &tl), KVR_EINVAL, "seq of 7 bytes");
    cr_assert_eq(parse(2, "", 0, "123456789", 9, NULL, 0, &from, &tl), KVR_EINVAL, "seq of 9 bytes");
    cr_assert_eq(parse(3, "", 0, "12345678", 8, "", 0, &from, &tl), KVR_EINVAL, "an empty topic");
    cr_assert_eq(parse(3, "", 0, "12345678", 8, big, KVR_KVEV_TOPIC_MAX + 1, &from, &tl), KVR_EINVAL,
                 "a topic over the limit");
    cr_assert_eq(parse(3, "", 0, "12345678", 8, big, KVR_KVEV_TOPIC_MAX, &from, &tl), KVR_OK, "at the limit");
}

Test(kvev, disk_medium_in_every_form)
{
    kvr_kvev_format_t forms[3] = {KVR_KVEV_VLLM, KVR_KVEV_VLLM_MAP, KVR_KVEV_RFC1527};
    uint64_t h = 99;

    for (int f = 0; f < 3; f++) {
        kvr_kvev_enc_t e;
        msgpack_unpacked u;
        msgpack_object ev;
        kvr_kvev_enc_init(&e, forms[f], 16, "pod-1");
        kvr_kvev_begin(&e, 4.0, 4, "default", "m");
        kvr_kvev_stored(&e, h, KVR_KVEV_DISK);
        kvr_kvev_stored(&e, h, KVR_KVEV_CPU); /* the fast path keeps each medium's bytes */
        kvr_kvev_removed(&e, &h, 1, KVR_KVEV_DISK);
        kvr_kvev_removed(&e, &h, 1, KVR_KVEV_CPU);
        ev = batch(unpack(&u, &e), 4.0, 4);
        const char *want[4] = {"DISK", "CPU", "DISK", "CPU"};
        for (int i = 0; i < 4; i++) {
            msgpack_object x = ev.via.array.ptr[i];
            msgpack_object m = forms[f] == KVR_KVEV_VLLM ? x.via.array.ptr[i < 2 ? 6 : 2] : map_get(x, "medium");
            cr_assert(str_is(m, want[i]), "form %d event %d", f, i);
            if (forms[f] == KVR_KVEV_VLLM)
                check_hashes(x.via.array.ptr[1], &h, 1);
        }
        msgpack_unpacked_destroy(&u);
        kvr_kvev_enc_destroy(&e);
    }
}
