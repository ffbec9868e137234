"""
POST /batch/get against the real server: the framing of docs/http-contract.md ("Batches") —
"KVRB", u32 LE count, per key a 16-byte record (u8 found, 7 zero bytes, u64 LE length) and the
block's bytes — byte-exact in the request's order, over the io_uring HTTP/1.1 path and over
h2o (h2c, TLS with HTTP/1.1 and h2). Each limit is pushed past: 128 keys, the found bytes over
--max-block-size, this worker's 1,024 batch pins in flight; and the pins go when the response
is out (or refused, or abandoned).
"""

import socket
import struct

import pytest

from conftest import SLOW, MiB, make_block, quote_key
from harness import wait_until

KiB = 1 << 10
MAX_BLOCK = 4 * MiB


ARGS = ("--memory", "96M", "--workers", "1", "--max-block-size", str(MAX_BLOCK))


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tls_cert):
    """A plain server (io_uring HTTP/1.1, h2c) and a TLS one (h2o, HTTP/1.1 and h2)."""
    from conftest import module_server
    s = {"plain": module_server(tmp_path_factory, "batchget", args=ARGS),
         "tls": module_server(tmp_path_factory, "batchget-tls", tls=tls_cert, args=ARGS)}
    yield s
    for v in s.values():
        v.stop()


@pytest.fixture(scope="module")
def srv(servers):
    return servers["plain"]


class Both:
    """put/assert_consistent on both servers; the rest from the plain one."""

    def __init__(self, servers):
        self.servers = servers

    def put(self, key, data):
        rs = [s.put(key, data) for s in self.servers.values()]
        return rs[0] if all(r.status == rs[0].status for r in rs) else rs[-1]

    def assert_consistent(self):
        for s in self.servers.values():
            s.assert_consistent()


def _lines(keys):
    return "\n".join(quote_key(k) for k in keys).encode()


def parse(body, n):
    """The framed answer -> [bytes or None] (asserting every rule of the framing)."""
    assert body[:4] == b"KVRB" and struct.unpack_from("<I", body, 4)[0] == n
    pos, out = 8, []
    for _ in range(n):
        found, length = struct.unpack_from("<B7xQ", body, pos)
        assert body[pos + 1:pos + 8] == b"\0" * 7
        pos += 16
        assert found in (0, 1)
        if not found:
            assert length == 0
            out.append(None)
            continue
        out.append(bytes(body[pos:pos + length]))
        pos += length
    assert pos == len(body), "bytes after the last record"
    return out


def plain_post(srv, path, body, timeout=20.0):
    """POST over plain HTTP/1.1 (the io_uring path), the raw answer."""
    with socket.create_connection((srv.host, srv.port), timeout=timeout) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                  "Connection: close\r\n\r\n".encode() + body)
        data = bytearray()
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            data += chunk
    head, _, rest = bytes(data).partition(b"\r\n\r\n")
    status = int(head.split()[1])
    hdrs = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    assert int(hdrs[b"Content-Length"]) == len(rest)
    return status, hdrs, rest


MODES = ["h1-uring", "curl-tls-h1", "curl-tls-h2", "curl-h2c"]


def post(srv, mode, path, body):
    """srv: a Both; the TLS modes go to the TLS server."""
    if mode == "h1-uring":
        status, _h, data = plain_post(srv.servers["plain"], path, body)
        return status, data
    target = srv.servers["tls" if mode.startswith("curl-tls") else "plain"]
    r = target.curl(mode, "POST", path, body=body)
    assert r.error is None, r.error
    return r.status, r.body


@pytest.fixture(scope="module")
def both(servers):
    return Both(servers)


@pytest.fixture(scope="module")
def blocks(both):
    """Blocks of several sizes, one spanning many arena pages, and an empty one."""
    b = {"a": b"AAAA", "b/c": make_block(100_000, "bc"), "big": make_block(3 * MiB + 7, "big"), "e": b""}
    for k, v in b.items():
        assert both.put(k, v).status == 201
    return b


@pytest.mark.parametrize("mode", MODES)
def test_blocks_in_request_order_with_misses(both, blocks, mode):
    keys = ["a", "missing", "big", "b/c", "e", "a", "nope"]
    status, body = post(both, mode, "/batch/get", _lines(keys))
    assert status == 200
    assert parse(body, len(keys)) == [blocks.get(k) for k in keys]
    both.assert_consistent()


