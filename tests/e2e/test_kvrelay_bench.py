"""
build/kvrelay-bench, the load generator, against real servers: kvrelay (HTTP/1.1 and h2c,
every workload, the relay with gRPC subscribers), redis-server (RESP2) and memcached (text
protocol), plus small Python stand-ins for what must be detected: a proxy that flips bytes of
GET bodies (corrupt), a server that never answers (timeout).

Every run is bounded (--duration of a second or two, or --requests) and every subprocess has
a timeout; servers started here are stopped by PID.
"""

import json
import os
import pty
import shutil
import socket
import subprocess
import threading
import uuid

import pytest

from conftest import BINARY, SLOW, free_port, module_server
from harness import read_terminal
from peers import CannedServer, start_and_wait, stop_proc

BENCH = BINARY.parent / "kvrelay-bench"
KiB = 1024


def require_bench():
    if not BENCH.is_file() or not os.access(BENCH, os.X_OK):
        pytest.fail(f"kvrelay-bench not found: {BENCH} (build it with `make`)", pytrace=False)
    return str(BENCH)


def prefix():
    return f"t-{uuid.uuid4().hex[:10]}"


def run_bench(tmp_path, *args, timeout=60.0, name="out"):
    """Runs kvrelay-bench with --json; returns (CompletedProcess, parsed JSON or None)."""
    out = tmp_path / f"{name}-{uuid.uuid4().hex[:6]}.json"
    argv = [require_bench(), *map(str, args), "--json", str(out)]
    p = subprocess.run(argv, capture_output=True, timeout=timeout * SLOW, stdin=subprocess.DEVNULL)
    data = None
    if out.exists():
        text = out.read_text()
        try:
            data = json.loads(text)
        except ValueError as e:
            raise AssertionError(f"--json wrote invalid JSON ({e}):\n{text}")
        assert data["command_line"] == argv, data["command_line"]
    return p, data


def describe(p, data=None):
    return (f"rc={p.returncode}\n--- stdout ---\n{p.stdout.decode(errors='replace')}\n"
            f"--- stderr ---\n{p.stderr.decode(errors='replace')}\n--- json ---\n"
            f"{json.dumps(data, indent=1)[:4000] if data else None}")


def check_consistent(d, size=None, sizes=None):
    """The JSON adds up: requests, successes, errors, kinds, ops, bytes, latency."""
    assert d["requests"] == d["successes"] + d["errors"], d
    assert sum(d["errors_by_kind"][k] for k in d["errors_by_kind"] if k != "unpublished") == d["errors"]
    ops = d["ops"]
    assert sum(o["requests"] for o in ops.values()) == d["requests"]
    assert sum(o["successes"] for o in ops.values()) == d["successes"]
    assert sum(o["errors"] for o in ops.values()) == d["errors"]
    assert sum(o["bytes"] for o in ops.values()) == d["bytes"]
    assert d["misses"] == sum(o["misses"] for o in ops.values())
    for name, o in ops.items():
        assert o["requests"] == o["successes"] + o["errors"], (name, o)
        if d["protocol"] == "http":
            assert o["successes"] <= sum(o["statuses"].values()) <= o["requests"], (name, o)
        lat = o["latency_ms"]
        assert lat["count"] == o["successes"], (name, o)
        if lat["count"]:
            assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99_9"] <= lat["max"], (name, lat)
        payload_ops = o["successes"] - o["misses"]
        if name in ("put", "get"):
            if size is not None:
                assert o["bytes"] == payload_ops * size, (name, o, size)
            if sizes is not None:
                assert payload_ops * sizes[0] <= o["bytes"] <= payload_ops * sizes[1], (name, o, sizes)
        else:
            assert o["bytes"] == 0, (name, o)
    assert d["duration_s"] > 0
    tp = d["throughput"]
    assert abs(tp["requests_per_s"] - d["requests"] / d["duration_s"]) <= 1e-3 * max(1.0, tp["requests_per_s"])
    assert abs(tp["bytes_per_s"] - d["bytes"] / d["duration_s"]) <= 1e-3 * max(1.0, tp["bytes_per_s"]) + 1
    assert d["cpu"]["total_s"] >= 0 and d["cpu"]["user_s"] >= 0 and d["cpu"]["sys_s"] >= 0
    assert d["latency_ms"]["count"] == d["successes"]


# ---------------------------------------------------------------------------------------------
# kvrelay


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = module_server(tmp_path_factory, "bench",
                      args=["--memory", "512M", "--workers", "2", "--grpc-bind", "127.0.0.1:0"])
    yield s
    s.stop()


