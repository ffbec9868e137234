/*
 * phr.h — the prototypes of picohttpparser as libh2o-evloop 2.2 exports it (Debian ships the
 * library, not the parser's header). One place, so that a change of layout is one edit. The
 * struct layouts are picohttpparser's own and must match the library exactly.
 */
#ifndef KVR_IO_PHR_H
#define KVR_IO_PHR_H

#include <stddef.h>
#include <sys/types.h>

struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};

/* Bytes of the head consumed, -2 when incomplete, -1 on a malformed head. */
int phr_parse_request(const char *buf, size_t len, const char **method, size_t *method_len, const char **path,
                      size_t *path_len, int *minor_version, struct phr_header *headers, size_t *num_headers,
                      size_t last_len);

/* Zero-filled before the first call. */
struct phr_chunked_decoder {
    size_t bytes_left_in_chunk;
    char consume_trailer;
    char _hex_count;
    char _state;
};

/* Decodes in place: *bufsz becomes the decoded length; returns the undecoded bytes left after
 * the body's end (>= 0), -2 when more is needed, -1 on malformed framing. */
ssize_t phr_decode_chunked(struct phr_chunked_decoder *decoder, char *buf, size_t *bufsz);

#endif
