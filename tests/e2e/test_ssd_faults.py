"""
The disk tier's faults (issue 26; docs/ssd-tier.md, "Faults"), end to end on the real
supervisor. Reads and writes fail through the test hook KVRELAY_SSD_FAULT (io/ssdfault.h), a
full file system is a size-limited tmpfs:

  - a read that fails (EIO) or finds the end of the file: that GET is a 404, counted in
    kvrelay_disk_read_errors_total, logged at most once a second; the block stays on disk
    (HEAD still finds it), no worker dies, RAM blocks are served as before;
  - reads cut short (every read returns half of what it read): every block is served byte-exact
    all the same;
  - a write that fails (EIO) or is cut short (a full device): counted in
    kvrelay_disk_write_errors_total, the block stays in RAM only (not tried again), the writer
    backs off; every GET is byte-exact or a 404, none of the failed copies is ever served or
    restored, and a restart on the same file brings back exactly what was indexed;
  - a file system too small for --ssd-size: the start is refused (exit 2) with the reason and
    the space it tried to take given back; on a tmpfs that fits, the tier serves (tmpfs takes
    O_DIRECT since Linux 6.6; before, the tier falls back to buffered I/O and says so).

Every loop is bounded in count and time; servers are stopped by PID.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import SLOW, Server, run_binary  # noqa: E402
from harness import wait_until  # noqa: E402
from test_metrics import promtool_check  # noqa: E402
from test_ssd_tier import ARENA, SSD, block, get, put_and_read, ssd_dir  # noqa: E402,F401  (ssd_dir: a fixture)

N = 48  # blocks of 1 MiB through a 32 MiB arena: the first ~16 end up on disk only


@pytest.fixture
def start(tmp_path):
    started = []

    def run(ssd, fault=None, args=SSD, name=None, memory=ARENA):
        env = {"KVRELAY_SSD_FAULT": fault} if fault else {}
        srv = Server(tmp_path, args=["--memory", memory, "--workers", "2", "--ssd-path", str(ssd), *args],
                     env=env, name=name or f"fault{len(started)}")
        started.append(srv)
        return srv.start()

    yield run
    for s in started:
        s.stop()


def metrics(srv):
    body = srv.request("GET", "/metrics").body.decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^([a-z_]+) (\S+)$", body, re.M)}


def fill(srv, n, behind=12):
    """PUTs and reads n blocks (each read once: admitted), keeping the disk writer's attempts
    (copies and failed copies) at most `behind` blocks behind, then waits until it has tried
    all n (a failing device makes it pause between rounds: up to a second)."""
    def caught_up(k):
        m = metrics(srv)
        return m["kvrelay_disk_writes_total"] + m["kvrelay_disk_write_errors_total"] >= k

    conn = srv.connection()
    for i in range(n):
        put_and_read(srv, conn, i)
        if i >= behind:
            wait_until(lambda: caught_up(i + 1 - behind), 10 * SLOW, interval=0.01,
                       what=f"the disk writer to try block {i - behind}")
    conn.close()
    wait_until(lambda: caught_up(n), 10 * SLOW, interval=0.01, what="the disk writer to try every block")


def read_all(srv, n):
    conn = srv.connection()
    got = {i: get(conn, f"ssd/{i:05d}") for i in range(n)}
    conn.close()
    wrong = [i for i, (status, body) in got.items() if status == 200 and body != block(i)]
    assert not wrong, f"blocks served with wrong bytes: {wrong}"
    other = {i: s for i, (s, _) in got.items() if s not in (200, 404)}
    assert not other, f"answers other than 200 or 404: {other}"
    return sorted(i for i, (s, _) in got.items() if s == 404)


def no_process_died(srv):
    m = metrics(srv)
    assert m["kvrelay_worker_restarts_total"] == 0, m
    assert m["kvrelay_workers"] == 2, m
    assert srv.log_text().count("publisher started") == 1, "the publisher was restarted"


@pytest.mark.parametrize("fault", ["read-eio", "read-eof"])
def test_a_failed_read_is_a_counted_miss_and_loses_nothing(start, ssd_dir, fault):
    srv = start(ssd_dir / "tier", fault=fault)
    fill(srv, N)
    m0 = metrics(srv)
    assert m0["kvrelay_disk_writes_total"] >= N - 12, m0
    t0 = time.monotonic()
    missed = read_all(srv, N)
    m1 = metrics(srv)
    print(f"{fault}: {len(missed)} of {N} GETs missed, {m1['kvrelay_disk_read_errors_total']:.0f} read errors")
    assert len(missed) >= 8, f"too few blocks were on disk only to test reads: {missed}"
    assert m1["kvrelay_disk_read_errors_total"] - m0["kvrelay_disk_read_errors_total"] == len(missed), m1
    # each failed read is a miss of that GET, counted once; the others hits
    assert m1["kvrelay_get_misses_total"] - m0["kvrelay_get_misses_total"] == len(missed), m1
    assert m1["kvrelay_get_hits_total"] - m0["kvrelay_get_hits_total"] == N - len(missed), m1
    assert m1["kvrelay_disk_reads_total"] == m0["kvrelay_disk_reads_total"], "a failed read served a block"
    # the disk copies are still there: a failed read is not a lost block
    for i in missed:
        assert srv.request("HEAD", f"/kv/ssd/{i:05d}").status == 200, i
    wait_until(lambda: "ssd: a read of page" in srv.log_text(), 5 * SLOW, what="the read error logged")
    lines = srv.log_text().count("ssd: a read of page")
    # at most a line a second in each of the 2 workers
    assert lines <= 2 * (time.monotonic() - t0 + 2), f"{lines} log lines for {len(missed)} failed reads"
    no_process_died(srv)


def test_reads_cut_short_still_serve_every_block_byte_exact(start, ssd_dir):
    srv = start(ssd_dir / "tier", fault="read-short")
    fill(srv, N)
    m0 = metrics(srv)
    missed = read_all(srv, N)
    m1 = metrics(srv)
    assert missed == [], f"short reads made misses: {missed}"
    assert "the first read made to fail on purpose" in srv.log_text(), "the hook never cut a read short"
    assert m1["kvrelay_disk_reads_total"] - m0["kvrelay_disk_reads_total"] >= 8, m1
    assert m1["kvrelay_disk_read_errors_total"] == 0 and m1["kvrelay_disk_read_bad_total"] == 0, m1
    no_process_died(srv)


@pytest.mark.parametrize("fault", ["write-eio:4", "write-short:4"])
def test_a_failed_write_keeps_the_block_in_ram_only_and_is_never_restored(start, ssd_dir, fault):
    srv = start(ssd_dir / "tier", fault=fault)
    fill(srv, N)
    m = metrics(srv)
    print(f"{fault}: {m['kvrelay_disk_writes_total']:.0f} copies, {m['kvrelay_disk_write_errors_total']:.0f} failed")
    assert m["kvrelay_disk_write_errors_total"] >= 8, m
    # what the index holds is what was copied less what went with recycled pages (the writer's
    # counters reach /metrics through the publisher a moment later)
    wait_until(lambda: (lambda x: x["kvrelay_disk_blocks"] <= x["kvrelay_disk_writes_total"]
                        - x["kvrelay_disk_evictions_total"])(metrics(srv)), 5 * SLOW, what="the counters")
    wait_until(lambda: "could not be written" in srv.log_text(), 5 * SLOW, what="the write error logged")
    assert srv.log_text().count("could not be written") < m["kvrelay_disk_write_errors_total"], "not rate-limited"
    missed = read_all(srv, N)
    m = metrics(srv)
    # a block lost from RAM was either never copied (failed, or the writer was behind) or is
    # served from disk; nothing else
    lost = m["kvrelay_disk_write_errors_total"] + m["kvrelay_disk_demotion_drops_total"] + m["kvrelay_disk_evictions_total"]
    assert len(missed) <= lost, (missed, m)
    assert len(missed) > 0, "every failed copy was still in RAM: the test did not reach the disk"
    no_process_died(srv)
    on_disk = int(m["kvrelay_disk_blocks"])
    srv.stop()

    # a restart on the same file, without faults: what was indexed comes back, nothing else
    again = start(ssd_dir / "tier", name="after")
    assert re.search(rf"\b{on_disk} blocks restored", again.log_text()), again.log_text()[-2000:]
    # RAM starts empty: every block served now is one the index held at the stop (a block whose
    # copy failed and that was still in RAM is gone); none that was missing before comes back
    served = set(range(N)) - set(read_all(again, N))
    assert len(served) == on_disk, (sorted(served), on_disk)
    assert not served & set(missed), "a restart served a block that was missing before it"


def _mount_tmpfs(path, size):
    path.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if p.returncode != 0:
        path.rmdir()
        pytest.skip(f"cannot mount a tmpfs here (not root?): {p.stderr.decode(errors='replace').strip()}")


def test_a_file_system_too_small_is_refused_and_one_that_fits_serves(start, tmp_path):
    small = tmp_path / "small"
    _mount_tmpfs(small, "48M")
    try:
        p = run_binary(["--http-bind", "127.0.0.1:0", "--grpc-bind", "off", "--memory", ARENA, "--ssd-path",
                        str(small / "tier"), "--ssd-size", "64M", "--ssd-page-size", "4M"], timeout=30)
        err = p.stderr.decode(errors="replace") + p.stdout.decode(errors="replace")
        assert p.returncode == 2, f"expected a refusal (exit 2), got {p.returncode}: {err}"
        assert "cannot reserve" in err and "No space left on device" in err, err
        st = os.statvfs(small)
        assert st.f_bfree * st.f_frsize > 40 << 20, "the failed reserve kept the space it took"

        # 20 blocks of 1 MiB through an 8 MiB arena, into 9 pages of 4 MiB (3 records each)
        srv = start(small / "tier", memory="8M", args=("--ssd-size", "40M", "--ssd-page-size", "4M",
                                                      "--ssd-window", "8M"))
        fill(srv, 20, behind=4)
        m0 = metrics(srv)
        missed = read_all(srv, 20)
        m = metrics(srv)
        assert missed == [], (missed, m)
        assert m["kvrelay_disk_reads_total"] - m0["kvrelay_disk_reads_total"] >= 8, m
        assert "KVRELAY_SSD_FAULT" not in srv.log_text(), "no fault hook here: the tmpfs alone"
        srv.stop()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_latency_histograms_count_every_read_and_write(start, ssd_dir):
    """No fault: each record write the writer completed and each read that served a GET is in its
    histogram once, buckets cumulative up to +Inf = count (docs/ssd-tier.md, "Metrics")."""
    srv = start(ssd_dir / "tier")
    fill(srv, N)
    missed = read_all(srv, N)
    assert missed == [], missed
    body = srv.request("GET", "/metrics").body.decode()
    m = metrics(srv)
    for name, total in (("kvrelay_disk_read_seconds", "kvrelay_disk_reads_total"),
                        ("kvrelay_disk_write_seconds", "kvrelay_disk_writes_total")):
        wait_until(lambda: metrics(srv)[f"{name}_count"] == metrics(srv)[total], 5 * SLOW, what=f"{name} counted")
        m = metrics(srv)
        assert m[total] >= 8, (total, m[total])
        buckets = [(float(le) if le != "+Inf" else float("inf"), float(v)) for le, v in
                   re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', body, re.M)]
        assert len(buckets) == 13 and buckets[-1][0] == float("inf"), buckets
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), f"{name}: not cumulative {buckets}"
        assert m[f"{name}_sum"] > 0, m
    rc, out = promtool_check(srv.request("GET", "/metrics").body.decode())
    assert rc == 0, f"promtool check metrics failed with the disk tier on:\n{out}"
    no_process_died(srv)


def test_a_promotion_is_a_hit_and_a_disk_read_not_a_miss_or_a_put(start, ssd_dir):
    """A GET served from disk counts as a hit and a disk read, not as a miss in RAM nor as a PUT
    of a new block; a GET neither tier serves is one miss (docs/ssd-tier.md, "Metrics")."""
    srv = start(ssd_dir / "tier")
    fill(srv, N)
    conn = srv.connection()
    assert get(conn, "ssd/nothing-here")[0] == 404
    m0 = metrics(srv)
    missed = read_all(srv, N)
    assert get(conn, "ssd/nothing-here")[0] == 404
    conn.close()
    m1 = metrics(srv)
    d = {k: m1[k] - m0[k] for k in ("kvrelay_get_hits_total", "kvrelay_get_misses_total", "kvrelay_put_new_total",
                                     "kvrelay_disk_reads_total")}
    assert missed == [], missed
    assert d["kvrelay_disk_reads_total"] >= 8, d
    assert d["kvrelay_get_hits_total"] == N, d
    assert d["kvrelay_get_misses_total"] == 1, d
    assert d["kvrelay_put_new_total"] == 0, d


def test_reads_past_the_workers_budget_are_503_and_served_on_retry(tmp_path, ssd_dir):
    """KVR_API_DISK_READS_MAX (64) reads from disk in flight in one worker: a burst of 100 GETs of
    blocks on disk only, sent while the worker is stopped (SIGSTOP) so that all of them are in
    its ring when it resumes, gets 200 byte-exact for the ones within the budget and 503 with
    Retry-After for the rest, each counted in kvrelay_disk_read_busy_total; every 503 is served
    byte-exact on retry, and no process dies (docs/ssd-tier.md, "Faults")."""
    size, n, burst = 64 << 10, 800, 100  # 50 MiB of 64 KiB blocks through a 32 MiB arena
    srv = Server(tmp_path, args=["--memory", ARENA, "--workers", "1", "--ssd-path", str(ssd_dir / "tier"), *SSD],
                 name="budget").start()
    try:
        conn = srv.connection()
        for i in range(n):
            key = f"small/{i:05d}"
            conn.request("PUT", f"/kv/{key}", body=block(i, size))
            r = conn.getresponse()
            r.read()
            assert r.status in (200, 201), (key, r.status)
            assert get(conn, key) == (200, block(i, size)), key  # read once: admitted
            if i >= 100:
                wait_until(lambda: metrics(srv)["kvrelay_disk_writes_total"] >= i - 100, 10 * SLOW, interval=0.01,
                           what=f"the disk writer to copy block {i - 100}")
        conn.close()
        wait_until(lambda: metrics(srv)["kvrelay_disk_writes_total"] >= n, 10 * SLOW, what="every block copied")
        m0 = metrics(srv)
        assert m0["kvrelay_evictions_total"] >= burst + 50, f"too few blocks left RAM for the burst: {m0}"

        (worker,) = srv.worker_pids()
        socks = []
        try:
            for _ in range(burst):  # connected and served once: each has its receive armed in the worker
                s = socket.create_connection((srv.host, srv.port), timeout=10 * SLOW)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                status = _read_response(s)[0]
                assert status == 200
                socks.append(s)
            os.kill(worker, signal.SIGSTOP)
            try:
                for i, s in enumerate(socks):  # the first `burst` blocks: evicted first, on disk only
                    s.sendall(f"GET /kv/small/{i:05d} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                time.sleep(0.2)
            finally:
                os.kill(worker, signal.SIGCONT)
            answers = [_read_response(s) for s in socks]
        finally:
            for s in socks:
                s.close()
        ok = [i for i, a in enumerate(answers) if a[0] == 200]
        busy = [i for i, a in enumerate(answers) if a[0] == 503]
        wrong = [i for i in ok if answers[i][1] != block(i, size)]
        other = {i: a[0] for i, a in enumerate(answers) if a[0] not in (200, 503)}
        m1 = metrics(srv)
        print(f"budget: {len(ok)} served, {len(busy)} answered 503 of a burst of {burst}")
        assert not wrong and not other, (wrong, other)
        assert busy, "no GET of the burst went past the budget of 64 reads in flight"
        assert len(ok) >= 64, f"fewer than the budget were served: {len(ok)}"
        assert all(answers[i][2] == "1" for i in busy), "a 503 without Retry-After: 1"
        assert m1["kvrelay_disk_read_busy_total"] - m0["kvrelay_disk_read_busy_total"] == len(busy), m1
        assert m1["kvrelay_disk_reads_total"] - m0["kvrelay_disk_reads_total"] == len(ok), m1
        conn = srv.connection()
        again = {i: get(conn, f"small/{i:05d}") for i in busy}
        conn.close()
        assert all(v == (200, block(i, size)) for i, v in again.items()), {i: v[0] for i, v in again.items()}
        m2 = metrics(srv)
        assert m2["kvrelay_worker_restarts_total"] == 0 and m2["kvrelay_workers"] == 1, m2
    finally:
        srv.stop()


def _read_response(s):
    """One HTTP/1.1 response with a Content-Length from socket s: (status, body, Retry-After)."""
    buf = b""
    deadline = time.monotonic() + 10 * SLOW
    while b"\r\n\r\n" not in buf and time.monotonic() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(hdrs.get("content-length", "0"))
    while len(body) < length and time.monotonic() < deadline:
        chunk = s.recv(max(65536, length - len(body)))
        if not chunk:
            break
        body += chunk
    assert len(body) == length, f"a response cut short: {len(body)} of {length} bytes"
    return status, body, hdrs.get("retry-after")
