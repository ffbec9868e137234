"""
build/bench/lean_client, the second load client of scripts/bench-dataplane.sh (--client lean),
written apart from kvrelay-bench: against the real kvrelay (PUT, then GETs of what it PUT, every
body checked), the null server, memcached and Redis (skipped, with the reason, when the binary is
not on PATH), and against answers it must refuse: a key holding other bytes of the same length
(corrupt), another length (length), a body cut short (short), a miss.

Every client run is bounded (--duration 1 or less, or --requests) and has a subprocess timeout;
every server started here is stopped by PID.
"""

import json
import os
import shutil
import signal
import subprocess
import uuid

import pytest

from conftest import BINARY, SLOW, _die_with_parent, free_port, module_server
from harness import wait_until
from peers import CannedServer, start_and_wait, stop_proc

LEAN = BINARY.parent / "bench" / "lean_client"
NULL = BINARY.parent / "bench" / "null_server"
KiB = 1024


def require(path):
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(f"{path} not found (build it with `make`)", pytrace=False)
    return str(path)


def prefix():
    return f"lc-{uuid.uuid4().hex[:10]}"


def run_lean(tmp_path, *args, timeout=30.0):
    """Runs lean_client with --json; returns (CompletedProcess, parsed JSON or None)."""
    out = tmp_path / f"lean-{uuid.uuid4().hex[:6]}.json"
    argv = [require(LEAN), *map(str, args), "--json", str(out)]
    p = subprocess.run(argv, capture_output=True, timeout=timeout * SLOW, stdin=subprocess.DEVNULL)
    data = json.loads(out.read_text()) if out.exists() else None
    if data is not None:
        assert data["tool"] == "lean_client" and data["command_line"] == argv, data
    return p, data


def describe(p, d=None):
    return (f"rc={p.returncode}\n--- stdout ---\n{p.stdout.decode(errors='replace')}\n--- stderr ---\n"
            f"{p.stderr.decode(errors='replace')}\n--- json ---\n{json.dumps(d, indent=1)[:3000] if d else None}")


