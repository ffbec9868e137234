"""
Faults: a worker SIGKILLed under load, SIGTERM under load, and malformed or hostile input.
Nothing acknowledged may be lost, nothing accepted may be cut short, no worker may crash on
bad input, and no pin may leak.
"""

import os
import random
import signal
import socket
import threading
import time

import pytest

from conftest import (
    MiB,
    KiB,
    SLOW,
    assert_error,
    kv_path,
    make_block,
    module_server,
    parse_raw_response,
    raw_connect,
    read_one_response,
    read_until_close,
    response_length,
    send_while_reading,
    unique_key,
)
from harness import wait_peer_read, wait_until


# ---------------------------------------------------------------------------------------------
# Load generator: threads doing PUT + GET of their own and others' blocks for a bounded time.


class Load:
    SIZES = [1 * KiB, 16 * KiB, 200 * KiB, 1 * MiB, 4 * MiB, 8 * MiB]

    def __init__(self, srv, threads=4, duration=4.0, max_bytes_per_thread=150 * MiB, prefix=None):
        self.srv = srv
        self.nthreads = threads
        self.duration = duration * SLOW
        self.max_bytes = max_bytes_per_thread
        self.prefix = prefix or unique_key("load")
        self.lock = threading.Lock()
        self.acked = {}  # key -> bytes: PUT answered 200/201
        self.unacked = {}  # key -> bytes: PUT whose answer never arrived
        self.violations = []
        self.counts = {"put": 0, "get": 0, "transport_errors": 0}
        self.threads = []

    def start(self):
        self.deadline = time.monotonic() + self.duration
        for t in range(self.nthreads):
            th = threading.Thread(target=self._run, args=(t,), daemon=True)
            th.start()
            self.threads.append(th)
        return self

    def join(self):
        for th in self.threads:
            th.join(self.duration + 60)
            assert not th.is_alive(), "load thread did not finish"

    def _run(self, tid):
        rng = random.Random(tid)
        conn = self.srv.connection(timeout=20)
        sent = 0
        try:
            for i in range(100000):
                if time.monotonic() > self.deadline:
                    break
                if sent < self.max_bytes:
                    key = f"{self.prefix}-{tid}-{i}"
                    data = make_block(rng.choice(self.SIZES), key)
                    sent += len(data)
                    r = self.srv.request("PUT", kv_path(key), body=data, conn=conn)
                    with self.lock:
                        self.counts["put"] += 1
                        if r.status in (200, 201):
                            self.acked[key] = data
                        elif r.status == 0:
                            self.unacked[key] = data
                            self.counts["transport_errors"] += 1
                        else:
                            self.violations.append(("PUT", key, r.status, r.body[:200]))
                with self.lock:
                    if not self.acked:
                        continue
                    key = rng.choice(list(self.acked))
                    want = self.acked[key]
                r = self.srv.request("GET", kv_path(key), conn=conn)
                with self.lock:
                    self.counts["get"] += 1
                    if r.status == 200:
                        if r.body != want:
                            self.violations.append(("GET torn/wrong bytes", key, len(r.body), len(want)))
                    elif r.status == 0:
                        self.counts["transport_errors"] += 1
                    else:
                        self.violations.append(("GET", key, r.status, r.body[:200]))
        finally:
            conn.close()


def _sum_requests_total(srv):
    total = 0.0
    for line in srv.metrics_text().splitlines():
        if line.startswith("kvrelay_http_requests_total{") or line.startswith("kvrelay_http_requests_total "):
            total += float(line.rsplit(" ", 1)[1])
    return total


COUNTERS = ("dedup_hits", "get_hits", "get_misses", "put_new", "put_conflicts", "deletes", "evictions")