def target(s):
    return f"{s.host}:{s.port}"


def test_help_documents_every_option():
    p = subprocess.run([require_bench(), "--help"], capture_output=True, timeout=10)
    assert p.returncode == 0
    text = p.stdout.decode()
    for opt in ("--target", "--protocol", "--http2", "--token", "--workload", "--mix", "--size", "--keys",
                "--key-prefix", "--popularity", "--dedup", "--connections", "--threads", "--duration",
                "--requests", "--warmup", "--preload", "--json", "--quiet", "--no-verify", "--grpc",
                "--subscribers", "--rate", "--max-errors", "corrupt", "--events", "--event-subscribers"):
        assert opt in text, opt
    bad = subprocess.run([require_bench(), "--workload", "nope"], capture_output=True, timeout=10)
    assert bad.returncode == 2 and b"--workload" in bad.stderr


def test_unreachable_target_is_one_clear_error():
    p = subprocess.run([require_bench(), "--target", f"127.0.0.1:{free_port()}", "--duration", "1"],
                       capture_output=True, timeout=20)
    assert p.returncode == 3, describe(p)
    assert b"cannot connect" in p.stderr


WORKLOADS = [
    ("put", []),
    ("get", ["--preload"]),
    ("head", ["--preload"]),
    ("exists", ["--preload"]),
    ("mixed", ["--preload", "--mix", "get=50,put=20,head=10,exists=10,delete=10", "--size", "1K-48K",
               "--popularity", "zipf:0.9"]),
]


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "h2c"])
@pytest.mark.parametrize("workload,extra", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_workload_against_kvrelay(srv, tmp_path, workload, extra, http2):
    args = ["--target", target(srv), "--workload", workload, "--duration", "1", "--connections", "6",
            "--threads", "2", "--keys", "400", "--key-prefix", prefix(), *extra]
    if "--size" not in extra:
        args += ["--size", "8K"]
    if http2:
        args += ["--http2", "--streams", "2"]
    p, d = run_bench(tmp_path, *args, timeout=60)
    assert p.returncode == 0, describe(p, d)
    assert d is not None, describe(p)
    assert d["protocol"] == "http" and d["http2"] is http2 and d["workload"] == workload
    assert d["connections"] == 6 and d["threads"] == min(2, os.cpu_count()) and d["keys"] == 400
    assert d["errors"] == 0 and d["requests"] > 50, describe(p, d)
    assert 0.9 <= d["duration_s"] <= 3.0 * SLOW, d["duration_s"]
    if "--size" in extra:
        check_consistent(d, sizes=(1 * KiB, 48 * KiB))
        assert set(d["ops"]) <= {"put", "get", "head", "exists", "delete"} and len(d["ops"]) >= 4, d["ops"]
    else:
        check_consistent(d, size=8 * KiB)
        assert d["size"] == {"spec": "8K", "min": 8192, "max": 8192}
        assert list(d["ops"]) == [workload]
        op = d["ops"][workload]
        if workload == "put":
            assert set(op["statuses"]) <= {"201", "200"} and op["statuses"].get("201", 0) > 0, op
            assert d["preload"] is None
        else:
            assert op["statuses"] == {"200": op["requests"]}, op
            assert d["preload"]["successes"] == 400 and d["preload"]["errors"] == 0, d["preload"]
            assert op["misses"] == 0
    text = p.stdout.decode()
    for col in ("req/s", "GB/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"):
        assert col in text, text
    assert "\r" not in text, "no progress line when stdout is not a terminal"


def test_put_dedup_and_request_limit(srv, tmp_path):
    p, d = run_bench(tmp_path, "--target", target(srv), "--workload", "put", "--requests", "3000", "--connections",
                     "4", "--keys", "100000", "--dedup", "0.5", "--size", "2K", "--key-prefix", prefix())
    assert p.returncode == 0, describe(p, d)
    check_consistent(d, size=2 * KiB)
    assert d["requests"] == 3000 and d["request_limit"] == 3000
    st = d["ops"]["put"]["statuses"]
    # about half of the PUTs repeat a key already PUT: dedup hits (200)
    assert 900 <= st.get("200", 0) <= 2100 and st.get("201", 0) + st.get("200", 0) == 3000, st


def test_large_blocks_and_warmup(srv, tmp_path):
    pre = prefix()
    p, d = run_bench(tmp_path, "--target", target(srv), "--workload", "get", "--preload", "--keys", "12",
                     "--size", "256K-3M", "--connections", "3", "--duration", "1", "--warmup", "0.5",
                     "--key-prefix", pre)
    assert p.returncode == 0, describe(p, d)
    check_consistent(d, sizes=(256 * KiB, 3 * 1024 * KiB))
    assert d["warmup_s"] == 0.5 and d["errors"] == 0 and d["ops"]["get"]["successes"] > 10
    assert d["preload"]["bytes"] >= 12 * 256 * KiB


def test_misses_are_errors_unless_allowed(srv, tmp_path):
    args = ["--target", target(srv), "--workload", "get", "--requests", "300", "--connections", "3",
            "--key-prefix", prefix(), "--keys", "50"]
    p, d = run_bench(tmp_path, *args)
    assert p.returncode == 1, describe(p, d)
    assert d["errors_by_kind"]["miss"] == 300 and d["successes"] == 0
    assert d["ops"]["get"]["statuses"] == {"404": 300}
    check_consistent(d)
    p, d = run_bench(tmp_path, *args, "--misses", "ok")
    assert p.returncode == 0, describe(p, d)
    assert d["successes"] == 300 and d["misses"] == 300 and d["bytes"] == 0 and d["errors"] == 0
    p, d = run_bench(tmp_path, *args, "--max-errors", "300")
    assert p.returncode == 0, describe(p, d)
    p, d = run_bench(tmp_path, *args, "--max-errors", "299")
    assert p.returncode == 1, describe(p, d)


def test_token(kvrelay, tmp_path):
    s = kvrelay("--memory", "64M", "--workers", "1", "--token", "s3cret", token="s3cret")
    for h2 in ([], ["--http2"]):
        base = ["--target", target(s), "--workload", "put", "--requests", "200", "--connections", "2",
                "--size", "1K", "--key-prefix", prefix(), *h2]
        p, d = run_bench(tmp_path, *base, "--token", "s3cret")
        assert p.returncode == 0 and d["successes"] == 200, describe(p, d)
        p, d = run_bench(tmp_path, *base)
        assert p.returncode == 1 and d["errors_by_kind"]["status"] == 200, describe(p, d)
        assert d["ops"]["put"]["statuses"] == {"401": 200}, d["ops"]


# ---------------------------------------------------------------------------------------------
# A byte-flipping proxy and a silent server


class FlipProxy:
    """TCP proxy: client bytes go through untouched; in the server's HTTP/1.1 responses, the
    body of every `every`-th application/octet-stream response (a GET of a block) gets one
    byte flipped in its middle. Counts what it flipped."""

    def __init__(self, upstream, every):
        self.upstream = upstream
        self.every = every
        self.lock = threading.Lock()
        self.seen = 0
        self.flipped = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        self.threads = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            u = socket.create_connection(self.upstream, timeout=10)
            for fn in (self._up, self._down):
                t = threading.Thread(target=fn, args=(c, u), daemon=True)
                t.start()
                self.threads.append(t)

    @staticmethod
    def _up(c, u):
        try:
            while True:
                b = c.recv(1 << 16)
                if not b:
                    break
                u.sendall(b)
        except OSError:
            pass
        finally:
            for s in (u,):
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def _down(self, c, u):
        buf = b""
        state, left, flip_at, pos = "head", 0, -1, 0
        try:
            while True:
                b = u.recv(1 << 16)
                if not b:
                    break
                buf += b
                while buf:
                    if state == "head":
                        i = buf.find(b"\r\n\r\n")
                        if i < 0:
                            break
                        head, buf = buf[: i + 4], buf[i + 4:]
                        low = head.lower()
                        n = 0
                        for line in low.split(b"\r\n"):
                            if line.startswith(b"content-length:"):
                                n = int(line.split(b":", 1)[1])
                        flip_at = -1
                        if b"application/octet-stream" in low and n > 0:
                            with self.lock:
                                self.seen += 1
                                if self.seen % self.every == 0:
                                    self.flipped += 1
                                    flip_at = n // 2
                        c.sendall(head)
                        state, left, pos = "body", n, 0
                    if state == "body":
                        take = buf[:left]
                        buf = buf[len(take):]
                        if pos <= flip_at < pos + len(take):
                            t = bytearray(take)
                            t[flip_at - pos] ^= 0x20
                            take = bytes(t)
                        c.sendall(take)
                        pos += len(take)
                        left -= len(take)
                        if left == 0:
                            state = "head"
                        else:
                            break
        except OSError:
            pass
        finally:
            try:
                c.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self):
        self.stopped = True
        self.sock.close()


