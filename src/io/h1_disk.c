/*
 * h1_disk.c — a GET whose block is read from the disk tier (api.h, "A GET whose key is not in
 * RAM"; docs/ssd-tier.md, "Reads and promotion"). See h1_int.h for the parts of the server.
 *
 * The reads go through the worker's ring on the connection's read op, 64 pieces of the
 * reservation at a time, so the connection is never freed while the kernel may still write into
 * the reserved pages (rbusy), and a connection that goes meanwhile gives the reservation back
 * from its last completion (kvr_api_done).
 */
#include "io/h1_int.h"

#include <errno.h>

static void disk_read(h1c_t *c)
{
    uint64_t off;
    int n = kvr_api_disk_iov(c->s->api, &c->res, c->iov, H1_IOV, &off);

    if (n <= 0 || kvr_uring_preadv(&c->s->ring, c->s->api->ssd_fd, c->iov, n, off, &c->rop) != KVR_OK) {
        kvr_h1_disk_done(c, -EIO);
        return;
    }
    c->rbusy = 1;
}

void kvr_h1_disk_start(h1c_t *c)
{
    c->state = ST_DISK;
    c->last_ms = kvr_clock_coarse_ms();
    disk_read(c);
}

void kvr_h1_disk_done(h1c_t *c, int res)
{
    c->last_ms = kvr_clock_coarse_ms();
    if (kvr_api_disk_step(c->s->api, &c->res, res))
        disk_read(c);
    else
        kvr_h1_respond(c);
}
