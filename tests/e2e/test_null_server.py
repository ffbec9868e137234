"""
build/bench/null_server, the store-nothing HTTP/1.1 server that scripts/bench-dataplane.sh
measures as the ceiling of kvrelay-bench: its GET bodies are exactly the bytes kvrelay-bench
verifies (checked both by kvrelay-bench and against the derivation documented in
tools/kvrelay-bench/block.h, recomputed here), PUT/HEAD/exists/DELETE answer as kvrelay-bench
expects, its parser refuses what it does not frame, and its bounds hold (head size,
connections per worker). Every server started here is stopped by PID; every run is bounded.
"""

import json
import os
import signal
import socket
import struct
import subprocess
import uuid

import pytest
import xxhash

from conftest import BINARY, SLOW, _die_with_parent
from harness import wait_server_closed, wait_until

NULL = BINARY.parent / "bench" / "null_server"
BENCH = BINARY.parent / "kvrelay-bench"
KiB, MiB = 1024, 1024 * 1024


def require(path):
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(f"{path} not found (build it with `make`)", pytrace=False)
    return str(path)


class NullServer:
    def __init__(self, tmp_path, *args):
        self.port_file = tmp_path / f"port-{uuid.uuid4().hex[:6]}"
        self.log = open(tmp_path / f"null-{uuid.uuid4().hex[:6]}.log", "w+b")
        self.proc = subprocess.Popen([require(NULL), "--bind", "127.0.0.1:0", "--port-file", str(self.port_file), *args],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                     preexec_fn=_die_with_parent)
        try:
            wait_until(lambda: self.proc.poll() is not None or self.port_file.read_text().strip(), 10 * SLOW,
                       what="the null server's port file")
        except AssertionError:
            pass  # reported below with the log
        if self.proc.poll() is None and self.port_file.exists() and self.port_file.read_text().strip():
            self.port = int(self.port_file.read_text().split("=")[1])
            return
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.log.seek(0)
        raise AssertionError(f"null_server did not start: {self.log.read().decode(errors='replace')}")

    def children(self):
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
                except OSError:
                    continue
                if ppid == self.proc.pid:
                    out.append(int(d))
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10 * SLOW)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.seek(0)
        log = self.log.read().decode(errors="replace")
        self.log.close()
        # a worker that died (or a sanitizer report) makes the parent exit non-zero
        assert self.proc.returncode == 0, f"null_server exited {self.proc.returncode}:\n{log}"
        assert "Sanitizer" not in log and "runtime error" not in log, log


@pytest.fixture
def null_2m(tmp_path):
    s = NullServer(tmp_path, "--get-size", "2M")
    yield s
    s.stop()


def bench(tmp_path, port, *args, timeout=60):
    out = tmp_path / f"b-{uuid.uuid4().hex[:6]}.json"
    p = subprocess.run([require(BENCH), "--target", f"127.0.0.1:{port}", *map(str, args), "--json", str(out),
                        "--quiet"], capture_output=True, timeout=timeout * SLOW, stdin=subprocess.DEVNULL)
    return p, json.loads(out.read_text()) if out.exists() else None


def block(name, size):
    """tools/kvrelay-bench/block.h, recomputed: stamp (name hash, size) then the xorshift pool."""
    h = xxhash.xxh3_64_intdigest(name.encode(), seed=0x6B76722D62656E63)
    off = (h >> 32) % 65536 + 16
    words = (off + size + 7) // 8
    s, mask, pool = 0x6B7672656C617921, (1 << 64) - 1, bytearray()
    for _ in range(words):
        s ^= (s << 13) & mask
        s ^= s >> 7
        s ^= (s << 17) & mask
        pool += struct.pack("<Q", s)
    return (struct.pack("<QQ", h, size ^ 0x6B76726C79626E63) + bytes(pool[off:off + size - 16]))[:size]


