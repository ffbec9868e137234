/*
 * publisher_events.c — the KV events: vLLM's ZMQ event stream from the publisher
 * (docs/kv-events.md).
 *
 * The publisher already owns the one ordered change log and counts the owners of every
 * canonical hash per pool, and apart the disk tier's; in each medium (CPU: the arena, DISK: the
 * disk tier) a hash's first owner is a BlockStored of that medium, its last one leaving a
 * BlockRemoved of it (publisher.c calls pub_kvev_op at those moments), so a block copied to
 * disk is stored in DISK too, and one evicted from RAM but on disk is removed from CPU only. Per pool, the events wait
 * in a small array and go out as one batch once the oldest has waited --kv-events-interval (or
 * at --kv-events-max-batch), so that a busy pool makes at most one message per interval:
 * a PUB message [topic, seq, payload] whose topic is the pool's, whose seq counts that topic's
 * batches from 0, whose payload is vLLM's msgpack EventBatch (wire/kvev.h).
 *
 * Every batch sent is also kept in a FIFO replay buffer (--kv-events-buffer batches and
 * --kv-events-buffer-bytes bytes, all topics together). A ROUTER socket answers "from seq N of
 * topic T" with the kept batches, then vLLM's end marker; when the buffer no longer holds N it
 * answers with the pool's whole state instead (AllBlocksCleared, then one BlockStored per held
 * hash, every message stamped with the topic's last seq), which is exact because the pending
 * events are flushed first. A new stream (publisher start, a pool made later, a rebuild after
 * a change-log overflow) opens with the same statement of the whole state.
 *
 * Bounds: PUB drops a subscriber's messages beyond --kv-events-hwm (ZMQ's rule; the
 * subscriber sees the gap and replays), the replay socket's queue holds one whole answer per
 * requester (the longer of a replay of the whole buffer and a resync of the largest pool the
 * index allows); one that does not read its answers has the rest cut, counted, and asks again.
 * No send ever blocks. Only this process touches the sockets; ZMQ's I/O thread is its own.
 */
#include "proc/publisher_int.h"

#include "base/clock.h"
#include "base/log.h"
#include "core/owners.h"
#include "shm/stats.h"
#include "wire/kvev.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define TOPIC_MAX         (KVR_CFG_STR_MAX * 3 + 8)
#define REQUESTS_PER_TURN 16 /* replay requests answered per publisher turn */