def check_clean(p, d, workload, size, proto="http"):
    """A run without errors whose JSON adds up, with the fields the bench report reads."""
    assert p.returncode == 0, describe(p, d)
    assert d["protocol"] == proto and d["workload"] == workload and d["errors"] == 0, describe(p, d)
    assert d["total_errors"] == 0 and d["exit_status"] == 0
    assert d["requests"] == d["successes"] > 20, describe(p, d)
    assert d["bytes"] == d["successes"] * size
    tp, lat = d["throughput"], d["latency_ms"]
    assert abs(tp["requests_per_s"] - d["requests"] / d["duration_s"]) <= 1e-3 * tp["requests_per_s"]
    assert abs(tp["gb_per_s"] - d["bytes"] / d["duration_s"] / 1e9) <= 1e-5 + 1e-3 * tp["gb_per_s"]
    assert lat["count"] == d["successes"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99_9"] <= lat["max"], lat
    assert d["cpu"]["total_s"] >= 0 and d["ops"][workload]["requests"] == d["requests"]
    assert b"lean_client:" in p.stdout


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = module_server(tmp_path_factory, "lean", args=["--memory", "256M", "--workers", "2"])
    yield s
    s.stop()


def target(s):
    return f"{s.host}:{s.port}"


def test_options():
    p = subprocess.run([require(LEAN), "--help"], capture_output=True, timeout=10)
    assert p.returncode == 0
    for opt in ("--protocol", "--target", "--size", "--connections", "--threads", "--workload", "--preload",
                "--keys", "--key-prefix", "--duration", "--requests", "--timeout", "--json", "--quiet",
                "--no-verify", "--pick"):
        assert opt.encode() in p.stdout, opt
    for bad in (["--nope"], ["--workload", "mixed"], ["--size", "8"], ["--protocol", "h3"], ["extra"]):
        q = subprocess.run([require(LEAN), *bad], capture_output=True, timeout=10)
        assert q.returncode == 2, (bad, q)


def test_unreachable_target_exits_3():
    p = subprocess.run([require(LEAN), "--target", f"127.0.0.1:{free_port()}", "--duration", "0.2"],
                       capture_output=True, timeout=20)
    assert p.returncode == 3 and b"cannot connect" in p.stderr, p


@pytest.mark.parametrize("size", [16 * KiB, 256 * KiB], ids=["16K", "256K"])
def test_kvrelay_put_then_get(srv, tmp_path, size):
    pre = prefix()
    common = ["--target", target(srv), "--size", size, "--key-prefix", pre, "--connections", "8"]
    # at most 100 MiB: nothing is evicted before the GETs below
    p, d = run_lean(tmp_path, *common, "--workload", "put", "--duration", "0.5", "--requests", 400, "--threads", "2")
    check_clean(p, d, "put", size)
    assert set(d["statuses"]) == {"201"}, d["statuses"]  # every PUT a new key
    # the GETs read what the PUTs wrote (keys <prefix>-0.. in order), verified
    n = min(d["requests"], 200)
    p, d = run_lean(tmp_path, *common, "--workload", "get", "--keys", n, "--duration", "0.5", "--pick", "round-robin")
    check_clean(p, d, "get", size)
    assert d["statuses"] == {"200": d["requests"]} and d["verify"] is True
    # --preload PUTs the GET set itself (its own prefix), outside the measurement
    p, d = run_lean(tmp_path, *common[:-4], "--key-prefix", prefix(), "--connections", "4", "--workload", "get",
                    "--preload", "--keys", 50, "--requests", 300)
    check_clean(p, d, "get", size)
    assert d["requests"] == 300 and d["preload"]["successes"] == 50 and d["preload"]["errors"] == 0, describe(p, d)


def test_kvrelay_other_bytes_are_corrupt(srv, tmp_path):
    """A key that holds other bytes of the right length: every GET of it is a corrupt error;
    another length is a length error; a key never PUT is a miss."""
    pre = prefix()
    assert srv.put(f"{pre}-0", os.urandom(16 * KiB)).status == 201
    p, d = run_lean(tmp_path, "--target", target(srv), "--workload", "get", "--size", "16K", "--key-prefix", pre,
                    "--keys", 1, "--requests", 40, "--connections", 2)
    assert p.returncode == 1, describe(p, d)
    assert d["errors_by_kind"]["corrupt"] == 40 and d["successes"] == 0 and d["errors"] == 40, describe(p, d)
    assert "corrupt" in d["error_samples"] and b"corrupt" in p.stderr
    # the same bytes as lean_client's block but one word flipped near the end: still caught
    good = prefix()
    p, d = run_lean(tmp_path, "--target", target(srv), "--workload", "get", "--preload", "--size", "16K",
                    "--key-prefix", good, "--keys", 1, "--requests", 1, "--connections", 1)
    assert p.returncode == 0, describe(p, d)
    body = bytearray(srv.get(f"{good}-0").body)
    body[-3] ^= 0x40
    flipped = prefix()
    assert srv.put(f"{flipped}-0", bytes(body)).status == 201
    p, d = run_lean(tmp_path, "--target", target(srv), "--workload", "get", "--size", "16K", "--key-prefix", flipped,
                    "--keys", 1, "--requests", 5, "--connections", 1)
    assert p.returncode == 1 and d["errors_by_kind"]["corrupt"] == 5, describe(p, d)
    assert srv.put(f"{pre}-L-0", os.urandom(16 * KiB - 8)).status == 201
    p, d = run_lean(tmp_path, "--target", target(srv), "--workload", "get", "--size", "16K", "--key-prefix",
                    f"{pre}-L", "--keys", 1, "--requests", 10, "--connections", 1)
    assert p.returncode == 1 and d["errors_by_kind"]["length"] == 10, describe(p, d)
    p, d = run_lean(tmp_path, "--target", target(srv), "--workload", "get", "--size", "16K", "--key-prefix",
                    prefix(), "--keys", 5, "--requests", 10, "--connections", 1)
    assert p.returncode == 1 and d["errors_by_kind"]["miss"] == 10 == d["misses"], describe(p, d)


def test_short_answer_is_detected(tmp_path):
    # a 200 whose body stops after 100 of its 16,384 bytes, then the connection closes
    server = CannedServer(b"HTTP/1.1 200 OK\r\nContent-Length: 16384\r\n\r\n" + b"x" * 100, close=True)
    try:
        p, d = run_lean(tmp_path, "--target", f"127.0.0.1:{server.port}", "--workload", "get", "--size", "16K",
                        "--keys", 3, "--requests", 6, "--connections", 1, "--timeout", 2)
    finally:
        server.close()
    assert p.returncode == 1, describe(p, d)
    assert d["errors_by_kind"]["short"] == 6 and d["successes"] == 0, describe(p, d)


class NullServer:
    def __init__(self, tmp_path, size):
        self.port_file = tmp_path / f"port-{uuid.uuid4().hex[:6]}"
        self.log = open(tmp_path / "null.log", "w+b")
        self.proc = subprocess.Popen([require(NULL), "--bind", "127.0.0.1:0", "--port-file", str(self.port_file),
                                      "--get-size", size], stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=self.log, preexec_fn=_die_with_parent)
        wait_until(lambda: self.proc.poll() is not None or (self.port_file.exists() and
                                                            self.port_file.read_text().strip()),
                   10 * SLOW, what="the null server's port file")
        assert self.proc.poll() is None, self.log.read()
        self.port = int(self.port_file.read_text().split("=")[1])

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def test_null_server(tmp_path):
    null = NullServer(tmp_path, "16K")
    try:
        common = ["--target", f"127.0.0.1:{null.port}", "--size", "16K", "--connections", "4"]
        p, d = run_lean(tmp_path, *common, "--workload", "put", "--duration", "0.5")
        check_clean(p, d, "put", 16 * KiB)
        # its GET bodies are kvrelay-bench's blocks: the length holds, the bytes are not this client's
        p, d = run_lean(tmp_path, *common, "--workload", "get", "--duration", "0.5", "--no-verify")
        check_clean(p, d, "get", 16 * KiB)
        assert d["verify"] is False
        p, d = run_lean(tmp_path, *common, "--workload", "get", "--requests", 20)
        assert p.returncode == 1 and d["errors_by_kind"]["corrupt"] == 20, describe(p, d)
    finally:
        null.stop()


def _peer(tmp_path, binary):
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"{binary} is not on PATH (scripts/install-deps.sh --bench installs it)")
    port = free_port()
    if binary == "memcached":
        argv = [path, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "256", "-I", "16m", "-t", "2"]
        argv += ["-u", "nobody"] if os.geteuid() == 0 else []
    else:
        argv = [path, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(tmp_path), "--protected-mode", "no"]
    return start_and_wait(argv, port, open(tmp_path / f"{binary}.log", "w+b")), port


@pytest.mark.parametrize("binary,proto", [("memcached", "memcache"), ("redis-server", "resp")])
def test_peer_store(tmp_path, binary, proto):
    proc, port = _peer(tmp_path, binary)
    try:
        common = ["--protocol", proto, "--target", f"127.0.0.1:{port}", "--connections", "4"]
        for size in (16 * KiB, 256 * KiB):
            pre = prefix()
            p, d = run_lean(tmp_path, *common, "--size", size, "--key-prefix", pre, "--workload", "put",
                            "--duration", "0.4", "--requests", 400)  # 100 MiB at most: nothing evicted
            check_clean(p, d, "put", size, proto)
            p, d = run_lean(tmp_path, *common, "--size", size, "--key-prefix", pre, "--workload", "get",
                            "--keys", min(d["requests"], 100), "--duration", "0.4")
            check_clean(p, d, "get", size, proto)
        p, d = run_lean(tmp_path, *common, "--size", "16K", "--key-prefix", prefix(), "--workload", "get",
                        "--keys", 10, "--requests", 30)
        assert p.returncode == 1 and d["errors_by_kind"]["miss"] == 30, describe(p, d)
    finally:
        stop_proc(proc)
