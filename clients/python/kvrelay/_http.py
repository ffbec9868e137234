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

import select
import socket
import ssl
import struct
import time
from typing import Iterable, Optional, Sequence

MAX_LINE = 8 * 1024
MAX_HEADERS = 64
MAX_HEAD_BYTES = 64 * 1024
DEFAULT_MAX_BODY = 1 << 32  # 4 GiB: above kvrelay's largest --max-block-size
# One receive while a head is read. Small on purpose: what arrives with the head beyond it
# (at most this much of a body) is the only part of a body ever copied; the rest is received
# straight into the caller's buffer.
READ_CHUNK = 8 * 1024


class ProtocolError(Exception):
    """The peer sent something this client does not accept (the connection is dropped)."""


class Response:
    __slots__ = ("status", "length", "will_close")

    def __init__(self, status: int, length: int, will_close: bool):
        self.status = status
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
    """One keep-alive connection. Not thread-safe: the pool hands it to one thread at a time.

    Plain TCP runs the socket in blocking mode with the timeout set in the kernel
    (SO_RCVTIMEO / SO_SNDTIMEO): a body then travels in one system call (recv_into with
    MSG_WAITALL, one sendmsg for a gathered body) with the GIL released for all of it, instead
    of a poll() and a partial read per socket buffer. TLS keeps Python's timeout mode."""

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
            else:
                t = max(float(timeout), 0.001)  # a zero timeval would mean "never time out"
                tv = struct.pack("ll", int(t), int((t % 1) * 1e6))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
                sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.tls = ssl_context is not None
        self._waitall = 0 if self.tls else socket.MSG_WAITALL
        self._buf = bytearray()  # received and not yet consumed, from _pos
        self._pos = 0
        self.closed = False
        self.bytes_in = 0  # bytes received so far: "did any of a response arrive?"
        self.idle_since = time.monotonic()  # when the pool last took it back

    def dropped(self) -> bool:
        """True when this idle connection must not carry another request: closed here, bytes
        left over from an earlier response, or readable (the server's FIN or RST, or bytes
        nobody asked for: between requests a kept-alive HTTP/1.1 connection has nothing to
        say). One poll() with a zero timeout, no byte consumed — the check urllib3's
        is_connection_dropped makes before reusing a pooled connection."""
        if self.closed or self._pos != len(self._buf):
            return True
        if self.tls and self.sock.pending():
            return True
        try:
            p = select.poll()
            p.register(self.sock, select.POLLIN | select.POLLERR | select.POLLHUP)
            return bool(p.poll(0))
        except (OSError, ValueError):
            return True

    # -- sending ----------------------------------------------------------------------------

    def send(self, head: bytes, body: Sequence = ()) -> None:
        """Sends a request head and then the body parts (bytes-like, each sent as it is)."""
        parts = [memoryview(head)]
        for p in body:
            mv = p if isinstance(p, memoryview) else memoryview(p)
            if mv.nbytes:
                parts.append(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv)
        try:
            if self.tls or len(parts) == 1:
                for p in parts:
                    self.sock.sendall(p)
                return
            self._sendmsg_all(parts)
        except BlockingIOError as e:  # SO_SNDTIMEO expired
            raise TimeoutError("send timed out") from e

    def sendall(self, data) -> None:
        try:
            self.sock.sendall(data)
        except BlockingIOError as e:
            raise TimeoutError("send timed out") from e

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

    def _recv_some(self, n: int) -> bytes:
        try:
            data = self.sock.recv(n)
        except BlockingIOError as e:  # SO_RCVTIMEO expired
            raise TimeoutError("receive timed out") from e
        if not data:
            raise ConnectionResetError("connection closed by the server")
        self.bytes_in += len(data)
        return data

    def _compact(self) -> None:
        if self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif self._pos > 65536:
            del self._buf[:self._pos]
            self._pos = 0

    def _take(self, n: int) -> memoryview:
        """Up to n already-received bytes (a view valid until the next call)."""
        k = min(n, len(self._buf) - self._pos)
        mv = memoryview(self._buf)[self._pos:self._pos + k]
        self._pos += k
        return mv

    def read_head(self, head_request: bool = False) -> Response:
        """Reads one response head. For a HEAD request the length is reported but no body
        follows (Response.length is then 0)."""
        self._compact()
        scan = self._pos
        while True:
            end = self._buf.find(b"\r\n\r\n", scan)
            if end >= 0:
                break
            if len(self._buf) - self._pos > MAX_HEAD_BYTES:
                raise ProtocolError(f"response head over {MAX_HEAD_BYTES} bytes")
            scan = max(self._pos, len(self._buf) - 3)
            self._buf += self._recv_some(READ_CHUNK)
        if end + 4 - self._pos > MAX_HEAD_BYTES:
            raise ProtocolError(f"response head over {MAX_HEAD_BYTES} bytes")
        lines = bytes(self._buf[self._pos:end]).split(b"\r\n")
        self._pos = end + 4
        if max(map(len, lines)) + 2 > MAX_LINE:
            raise ProtocolError(f"response line over {MAX_LINE} bytes")
        if len(lines) - 1 > MAX_HEADERS:
            raise ProtocolError(f"more than {MAX_HEADERS} header lines")
        first = lines[0]
        parts = first.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
            raise ProtocolError(f"bad status line {first[:60]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            raise ProtocolError(f"unexpected interim response {status}")
        # Only three headers matter here; the others are checked for shape and skipped
        # (pipelined existence checks parse thousands of heads: no dict per head).
        length_value = None
        connection = b""
        for line in lines[1:]:
            i = line.find(b":")
            if i <= 0:
                raise ProtocolError(f"bad header line {line[:60]!r}")
            c0 = line[0] | 0x20
            if c0 == 0x63:  # c...
                name = line[:i].strip().lower()
                if name == b"content-length":
                    length_value = line[i + 1:]
                elif name == b"connection":
                    connection = line[i + 1:].lower()
            elif c0 == 0x74 and line[:i].strip().lower() == b"transfer-encoding":
                raise ProtocolError("Transfer-Encoding responses are not accepted")
        will_close = b"close" in connection or (parts[0] == b"HTTP/1.0" and b"keep-alive" not in connection)
        if length_value is not None:
            length = _parse_length(length_value.decode("latin-1"), self.max_body)
        elif head_request or status in (204, 304):
            length = 0
        else:
            raise ProtocolError("response without Content-Length")
        return Response(status, 0 if head_request else length, will_close)

    def _recv_into(self, mv: memoryview) -> None:
        """Fills mv completely from the socket (bounded: each call receives at least one
        byte, or raises)."""
        got = 0
        want = mv.nbytes
        while got < want:
            try:
                n = self.sock.recv_into(mv[got:], want - got, self._waitall)
            except BlockingIOError as e:
                raise TimeoutError("receive timed out") from e
            if not n:
                raise ConnectionResetError(f"short body: {got} of {want} bytes")
            got += n
            self.bytes_in += n

    def read_body(self, n: int) -> bytes:
        """Exactly n bytes into fresh memory."""
        if n == 0:
            return b""
        have = self._take(n)
        if have.nbytes == n:
            return bytes(have)
        rest = n - have.nbytes
        if rest <= READ_CHUNK:
            out = bytearray(have)
            have.release()
            tail = bytearray(rest)
            self._recv_into(memoryview(tail))
            return bytes(out + tail)
        out = bytearray(n)
        out[:have.nbytes] = have
        k = have.nbytes
        have.release()
        self._recv_into(memoryview(out)[k:])
        return bytes(out)  # get() promises bytes; the copy-free path is read_into

    def read_into(self, views: Iterable[memoryview]) -> int:
        """Fills each view completely, in order: first from what was already received, then
        straight from the socket into the view."""
        total = 0
        for mv in views:
            have = self._take(mv.nbytes)
            k = have.nbytes
            if k:
                mv[:k] = have
            have.release()
            if k < mv.nbytes:
                self._recv_into(mv[k:])
            total += mv.nbytes
        return total

    def discard(self, n: int) -> None:
        """Reads and drops n bytes (small bodies only; callers close for large ones)."""
        have = self._take(n)
        n -= have.nbytes
        have.release()
        while n > 0:
            n -= len(self._recv_some(min(n, READ_CHUNK)))
        self._compact()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.close()
        except Exception:
            pass