static const uint8_t end_seq[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

typedef struct {
    uint64_t hash;
    uint8_t stored; /* 1: BlockStored, 0: BlockRemoved */
    uint8_t medium; /* kvr_kvev_medium_t */
} kvev_op_t;

typedef struct {
    int open;            /* the stream's first batch went out */
    uint64_t next_seq;   /* the seq of the topic's next batch */
    uint64_t first_kept; /* the oldest seq of this topic the buffer holds (next_seq: none) */
    uint64_t first_ns;   /* when the oldest pending event was seen */
    kvev_op_t *ops;      /* pending events, up to --kv-events-max-batch */
    uint32_t nops;
    char ns[KVR_CFG_STR_MAX], model[KVR_CFG_STR_MAX], topic[TOPIC_MAX];
} kvev_pool_t;

typedef struct {
    uint32_t pool;
    uint64_t seq;
    uint8_t *data;
    size_t len;
} kvev_kept_t;

struct pub_kvev {
    void *ctx, *pub, *replay;
    kvr_kvev_enc_t enc;
    kvev_pool_t pool[KVR_POOLS_MAX];
    uint32_t npools;
    kvev_kept_t *ring; /* the replay buffer, FIFO */
    size_t cap, head, count, bytes;
    uint64_t *removed; /* scratch: a batch's run of removals */
};

/* ------------------------------------------------------------------ endpoints */

/*
 * "tcp://HOST:*" or "tcp://HOST:0" becomes "tcp://HOST:PORT" with a port free now: the supervisor
 * resolves it once, before the first publisher, so that every publisher (a replacement after a
 * crash too) binds the same port and the port file can name it. Other endpoints stay. Returns
 * the port (0: not tcp, or not resolved) or -1 on error.
 */
int kvr_kvev_resolve_endpoint(char *ep, size_t cap)
{
    char host[256];
    const char *colon;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd, port;

    if (strncmp(ep, "tcp://", 6) != 0 || (colon = strrchr(ep + 6, ':')) == NULL)
        return 0;
    if (strcmp(colon + 1, "*") != 0 && strcmp(colon + 1, "0") != 0)
        return atoi(colon + 1);
    snprintf(host, sizeof(host), "%.*s", (int)(colon - (ep + 6)), ep + 6);
    memset(&ss, 0, sizeof(ss));
    if (inet_pton(AF_INET, host, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
        ss.ss_family = AF_INET;
        sl = sizeof(struct sockaddr_in);
    } else if (strcmp(host, "*") == 0) {
        ss.ss_family = AF_INET;
        sl = sizeof(struct sockaddr_in);
    } else {
        return -1; /* a name or IPv6: give the port yourself */
    }
    if ((fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        close(fd);
        return -1;
    }
    port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    close(fd);
    snprintf(ep + (colon + 1 - ep), cap - (size_t)(colon + 1 - ep), "%d", port);
    return port;
}

/* ------------------------------------------------------------------ streams */

static double wall_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void keep(struct pub_kvev *k, pub_t *p, uint32_t pool, uint64_t seq, const uint8_t *data, size_t len)
{
    kvev_kept_t *e;
    uint8_t *copy = malloc(len);

    if (copy == NULL) { /* not kept: a replay from here on resyncs */
        k->pool[pool].first_kept = seq + 1;
        return;
    }
    memcpy(copy, data, len);
    while (k->count > 0 && (k->count == k->cap || k->bytes + len > p->cfg->kv_events_buffer_bytes)) {
        kvev_kept_t *old = &k->ring[k->head];
        k->pool[old->pool].first_kept = old->seq + 1;
        k->bytes -= old->len;
        free(old->data);
        k->head = (k->head + 1) % k->cap;
        k->count--;
    }
    e = &k->ring[(k->head + k->count) % k->cap];
    *e = (kvev_kept_t){pool, seq, copy, len};
    k->count++;
    k->bytes += len;
    kvr_atomic_store_relaxed(&p->store.my_stats->c[KVR_ST_KVEV_BUF_BATCHES], k->count);
    kvr_atomic_store_relaxed(&p->store.my_stats->c[KVR_ST_KVEV_BUF_BYTES], k->bytes);
}

/* Sends the encoder's batch as the pool's next seq, keeps it for replay. */
static void send_batch(pub_t *p, uint32_t pool)
{
    struct pub_kvev *k = p->kvev;
    kvev_pool_t *kp = &k->pool[pool];
    const uint8_t *data;
    size_t len;
    uint8_t seq[8];
    uint64_t s = kp->next_seq;

    if (kvr_kvev_end(&k->enc, &data, &len) != KVR_OK) {
        KVR_LOG_RATELIMITED(KVR_LOG_ERROR, "kv events: out of memory encoding a batch of pool %u", pool);
        kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_SEND_ERRORS, 1);
        kp->first_kept = ++kp->next_seq; /* a gap nobody can replay: replays of it resync */
        return;
    }
    for (int i = 0; i < 8; i++)
        seq[i] = (uint8_t)(s >> (56 - 8 * i));
    if (zmq_send(k->pub, kp->topic, strlen(kp->topic), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(k->pub, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 || zmq_send(k->pub, data, len, ZMQ_DONTWAIT) < 0)
        kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_SEND_ERRORS, 1); /* kept: it replays */
    kp->next_seq = s + 1;
    keep(k, p, pool, s, data, len);
    kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_BATCHES, 1);
    kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_BYTES, len);
}

/* Takes on the pools the publisher took on since: their topics, from the store's table. */
static void take_pools(pub_t *p)
{
    struct pub_kvev *k = p->kvev;

    for (; k->npools < p->npools; k->npools++) {
        kvev_pool_t *kp = &k->pool[k->npools];
        kvr_pool_info_t info;
        if (kvr_store_pool_info(&p->store, k->npools, &info) != KVR_OK)
            info.ns_name = info.model = "";
        snprintf(kp->ns, sizeof(kp->ns), "%s", info.ns_name);
        snprintf(kp->model, sizeof(kp->model), "%s", info.model);
        if (info.ns_name[0] == '\0' || strcmp(info.ns_name, "default") == 0)
            snprintf(kp->topic, sizeof(kp->topic), "kv@%s@%s", p->cfg->kv_events_backend_id, info.model);
        else
            snprintf(kp->topic, sizeof(kp->topic), "kv@%s/%s@%s", p->cfg->kv_events_backend_id, info.ns_name,
                     info.model);
    }
}

/* One replay message to the requester id: [id, "", seq, data], or vLLM's end marker when data is
 * NULL. KVR_OK, or KVR_ERR when the requester is gone or its queue is full (the answer is cut). */
static int reply(pub_t *p, zmq_msg_t *id, uint64_t seq, const uint8_t *data, size_t len)
{
    struct pub_kvev *k = p->kvev;
    uint8_t s[8];

    for (int i = 0; i < 8; i++)
        s[i] = (uint8_t)(seq >> (56 - 8 * i));
    if (zmq_send(k->replay, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE | ZMQ_DONTWAIT) <
        0)
        return KVR_ERR; /* gone, or its queue is full: cut */
    zmq_send(k->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(k->replay, data == NULL ? end_seq : s, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(k->replay, data == NULL ? (const uint8_t *)"" : data, len, ZMQ_DONTWAIT);
    return KVR_OK;
}

/*
 * The pool's whole state in batches of at most --kv-events-max-batch events: AllBlocksCleared,
 * then one BlockStored per owned hash. live: sent as the topic's next seqs (a stream's start or
 * a rebuild); otherwise answered to a replay requester (id), every message stamped `stamp`.
 * Returns KVR_OK, or KVR_ERR when a replay answer could not be queued (cut short).
 */
/* Owner slot `slot` of the pool's table in medium m (0 CPU, 1 DISK): whether the hash there is
 * held in it (its RAM owners are its owners less its disk owners). */
static int held_in(const pub_pool_t *pp, size_t slot, int m)
{
    const kvr_owner_ent_t *t = &pp->owners.tab[slot];
    uint32_t disk = t->count > 0 ? kvr_owners_count(&pp->disk, t->hash) : 0;

    return m == KVR_KVEV_DISK ? disk > 0 : t->count > disk;
}

static int state_batches(pub_t *p, uint32_t pool, int live, zmq_msg_t *id, uint64_t stamp)
{
    struct pub_kvev *k = p->kvev;
    kvev_pool_t *kp = &k->pool[pool];
    const pub_pool_t *pp = &p->pool[pool];
    const kvr_owners_t *o = &pp->owners;
    size_t max = p->cfg->kv_events_max_batch, left = 1, slot = 0, stored;
    int first = 1, m = 0;

    for (size_t i = 0; i < o->cap; i++) /* one BlockStored per hash and medium holding it */
        left += held_in(pp, i, KVR_KVEV_CPU) + held_in(pp, i, KVR_KVEV_DISK);
    stored = left - 1;
    while (left > 0) {
        size_t n = left < max ? left : max;
        kvr_kvev_begin(&k->enc, wall_seconds(), n, kp->ns, kp->model);
        left -= n;
        if (first) {
            kvr_kvev_cleared(&k->enc);
            kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_CLEARED, 1);
            n--;
            first = 0;
        }
        for (; n > 0 && slot < o->cap; m = !m, slot += m == 0) /* (slot, CPU), (slot, DISK), ... */
            if (held_in(pp, slot, m)) {
                kvr_kvev_stored(&k->enc, o->tab[slot].hash, (kvr_kvev_medium_t)m);
                n--;
            }
        if (live) {
            send_batch(p, pool);
        } else {
            const uint8_t *data;
            size_t len;
            if (kvr_kvev_end(&k->enc, &data, &len) != KVR_OK || reply(p, id, stamp, data, len) != KVR_OK)
                return KVR_ERR;
        }
        kvr_seg_heartbeat(p->seg); /* a large pool takes a while */
    }
    if (live)
        kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_STORED, stored);
    return KVR_OK;
}

/* Opens pool's stream if it is not: the whole state as its first batches. */
static void open_stream(pub_t *p, uint32_t pool)
{
    kvev_pool_t *kp = &p->kvev->pool[pool];

    if (kp->open)
        return;
    kp->open = 1;
    kp->nops = 0; /* what is pending is in the state already */
    state_batches(p, pool, 1, NULL, 0);
}

static void flush_pool(pub_t *p, uint32_t pool)
{
    struct pub_kvev *k = p->kvev;
    kvev_pool_t *kp = &k->pool[pool];
    size_t events = 0, stored = 0, removed = 0;

    if (kp->nops == 0)
        return;
    for (uint32_t i = 0; i < kp->nops; i++) /* a run of removals of one medium is one BlockRemoved */
        events += kp->ops[i].stored || i == 0 || kp->ops[i - 1].stored || kp->ops[i - 1].medium != kp->ops[i].medium;
    kvr_kvev_begin(&k->enc, wall_seconds(), events, kp->ns, kp->model);
    for (uint32_t i = 0; i < kp->nops;) {
        kvr_kvev_medium_t m = (kvr_kvev_medium_t)kp->ops[i].medium;
        if (kp->ops[i].stored) {
            kvr_kvev_stored(&k->enc, kp->ops[i++].hash, m);
            stored++;
            continue;
        }
        size_t n = 0;
        while (i < kp->nops && !kp->ops[i].stored && kp->ops[i].medium == m)
            k->removed[n++] = kp->ops[i++].hash;
        kvr_kvev_removed(&k->enc, k->removed, n, m);
        removed += n;
    }
    kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_STORED, stored);
    kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_REMOVED, removed);
    kp->nops = 0;
    send_batch(p, pool);
    pub_record_latency(p, KVR_ST_KVEV_HIST, kp->first_ns);
}