def talk(port, data, timeout=5.0):
    """Sends data, then reads until the server closes (or nothing more comes for `timeout`)."""
    c = socket.create_connection(("127.0.0.1", port), timeout=timeout * SLOW)
    out = b""
    try:
        c.sendall(data)
        while True:
            d = c.recv(1 << 20)
            if not d:
                return out, True
            out += d
    except socket.timeout:
        return out, False
    finally:
        c.close()


def read_response(f, head_only=False):
    """(status, headers, body) of one response from a socket file (HEAD: no body)."""
    status = int(f.readline().split()[1])
    headers = {}
    while True:
        line = f.readline().rstrip(b"\r\n")
        if not line:
            break
        k, v = line.split(b":", 1)
        headers[k.strip().lower().decode()] = v.strip().decode()
    return status, headers, b"" if head_only else f.read(int(headers.get("content-length", 0)))


def test_kvrelay_bench_verifies_every_get(null_2m, tmp_path):
    p, r = bench(tmp_path, null_2m.port, "--workload", "get", "--size", "2M", "--keys", "64", "--requests", "300",
                 "--connections", "16")
    assert p.returncode == 0, p.stderr.decode()
    assert r["verify"] is True and r["errors"] == 0 and r["successes"] == 300
    assert r["ops"]["get"]["bytes"] == 300 * 2 * MiB


def test_wrong_size_is_seen_by_the_client(null_2m, tmp_path):
    p, r = bench(tmp_path, null_2m.port, "--workload", "get", "--size", "256K", "--requests", "50")
    assert p.returncode == 1 and r["errors_by_kind"]["length"] == 50, p.stdout.decode()


