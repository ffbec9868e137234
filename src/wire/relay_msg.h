/*
 * relay_msg.h — encoding dynamo.kvrelay.v1 FilterUpdate messages as gRPC messages, a pure
 * codec: the caller supplies the identities and the times (core/relay.c reads them from the
 * relay's state), this writes the bytes.
 */
#ifndef KVR_WIRE_RELAY_MSG_H
#define KVR_WIRE_RELAY_MSG_H

#include "common.h"
#include "wire/relay.pb-c.h"

/* Upper bound of the envelope kvr_wire_filter_update adds around a payload. */
#define KVR_RELAY_ENVELOPE_MAX 512

typedef struct {
    const Dynamo__Kvrelay__V1__RelayIdentity *relay;
    const Dynamo__Kvrelay__V1__ProducerIdentity *producer;
    uint64_t base_seq, seq, send_ts_us;
    int kind; /* Dynamo__Kvrelay__V1__FilterUpdateKind */
} kvr_wire_filter_update_t;

/*
 * Writes a gRPC-framed FilterUpdate into dst: the envelope (fields 1-7 and 127: protocol
 * version, identities, sequences, time, kind, contract marker) and then field 8 with
 * payload_len bytes, whose start is returned in *payload for the caller to fill (CBI1).
 * Returns the total message length, or 0 if cap is too small.
 */
size_t kvr_wire_filter_update(const kvr_wire_filter_update_t *u, size_t payload_len, uint8_t *dst, size_t cap,
                              uint8_t **payload);

#endif
