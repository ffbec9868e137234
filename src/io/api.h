/*
 * api.h — kvrelay's HTTP request layer, one for every transport.
 *
 * Routing, authentication, key decoding, status codes, JSON errors, the store calls and the
 * request metrics live here once. The transports — the io_uring HTTP/1.1 path (h1*.c) and the
 * h2o paths (http.c: TLS, h2c) — parse their own framing, fill a kvr_api_req_t from the
 * request head, and carry out the kvr_api_res_t they get back. The contract itself is in
 * docs/http-contract.md.
 *
 * A PUT is decided from its head: authorisation, key, Content-Length against
 * --max-block-size, a length conflict, a dedup hit and "no room even after eviction" are all
 * known before the first body byte is read. For a new block kvr_api_handle reserves its entry
 * and pages (res->put == KVR_API_PUT_RESERVED) and the transport receives the body straight
 * into the reservation's spans (kvr_api_txn_iov); a dedup hit (KVR_API_PUT_DEDUP) has already
 * taken its reference and the transport only consumes the body. Either way the transport then
 * calls kvr_api_put_end, with ok = 0 when the body did not arrive whole: the reservation is
 * given back, or the dedup reference dropped again, and nothing of the PUT remains.
 *
 * Life of a response: kvr_api_handle fills it; the transport sends it; kvr_api_done releases
 * what it holds (a GET's pin, a metrics page) and counts the request. Every response carries a
 * body that is either inline (JSON, text), a pinned block (GET) or a heap buffer (/metrics).
 */
#ifndef KVR_IO_API_H
#define KVR_IO_API_H

#include "common.h"
#include "base/clock.h"
#include "core/config.h"
#include "core/relay.h"
#include "core/store.h"
#include "io/metrics.h"
#include "shm/stats.h"

#include <sys/uio.h>

/* POST is counted as "other" in the metrics (kvr_api_done). */
enum { KVR_M_GET,
       KVR_M_PUT,
       KVR_M_HEAD,
       KVR_M_DELETE,
       KVR_M_OTHER,
       KVR_M_POST };

#define KVR_API_MAX_HEAD   (16u << 10) /* request line + headers; 431 beyond */
#define KVR_API_INLINE_MAX 8192        /* JSON bodies: a 1,024-byte key escaped 6x fits */
/* POST /batch/exists and /batch/delete (docs/http-contract.md, "Batches"): the body is the
 * keys, one per line, percent-encoded as in a path. */
#define KVR_API_BATCH_MAX_KEYS 4096
#define KVR_API_BATCH_MAX_BODY (1u << 20)
/* POST /batch/get: the same body; the answer frames each block (docs/http-contract.md) and its
 * bytes are sent from the segment, so every found block is pinned until the response is out.
 * Bounds: keys per request, found bytes per response (--max-block-size: no more than the
 * largest single GET) and this worker's batch pins in flight (a quarter of the 4,096-slot pin
 * table, so that batches never starve single GETs of pins). */
#define KVR_API_BATCH_GET_MAX_KEYS 128
#define KVR_API_BATCH_GET_MAX_PINS 1024

typedef struct {
    const kvr_config_t *cfg;
    kvr_seg_t *seg;
    kvr_store_t *store;
    kvr_relay_t *relay;
    struct kvr_api_auth_s *auth; /* the tenants view and this worker's answers (api_auth.c) */
    int draining;                /* this worker is draining: /readyz says 503 */
    uint64_t inflight;           /* bytes of this worker's PUT reservations not yet committed */
    uint64_t inflight_cap;       /* this worker's share of --max-inflight-bytes */
    uint64_t peer_cap;           /* what one peer address may hold of it (--peer-inflight-share) */
    uint32_t batch_pins;         /* pins held by this worker's batch GET responses */
    int ssd_fd;                  /* the disk tier's file, read-only (api_disk.c); -1: not open */
    unsigned disk_reads;         /* GETs of this worker reading from the disk tier now */
    int disk_warned;             /* a bad record was logged (once per worker) */
} kvr_api_t;

/* GETs of one worker reading from the disk tier at once; more wait their turn as a 503. */
#define KVR_API_DISK_READS_MAX 64

/* What a transport knows of a request once its head is parsed. */
typedef struct {
    unsigned method;  /* KVR_M_* */
    const char *path; /* raw path, query stripped */
    size_t path_len;
    const char *auth; /* Authorization value, or NULL */
    size_t auth_len;
    const char *seq_hash; /* X-KV-Sequence-Hash value, or NULL */
    size_t seq_hash_len;
    const char *model; /* X-KV-Model value (a PUT's relay pool), or NULL */
    size_t model_len;
    uint64_t body_len;  /* Content-Length (PUT), or the whole chunked body */
    size_t head_bytes;  /* request line + header names and values */
    int length_unknown; /* chunked, not received yet: check the head only */
    int buffered;       /* the body is already in memory (h2o): no budget applies */
    uint64_t peer_held; /* reservation bytes the client's address holds in this worker */
} kvr_api_req_t;

enum { KVR_API_BODY_INLINE,
       KVR_API_BODY_BLOCK,
       KVR_API_BODY_HEAP };
/* DEFERRED: a chunked PUT passed every check of its head and comes back with its length; WAIT:
 * this worker's PUT reservations in flight are at their budget, ask again later. */
enum { KVR_API_PUT_NONE,
       KVR_API_PUT_RESERVED,
       KVR_API_PUT_DEDUP,
       KVR_API_PUT_DEFERRED,
       KVR_API_PUT_WAIT };
