/*
 * fuzz_kvev.c — libFuzzer driver for the KV events' wire code (src/wire/kvev.c): the replay
 * request parser, and the batch encoder, whose output must decode back (msgpack-c) to the
 * events it was given.
 *
 * Input: frames for the parser, each a length byte then that many bytes (the last one cut
 * where the input ends); the same bytes read as 8-byte hashes feed the encoder.
 */
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "wire/kvev.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void fuzz_parse(const uint8_t *data, size_t size)
{
    const uint8_t *fr[4], *topic;
    size_t len[4], n = 0, tlen;
    uint64_t from;

    while (size > 0 && n < 4) {
        size_t l = data[0];
        data++;
        size--;
        if (l > size)
            l = size;
        fr[n] = data;
        len[n++] = l;
        data += l;
        size -= l;
    }
    if (kvr_kvev_parse_replay(n, fr, len, &from, &topic, &tlen) == KVR_OK) {
        check((n == 2 || n == 3) && len[0] == 0 && len[1] == 8);
        check(n == 2 ? topic == NULL && tlen == 0 : topic == fr[2] && tlen == len[2] && tlen > 0);
    }
}

static void fuzz_encode(const uint8_t *data, size_t size)
{
    kvr_kvev_enc_t e;
    uint64_t h[64];
    size_t nh = size / 8 < 64 ? size / 8 : 64, off = 0, n;
    const uint8_t *out;
    msgpack_unpacked u;

    for (size_t i = 0; i < nh; i++)
        memcpy(&h[i], data + 8 * i, 8);
    kvr_kvev_enc_init(&e, (kvr_kvev_format_t)(size % 3), size, "fuzz");
    kvr_kvev_begin(&e, 1.0, nh + 2, "default", "m");
    kvr_kvev_cleared(&e);
    for (size_t i = 0; i < nh; i++)
        kvr_kvev_stored(&e, h[i], (kvr_kvev_medium_t)((h[i] >> 7) & 1));
    kvr_kvev_removed(&e, h, nh, (kvr_kvev_medium_t)(size & 1));
    check(kvr_kvev_end(&e, &out, &n) == KVR_OK);
    msgpack_unpacked_init(&u);
    check(msgpack_unpack_next(&u, (const char *)out, n, &off) == MSGPACK_UNPACK_SUCCESS && off == n);
    check(u.data.type == MSGPACK_OBJECT_ARRAY && u.data.via.array.size == 3);
    check(u.data.via.array.ptr[1].type == MSGPACK_OBJECT_ARRAY && u.data.via.array.ptr[1].via.array.size == nh + 2);
    msgpack_unpacked_destroy(&u);
    kvr_kvev_enc_destroy(&e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_parse(data, size);
    fuzz_encode(data, size);
    return 0;
}
