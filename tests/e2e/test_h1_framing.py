"""
HTTP/1.1 framing on the io_uring path (src/io/h1.c) that a read's boundaries must not change:
pipelined requests behind a chunked body, delivered in one write and split at every byte.

Raw sockets throughout: a client library would frame for us. Every wait is bounded; the
server is stopped by PID by the fixture.
"""

import json
import socket
import time

import pytest

from conftest import KiB, SLOW, kv_path, module_server, raw_connect, unique_key
from test_dataplane import Reader, _req


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = module_server(tmp_path_factory, "framing", args=("--memory", "64M", "--workers", "1"))
    yield s
    s.stop()


def _chunked(pieces, ext=None, trailers=()):
    """A chunked body: each piece one chunk (the first with a chunk extension), then the last
    chunk and the trailer section."""
    out = bytearray()
    for i, p in enumerate(pieces):
        out += b"%x" % len(p)
        if i == 0 and ext:
            out += ext
        out += b"\r\n" + p + b"\r\n"
    out += b"0\r\n" + b"".join(t + b"\r\n" for t in trailers) + b"\r\n"
    return bytes(out)


def _pipeline(tag):
    """A chunked PUT and four requests behind it: (bytes, [(status, body or None)], {key: data}).
    The length does not depend on tag's value, only on its length."""
    k1, k2 = f"pipe-{tag}-a", f"pipe-{tag}-b"
    d1 = b"hello" + b"\r\n0\r\n\r\n" + bytes(range(256))[:40] + f"<{tag}>".encode()  # framing-like bytes inside the data
    d2 = f"second block {tag}".encode() * 3
    body1 = _chunked([d1[:5], d1[5:13], d1[13:]], ext=b";name=value", trailers=(b"X-Trailer: t",))
    body2 = _chunked([d2[:7], d2[7:]])
    payload = (
        _req("PUT", kv_path(k1), [("Transfer-Encoding", "chunked")], body1)
        + _req("GET", kv_path(k1))
        + _req("PUT", kv_path(k2), [("Transfer-Encoding", "Chunked")], body2)
        + _req("GET", "/healthz")
        + _req("GET", kv_path(k2))
    )
    want = [(201, None), (200, d1), (201, None), (200, b"ok\n"), (200, d2)]
    return payload, want, {k1: d1, k2: d2}


def _send_pieces(srv, pieces, nresp, gap_s=0.002):
    """Sends pieces on one connection with TCP_NODELAY and a short pause between them (so that
    each tends to arrive in a read of its own), then reads nresp responses in order."""
    s = raw_connect(srv)
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i, p in enumerate(pieces):
            if i:
                time.sleep(gap_s)
            s.sendall(p)
        rd = Reader(s)
        return [rd.response(5 * SLOW) for _ in range(nresp)]
    finally:
        s.close()


def _check(resps, want, tag):
    assert len(resps) == len(want)
    for i, (r, (status, body)) in enumerate(zip(resps, want)):
        assert r.status == status, f"{tag}: response {i}: {r!r}"
        if body is not None:
            assert r.body == body, f"{tag}: response {i}: body differs: {r!r}"
    assert json.loads(resps[0].body)["bytes"] == len(want[1][1]), resps[0]
    assert json.loads(resps[2].body)["bytes"] == len(want[4][1]), resps[2]


def test_pipelined_after_chunked_in_one_write(srv):
    """The head's own read takes the whole chunked body and the requests behind it."""
    tag = unique_key("one")
    payload, want, blocks = _pipeline(tag)
    assert len(payload) < 2048, "must fit one head read (H1_HEAD_READ)"
    _check(_send_pieces(srv, [payload], len(want)), want, tag)
    for k, d in blocks.items():
        assert srv.get(k).body == d


def test_pipelined_after_chunked_split_at_every_byte(srv):
    """The same bytes in two writes, split at every byte boundary: inside the head, the chunk
    sizes, extensions, data, the last chunk, the trailer and the pipelined requests."""
    t0 = time.monotonic()
    n = len(_pipeline("0000")[0])
    for cut in range(1, n):
        tag = f"{cut:04d}"
        payload, want, blocks = _pipeline(tag)
        assert len(payload) == n
        _check(_send_pieces(srv, [payload[:cut], payload[cut:]], len(want)), want, f"split at {cut}")
        assert time.monotonic() - t0 < 50 * SLOW, f"too slow: {cut} of {n} splits done"
    # every block is there, byte-exact, also when read on a connection of its own
    for cut in (1, n // 2, n - 1):
        for k, d in _pipeline(f"{cut:04d}")[2].items():
            assert srv.get(k).body == d, k
    srv.assert_consistent()


def test_pipelined_after_large_chunked_body(srv):
    """A body longer than one read (the head read takes 2 KiB, a chunked read at most the head
    buffer): the read that finds the end also takes the next requests, here a long head too."""
    key, key2 = unique_key("bigchunk"), unique_key("bigchunk2")
    data = bytes((i * 7 + 3) & 0xFF for i in range(200 * KiB))
    pieces = [data[i:i + 3000] for i in range(0, len(data), 3000)]
    long_head = _req("GET", kv_path(key), [("X-Pad", "p" * (12 * KiB))])
    payload = (
        _req("PUT", kv_path(key), [("Transfer-Encoding", "chunked")], _chunked(pieces))
        + long_head
        + _req("PUT", kv_path(key2), [("Transfer-Encoding", "chunked")], _chunked([data[:5000]]))
        + _req("GET", kv_path(key2))
    )
    resps = _send_pieces(srv, [payload], 4)
    assert [r.status for r in resps] == [201, 200, 201, 200], resps
    assert resps[1].body == data and resps[3].body == data[:5000]