def test_sigkill_workers_under_load(kvrelay):
    srv = kvrelay("--memory", "1G", "--workers", "2")
    srv.kills_expected = True
    original = srv.worker_pids()
    assert len(original) == 2, f"--workers 2 should give 2 workers: {original}"
    load = Load(srv, threads=4, duration=4.0).start()
    wait_until(lambda: len(load.acked) >= 8, 10 * SLOW, what="the load to have PUTs acknowledged before the first kill")
    before_stats = srv.stats()
    before_requests = _sum_requests_total(srv)
    os.kill(original[0], signal.SIGKILL)
    # the second kill comes once the first worker has been replaced, still under the load
    srv.wait_workers(2, exclude=[original[0]])
    os.kill(original[1], signal.SIGKILL)
    load.join()

    workers = srv.wait_workers(2, exclude=original)
    assert not set(workers) & set(original), workers
    assert srv.wait_ready(10 * SLOW), "/readyz did not return to 200 after the workers were replaced"
    assert srv.alive()

    assert not load.violations, load.violations[:10]
    print("load:", load.counts, "acked", len(load.acked), "unacked", len(load.unacked))
    assert load.counts["put"] > 20 and len(load.acked) > 20, load.counts
    for key, data in load.acked.items():
        r = srv.get(key, timeout=30)
        assert r.status == 200, f"acknowledged block {key} lost after the kill: {r!r}"
        assert r.body == data, f"acknowledged block {key} damaged after the kill"
    present_unacked = 0
    for key, data in load.unacked.items():
        r = srv.get(key, timeout=30)
        assert r.status in (200, 404), r
        if r.status == 200:
            assert r.body == data, f"unacknowledged block {key} is visible but torn"
            present_unacked += 1

    d, s = srv.assert_consistent()
    assert s["unique_blocks"] == len(load.acked) + present_unacked, (s, len(load.acked), present_unacked)
    for c in COUNTERS:
        assert s[c] >= before_stats[c], f"counter {c} went backwards after a worker died: {before_stats[c]} -> {s[c]}"
    assert _sum_requests_total(srv) >= before_requests, "kvrelay_http_requests_total went backwards"
    assert "worker" in srv.log_text()


def test_sigterm_idle_exits_zero(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "2", "--shutdown-grace", "5s")
    workers = srv.worker_pids()
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    rc = srv.proc.wait(timeout=15 * SLOW)
    took = time.monotonic() - t0
    assert rc == 0, f"SIGTERM exit code {rc}"
    assert took < 2.0 * SLOW, f"an idle server took {took:.1f}s to stop"
    _assert_gone(workers)


def _assert_gone(pids, limit=3.0):
    def alive():
        return [p for p in pids if os.path.exists(f"/proc/{p}") and _state(p) not in ("Z", "X")]

    wait_until(lambda: not alive(), limit * SLOW, what=f"the children {list(pids)} to be gone (alive: {alive()})")


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def _healthz_first(srv, timeout=20):
    """A connection the server has certainly accepted: one request already answered on it."""
    s = raw_connect(srv, timeout=timeout)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    r = read_one_response(s, 5 * SLOW)
    assert r.status == 200, r
    return s


