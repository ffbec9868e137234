/*
 * common.h — the few things every kvrelay module shares: status codes, byte-order
 * helpers for wire codecs, branch hints and forward declarations of central types.
 *
 * Status convention: functions return KVR_OK (0) on success, a negative KVR_E* code on a
 * failure the caller must handle, and syscall wrappers return -errno. A layer uses few codes
 * and unwinds a multi-step setup through one `fail:` label.
 */
#ifndef KVR_COMMON_H
#define KVR_COMMON_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KVR_OK        0
#define KVR_ERR       -1 /* generic failure, already logged */
#define KVR_AGAIN     -2 /* try again later (would block, busy) */
#define KVR_ENOTFOUND -3 /* no such key */
#define KVR_ECONFLICT -4 /* same key, different length */
#define KVR_ENOSPACE  -5 /* no room even after eviction */
#define KVR_EINVAL    -6 /* invalid argument (bad key, bad size) */
#define KVR_EBUSY     -7 /* a per-process table (pins) is full */
#define KVR_EQUOTA    -8 /* the namespace's memory quota cannot hold it */

#define KVR_LIKELY(x)   __builtin_expect(!!(x), 1)
#define KVR_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define KVR_ARRAY_SIZE(a)  (sizeof(a) / sizeof((a)[0]))
#define KVR_ALIGN_UP(x, a) (((x) + ((a)-1)) & ~((__typeof__(x))(a)-1))
#define KVR_CACHELINE      64
#define KVR_NIL            UINT32_MAX /* no entry, no page: the null index of every shared table */
/* Longest key in bytes, decoded (wire/keys.h decodes to it, the store keeps up to it). */
#define KVR_KEY_MAX 1024

/* Little-/big-endian loads and stores for wire codecs: never cast structs onto bytes. */
static inline uint16_t kvr_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t kvr_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t kvr_le64(const uint8_t *p)
{
    return (uint64_t)kvr_le32(p) | ((uint64_t)kvr_le32(p + 4) << 32);
}
static inline uint8_t *kvr_put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    return p + 2;
}
static inline uint8_t *kvr_put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
    return p + 4;
}
static inline uint8_t *kvr_put_le64(uint8_t *p, uint64_t v)
{
    kvr_put_le32(p, (uint32_t)v);
    return kvr_put_le32(p + 4, (uint32_t)(v >> 32));
}
static inline uint32_t kvr_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline uint8_t *kvr_put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
    return p + 4;
}

/* Central types, declared once. */
typedef struct kvr_seg_s kvr_seg_t;     /* a process's handle on the shared segment */
typedef struct kvr_store_s kvr_store_t; /* a process's handle on the block store */

#define KVR_NS_MAX     64 /* namespaces: "default" (id 0) and up to 63 from --tenants */
#define KVR_NS_DEFAULT 0
#define KVR_MODEL_MAX  128 /* bytes of a model name (wire/keys.h, kvr_model_valid) */
#define KVR_POOLS_MAX  256 /* relay pools, one per (namespace, model): the most --max-pools allows */

#endif