@pytest.mark.parametrize("every", [7, 1])
def test_flipped_bytes_are_corrupt_errors(srv, tmp_path, every):
    pre = prefix()
    common = ["--workload", "get", "--keys", "64", "--size", "4K", "--key-prefix", pre, "--connections", "4"]
    # the blocks are PUT straight to the server; the GETs go through the proxy
    p, d = run_bench(tmp_path, "--target", target(srv), "--workload", "put", "--keys", "64", "--size", "4K",
                     "--key-prefix", pre, "--requests", "64", "--connections", "1", "--threads", "1")
    assert p.returncode == 0 and d["ops"]["put"]["statuses"] == {"201": 64}, describe(p, d)
    proxy = FlipProxy((srv.host, srv.port), every)
    try:
        p, d = run_bench(tmp_path, "--target", f"127.0.0.1:{proxy.port}", *common, "--requests", "700")
    finally:
        proxy.close()
    assert p.returncode != 0, describe(p, d)
    check_consistent(d, size=4 * KiB)
    assert d["requests"] == 700 and proxy.seen == 700
    corrupt = d["errors_by_kind"]["corrupt"]
    assert corrupt == proxy.flipped == 700 // every, (corrupt, proxy.flipped, describe(p, d))
    assert d["successes"] == 700 - corrupt and d["errors"] == corrupt
    assert d["ops"]["get"]["bytes"] == (700 - corrupt) * 4 * KiB
    assert "corrupt" in d["error_samples"] and "XXH3" in d["error_samples"]["corrupt"]
    assert b"corrupt" in p.stdout