/* ------------------------------------------------------------------ the publisher's calls */

int pub_kvev_open(pub_t *p)
{
    const kvr_config_t *cfg = p->cfg;
    struct pub_kvev *k;
    kvr_kvev_format_t fmt;
    int hwm = (int)cfg->kv_events_hwm, zero = 0, one = 1, rhwm;

    if (cfg->kv_events_bind[0] == '\0')
        return KVR_OK;
    if (kvr_kvev_format(cfg->kv_events_format, &fmt) != KVR_OK || (k = calloc(1, sizeof(*k))) == NULL)
        return KVR_ERR;
    k->cap = cfg->kv_events_buffer;
    k->ring = calloc(k->cap, sizeof(*k->ring));
    k->removed = calloc(cfg->kv_events_max_batch, sizeof(*k->removed));
    if (k->ring == NULL || k->removed == NULL || (k->ctx = zmq_ctx_new()) == NULL ||
        (k->pub = zmq_socket(k->ctx, ZMQ_PUB)) == NULL)
        goto fail;
    zmq_setsockopt(k->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(k->pub, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(k->pub, cfg->kv_events_bind) != 0) {
        kvr_error("kv events: cannot bind %s: %s", cfg->kv_events_bind, zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (cfg->kv_events_replay_bind[0] != '\0') {
        /* one whole answer fits the queue of one requester: a replay of the whole buffer, or a
         * resync, one message per --kv-events-max-batch hashes of a pool that can hold at most
         * one per index entry; ROUTER_MANDATORY makes a full queue an error we count instead of
         * a silent drop */
        uint64_t most = (p->max_blocks + 1 + cfg->kv_events_max_batch - 1) / cfg->kv_events_max_batch;
        if (most < cfg->kv_events_buffer)
            most = cfg->kv_events_buffer;
        rhwm = most + 2 < (1u << 30) ? (int)most + 2 : 1 << 30;
        if ((k->replay = zmq_socket(k->ctx, ZMQ_ROUTER)) == NULL)
            goto fail;
        zmq_setsockopt(k->replay, ZMQ_SNDHWM, &rhwm, sizeof(rhwm));
        zmq_setsockopt(k->replay, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(k->replay, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
        if (zmq_bind(k->replay, cfg->kv_events_replay_bind) != 0) {
            kvr_error("kv events: cannot bind %s: %s", cfg->kv_events_replay_bind, zmq_strerror(zmq_errno()));
            goto fail;
        }
    }
    kvr_kvev_enc_init(&k->enc, fmt, cfg->kv_block_size, cfg->kv_events_backend_id);
    p->kvev = k;
    kvr_info("kv events (%s) on %s, replay on %s, topics kv@%s@<model>", cfg->kv_events_format, cfg->kv_events_bind,
             cfg->kv_events_replay_bind[0] ? cfg->kv_events_replay_bind : "(none)", cfg->kv_events_backend_id);
    return KVR_OK;
fail:
    if (k->replay != NULL)
        zmq_close(k->replay);
    if (k->pub != NULL)
        zmq_close(k->pub);
    if (k->ctx != NULL)
        zmq_ctx_term(k->ctx);
    free(k->ring);
    free(k->removed);
    free(k);
    return KVR_ERR;
}

void pub_kvev_op(pub_t *p, uint32_t pool, int stored, uint64_t hash, kvr_kvev_medium_t m)
{
    struct pub_kvev *k = p->kvev;
    kvev_pool_t *kp;

    if (k == NULL)
        return;
    take_pools(p);
    if (pool >= k->npools)
        return;
    kp = &k->pool[pool];
    if (!kp->open) { /* a pool made since: its stream opens with the state, this op included */
        open_stream(p, pool);
        return;
    }
    if (kp->ops == NULL && (kp->ops = malloc(p->cfg->kv_events_max_batch * sizeof(*kp->ops))) == NULL) {
        kp->open = 0; /* reopens with the whole state at the next op */
        return;
    }
    if (kp->nops == 0)
        kp->first_ns = p->log_seen_ns ? p->log_seen_ns : kvr_clock_ns();
    kp->ops[kp->nops++] = (kvev_op_t){hash, (uint8_t)(stored != 0), (uint8_t)m};
    if (kp->nops >= p->cfg->kv_events_max_batch)
        flush_pool(p, pool);
}

void pub_kvev_flush_due(pub_t *p, uint64_t now)
{
    uint64_t wait = p->cfg->kv_events_interval_ms * 1000000ull;

    if (p->kvev == NULL)
        return;
    for (uint32_t i = 0; i < p->kvev->npools; i++)
        if (p->kvev->pool[i].nops > 0 && now >= p->kvev->pool[i].first_ns + wait)
            flush_pool(p, i);
}

uint64_t pub_kvev_due(pub_t *p)
{
    uint64_t due = UINT64_MAX, wait = p->cfg->kv_events_interval_ms * 1000000ull;

    for (uint32_t i = 0; p->kvev != NULL && i < p->kvev->npools; i++)
        if (p->kvev->pool[i].nops > 0 && p->kvev->pool[i].first_ns + wait < due)
            due = p->kvev->pool[i].first_ns + wait;
    return due;
}

void pub_kvev_generation(pub_t *p)
{
    struct pub_kvev *k = p->kvev;

    if (k == NULL)
        return;
    take_pools(p);
    for (uint32_t i = 0; i < k->npools; i++) {
        k->pool[i].open = 0;
        open_stream(p, i);
    }
}

/* ------------------------------------------------------------------ replay */

/* The pool whose topic is t (n bytes), or -1. */
static int pool_of_topic(const struct pub_kvev *k, const uint8_t *t, size_t n)
{
    for (uint32_t i = 0; i < k->npools; i++)
        if (strlen(k->pool[i].topic) == n && memcmp(k->pool[i].topic, t, n) == 0)
            return (int)i;
    return -1;
}

/* Answers one request: frames [id, "", seq8] (vLLM's: pool 0's topic) or [id, "", seq8, topic]
 * (nfr counts them; more than 4 is malformed). */
static void answer(pub_t *p, zmq_msg_t *fr, int nfr)
{
    struct pub_kvev *k = p->kvev;
    const uint8_t *frame[3], *topic;
    size_t len[3], tlen;
    uint64_t from;
    int pool = 0, ok = KVR_OK;
    kvev_pool_t *kp;

    for (int i = 1; i < nfr && i < 4; i++) {
        frame[i - 1] = zmq_msg_data(&fr[i]);
        len[i - 1] = zmq_msg_size(&fr[i]);
    }
    if (nfr < 3 || nfr > 4 || kvr_kvev_parse_replay((size_t)nfr - 1, frame, len, &from, &topic, &tlen) != KVR_OK) {
        kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_BAD_REQUESTS, 1);
        KVR_LOG_RATELIMITED(KVR_LOG_WARN, "kv events: a malformed replay request (%d frames) ignored", nfr);
        return;
    }
    if (topic != NULL)
        pool = pool_of_topic(k, topic, tlen);
    if (pool < 0 || (uint32_t)pool >= k->npools || !k->pool[pool].open || from >= k->pool[pool].next_seq) {
        reply(p, &fr[0], 0, NULL, 0); /* nothing to send: only the end marker */
        return;
    }
    kp = &k->pool[pool];
    if (from < kp->first_kept) {       /* the buffer lost it: the whole state as of the last seq */
        flush_pool(p, (uint32_t)pool); /* so that the state is exactly the last seq's */
        ok = state_batches(p, (uint32_t)pool, 0, &fr[0], kp->next_seq - 1);
        kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_RESYNCS, 1);
    } else {
        for (size_t i = 0; i < k->count && ok == KVR_OK; i++) {
            const kvev_kept_t *e = &k->ring[(k->head + i) % k->cap];
            if (e->pool == (uint32_t)pool && e->seq >= from)
                ok = reply(p, &fr[0], e->seq, e->data, e->len);
        }
        kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_REPLAYS, 1);
    }
    if (ok != KVR_OK || reply(p, &fr[0], 0, NULL, 0) != KVR_OK)
        kvr_stat_add(p->store.my_stats, KVR_ST_KVEV + KVR_KC_SEND_ERRORS, 1);
}

int pub_kvev_service(pub_t *p)
{
    struct pub_kvev *k = p->kvev;
    zmq_msg_t fr[5];
    int n, more;

    if (k == NULL || k->replay == NULL)
        return 0;
    for (int r = 0; r < REQUESTS_PER_TURN; r++) {
        n = 0;
        more = 1;
        while (more) {
            zmq_msg_t *m = &fr[n < 5 ? n : 4];
            if (n >= 5)
                zmq_msg_close(m); /* too many frames: keep reading them, the request is bad */
            zmq_msg_init(m);
            if (zmq_msg_recv(m, k->replay, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(m);
                for (int i = 0; i < n && i < 5; i++)
                    zmq_msg_close(&fr[i]);
                return 0; /* EAGAIN: none (a multipart message arrives whole) */
            }
            more = zmq_msg_more(m);
            n++;
        }
        answer(p, fr, n > 5 ? 6 : n);
        for (int i = 0; i < n && i < 5; i++)
            zmq_msg_close(&fr[i]);
    }
    return 1; /* perhaps more: look again soon */
}

int pub_kvev_fd(pub_t *p)
{
    int fd = -1;
    size_t sz = sizeof(fd);

    if (p->kvev == NULL || p->kvev->replay == NULL || zmq_getsockopt(p->kvev->replay, ZMQ_FD, &fd, &sz) != 0)
        return -1;
    return fd;
}
