"""
Socket options of the HTTP/1.1 data plane: --send-zc-min (zero-copy sends hold their pin until
the kernel lets go) and --recv-lowat (a raised SO_RCVLOWAT never holds back a body's tail).
"""

import time

import pytest

from conftest import KiB, MiB, SLOW, kv_path, make_block, raw_connect
from h1_raw import Reader, _req
from harness import wait_until


def test_send_zc_gets_are_byte_exact_and_release_their_pins(kvrelay):
    """--send-zc-min 1M: GETs of 1 MiB and more go out with IORING_OP_SENDMSG_ZC (the pin is
    held until the kernel's notification); smaller ones with sendmsg. Bodies are byte-exact,
    keep-alive and pipelining work across both kinds, and afterwards no pin is left."""
    srv = kvrelay("--memory", "256M", "--workers", "1", "--send-zc-min", "1M")
    blocks = {f"zc-{n}": make_block(n, f"zc-{n}") for n in (64 * KiB, MiB, 2 * MiB + 17, 40 * MiB)}
    for k, v in blocks.items():
        assert srv.put(k, bytes(v)).status == 201
    s = raw_connect(srv)
    rd = Reader(s)
    order = list(blocks) * 2
    s.sendall(b"".join(_req("GET", kv_path(k)) for k in order))
    for k in order:
        r = rd.response(30 * SLOW)
        assert r.status == 200 and r.body == blocks[k], k
    s.close()
    srv.assert_consistent()


@pytest.mark.parametrize("lowat", ["256K", "0"])
def test_recv_lowat_bodies_round_trip_and_the_tail_never_waits(kvrelay, lowat):
    """--recv-lowat L raises SO_RCVLOWAT while a PUT body of 2L or more is received, and lowers
    it for the body's last L bytes and for every other read. Bodies on both sides of 2L are
    byte-exact; a body whose last bytes come late completes as soon as they come (a raised mark
    on the tail would leave them queued until --io-timeout); the next request on the same
    connection, a small GET, is answered at once; after a client that stops mid-body, a new
    connection is served and nothing is left reserved."""
    srv = kvrelay("--memory", "256M", "--workers", "1", "--recv-lowat", lowat, "--io-timeout", "5s")
    L = 256 * KiB
    sizes = (2 * L - 1, 2 * L, 2 * L + 1, 3 * L + 7, 2 * MiB, 32 * MiB + 5)
    s = raw_connect(srv)
    rd = Reader(s)
    for n in sizes:
        key = f"lw-{lowat}-{n}"
        data = bytes(make_block(n, key))
        s.sendall(_req("PUT", kv_path(key), [("Content-Length", n)], data))
        assert rd.response(30 * SLOW).status == 201, n
        s.sendall(_req("GET", kv_path(key)))
        r = rd.response(30 * SLOW)
        assert r.status == 200 and r.body == data, n
    # the last 1,000 bytes of a 2 MiB body come 0.5 s late: the answer follows them at once
    n, key = 2 * MiB, f"lw-{lowat}-late"
    data = bytes(make_block(n, key))
    s.sendall(_req("PUT", kv_path(key), [("Content-Length", n)], data[:-1000]))
    time.sleep(0.5)  # the tail comes late on purpose: what the test is about
    t0 = time.monotonic()
    s.sendall(data[-1000:])
    assert rd.response(3 * SLOW).status == 201
    assert time.monotonic() - t0 < 2 * SLOW, "the tail waited"
    # a small GET right after on the same connection
    t0 = time.monotonic()
    s.sendall(_req("GET", kv_path(f"lw-{lowat}-{2 * L - 1}")))
    assert rd.response(3 * SLOW).status == 200
    assert time.monotonic() - t0 < 1 * SLOW
    s.close()
    # a client that stops 100 KiB into a 2 MiB body and goes away: nothing stays reserved
    c = raw_connect(srv)
    c.sendall(_req("PUT", kv_path(f"lw-{lowat}-cut"), [("Content-Length", 2 * MiB)], b"x" * (100 * KiB)))
    # the cut PUT's head has been read and its reservation taken before the client leaves
    wait_until(lambda: srv.debug_store()["reserved_blocks"] == 1, 10 * SLOW,
               what="the cut PUT to hold a reservation")
    c.close()
    assert srv.put(f"lw-{lowat}-after", b"y" * (3 * L)).status == 201
    srv.assert_consistent(limit=10.0)  # polls until the cut PUT's reservation is gone
    assert srv.get(f"lw-{lowat}-cut").status == 404