/* A batch request passed every check of its head: the transport collects the body (at most
 * KVR_API_BATCH_MAX_BODY) in memory and calls kvr_api_batch. Shares res->put's field. */
#define KVR_API_BODY_WANTED 16

typedef struct {
    int status; /* 0 while a reserved PUT waits for its body */
    const char *reason;
    const char *ctype;    /* Content-Type, or NULL */
    const char *hdr_name; /* one extra header, lower case (allow, www-authenticate, retry-after) */
    const char *hdr_value;
    int close;       /* the connection must end after this response */
    int drain;       /* answered before its body: the transport consumes the body after it */
    unsigned body;   /* KVR_API_BODY_* */
    uint64_t length; /* Content-Length of the representation */
    int head_only;   /* HEAD: the length is announced, no body bytes follow */
    /* BLOCK */
    kvr_block_ref_t ref;
    int pinned;
    /* HEAP */
    char *heap;
    /* BLOCK of a batch GET: several pinned blocks and their framing (api_batch.c, "batch GET") */
    struct kvr_api_multi_s *multi;
    /* the caller, as its bearer token says (docs/tenancy.md): every store operation of the
     * request runs in namespace ns; admin opens /debug and /metrics when tenants are on */
    uint16_t ns;
    uint8_t admin;
    /* GET from the disk tier (api_disk.c): set while the block is read into its reservation */
    struct kvr_api_disk_s *dk;
    /* PUT */
    unsigned put; /* KVR_API_PUT_* */
    kvr_put_txn_t txn;
    uint64_t put_len;
    uint16_t klen;
    uint8_t key[KVR_KEY_MAX];
    /* INLINE */
    size_t inline_len;
    char inline_buf[KVR_API_INLINE_MAX];
} kvr_api_res_t;

/*
 * A GET whose key is not in RAM but in the disk tier (api_disk.c; docs/ssd-tier.md, "Reads and
 * promotion"). kvr_api_handle leaves res->dk set and res->status 0: the transport reads the
 * record with kvr_api_disk_iov (iovecs for the rest of it, and the file offset) until
 * kvr_api_disk_step says it is whole, which decides the response (the block promoted to RAM and
 * pinned: 200; anything wrong: a miss, 404). kvr_api_disk_abort gives the reservation back when
 * the connection goes (never while a read into it is in flight); kvr_api_done calls it too.
 * kvr_api_disk_sync does all of it with blocking reads (the h2o transport).
 */
int kvr_api_disk_iov(kvr_api_t *a, kvr_api_res_t *res, struct iovec *iov, int max, uint64_t *off);
int kvr_api_disk_step(kvr_api_t *a, kvr_api_res_t *res, int n);
void kvr_api_disk_abort(kvr_api_t *a, kvr_api_res_t *res);
void kvr_api_disk_sync(kvr_api_t *a, kvr_api_res_t *res);

/* KVR_OK, or KVR_ERR when out of memory. */
int kvr_api_init(kvr_api_t *a, const kvr_config_t *cfg, kvr_seg_t *seg, kvr_store_t *store, kvr_relay_t *relay);

/* Method name -> KVR_M_*. */
unsigned kvr_api_method(const char *m, size_t n);

/* Decides the request. Always fills *res (which the caller zero-initialises: kvr_api_res_reset). */
void kvr_api_handle(kvr_api_t *a, const kvr_api_req_t *rq, kvr_api_res_t *res);

/* Payload spans of a reserved PUT from offset off; returns the count (<= max). */
size_t kvr_api_txn_iov(kvr_api_t *a, const kvr_api_res_t *res, uint64_t off, struct iovec *iov, size_t max);

/* 1 when a PUT of len bytes would get a reservation now (not KVR_API_PUT_WAIT). */
int kvr_api_put_fits(const kvr_api_t *a, uint64_t len);
/* 1 when a peer address holding `held` reservation bytes may take len more (--peer-inflight-share;
 * its first reservation always may). */
int kvr_api_peer_fits(const kvr_api_t *a, uint64_t held, uint64_t len);

/* Copies body bytes into the reservation at offset off: for bodies a transport already holds in
 * memory (h2o's buffered bodies, the few body bytes that arrived with an io_uring head). */
void kvr_api_put_write(kvr_api_t *a, kvr_api_res_t *res, uint64_t off, const void *data, uint64_t len);

/* The body of a PUT is in (ok = 1) or will never be (ok = 0). With ok it fills the answer. */
void kvr_api_put_end(kvr_api_t *a, kvr_api_res_t *res, int ok);

/* The body of a KVR_API_BODY_WANTED request has arrived: answers it. */
void kvr_api_batch(kvr_api_t *a, const kvr_api_req_t *rq, const char *body, size_t len, kvr_api_res_t *res);

/* A transport-level error (framing, limits) as the contract's JSON. */
void kvr_api_error(kvr_api_res_t *res, int status, const char *code, const char *msg);

/* The body bytes of an INLINE or HEAP response. */
const char *kvr_api_body_bytes(const kvr_api_res_t *res);

/* Payload spans of a BLOCK response from offset off; returns the count (<= max). */
size_t kvr_api_block_iov(kvr_api_t *a, const kvr_api_res_t *res, uint64_t off, struct iovec *iov, size_t max);

/* The response has been sent (or abandoned): release its pin or buffer and count it. */
void kvr_api_done(kvr_api_t *a, kvr_api_res_t *res, unsigned method, uint64_t start_us, uint64_t bytes_in,
                  uint64_t bytes_out);

/* Resets a response for reuse (keeps nothing). */
void kvr_api_res_reset(kvr_api_res_t *res);

#endif