@pytest.mark.parametrize("mode", ["h1-uring", "curl-tls-h2"])
def test_128_keys_past_the_per_send_iovec_batch(both, mode):
    # 128 blocks = 257+ iovecs: the body goes out in several sendmsg / h2o_send batches, each
    # resuming at the sent offset
    keys = [f"many-{mode}/{i}" for i in range(128)]
    data = {k: make_block(16 * KiB + i, k) for i, k in enumerate(keys)}
    for k in keys:
        assert both.put(k, data[k]).status == 201
    status, body = post(both, mode, "/batch/get", _lines(keys))
    assert status == 200
    assert parse(body, 128) == [data[k] for k in keys]
    both.assert_consistent()


def _json_error(status, body, want_status, code):
    import json
    assert status == want_status, (status, body[:200])
    doc = json.loads(body)
    assert doc["error"] == code and doc["message"]
    return doc


@pytest.mark.parametrize("mode", ["h1-uring", "curl-tls-h2"])
def test_more_than_128_keys_is_413(both, blocks, mode):
    status, body = post(both, mode, "/batch/get", _lines(["a"] * 128))
    assert status == 200 and parse(body, 128) == [b"AAAA"] * 128
    status, body = post(both, mode, "/batch/get", _lines(["a"] * 129))
    assert "128 keys" in _json_error(status, body, 413, "EntityTooLarge")["message"]
    both.assert_consistent()


@pytest.mark.parametrize("mode", ["h1-uring", "curl-tls-h2"])
def test_found_bytes_over_max_block_size_is_413(both, blocks, mode):
    # big (3 MiB) + b/c fits the 4 MiB bound; big twice does not: refused, its pins released
    status, body = post(both, mode, "/batch/get", _lines(["big", "b/c", "missing"]))
    assert status == 200
    status, body = post(both, mode, "/batch/get", _lines(["a", "big", "missing", "big"]))
    assert "--max-block-size" in _json_error(status, body, 413, "EntityTooLarge")["message"]
    both.assert_consistent()


def test_bad_lines_methods_and_framing_errors(srv, blocks):
    status, _h, body = plain_post(srv, "/batch/get", b"a\n%zz")
    assert "line 2" in _json_error(status, body, 400, "InvalidRequest")["message"]
    status, _h, body = plain_post(srv, "/batch/get", b"a\n\nb")
    assert "line 2" in _json_error(status, body, 400, "InvalidRequest")["message"]
    r = srv.request("GET", "/batch/get")
    assert r.status == 405 and r.header("allow") == "POST"
    # the route is outside /kv/: the key "batch/get" is still a key
    assert srv.request("GET", "/kv/batch/get").status == 404
    srv.assert_consistent()


def _hold(srv, body):
    """Sends a batch GET and reads none of the answer: its pins stay while it is unsent."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answer cannot be absorbed
    s.settimeout(20)
    s.connect((srv.host, srv.port))
    s.sendall(f"POST /batch/get HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def test_batch_pins_in_flight_per_worker_are_bounded(kvrelay):
    # 8 held answers of 128 pins each reach the worker's 1,024; the next batch is 503 with
    # Retry-After until one of them goes, then served. Single GETs are never refused.
    srv = kvrelay("--memory", "64M", "--workers", "1")
    blk = make_block(128 * KiB, "held")
    assert srv.put("held", blk).status == 201
    assert srv.put("small", b"s").status == 201
    body = _lines(["held"] * 128)  # 16 MiB per answer, far past any socket buffer
    held = [_hold(srv, body) for _ in range(8)]
    try:
        wait_until(lambda: srv.debug_store()["pinned_blocks"] == 1, 10 * SLOW, interval=0.02,
                   what="the 8 held batches to pin the block")
        status, hdrs, data = plain_post(srv, "/batch/get", _lines(["small"]))
        assert status == 503 and hdrs.get(b"retry-after") == b"1", (status, data)
        _json_error(status, data, 503, "Busy")
        assert srv.get("small").body == b"s"  # a single GET still has pins
        held.pop().close()

        def served():
            status, _h, data = plain_post(srv, "/batch/get", _lines(["small"]))
            return data if status == 200 else None

        data = wait_until(served, 10 * SLOW, what="a batch GET to be served again once a held one closed")
        assert parse(data, 1) == [b"s"]
    finally:
        for s in held:
            s.close()
    srv.assert_consistent()
