/*
 * evsub.c — see evsub.h. The wire form is docs/kv-events.md's: frames [topic, seq (8 bytes,
 * big-endian), msgpack [ts, [events], rank]]; a BlockStored is ["BlockStored", [hash], ...] or
 * {"type": "BlockStored", "block_hashes": [hash], ...}. Only the stored hashes matter here
 * (each PUT of the workload has its own hash); gaps in a topic's seq are counted (the
 * publisher or ZMQ dropped something for us), not repaired.
 */
#include "evsub.h"

#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define TOPICS 64

struct kvb_evsub {
    void *ctx, *sock;
    uint64_t *set; /* open addressing, 0 = empty (hash 0 kept in has_zero) */
    size_t cap, n;
    int has_zero;
    uint64_t batches, bytes, gaps;
    struct {
        char name[256];
        uint64_t next;
    } topic[TOPICS];
    int ntopics;
};

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static int set_add(kvb_evsub_t *e, uint64_t h)
{
    if (h == 0) {
        e->has_zero = 1;
        return 0;
    }
    if (2 * (e->n + 1) > e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 1 << 16;
        uint64_t *t = calloc(cap, sizeof(*t));
        if (t == NULL)
            return -1;
        for (size_t i = 0; i < e->cap; i++)
            if (e->set[i] != 0) {
                size_t j = mix(e->set[i]) & (cap - 1);
                while (t[j] != 0)
                    j = (j + 1) & (cap - 1);
                t[j] = e->set[i];
            }
        free(e->set);
        e->set = t;
        e->cap = cap;
    }
    for (size_t j = mix(h) & (e->cap - 1);; j = (j + 1) & (e->cap - 1)) {
        if (e->set[j] == h)
            return 0;
        if (e->set[j] == 0) {
            e->set[j] = h;
            e->n++;
            return 0;
        }
    }
}

int kvb_evsub_holds(const kvb_evsub_t *e, uint64_t h)
{
    if (h == 0)
        return e->has_zero;
    if (e->cap == 0)
        return 0;
    for (size_t j = mix(h) & (e->cap - 1);; j = (j + 1) & (e->cap - 1)) {
        if (e->set[j] == h)
            return 1;
        if (e->set[j] == 0)
            return 0;
    }
}

kvb_evsub_t *kvb_evsub_open(const char *endpoint, char *err, size_t errlen)
{
    kvb_evsub_t *e = calloc(1, sizeof(*e));
    int hwm = 1000000;

    if (e == NULL || (e->ctx = zmq_ctx_new()) == NULL || (e->sock = zmq_socket(e->ctx, ZMQ_SUB)) == NULL) {
        snprintf(err, errlen, "cannot make a ZMQ SUB socket");
        kvb_evsub_close(e);
        return NULL;
    }
    zmq_setsockopt(e->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    if (zmq_setsockopt(e->sock, ZMQ_SUBSCRIBE, "kv@", 3) != 0 || zmq_connect(e->sock, endpoint) != 0) {
        snprintf(err, errlen, "cannot subscribe to %s: %s", endpoint, zmq_strerror(zmq_errno()));
        kvb_evsub_close(e);
        return NULL;
    }
    return e;
}

int kvb_evsub_fd(kvb_evsub_t *e)
{
    int fd = -1;
    size_t sz = sizeof(fd);

    zmq_getsockopt(e->sock, ZMQ_FD, &fd, &sz);
    return fd;
}

static int is_str(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) && !memcmp(o->via.str.ptr, s, o->via.str.size);
}

/* The hashes of a BlockStored event, or NULL for any other event. */
static const msgpack_object *stored_hashes(const msgpack_object *ev)
{
    if (ev->type == MSGPACK_OBJECT_ARRAY && ev->via.array.size >= 2 && is_str(&ev->via.array.ptr[0], "BlockStored"))
        return &ev->via.array.ptr[1];
    if (ev->type == MSGPACK_OBJECT_MAP) {
        const msgpack_object *hashes = NULL;
        int stored = 0;
        for (uint32_t i = 0; i < ev->via.map.size; i++) {
            const msgpack_object_kv *kv = &ev->via.map.ptr[i];
            if (is_str(&kv->key, "type") && is_str(&kv->val, "BlockStored"))
                stored = 1;
            else if (is_str(&kv->key, "block_hashes"))
                hashes = &kv->val;
        }
        return stored ? hashes : NULL;
    }
    return NULL;
}