def test_no_answer_is_a_timeout(tmp_path):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        ls.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(ls.accept()[0])  # read nothing, answer nothing
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        p, d = run_bench(tmp_path, "--target", f"127.0.0.1:{ls.getsockname()[1]}", "--workload", "get",
                         "--requests", "4", "--connections", "2", "--timeout", "0.3", "--keys", "4", timeout=30)
    finally:
        stop.set()
        t.join(2)
        for c in held:
            c.close()
        ls.close()
    assert p.returncode == 1, describe(p, d)
    assert d["errors_by_kind"]["timeout"] == 4 and d["successes"] == 0, describe(p, d)


CANNED = [
    ("short", b"HTTP/1.1 200 OK\r\nContent-Length: 8192\r\n\r\n" + b"x" * 100, True),
    ("status", b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}", False),
    ("length", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789", False),
    ("protocol", b"SSH-2.0-OpenSSH\r\n\r\n", True),
]


@pytest.mark.parametrize("kind,answer,close", CANNED, ids=[c[0] for c in CANNED])
def test_each_failure_has_its_kind(tmp_path, kind, answer, close):
    server = CannedServer(answer, close)
    try:
        p, d = run_bench(tmp_path, "--target", f"127.0.0.1:{server.port}", "--workload", "get", "--requests", "20",
                         "--connections", "2", "--size", "8K", "--keys", "5", timeout=30)
    finally:
        server.close()
    assert p.returncode == 1, describe(p, d)
    assert d["errors_by_kind"][kind] == 20 and d["errors"] == 20 and d["successes"] == 0, describe(p, d)
    assert kind in d["error_samples"], d["error_samples"]


def test_progress_line_on_a_terminal(srv, tmp_path):
    master, slave = pty.openpty()
    proc = subprocess.Popen([require_bench(), "--target", target(srv), "--workload", "put", "--duration", "2.5",
                             "--connections", "2", "--size", "1K", "--key-prefix", prefix()],
                            stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    os.close(slave)
    try:
        out = read_terminal(master, 30 * SLOW)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert proc.returncode == 0, (out, proc.stderr.read())
    text = out.decode(errors="replace")
    assert text.count("\r") >= 2 and "req/s" in text and "GB/s" in text and "errors" in text, text
    assert "p99 ms" in text  # then the table


# ---------------------------------------------------------------------------------------------
# The relay


def test_relay_workload(srv, tmp_path):
    p, d = run_bench(tmp_path, "--target", target(srv), "--workload", "relay", "--grpc", srv.grpc,
                     "--subscribers", "3", "--rate", "2000", "--duration", "1.5", "--connections", "2",
                     "--warmup", "0.3", timeout=60)
    assert p.returncode == 0, describe(p, d)
    check_consistent(d, size=1024)
    r = d["relay"]
    assert r["subscribers"] == 3 and r["ended_streams"] == 0 and r["failed_replicas"] == 0 and r["unpublished"] == 0
    assert d["ops"]["put"]["statuses"] == {"201": d["requests"]}
    assert 1500 <= r["puts_measured"] <= r["puts_acknowledged"], r
    assert abs(d["requests"] - 3000) <= 300, d["requests"]  # paced at 2000/s for 1.5 s
    lat = r["publish_latency_ms"]
    assert lat["count"] == r["publish_samples"] == 3 * r["puts_measured"], r
    assert 0 <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99_9"] <= lat["max"] < 2000 * SLOW, lat
    assert len(r["subscriber_stats"]) == 3
    for s in r["subscriber_stats"]:
        assert s["ended"] is False and s["failed"] is False and s["grpc_status"] == -1, s
        assert s["snapshot_chunks"] >= 1 and s["deltas"] > 0 and s["frames_per_s"] > 0 and s["bytes_per_s"] > 0, s
        assert s["latency_samples"] == r["puts_measured"], s
    text = p.stdout.decode()
    assert "publish latency" in text and "streams ended early: 0" in text, text


def test_relay_workload_with_kv_events_subscribers(kvrelay, tmp_path):
    """--events: a ZMQ subscriber of the KV events next to a gRPC one, each PUT's latency taken
    from its 201 to its BlockStored; every acknowledged PUT is seen, without a seq gap."""
    s = kvrelay("--memory", "64M", "--workers", "1", "--grpc-bind", "127.0.0.1:0",
                "--kv-events-bind", "tcp://127.0.0.1:*")
    ports = dict(line.split("=", 1) for line in s.port_file.read_text().split())
    events = f"tcp://127.0.0.1:{ports['kv_events']}"
    p, d = run_bench(tmp_path, "--target", target(s), "--workload", "relay", "--grpc", s.grpc,
                     "--subscribers", "1", "--events", events, "--rate", "2000", "--duration", "1.5",
                     "--connections", "2", timeout=60)
    assert p.returncode == 0, describe(p, d)
    r = d["relay"]
    assert r["events"] == events and r["event_subscribers"] == 1 and r["unpublished"] == 0, r
    assert 1500 <= r["puts_measured"] <= r["puts_acknowledged"], r
    ev, grpc = r["events_latency_ms"], r["publish_latency_ms"]
    assert ev["count"] == r["events_samples"] == r["puts_measured"] == grpc["count"], r
    assert 0 <= ev["p50"] <= ev["p99"] <= ev["max"] < 2000 * SLOW, ev
    evsub = [x for x in r["subscriber_stats"] if x["id"] == 1]
    assert len(evsub) == 1 and evsub[0]["frames"] > 0 and not evsub[0]["ended"], r
    text = p.stdout.decode()
    assert "KV events latency" in text and "0 seq gaps" in text, text
    p, d = run_bench(tmp_path, "--target", target(s), "--workload", "relay", "--subscribers", "0",
                     "--event-subscribers", "2", "--events", events, "--rate", "1000", "--duration", "0.5",
                     "--connections", "2", timeout=60)
    assert p.returncode == 0, describe(p, d)
    r = d["relay"]
    assert r["subscribers"] == 0 and r["event_subscribers"] == 2, r
    assert r["events_samples"] == 2 * r["puts_measured"] > 0 and r["publish_latency_ms"]["count"] == 0, r
    p = subprocess.run([require_bench(), "--workload", "relay", "--event-subscribers", "1"], capture_output=True,
                       timeout=10)
    assert p.returncode == 2 and b"--event-subscribers needs --events" in p.stderr, p.stderr


def test_relay_stream_cut_is_reported(kvrelay, tmp_path):
    """More subscribers than the server admits: the extra stream ends early with its gRPC
    status and kv-relay-error-reason, the others go on, and the run fails."""
    s = kvrelay("--memory", "64M", "--workers", "1", "--grpc-bind", "127.0.0.1:0", "--max-streams", "2")
    p, d = run_bench(tmp_path, "--target", target(s), "--workload", "relay", "--grpc", s.grpc,
                     "--subscribers", "3", "--threads", "2", "--rate", "500", "--duration", "1", timeout=60)
    assert p.returncode == 1, describe(p, d)
    r = d["relay"]
    assert r["ended_streams"] == 1 and r["unpublished"] == 0 and r["failed_replicas"] == 0, r
    ended = [x for x in r["subscriber_stats"] if x["ended"]]
    assert len(ended) == 1 and ended[0]["grpc_status"] == 8, r
    assert ended[0]["reason"] == "RELAY_ERROR_REASON_RESOURCE_LIMIT", ended
    live = [x for x in r["subscriber_stats"] if not x["ended"]]
    assert all(x["latency_samples"] == r["puts_measured"] > 0 for x in live), r
    assert d["errors"] == 0 and d["relay_errors"] == 1 and d["total_errors"] == 1
    assert "ENDED after" in p.stdout.decode() and "grpc-status 8" in p.stdout.decode()
    assert "RESOURCE_LIMIT" in p.stdout.decode()


# ---------------------------------------------------------------------------------------------
# redis-server and memcached


def _require(binary, package):
    """The binary's path. A test never installs packages: the test set of scripts/install-deps.sh
    lists this one, so a missing binary is a failure that names the command, not a skip."""
    path = shutil.which(binary) or (f"/usr/bin/{binary}" if os.path.exists(f"/usr/bin/{binary}") else None)
    if path is None:
        pytest.fail(f"{binary} is missing: install Debian's {package} with `scripts/install-deps.sh test`",
                    pytrace=False)
    return path


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    path = _require("redis-server", "redis-server")
    d = tmp_path_factory.mktemp("redis")
    port = free_port()
    with open(d / "redis.log", "w+b") as log:
        proc = start_and_wait([path, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                "--dir", str(d), "--protected-mode", "no"], port, log)
        try:
            yield f"127.0.0.1:{port}"
        finally:
            stop_proc(proc)


@pytest.fixture(scope="module")
def memcached(tmp_path_factory):
    path = _require("memcached", "memcached")
    d = tmp_path_factory.mktemp("memcached")
    port = free_port()
    argv = [path, "-l", "127.0.0.1", "-p", str(port), "-I", "64m", "-m", "1024"]
    if os.geteuid() == 0:
        argv += ["-u", "nobody"]  # memcached refuses to run as root
    with open(d / "memcached.log", "w+b") as log:
        proc = start_and_wait(argv, port, log)
        try:
            yield f"127.0.0.1:{port}"
        finally:
            stop_proc(proc)


KV_WORKLOADS = [
    ("put", []),
    ("get", ["--preload"]),
    ("head", ["--preload"]),
    ("exists", ["--preload"]),
    ("mixed", ["--preload", "--mix", "get=60,put=20,head=10,exists=5,delete=5", "--size", "1K-40K"]),
]


def _kv_store_run(tmp_path, proto, addr, workload, extra):
    args = ["--protocol", proto, "--target", addr, "--workload", workload, "--duration", "1", "--connections", "4",
            "--keys", "300", "--key-prefix", prefix(), *extra]
    if "--size" not in extra:
        args += ["--size", "8K"]
    p, d = run_bench(tmp_path, *args)
    assert p.returncode == 0, describe(p, d)
    assert d["protocol"] == proto and d["errors"] == 0 and d["requests"] > 50, describe(p, d)
    if "--size" in extra:
        check_consistent(d, sizes=(1 * KiB, 40 * KiB))
        assert len(d["ops"]) == 5, d["ops"]
    else:
        check_consistent(d, size=8 * KiB)
        assert list(d["ops"]) == [workload] and d["ops"][workload]["misses"] == 0
    return d


@pytest.mark.parametrize("workload,extra", KV_WORKLOADS, ids=[w[0] for w in KV_WORKLOADS])
def test_resp_against_redis(redis, tmp_path, workload, extra):
    _kv_store_run(tmp_path, "resp", redis, workload, extra)


@pytest.mark.parametrize("workload,extra", KV_WORKLOADS, ids=[w[0] for w in KV_WORKLOADS])
def test_memcache_against_memcached(memcached, tmp_path, workload, extra):
    _kv_store_run(tmp_path, "memcache", memcached, workload, extra)


def test_resp_and_memcache_misses(redis, memcached, tmp_path):
    for proto, addr in (("resp", redis), ("memcache", memcached)):
        p, d = run_bench(tmp_path, "--protocol", proto, "--target", addr, "--workload", "get", "--requests", "100",
                         "--connections", "2", "--keys", "10", "--key-prefix", prefix())
        assert p.returncode == 1 and d["errors_by_kind"]["miss"] == 100, describe(p, d)
