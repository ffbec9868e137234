"""
A small HTTP/1.1 client transport for kvrelay (standard library only).

Why not http.client: the engines' hot paths need three things it cannot do together —
receive a body straight into a caller's buffer (``readinto`` on the socket's reader, no
intermediate bytes), send a body gathered from several buffers (a header plus a page's K and
V halves) without joining them, and pipeline many HEADs on one keep-alive connection.

Every parser limit is stated here and enforced (each has a test in tests/e2e/clients/):

    MAX_LINE        a status line or one header line, 8 KiB
    MAX_HEADERS     header lines in one response, 64
    MAX_HEAD_BYTES  a whole response head, 64 KiB
    max_body        the largest body read into fresh memory (Connection argument; bodies
                    received into a caller's buffer are bounded by that buffer)

A response without Content-Length (chunked or close-delimited) is refused: kvrelay always
sends one, and refusing keeps the parser small. Anything refused raises ProtocolError, and
the connection is not reused.
"""

from __future__ import annotations

import socket
import ssl
from typing import Iterable, Optional, Sequence

MAX_LINE = 8 * 1024
MAX_HEADERS = 64
MAX_HEAD_BYTES = 64 * 1024
DEFAULT_MAX_BODY = 1 << 32  # 4 GiB: above kvrelay's largest --max-block-size
READ_BUFFER = 256 * 1024  # the reader's buffer: heads and small bodies; big bodies bypass it


class ProtocolError(Exception):
    """The peer sent something this client does not accept (the connection is dropped)."""


class Response:
    __slots__ = ("status", "headers", "length", "will_close")

    def __init__(self, status: int, headers: dict, length: int, will_close: bool):
        self.status = status
        self.headers = headers
        self.length = length
        self.will_close = will_close


def _parse_length(value: str, max_body: int) -> int:
    v = value.strip()
    if not v.isdigit() or len(v) > 20:
        raise ProtocolError(f"bad Content-Length {value[:40]!r}")
    n = int(v)
    if n > max_body:
        raise ProtocolError(f"Content-Length {n} over the limit {max_body}")
    return n


class Connection:
    """One keep-alive connection. Not thread-safe: the pool hands it to one thread at a time."""

    def __init__(self, host: str, port: int, timeout: float, ssl_context: Optional[ssl.SSLContext] = None,
                 max_body: int = DEFAULT_MAX_BODY):
        self.host = host
        self.port = port
        self.max_body = max_body
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ssl_context is not None:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.tls = ssl_context is not None
        self.rfile = sock.makefile("rb", buffering=READ_BUFFER)
        self.closed = False

    # -- sending ----------------------------------------------------------------------------

    def send(self, head: bytes, body: Sequence = ()) -> None:
        """Sends a request head and then the body parts (bytes-like, each sent as it is)."""
        parts = [memoryview(head)]
        for p in body:
            mv = p if isinstance(p, memoryview) else memoryview(p)
            if mv.nbytes:
                parts.append(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv)
        if self.tls or len(parts) == 1:
            for p in parts:
                self.sock.sendall(p)
            return
        self._sendmsg_all(parts)

    def _sendmsg_all(self, parts: list) -> None:
        # sendmsg gathers the parts in one system call; a short write continues where it
        # stopped. Bounded: every iteration sends at least one byte or raises.
        i = 0
        while i < len(parts):
            n = self.sock.sendmsg(parts[i:i + 64])
            if n <= 0:
                raise ConnectionError("sendmsg sent nothing")
            while i < len(parts) and n >= parts[i].nbytes:
                n -= parts[i].nbytes
                i += 1
            if n:
                parts[i] = parts[i][n:]

    # -- receiving --------------------------------------------------------------------------

    def _line(self) -> bytes:
        line = self.rfile.readline(MAX_LINE + 1)
        if not line:
            raise ConnectionResetError("connection closed before a response")
        if len(line) > MAX_LINE:
            raise ProtocolError(f"response line over {MAX_LINE} bytes")
        return line

    def read_head(self, head_request: bool = False) -> Response:
        """Reads one response head. For a HEAD request the length is reported but no body
        follows (Response.length is then 0)."""
        line = self._line()
        total = len(line)
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
            raise ProtocolError(f"bad status line {line[:60]!r}")
        status = int(parts[1])
        version = parts[0]
        headers = {}
        count = 0
        while True:
            line = self._line()
            total += len(line)
            if total > MAX_HEAD_BYTES:
                raise ProtocolError(f"response head over {MAX_HEAD_BYTES} bytes")
            if line in (b"\r\n", b"\n"):
                break
            count += 1
            if count > MAX_HEADERS:
                raise ProtocolError(f"more than {MAX_HEADERS} header lines")
            name, sep, value = line.partition(b":")
            if not sep:
                raise ProtocolError(f"bad header line {line[:60]!r}")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        if 100 <= status < 200:
            raise ProtocolError(f"unexpected interim response {status}")
        conn_hdr = headers.get("connection", "").lower()
        will_close = "close" in conn_hdr or (version == b"HTTP/1.0" and "keep-alive" not in conn_hdr)
        if "transfer-encoding" in headers:
            raise ProtocolError("Transfer-Encoding responses are not accepted")
        if "content-length" in headers:
            length = _parse_length(headers["content-length"], self.max_body)
        elif head_request or status in (204, 304):
            length = 0
        else:
            raise ProtocolError("response without Content-Length")
        if head_request:
            return Response(status, headers, 0, will_close)
        return Response(status, headers, length, will_close)

    def read_body(self, n: int) -> bytes:
        """Exactly n bytes into fresh memory (one allocation: the reader fills the result)."""
        if n == 0:
            return b""
        data = self.rfile.read(n)
        if len(data) != n:
            raise ConnectionResetError(f"short body: {len(data)} of {n} bytes")
        return data

    def read_into(self, views: Iterable[memoryview]) -> int:
        """Fills each view completely, in order, straight from the socket."""
        total = 0
        for mv in views:
            want = mv.nbytes
            got = 0
            # Bounded: each readinto returns at least one byte or signals the end.
            while got < want:
                n = self.rfile.readinto(mv[got:])
                if not n:
                    raise ConnectionResetError(f"short body: {total + got} bytes")
                got += n
            total += got
        return total

    def discard(self, n: int) -> None:
        """Reads and drops n bytes (small bodies only; callers close for large ones)."""
        while n > 0:
            chunk = self.rfile.read(min(n, 65536))
            if not chunk:
                raise ConnectionResetError("short body while discarding")
            n -= len(chunk)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for f in (self.rfile, self.sock):
            try:
                f.close()
            except Exception:
                pass