static int apply(kvb_evsub_t *e, const uint8_t *p, size_t n, char *err, size_t errlen)
{
    msgpack_unpacked u;
    size_t off = 0;
    int rc = 0;

    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, (const char *)p, n, &off) != MSGPACK_UNPACK_SUCCESS ||
        u.data.type != MSGPACK_OBJECT_ARRAY || u.data.via.array.size < 2 ||
        u.data.via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY) {
        snprintf(err, errlen, "a payload that is not an EventBatch (%zu bytes)", n);
        rc = -1;
    }
    for (uint32_t i = 0; rc == 0 && i < u.data.via.array.ptr[1].via.array.size; i++) {
        const msgpack_object *h = stored_hashes(&u.data.via.array.ptr[1].via.array.ptr[i]);
        if (h == NULL)
            continue;
        if (h->type != MSGPACK_OBJECT_ARRAY) {
            snprintf(err, errlen, "BlockStored without a hash list");
            rc = -1;
            break;
        }
        for (uint32_t k = 0; k < h->via.array.size; k++)
            if (h->via.array.ptr[k].type == MSGPACK_OBJECT_POSITIVE_INTEGER && set_add(e, h->via.array.ptr[k].via.u64) != 0)
                rc = -1;
    }
    msgpack_unpacked_destroy(&u);
    return rc;
}

static void count_seq(kvb_evsub_t *e, const zmq_msg_t *topic, const zmq_msg_t *seq)
{
    const uint8_t *b = zmq_msg_data((zmq_msg_t *)seq);
    size_t tl = zmq_msg_size((zmq_msg_t *)topic);
    uint64_t s = 0;
    int i;

    if (zmq_msg_size((zmq_msg_t *)seq) != 8 || tl >= sizeof(e->topic[0].name))
        return;
    for (int k = 0; k < 8; k++)
        s = s << 8 | b[k];
    for (i = 0; i < e->ntopics; i++)
        if (strlen(e->topic[i].name) == tl && !memcmp(e->topic[i].name, zmq_msg_data((zmq_msg_t *)topic), tl))
            break;
    if (i == e->ntopics) {
        if (i == TOPICS)
            return;
        memcpy(e->topic[i].name, zmq_msg_data((zmq_msg_t *)topic), tl);
        e->topic[i].name[tl] = '\0';
        e->topic[i].next = s;
        e->ntopics++;
    }
    if (s > e->topic[i].next)
        e->gaps += s - e->topic[i].next;
    e->topic[i].next = s + 1;
}

int kvb_evsub_step(kvb_evsub_t *e, char *err, size_t errlen)
{
    int got = 0;

    for (;;) {
        zmq_msg_t fr[3];
        int n = 0, more = 1, bad = 0;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, e->sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                for (int i = 0; i < n && i < 3; i++)
                    zmq_msg_close(&fr[i]);
                return got; /* EAGAIN: none left (messages arrive whole) */
            }
            more = zmq_msg_more(&m);
            if (n < 3)
                fr[n] = m;
            else
                zmq_msg_close(&m), bad = 1;
            n++;
        }
        if (n != 3 || bad) {
            snprintf(err, errlen, "a message of %d frames, not 3", n);
            got = -1;
        } else {
            count_seq(e, &fr[0], &fr[1]);
            e->batches++;
            e->bytes += zmq_msg_size(&fr[2]);
            if (apply(e, zmq_msg_data(&fr[2]), zmq_msg_size(&fr[2]), err, errlen) != 0)
                got = -1;
        }
        for (int i = 0; i < n && i < 3; i++)
            zmq_msg_close(&fr[i]);
        if (got < 0)
            return -1;
        got++;
    }
}

void kvb_evsub_counts(const kvb_evsub_t *e, uint64_t *batches, uint64_t *bytes, uint64_t *gaps)
{
    *batches = e->batches;
    *bytes = e->bytes;
    *gaps = e->gaps;
}

void kvb_evsub_close(kvb_evsub_t *e)
{
    int zero = 0;

    if (e == NULL)
        return;
    if (e->sock != NULL) {
        zmq_setsockopt(e->sock, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_close(e->sock);
    }
    if (e->ctx != NULL)
        zmq_ctx_term(e->ctx);
    free(e->set);
    free(e);
}