def test_body_is_the_documented_derivation(null_2m):
    for name, quoted in (("kvb-2M-7", "kvb-2M-7"), ("a b/c", "a%20b%2Fc")):
        body, closed = talk(null_2m.port, f"GET /kv/{quoted} HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
        assert closed
        head, _, got = body.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: 2097152" in head
        assert got == block(name, 2 * MiB), name


def test_put_head_exists_delete(null_2m, tmp_path):
    p, r = bench(tmp_path, null_2m.port, "--workload", "put", "--size", "2M", "--requests", "200")
    assert p.returncode == 0 and r["errors"] == 0 and r["ops"]["put"]["statuses"] == {"201": 200}, p.stderr.decode()
    for wl in ("head", "exists"):
        p, r = bench(tmp_path, null_2m.port, "--workload", wl, "--size", "2M", "--requests", "200")
        assert p.returncode == 0 and r["errors"] == 0 and r["successes"] == 200, (wl, p.stdout.decode())
    p, r = bench(tmp_path, null_2m.port, "--workload", "mixed", "--mix", "delete=1", "--size", "2M",
                 "--requests", "50")
    assert p.returncode == 0 and r["errors"] == 0, p.stdout.decode()


def test_80mib_blocks(tmp_path):
    s = NullServer(tmp_path, "--get-size", "80M")
    try:
        for wl in ("get", "put"):
            p, r = bench(tmp_path, s.port, "--workload", wl, "--size", "80M", "--keys", "8", "--requests", "16",
                         "--connections", "4", "--timeout", "30")
            assert p.returncode == 0 and r["errors"] == 0 and r["ops"][wl]["bytes"] == 16 * 80 * MiB, wl
    finally:
        s.stop()


def test_put_memory_receives_bodies_one_after_another_and_wraps(tmp_path):
    # 2 workers x 1 MiB: 3 MiB bodies wrap around each worker's slice three times per body,
    # 256 KiB bodies sit at offsets that do not divide the slice evenly after a 3 MiB one
    s = NullServer(tmp_path, "--put-memory", "2M")
    try:
        for size, n in (("3M", 40), ("256K", 200), ("3M", 20)):
            p, r = bench(tmp_path, s.port, "--workload", "put", "--size", size, "--requests", str(n),
                         "--connections", "4", "--timeout", "30")
            assert p.returncode == 0 and r["errors"] == 0 and r["ops"]["put"]["statuses"] == {"201": n}, \
                (size, p.stdout.decode(), p.stderr.decode())
    finally:
        s.stop()
    for bad in ("17G", "lots", "-1"):
        p = subprocess.run([require(NULL), "--put-memory", bad], capture_output=True, timeout=10)
        assert p.returncode == 2 and b"--put-memory" in p.stderr, (bad, p.stderr)


def test_keep_alive_pipelining_and_100_continue(null_2m):
    c = socket.create_connection(("127.0.0.1", null_2m.port), timeout=10 * SLOW)
    c.sendall(b"HEAD /kv/x HTTP/1.1\r\n\r\n"
              b"PUT /kv/y HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
              b"GET /kv/y/exists HTTP/1.1\r\n\r\n"
              b"DELETE /kv/y HTTP/1.1\r\n\r\n")
    f = c.makefile("rb")
    st, h, _ = read_response(f, head_only=True)
    assert st == 200 and h["content-length"] == str(2 * MiB)
    answers = [read_response(f) for _ in range(3)]
    assert [a[0] for a in answers] == [201, 200, 200]
    assert json.loads(answers[1][2]) == {"exists": True} and json.loads(answers[2][2]) == {"deleted": True}
    c.sendall(b"PUT /kv/z HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
    assert f.readline() == b"HTTP/1.1 100 Continue\r\n" and f.readline() == b"\r\n"
    c.sendall(b"abc")
    assert read_response(f)[0] == 201
    c.close()


@pytest.mark.parametrize("request_bytes,status", [
    (b"PUT /kv/a HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
    (b"PUT /kv/a HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc", 400),
    (b"PUT /kv/a HTTP/1.1\r\n\r\n", 411),
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /kv/a HTTP/1.1\r\nX: " + b"y" * (16 * KiB - 23), 431),  # exactly 16 KiB, no end of head
], ids=["transfer-encoding", "two-lengths", "no-length", "garbage", "head-over-16k"])
def test_refusals_are_json_and_close(null_2m, request_bytes, status):
    if status == 431:
        assert len(request_bytes) == 16 * KiB
    out, closed = talk(null_2m.port, request_bytes)
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status}".encode()), out[:200]
    assert json.loads(body)["status"] == status
    assert closed, "the connection must be closed after a refusal"


def test_unknown_paths_and_methods(null_2m):
    out, _ = talk(null_2m.port, b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 404") and json.loads(out.partition(b"\r\n\r\n")[2])["status"] == 404
    out, _ = talk(null_2m.port, b"POST /kv/a HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 405")


def test_connection_bound(tmp_path):
    s = NullServer(tmp_path, "--workers", "1", "--max-conns", "2")
    try:
        held = [socket.create_connection(("127.0.0.1", s.port), timeout=5 * SLOW) for _ in range(2)]
        for c in held:  # both served
            c.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            assert c.recv(4096).startswith(b"HTTP/1.1 200")
        extra = socket.create_connection(("127.0.0.1", s.port), timeout=5 * SLOW)
        extra.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        try:
            got = extra.recv(4096)
        except ConnectionResetError:
            got = b""
        assert got == b"", "a connection beyond --max-conns must be closed unanswered"
        gone = held[0].getsockname()[1]
        held[0].close()
        wait_server_closed(gone, s.port, 5 * SLOW, what="the null server to close the connection it lost")
        again = socket.create_connection(("127.0.0.1", s.port), timeout=5 * SLOW)
        again.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert again.recv(4096).startswith(b"HTTP/1.1 200"), "served again once a connection closed"
        for c in (held[1], extra, again):
            c.close()
    finally:
        s.stop()


def test_workers_and_sigterm(tmp_path):
    s = NullServer(tmp_path, "--workers", "2")
    kids = s.children()
    assert len(kids) == 2
    s.stop()  # asserts exit status 0

    def running():  # alive and not a zombie
        return [k for k in kids if os.path.exists(f"/proc/{k}") and "Z" not in open(f"/proc/{k}/stat").read().split()[2]]

    wait_until(lambda: not running(), 5 * SLOW, what=f"the workers {kids} to end with the parent (workers outlived it)")
