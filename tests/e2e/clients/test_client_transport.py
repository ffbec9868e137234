"""
kvrelay.Client's transport: receiving into a caller's buffer, gathered sends, batch
existence checks (POST /batch/exists) on the kept-alive connection, and each limit of the response parser (kvrelay/_http.py)
pushed past against a canned server — a refused response is a miss, never an exception.
"""

import socket
import threading
import time

import pytest

from .conftest import MiB

from conftest import SLOW  # noqa: E402

from kvrelay import Client  # noqa: E402
from kvrelay import _http  # noqa: E402
from kvrelay.client import BATCH_MAX_KEYS  # noqa: E402


def test_get_into_put_memoryview_and_exists_many(kvrelay):
    srv = kvrelay("--memory", "256M", "--workers", "1")
    with Client(url=srv.base_url, max_connections=2) as c:
        data = bytearray(range(256)) * (4 * MiB // 256)
        view = memoryview(data)[MiB:3 * MiB]  # a slice: sent as it is
        assert c.put("mv", view)
        assert srv.get("mv").body == bytes(view)
        out = bytearray(2 * MiB)
        assert c.get_into("mv", out) == 2 * MiB and out == view
        dst = memoryview(bytearray(4 * MiB))[MiB:3 * MiB]  # into the middle of a buffer
        assert c.get_into("mv", dst) == 2 * MiB and dst == view
        assert c.get_into("mv", bytearray(10)) is None  # another length: a miss
        assert c.get_into("nope", bytearray(10)) is None
        assert c.get_into("mv", b"read-only") is None  # not writable: a miss, no raise
        assert c.errors == 1
        # a value of a few bytes under the same connection still works after the refusals
        assert c.put("small", b"abc") and c.get("small") == b"abc"

        keys = [f"e{i}" for i in range(1500)]
        for k in keys[::3]:
            assert c.put(k, b"x")
        opened = c.connections_opened
        t0 = time.monotonic()
        got = c.exists_many(keys)
        took = time.monotonic() - t0
        assert got == [i % 3 == 0 for i in range(1500)]
        assert c.connections_opened == opened, "the batch must use the kept-alive connection"
        # more keys than one batch request carries: cut in pieces, still exact
        many = [f"e{i}" for i in range(BATCH_MAX_KEYS + 10)]
        assert c.exists_many(many) == [i % 3 == 0 and i < 1500 for i in range(len(many))]
        print(f"exists_many 1500 keys: {took * 1000:.1f} ms")


class Canned:
    """A server that answers every request with the same bytes (bounded accepts)."""

    def __init__(self, reply):
        self.reply = reply
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(16)
        self.port = self.s.getsockname()[1]
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.serve, daemon=True)
        self.t.start()

    def serve(self):
        self.s.settimeout(0.1)
        for _ in range(200):
            if self.stop.is_set():
                return
            try:
                conn, _ = self.s.accept()
            except socket.timeout:
                continue
            try:
                conn.settimeout(1.0)
                conn.recv(65536)
                conn.sendall(self.reply)
                time.sleep(0.05)  # the scripted server's behaviour: a pause before it closes
            except OSError:
                pass
            finally:
                conn.close()

    def close(self):
        self.stop.set()
        self.t.join(5)
        self.s.close()


LIMIT_CASES = {
    "status line over MAX_LINE": b"HTTP/1.1 200 " + b"O" * _http.MAX_LINE + b"\r\n\r\n",
    "header line over MAX_LINE": b"HTTP/1.1 200 OK\r\nX: " + b"v" * _http.MAX_LINE + b"\r\nContent-Length: 0\r\n\r\n",
    "more than MAX_HEADERS": b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (_http.MAX_HEADERS + 1) + b"Content-Length: 0\r\n\r\n",
    "head over MAX_HEAD_BYTES": b"HTTP/1.1 200 OK\r\n" + (b"X: " + b"v" * 2000 + b"\r\n") * 40 + b"Content-Length: 0\r\n\r\n",
    "Content-Length over max_body": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (_http.DEFAULT_MAX_BODY + 1),
    "Content-Length not a number": b"HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\nhello world!",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "no Content-Length": b"HTTP/1.1 200 OK\r\n\r\nhello",
    "bad status line": b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    "interim response": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
}


@pytest.mark.parametrize("case", sorted(LIMIT_CASES))
def test_parser_limits(case):
    srv = Canned(LIMIT_CASES[case])
    try:
        with Client(url=f"http://127.0.0.1:{srv.port}", timeout_s=2.0 * SLOW) as c:
            assert c.get("k") is None
            assert c.get_into("k", bytearray(12)) is None
            assert c.put("k", b"v") is False
            assert c.errors == 3, case
            with pytest.raises((_http.ProtocolError, ConnectionError)):
                c.fetch("k")
    finally:
        srv.close()


def test_parser_accepts_at_the_limits():
    """Exactly at each bound is accepted (the limits are not off by one)."""
    line = b"X: " + b"v" * (_http.MAX_LINE - 5) + b"\r\n"
    assert len(line) == _http.MAX_LINE
    reply = (b"HTTP/1.1 200 OK\r\n" + line + b"Y: y\r\n" * (_http.MAX_HEADERS - 2)
             + b"Content-Length: 5\r\n\r\nhello")
    srv = Canned(reply)
    try:
        with Client(url=f"http://127.0.0.1:{srv.port}", timeout_s=2.0 * SLOW) as c:
            assert c.get("k") == b"hello" and c.errors == 0
    finally:
        srv.close()


def test_quote_key_is_the_reference_encoding():
    """The fast path encoder equals urllib.parse.quote(str(key), safe="") on random keys."""
    import random
    import urllib.parse

    from kvrelay.client import quote_key

    rng = random.Random(12)
    alphabet = "abcXYZ019_.-~/@ +%=?&#\u00e9\u20ac\x01\x7f"
    for _ in range(5000):
        k = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert quote_key(k) == urllib.parse.quote(k, safe=""), k
    assert quote_key(12345) == "12345"
