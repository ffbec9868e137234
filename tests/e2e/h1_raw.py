"""
Raw-socket helpers for the HTTP/1.1 data-plane tests (test_h1_*.py, test_io_engine.py):
requests written byte by byte, responses read off a socket without a library hiding the
framing, and /proc readings of a worker's memory and CPU.
"""

import json
import os
import socket
import ssl
import time

from conftest import Resp, parse_raw_response, raw_connect, read_until_close
from harness import SLOW


def _req(method, path, headers=(), body=b""):
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode() + body


class Reader:
    """Reads consecutive HTTP/1.1 responses off one socket, keeping what belongs to the next."""

    def __init__(self, sock):
        self.sock, self.buf = sock, bytearray()

    def response(self, limit_s):
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            head, sep, rest = bytes(self.buf[:65536]).partition(b"\r\n\r\n")
            if sep:
                status, hdrs, _ = parse_raw_response(head + sep)
                n = int(hdrs.get("content-length", "0"))
                if len(self.buf) >= len(head) + 4 + n:
                    body = bytes(self.buf[len(head) + 4 : len(head) + 4 + n])
                    del self.buf[: len(head) + 4 + n]
                    return Resp(status, hdrs, body, "1.1")
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            more = self.sock.recv(1 << 20)
            if not more:
                break
            self.buf += more
        raise AssertionError(f"no whole response within {limit_s} s: {bytes(self.buf[:200])!r}")


def _json_error(resp, status):
    assert resp.status == status, resp
    assert resp.header("content-type") == "application/json", resp
    doc = json.loads(resp.body)
    assert set(doc) == {"error", "message"}, doc
    return doc


def _rss_anon_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def _cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tcp_mem_kb():
    """Kernel memory held by TCP socket buffers (the clients' and the server's alike)."""
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                parts = line.split()
                return int(parts[parts.index("mem") + 1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    return 0


def _shared_kb(pids):
    """Memory held by the shared objects these processes map (the segment's memfd and any other
    shared mapping), each object counted once by its allocated blocks. It is the server's own
    figure: Shmem in /proc/meminfo is machine-wide and moves with whatever else runs."""
    seen, kb = set(), 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(None, 5)
            if len(fields) < 6 or fields[1][3] != "s":
                continue
            try:
                st = os.stat(f"/proc/{pid}/map_files/{fields[0]}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                kb += st.st_blocks * 512 // 1024
    return kb


def _mem_available_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def _got_continue(sock, wait_s):
    """True when "100 Continue" arrives within wait_s (the server began reading the body)."""
    sock.settimeout(wait_s)
    try:
        data = sock.recv(64)
    except socket.timeout:
        return False
    finally:
        sock.settimeout(10 * SLOW)
    assert data.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), data
    return True


def _tls_send(srv, payload, limit=5.0):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    raw = socket.create_connection((srv.host, srv.port), timeout=limit * SLOW)
    s = ctx.wrap_socket(raw, server_hostname="localhost")
    try:
        s.sendall(payload)
        return read_until_close(s, limit * SLOW)
    finally:
        s.close()


def _one(srv, payload):
    """Sends payload; returns its one response, asserting that no second one came and that the
    server then closed the connection."""
    s = raw_connect(srv)
    try:
        s.sendall(payload)
        data, how = read_until_close(s, 5 * SLOW)
    finally:
        s.close()
    status, hdrs, rest = parse_raw_response(data)
    assert status is not None, data[:300]
    n = int(hdrs.get("content-length", "0"))
    r = Resp(status, hdrs, rest[:n], "1.1")
    assert data.count(b"HTTP/1.1 ") == 1, f"bytes after the refused request ran as a request: {data!r}"
    assert how in ("eof", "reset"), how
    return r