def test_sigterm_under_load_drains(kvrelay):
    """SIGTERM while uploads and downloads are in flight: they all complete, new connections
    are either served completely or refused, idle ones are not told 'ready', a stalled client
    does not hold the exit beyond the grace, and the exit code is 0."""
    grace = 5.0
    srv = kvrelay("--memory", "512M", "--workers", "2", "--shutdown-grace", "5s", "--io-timeout", "30s")
    big = make_block(48 * MiB, "big")
    assert srv.put("big", big).status == 201
    workers = srv.worker_pids()
    results = {}
    started = threading.Barrier(5 + 1, timeout=20 * SLOW)
    sigterm_at = []
    done_at = {}

    def slow_upload(n):
        key = f"up{n}"
        # 8 MiB in 32 paced steps: about 1.1 s here, so it is in flight at the SIGTERM and done
        # well inside the 5 s grace even on a loaded machine (16 MiB took 2.9 s, too close).
        data = make_block(8 * MiB, key)
        try:
            s = _healthz_first(srv)
            try:
                s.sendall(f"PUT {kv_path(key)} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n".encode())
                step = 256 * KiB
                for off in range(0, len(data), step):
                    s.sendall(data[off : off + step])
                    if off == 0:
                        started.wait()
                    time.sleep(0.03)  # pacing: a slow upload is still in flight at the SIGTERM
                results[key] = read_one_response(s, 10 * SLOW)
                done_at[key] = time.monotonic()
            finally:
                s.close()
        except Exception as e:  # recorded, asserted below
            results[key] = e

    def slow_download(n):
        key = f"down{n}"
        try:
            s = _healthz_first(srv)
            try:
                s.sendall(b"GET /kv/big HTTP/1.1\r\nHost: x\r\n\r\n")
                buf = bytearray()
                first, total = True, None
                deadline = time.monotonic() + 30 * SLOW
                while time.monotonic() < deadline:
                    chunk = s.recv(MiB)
                    if not chunk:
                        break
                    buf += chunk
                    if first:
                        first = False
                        started.wait()
                    total = total or response_length(buf)
                    if total is not None and len(buf) >= total:
                        break
                    time.sleep(0.02)  # pacing: a slow reader is still in flight at the SIGTERM
                status, hdrs, body = parse_raw_response(bytes(buf))
                results[key] = (status, body)
            finally:
                s.close()
        except Exception as e:
            results[key] = e

    hammer_log = []
    stop_hammer = threading.Event()

    def hammer():
        """Fresh connections before and after SIGTERM: complete answer or no answer at all."""
        refused_after = 0
        for _ in range(5000):
            if stop_hammer.is_set() or refused_after >= 3:
                break
            try:
                s = socket.create_connection((srv.host, srv.port), timeout=5)
            except (ConnectionRefusedError, socket.timeout, OSError):
                if sigterm_at:
                    refused_after += 1
                hammer_log.append(("refused", None))
                time.sleep(0.02)  # pacing of the hammer's reconnects
                continue
            try:
                try:
                    s.sendall(b"GET /kv/stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                except OSError:
                    hammer_log.append(("reset-on-send", None))
                    continue
                data, how = read_until_close(s, 10 * SLOW)
                if not data:
                    hammer_log.append(("no-answer", how))
                else:
                    status, hdrs, body = parse_raw_response(data)
                    cl = int(hdrs.get("content-length", "-1")) if status else -1
                    if status is None or len(body) != cl:
                        hammer_log.append(("CUT", data[:200]))
                    else:
                        hammer_log.append(("ok", status))
            finally:
                s.close()
            time.sleep(0.01)  # pacing of the hammer's requests

    threads = [threading.Thread(target=slow_upload, args=(n,), daemon=True) for n in range(3)]
    threads += [threading.Thread(target=slow_download, args=(n,), daemon=True) for n in range(2)]
    hammers = [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
    idle = _healthz_first(srv)
    stalled = _healthz_first(srv)
    stalled.sendall(f"PUT {kv_path('stalled')} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n".encode() + b"x" * 1000)
    try:
        for t in threads + hammers:
            t.start()
        started.wait()
        wait_until(lambda: any(x[0] == "ok" for x in hammer_log), 10 * SLOW,
                   what="a hammer connection to be served before the SIGTERM")
        t0 = time.monotonic()
        sigterm_at.append(t0)
        srv.proc.send_signal(signal.SIGTERM)

        wait_until(lambda: srv.log_text().count("draining (grace") >= len(workers), 10 * SLOW,
                   what="every worker to log that it is draining")
        # an idle keep-alive connection asking /readyz while draining: never "ready"
        try:
            idle.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            data, how = read_until_close(idle, 3 * SLOW, max_bytes=4096)
        except OSError:
            data = b""
        if data:
            status, _, _ = parse_raw_response(data)
            assert status == 503, f"/readyz while draining answered {data[:200]!r}"

        try:
            rc = srv.proc.wait(timeout=grace + 10 * SLOW)
        except Exception:
            rc = None
        took = time.monotonic() - t0
    finally:
        stop_hammer.set()
        for t in threads + hammers:
            t.join(60)
        idle.close()
        stalled.close()

    print("sigterm:", rc, round(took, 2), {k: sum(1 for x in hammer_log if x[0] == k) for k in set(x[0] for x in hammer_log)})
    assert rc == 0, f"exit code after SIGTERM: {rc}"
    assert took <= grace + 2.0 * SLOW, f"shutdown took {took:.1f}s with a {grace}s grace"
    for n in range(3):
        r = results.get(f"up{n}")
        assert not isinstance(r, Exception) and r is not None and r.status == 201, f"in-flight upload up{n} cut short: {r!r}"
        assert done_at[f"up{n}"] > t0, f"upload up{n} finished before the SIGTERM: not in flight"
    for n in range(2):
        r = results.get(f"down{n}")
        assert not isinstance(r, Exception) and r is not None, f"in-flight download down{n}: {r!r}"
        status, body = r
        assert status == 200 and body == big, f"in-flight download down{n} cut short ({len(body)} of {len(big)} bytes)"
    cut = [x for x in hammer_log if x[0] == "CUT"]
    assert not cut, f"responses cut short during the drain: {cut[:5]}"
    assert any(x[0] == "ok" for x in hammer_log), hammer_log[:10]
    _assert_gone(workers)


# ---------------------------------------------------------------------------------------------
# Malformed and hostile input. One server for all cases; after each case the same workers
# still run, serve, and hold the canary blocks intact.

CANARY = make_block(4096, "canary")
BIG = make_block(16 * MiB, "bigcanary")


@pytest.fixture(scope="module")
def mal(tmp_path_factory):
    srv = module_server(
        tmp_path_factory, "malformed",
        args=["--memory", "128M", "--workers", "2", "--io-timeout", "1s", "--idle-timeout", "1s",
              "--max-block-size", "16M"],
    )
    try:
        assert srv.put("canary", CANARY).status == 201
        assert srv.put("bigcanary", BIG).status == 201
        srv.initial_workers = srv.worker_pids()
        yield srv
    finally:
        srv.stop()


def _send(srv, payload, limit=5.0, rcvbuf=None):
    """Sends payload on a fresh connection, then reads until the server closes or `limit`."""
    s = raw_connect(srv, rcvbuf=rcvbuf)
    try:
        try:
            s.sendall(payload)
        except OSError:
            pass
        return read_until_close(s, limit * SLOW)
    finally:
        s.close()


def _first_status(data):
    return parse_raw_response(data)[0]


def _expect_4xx_or_close(data, how, allowed=(400,)):
    if data:
        status = _first_status(data)
        assert status in allowed, f"expected one of {allowed} or a close, got {data[:300]!r}"
    else:
        assert how in ("eof", "reset"), f"server neither answered nor closed ({how})"


def _expect_json_400(srv, payload):
    s = raw_connect(srv)
    try:
        s.sendall(payload)
        r = read_one_response(s, 5 * SLOW)
        assert_error(r, 400, "InvalidRequest")
        # the connection is still usable afterwards
        s.sendall(b"GET /kv/canary HTTP/1.1\r\nHost: x\r\n\r\n")
        r2 = read_one_response(s, 5 * SLOW)
        assert r2.status == 200 and r2.body == CANARY, r2
    finally:
        s.close()


def case_bad_percent(srv):
    for p in (b"/kv/%zz", b"/kv/abc%", b"/kv/abc%4", b"/kv/%%41"):
        _expect_json_400(srv, b"GET " + p + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    _expect_json_400(srv, b"PUT /kv/%zz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")


def case_nul_in_key(srv):
    _expect_json_400(srv, b"GET /kv/a%00b HTTP/1.1\r\nHost: x\r\n\r\n")
    _expect_json_400(srv, b"PUT /kv/%00 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")


def case_raw_nul_byte(srv):
    data, how = _send(srv, b"GET /kv/a\x00b HTTP/1.1\r\nHost: x\r\n\r\n")
    _expect_4xx_or_close(data, how)


def case_key_2000_bytes(srv):
    k = b"k" * 2000
    _expect_json_400(srv, b"GET /kv/" + k + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    _expect_json_400(srv, b"PUT /kv/" + k + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
    _expect_json_400(srv, b"GET /kv/" + b"%2F" * 2000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")


def case_header_100k(srv):
    data, how = _send(srv, b"GET /kv/canary HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    assert data, f"a 100 KB header got no answer ({how})"
    assert _first_status(data) in (400, 413, 431), data[:300]


def case_header_1m(srv):
    data, how = _send(srv, b"GET /kv/canary HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n")
    _expect_4xx_or_close(data, how, allowed=(400, 413, 431))


def case_many_headers(srv):
    hdrs = b"".join(b"X-H%d: v\r\n" % i for i in range(1000))
    data, how = _send(srv, b"GET /kv/canary HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + hdrs + b"\r\n")
    _expect_4xx_or_close(data, how, allowed=(200, 400, 413, 431))


def case_body_over_cap(srv):
    """Content-Length above --max-block-size: 413 before the body is sent at all."""
    s = raw_connect(srv)
    try:
        t0 = time.monotonic()
        s.sendall(b"PUT /kv/overcap HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (16 * MiB + 1))
        r = read_one_response(s, 5 * SLOW)
        assert r.status == 413, r
        assert time.monotonic() - t0 < 5 * SLOW
    finally:
        s.close()
    s = raw_connect(srv)
    try:
        s.sendall(b"PUT /kv/overcap HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (1 << 40))
        r = read_one_response(s, 5 * SLOW)
        assert r.status == 413, r
    finally:
        s.close()
    assert srv.get("overcap").status == 404


def case_chunked_body_over_cap(srv):
    chunk = b"%x\r\n" % (256 * KiB) + b"z" * (256 * KiB) + b"\r\n"
    got = send_while_reading(
        srv,
        b"PUT /kv/overcapchunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
        [chunk] * 80,  # 20 MiB > 16M cap
    )
    assert _first_status(got) == 413, got[:300]
    assert srv.get("overcapchunked").status == 404


def case_truncated_body_close(srv):
    s = raw_connect(srv)
    s.sendall(b"PUT /kv/trunc1 HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"t" * 50000)
    wait_peer_read(s, 5 * SLOW, what="the server to read the head and the first half of the body")
    s.close()
    # the server has seen the close and given the truncated PUT's reservation back
    wait_until(lambda: srv.debug_store()["reserved_blocks"] == 0, 5 * SLOW,
               what="the truncated PUT's reservation to be released")
    assert srv.get("trunc1").status == 404, "a truncated PUT became visible"


def case_truncated_body_stall(srv):
    """Declared 100000 bytes, sent half, then silence: the io-timeout (1s) ends it."""
    s = raw_connect(srv)
    try:
        t0 = time.monotonic()
        s.sendall(b"PUT /kv/trunc2 HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"t" * 50000)
        data, how = read_until_close(s, 8 * SLOW)
        took = time.monotonic() - t0
        assert how in ("eof", "reset"), f"stalled upload not timed out after {took:.1f}s"
        assert took < 6 * SLOW, took
        if data:
            assert 400 <= _first_status(data) < 500, data[:300]
    finally:
        s.close()
    assert srv.get("trunc2").status == 404


def case_slowloris_headers(srv):
    s = raw_connect(srv)
    try:
        t0 = time.monotonic()
        s.sendall(b"GET /kv/canary HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        data, how = read_until_close(s, 10 * SLOW)
        assert how in ("eof", "reset"), f"incomplete headers kept open for {time.monotonic() - t0:.1f}s"
        assert time.monotonic() - t0 < 8 * SLOW
        if data:
            assert 400 <= _first_status(data) < 500, data[:300]
    finally:
        s.close()


def case_stalled_reader(srv):
    """GET of a 16 MiB block, read a little, stall past --io-timeout: the server cuts the
    connection and drops its pin."""
    s = raw_connect(srv, rcvbuf=4096, timeout=10)
    try:
        s.sendall(b"GET /kv/bigcanary HTTP/1.1\r\nHost: x\r\n\r\n")
        head = s.recv(1000)
        assert head.startswith(b"HTTP/1.1 200"), head
        wait_until(lambda: srv.debug_store()["pinned_blocks"] >= 1, 5 * SLOW,
                   what="the GET in flight to pin its block")
        time.sleep(2.5)  # the stall under test: no read for longer than --io-timeout (1 s)
        rest, how = read_until_close(s, 20 * SLOW, max_bytes=20 * MiB)
        total = len(head) + len(rest)
        assert total < len(BIG), f"stalled reader was never cut off (received all {total} bytes, {how})"
        assert how in ("eof", "reset"), how
    finally:
        s.close()
    wait_until(lambda: srv.debug_store()["pinned_blocks"] == 0, 5 * SLOW, interval=0.1,
               what="the stalled GET's pin to be released (leaked?)")


def case_garbage_binary(srv):
    rng = random.Random(7)
    for n in range(5):
        payload = bytes(rng.getrandbits(8) for _ in range(2048)) + b"\r\n\r\n"
        data, how = _send(srv, payload)
        _expect_4xx_or_close(data, how)


def case_garbage_text(srv):
    for payload in (b"HELLO WORLD\r\n\r\n", b"GET\r\n\r\n", b"GET /kv/canary HTTP/9.9\r\n\r\n",
                    b"\r\n\r\n\r\n\r\n", b"GET /kv/canary HTTP/1.1\r\nNoColonHeader\r\n\r\n"):
        data, how = _send(srv, payload)
        _expect_4xx_or_close(data, how, allowed=(400, 405, 505))


def case_tls_hello_on_plain_port(srv):
    payload = bytes.fromhex("160301020001000200fc0303") + os.urandom(500)
    data, how = _send(srv, payload)
    _expect_4xx_or_close(data, how)


def case_bad_content_length(srv):
    for cl in (b"abc", b"-1", b"1 2", b"99999999999999999999999"):
        data, how = _send(srv, b"PUT /kv/badcl HTTP/1.1\r\nHost: x\r\nContent-Length: " + cl + b"\r\n\r\nabc")
        _expect_4xx_or_close(data, how, allowed=(400, 413))
    assert srv.get("badcl").status == 404


def case_h2_garbage(srv):
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    payload = preface + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + os.urandom(300)
    data, how = _send(srv, payload)
    assert how in ("eof", "reset"), f"h2 garbage: connection not closed ({how})"


def case_pipelined(srv):
    payload = (b"GET /kv/canary HTTP/1.1\r\nHost: x\r\n\r\n"
               b"GET /kv/%zz HTTP/1.1\r\nHost: x\r\n\r\n"
               b"HEAD /kv/canary HTTP/1.1\r\nHost: x\r\n\r\n"
               b"GET /kv/canary HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data, how = _send(srv, payload)
    statuses = []
    rest = data
    for i in range(4):
        status, hdrs, body = parse_raw_response(rest)
        assert status is not None, (i, data[:500])
        statuses.append(status)
        n = 0 if i == 2 else int(hdrs.get("content-length", "0"))
        if status == 200 and i != 2:
            assert body[:n] == CANARY
        rest = body[n:]
    assert statuses == [200, 400, 200, 200], statuses


MALFORMED = {f.__name__[5:]: f for f in (
    case_bad_percent, case_nul_in_key, case_raw_nul_byte, case_key_2000_bytes, case_header_100k, case_header_1m,
    case_many_headers, case_body_over_cap, case_chunked_body_over_cap, case_truncated_body_close,
    case_truncated_body_stall, case_slowloris_headers, case_stalled_reader, case_garbage_binary,
    case_garbage_text, case_tls_hello_on_plain_port, case_bad_content_length, case_h2_garbage,
    case_pipelined,
)}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_input(mal, case):
    MALFORMED[case](mal)
    # the same workers are alive, serve, and the stored blocks are intact
    assert mal.worker_pids() == mal.initial_workers, f"workers changed: {mal.initial_workers} -> {mal.worker_pids()}"
    for _ in range(4):  # fresh connections: both workers get a chance
        r = mal.get("canary")
        assert r.status == 200 and r.body == CANARY, r
    assert mal.request("GET", "/healthz").status == 200


def test_malformed_store_consistent(mal):
    r = mal.get("bigcanary", timeout=30)
    assert r.status == 200 and r.body == BIG
    d, s = mal.assert_consistent()
    assert s["unique_blocks"] == 2, f"malformed requests stored something: {s}"
    assert mal.worker_pids() == mal.initial_workers


def test_concurrent_mixed_ops_never_torn(kvrelay):
    """PUT / GET / DELETE from several threads on a few shared keys while a small arena keeps
    evicting: every GET is one PUT's complete bytes or a 404, and the store stays consistent."""
    srv = kvrelay("--memory", "16M", "--workers", "2")
    keys = [f"mix{i}" for i in range(24)]
    versions = {k: [make_block(256 * KiB * (v + 1) + i, f"{k}-v{v}") for v in range(3)] for i, k in enumerate(keys)}
    violations = []
    counts = {"put": 0, "get": 0, "del": 0, "hit": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + 3.0 * SLOW

    def worker(tid):
        rng = random.Random(100 + tid)
        conn = srv.connection()
        try:
            for _ in range(20000):
                if time.monotonic() > deadline:
                    break
                k = rng.choice(keys)
                op = rng.random()
                if op < 0.4:
                    r = srv.request("PUT", kv_path(k), body=rng.choice(versions[k]), conn=conn)
                    ok = r.status in (200, 201, 409)
                    name = "put"
                elif op < 0.85:
                    r = srv.request("GET", kv_path(k), conn=conn)
                    ok = r.status == 404 or (r.status == 200 and r.body in versions[k])
                    name = "get"
                    if r.status == 200:
                        with lock:
                            counts["hit"] += 1
                else:
                    r = srv.request("DELETE", kv_path(k), conn=conn)
                    ok = r.status in (200, 404)
                    name = "del"
                with lock:
                    counts[name] += 1
                    if not ok:
                        violations.append((name, k, r.status, len(r.body), r.error))
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60 * SLOW)
    assert not violations, violations[:10]
    assert counts["hit"] > 50 and counts["put"] > 50, counts
    srv.assert_consistent()


def test_readyz_503_while_a_worker_is_down(kvrelay):
    """A worker that keeps crashing young (SIGABRT; a SIGKILL from outside is replaced at once)
    is respawned after a back-off; while it is down,
    /readyz (asked over connections held by the surviving worker) says 503, and 200 again
    once the replacement runs."""
    srv = kvrelay("--memory", "64M", "--workers", "2")
    srv.kills_expected = True
    victim = srv.worker_pids()[0]
    saw = {"503": 0, "200-while-down": 0}
    reasons = set()
    for _round in range(6):
        conns = []
        for _ in range(8):
            c = srv.connection(timeout=5)
            if srv.request("GET", "/healthz", conn=c).status == 200:
                conns.append(c)
        before = set(srv.worker_pids())
        os.kill(victim, signal.SIGABRT)
        deadline = time.monotonic() + 15 * SLOW
        new = set()
        down_since = None
        while time.monotonic() < deadline:
            now_pids = set(srv.worker_pids())
            new = now_pids - before
            if new and len(now_pids) == 2:
                break
            if victim not in now_pids and down_since is None:
                down_since = time.monotonic()
            for c in list(conns):
                r = srv.request("GET", "/readyz", conn=c, timeout=2)
                if r.status == 0:
                    conns.remove(c)  # it was the victim's
                elif r.status == 503:
                    saw["503"] += 1
                    reasons.add(r.body)
                elif down_since is not None and time.monotonic() - down_since > 0.05 and not (set(srv.worker_pids()) - before):
                    saw["200-while-down"] += 1
            time.sleep(0.01)  # poll interval of the /readyz watch while the worker is replaced
        for c in conns:
            c.close()
        assert new, f"worker {victim} was not replaced"
        victim = new.pop()
        if saw["503"]:
            break
    assert saw["200-while-down"] == 0, f"/readyz said 200 while a worker was down: {saw}"
    assert saw["503"] > 0, f"/readyz never said 503 while a worker was down: {saw}"
    # the body says why
    assert b"not ready: 1 of 2 workers serving\n" in reasons and all(b.startswith(b"not ready: ") for b in reasons), reasons
    assert srv.wait_ready(10 * SLOW), "/readyz did not return to 200"
