"""
HTTP/1.1 framing on the io_uring path (src/io/h1.c) that a read's boundaries must not change:
pipelined requests behind a chunked body, delivered in one write and split at every byte, and
the Transfer-Encoding rules of RFC 9112 (§5.2 obs-fold, §6.1 codings).

Raw sockets throughout: a client library would frame for us. Every wait is bounded; the
server is stopped by PID by the fixture.
"""

import json
import socket
import time

import pytest

from conftest import KiB, SLOW, kv_path, module_server, raw_connect, unique_key
from h1_raw import Reader, _json_error, _one, _req


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
                time.sleep(gap_s)  # pacing so each piece tends to arrive in a read of its own
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


def test_pipelined_after_chunked_answered_409_or_dedup(srv):
    """A chunked PUT decided at its end as a dedup hit (200) or a conflict (409) keeps the
    connection, and the requests behind it run in order, in one write and split in two."""
    key = unique_key("chunk-dup")
    assert srv.put(key, b"hello").status == 201
    payload = (
        _req("PUT", kv_path(key), [("Transfer-Encoding", "chunked")], _chunked([b"hel", b"lo"]))
        + _req("PUT", kv_path(key), [("Transfer-Encoding", "chunked")], _chunked([b"hello!"]))
        + _req("GET", "/healthz")
        + _req("GET", kv_path(key))
    )
    for cut in (None, 60, len(payload) // 2, len(payload) - 5):
        pieces = [payload] if cut is None else [payload[:cut], payload[cut:]]
        resps = _send_pieces(srv, pieces, 4)
        assert [r.status for r in resps] == [200, 409, 200, 200], (cut, resps)
        assert resps[2].body == b"ok\n" and resps[3].body == b"hello", resps
    assert srv.delete(key).json()["refs"] == 4  # the first PUT and four dedup hits


# ------------------------------------------------------------------ Transfer-Encoding


def _te_put(key, te_headers, body=b"5\r\nhello\r\n0\r\n\r\n", follow=True):
    head = f"PUT {kv_path(key)} HTTP/1.1\r\nHost: x\r\n".encode() + b"".join(te_headers) + b"\r\n"
    return head + body + (_req("GET", "/healthz") if follow else b"")


@pytest.mark.parametrize("fold", [
    [b"Transfer-Encoding:\r\n chunked\r\n"],             # the whole value on the folded line
    [b"Transfer-Encoding: chunked,\r\n\tgzip\r\n"],      # part of it
    [b"Transfer-Encoding: chunked\r\n", b"X-A: b\r\n c\r\n"],  # a fold elsewhere, TE itself fine
])
def test_obs_fold_is_400(srv, fold):
    """RFC 9112 §5.2: obs-fold in a request is rejected with 400 (not 501 because the folded
    Transfer-Encoding line looked like an unknown coding), and the connection closes."""
    key = unique_key("fold")
    r = _one(srv, _te_put(key, fold))
    doc = _json_error(r, 400)
    assert doc["error"] == "InvalidRequest", doc
    assert r.header("connection") == "close", r
    assert srv.get(key).status == 404


@pytest.mark.parametrize("te", [
    [b"Transfer-Encoding: chunked, chunked\r\n"],
    [b"Transfer-Encoding: chunked,chunked\r\n"],
    [b"Transfer-Encoding: chunked\r\n", b"Transfer-Encoding: chunked\r\n"],
    [b"Transfer-Encoding: chunked\r\n", b"Transfer-Encoding: CHUNKED\r\n"],
    [b"Transfer-Encoding: \r\n"],
    [b"Transfer-Encoding: ,\r\n"],
])
def test_chunked_more_than_once_or_empty_is_400(srv, te):
    """chunked applied twice (in one list or across two headers), or a Transfer-Encoding that
    names no coding: the framing is malformed, 400 and close; nothing after it runs."""
    key = unique_key("te2")
    r = _one(srv, _te_put(key, te))
    doc = _json_error(r, 400)
    assert doc["error"] == "InvalidRequest", doc
    assert r.header("connection") == "close", r
    assert srv.get(key).status == 404


@pytest.mark.parametrize("te", [
    [b"Transfer-Encoding: gzip\r\n"],
    [b"Transfer-Encoding: gzip, chunked\r\n"],
    [b"Transfer-Encoding: gzip\r\n", b"Transfer-Encoding: chunked\r\n"],
    [b"Transfer-Encoding: x-custom\r\n"],
])
def test_unknown_coding_is_501(srv, te):
    key = unique_key("te501")
    r = _one(srv, _te_put(key, te))
    doc = _json_error(r, 501)
    assert doc["error"] == "NotImplemented", doc
    assert srv.get(key).status == 404


@pytest.mark.parametrize("te", [b"Transfer-Encoding: chunked \r\n", b"Transfer-Encoding: , chunked,\r\n"])
def test_chunked_with_whitespace_and_empty_elements_is_accepted(srv, te):
    """RFC 9110 §5.6.1: a list's empty elements and optional whitespace are ignored."""
    key = unique_key("te-ows")
    resps = _send_pieces(srv, [_te_put(key, [te])], 2)
    assert [r.status for r in resps] == [201, 200], resps
    assert srv.get(key).body == b"hello"
