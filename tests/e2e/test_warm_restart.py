"""
Warm restart (issue 13): --segment-path keeps the segment in a file on tmpfs (here /dev/shm)
that outlives the processes; a new start on the same file re-attaches it, repairs the store
and publishes a new relay generation holding every block.

  - SIGTERM, start again: every block GETs byte-identical, the /kv/stats residency counters
    are the same, /debug/store is clean, and a relay subscriber (grpcio, the fail-closed
    consumer of relay/kvrelay_consumer.py) gets a snapshot of a NEW generation (new
    incarnation, higher layout_generation and catalog revision) holding every canonical hash;
  - SIGKILL of the whole process group in the middle of a PUT/GET load: every acknowledged
    block intact, every in-flight one absent or intact, /debug/store clean;
  - another geometry, a corrupted header, a wrong magic and a file in use are refused with
    errors naming the difference (a live kvrelay's lock at once); --segment-reset starts empty;
  - the file's lock (issue 20): 20 restarts, each started the moment the process group before
    was SIGKILLed under PUT load, all come up with every acknowledged block; a lock whose
    holder is gone is waited for, and the wait is logged.

`python3 tests/e2e/test_warm_restart.py --measure [GiB [block bytes]]` fills a segment of that
size (4 GiB of 2 MiB blocks by default) and prints how long a re-attach takes (not part of the
suite: it needs 4 GiB of RAM). A hugetlbfs segment is tested where KVRELAY_TEST_HUGETLBFS names
a mount with free huge pages.
"""

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import (  # noqa: E402
    SLOW,
    GroupServer,
    Server,
    http_request,
    kv_path,
    run_binary,
)
from harness import tcp_sockets, wait_until  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
SIZES = [1, 17, 100, 4095, 4096, 4097, 10000, 16 * KiB, 65 * KiB, 200 * KiB]


def xxh3(b):
    import xxhash

    return xxhash.xxh3_64_intdigest(b)


@pytest.fixture
def seg_path():
    p = Path("/dev/shm") / f"kvrelay-e2e-{uuid.uuid4().hex[:12]}.seg"
    yield p
    try:
        p.unlink()
    except FileNotFoundError:
        pass


@pytest.fixture
def servers(tmp_path):
    started = []

    def start(seg, *args, name=None, cls=Server):
        srv = cls(tmp_path, args=["--segment-path", str(seg), *args], name=name or f"warm{len(started)}")
        started.append(srv)
        return srv.start()

    yield start
    for s in started:
        s.stop()


RESIDENCY = ("unique_blocks", "total_refs", "resident_bytes", "logical_bytes", "dedup_savings_bytes",
             "capacity_bytes", "total_pages", "free_pages", "pinned_blocks", "zombie_blocks")


def residency(stats):
    return {k: stats[k] for k in RESIDENCY if k in stats}


def fill(srv, n, rng):
    """PUTs n blocks of mixed sizes (every tenth a dedup PUT of an earlier key); returns
    {key: (bytes, canonical hash)}."""
    blocks = {}
    conn = srv.connection()
    try:
        for i in range(n):
            size = rng.choice(SIZES)
            key = f"warm/{i:05d}-{rng.getrandbits(32):08x}"
            data = rng.randbytes(size)
            if i % 3 == 0:
                canon = rng.getrandbits(64)
                hdr = {"X-KV-Sequence-Hash": str(canon)}
            else:
                canon, hdr = xxh3(key.encode()), {}
            r = srv.request("PUT", kv_path(key), body=data, headers=hdr, conn=conn)
            if r.status == 0:
                conn = srv.connection()
            assert r.status == 201, f"PUT {key}: {r!r}"
            blocks[key] = (data, canon)
            if i % 10 == 9:
                k2 = rng.choice(list(blocks))
                r = srv.request("PUT", kv_path(k2), body=blocks[k2][0], conn=conn)
                assert r.status == 200, f"dedup PUT {k2}: {r!r}"
    finally:
        conn.close()
    return blocks


def check_blocks(srv, blocks, what):
    conn = srv.connection()
    bad = []
    try:
        for key, (data, _canon) in blocks.items():
            r = srv.request("GET", kv_path(key), conn=conn)
            if r.status == 0:
                conn = srv.connection()
                r = srv.request("GET", kv_path(key), conn=conn)
            if r.status != 200 or r.body != data:
                bad.append((key, r.status, len(r.body), len(data)))
    finally:
        conn.close()
    assert not bad, f"{what}: {len(bad)} of {len(blocks)} blocks missing or different, e.g. {bad[:5]}"


# ---------------------------------------------------------------------------------------------
# The relay side: the grpcio consumer of tests/e2e/relay


def relay_client(srv):
    from relay.conftest import RelayServer, _generate_stubs  # noqa: F401
    import importlib
    import tempfile
    import types

    out = Path(tempfile.mkdtemp(prefix="relay_stubs_", dir=str(srv.tmpdir)))
    _generate_stubs(out)
    sys.path.insert(0, str(out))
    try:
        mods = {m: importlib.import_module(m) for m in ("relay_pb2", "relay_pb2_grpc", "health_pb2", "health_pb2_grpc")}
    finally:
        sys.path.remove(str(out))
    stubs = types.SimpleNamespace(pb=mods["relay_pb2"], rpc=mods["relay_pb2_grpc"],
                                  hpb=mods["health_pb2"], hrpc=mods["health_pb2_grpc"])
    return RelayServer(srv, stubs)


def relay_view(rs):
    """(catalog revision, producer, incarnation) of a fresh catalog watch."""
    from relay.kvrelay_consumer import check_envelope

    inc = check_envelope(rs.relay_info())
    cat = rs.catalog()
    assert len(cat.snapshot.pools) == 1, cat
    return cat.revision, cat.snapshot.pools[0].producer, inc


def snapshot_replica(rs, producer, inc, name):
    from relay.kvrelay_consumer import PoolReplica

    d = rs.quiesce()
    rep = PoolReplica(producer, inc, name=name)
    rd = rs.reader(rs.subscribe(producer, name), name)
    deadline = time.monotonic() + 15 * SLOW
    while not (rep.ready and rep.seq >= d["published_seq"]):
        assert time.monotonic() < deadline, f"{name}: no snapshot within 15 s (seq {rep.seq})"
        ev = rd.get(0.5)
        if ev is None:
            continue
        assert ev[0] == "msg", f"{name}: stream ended: {ev}"
        rep.apply(ev[2])
    return rep


# ---------------------------------------------------------------------------------------------


def test_sigterm_then_restart_keeps_every_block_and_publishes_a_new_generation(servers, seg_path):
    from relay.kvrelay_consumer import occupied_slots

    rng = random.Random(1301)
    args = ("--memory", "96M", "--workers", "2", "--grpc-bind", "127.0.0.1:0")
    a = servers(seg_path, *args, name="before")
    assert "new file" in a.log_text(), a.log_tail(20)
    blocks = fill(a, 1000, rng)
    sizes = {len(d) for d, _ in blocks.values()}
    assert len(sizes) == len(SIZES), sizes
    s0 = a.stats()
    assert s0["unique_blocks"] == 1000 and s0["evictions"] == 0, s0
    assert s0["total_refs"] > 1000, "the dedup PUTs count references"
    ra = relay_client(a)
    try:
        rev0, prod0, inc0 = relay_view(ra)
        rep0 = snapshot_replica(ra, prod0, inc0, "before")
        canon = {c for _, c in blocks.values()}
        assert all(rep0.contains(c) for c in canon)
    finally:
        ra.close()
    assert a.stop() == 0, a.log_tail(30)
    assert seg_path.stat().st_size > 96 * MiB

    b = servers(seg_path, *args, name="after")
    log = b.log_text()
    assert "re-attached" in log and "store repair done" in log, b.log_tail(30)
    check_blocks(b, blocks, "after SIGTERM and restart")
    # polls until the last GET's pin is let go (it may lag the response by a moment), so that
    # pinned_blocks compares like for like
    b.assert_consistent()
    s1 = b.stats()
    assert residency(s1) == residency(s0), (residency(s0), residency(s1))
    rb = relay_client(b)
    try:
        rev1, prod1, inc1 = relay_view(rb)
        assert inc1 != inc0, "a restart is a new relay incarnation"
        assert prod1.producer_incarnation != prod0.producer_incarnation
        assert prod1.layout_generation > prod0.layout_generation, (prod0.layout_generation, prod1.layout_generation)
        assert rev1 > rev0, f"catalog revision must move: {rev0} -> {rev1}"
        rep1 = snapshot_replica(rb, prod1, inc1, "after")
        missing = [hex(c) for c in canon if not rep1.contains(c)]
        assert not missing, f"{len(missing)} canonical hashes not in the new snapshot: {missing[:5]}"
        assert occupied_slots(rep1.words) == len(canon), (occupied_slots(rep1.words), len(canon))
        assert rep1.snapshot_seq == 0 or rep1.words is not None
    finally:
        rb.close()
    print(f"1000 blocks ({s0['resident_bytes']} bytes) kept; generation {prod0.layout_generation} -> "
          f"{prod1.layout_generation}, catalog revision {rev0} -> {rev1}")


class Load:
    """PUT and GET threads against a server until stopped; records every acknowledged PUT."""

    def __init__(self, srv, known, seconds):
        self.srv = srv
        self.known = known  # key -> bytes, resident before the load
        self.acked = {}
        self.inflight = {}
        self.errors = []
        self.gets = 0
        self.stop_at = time.monotonic() + seconds
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.putter, args=(i,), daemon=True) for i in range(3)]
        self.threads += [threading.Thread(target=self.getter, args=(i,), daemon=True) for i in range(2)]

    def running(self):
        return not self.stopped.is_set() and time.monotonic() < self.stop_at

    def putter(self, t):
        rng = random.Random(t)
        conn = self.srv.connection(timeout=5)
        n = 0
        while self.running() and n < 100000:
            n += 1
            key = f"load/{t}/{n:06d}"
            data = rng.randbytes(rng.choice(SIZES))
            with self.lock:
                self.inflight[key] = data
            r = http_request(self.srv.host, self.srv.port, "PUT", kv_path(key), body=data, conn=conn, timeout=5)
            if r.status in (200, 201):
                with self.lock:
                    self.acked[key] = data
                    del self.inflight[key]
            elif r.status == 0:
                break  # the server is gone: this PUT stays in flight
            else:
                self.errors.append((key, r.status))
        conn.close()

    def getter(self, t):
        rng = random.Random(100 + t)
        keys = list(self.known)
        conn = self.srv.connection(timeout=5)
        n = 0
        while self.running() and n < 100000:
            n += 1
            key = rng.choice(keys)
            r = http_request(self.srv.host, self.srv.port, "GET", kv_path(key), conn=conn, timeout=5)
            if r.status == 0:
                break
            if r.status != 200 or r.body != self.known[key]:
                self.errors.append((key, r.status))
            self.gets += 1
        conn.close()

    def start(self):
        for th in self.threads:
            th.start()
        return self

    def join(self):
        self.stopped.set()
        for th in self.threads:
            th.join(15 * SLOW)


def test_sigkill_of_the_process_group_under_load_leaves_a_repairable_segment(servers, seg_path):
    rng = random.Random(1302)
    args = ("--memory", "96M", "--workers", "2", "--grpc-bind", "127.0.0.1:0")
    a = servers(seg_path, *args, name="killed", cls=GroupServer)
    a.kills_expected = True
    base = {k: d for k, (d, _c) in fill(a, 300, rng).items()}
    pids = [a.pid] + a.children()
    assert len(pids) >= 4, pids
    load = Load(a, base, 20 * SLOW).start()
    wait_until(lambda: len(load.acked) >= 300 and load.gets >= 300, 10 * SLOW, interval=0.02,
               what=f"300 PUTs acknowledged and 300 GETs (now {len(load.acked)}, {load.gets})")
    os.killpg(a.pid, signal.SIGKILL)  # the supervisor and all its children, at once
    a.proc.wait(10)
    load.join()
    assert a.proc.returncode == -signal.SIGKILL
    assert not load.errors, load.errors[:5]
    # every process of the group is gone (their flock on the file with them)
    wait_until(lambda: not any(Path(f"/proc/{p}").exists()
                               and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1][:3]
                               for p in pids if Path(f"/proc/{p}/stat").exists()),
               10 * SLOW, what=f"every process of the killed group {pids} to be gone")
    a.stop()

    b = servers(seg_path, *args, name="repaired")
    assert "re-attached" in b.log_text(), b.log_tail(30)
    b.assert_consistent()
    check_blocks(b, {k: (d, 0) for k, d in base.items()}, "blocks stored before the load")
    check_blocks(b, {k: (d, 0) for k, d in load.acked.items()}, "acknowledged PUTs of the load")
    torn = []
    for key, data in load.inflight.items():
        r = b.get(key)
        if not (r.status == 404 or (r.status == 200 and r.body == data)):
            torn.append((key, r.status, len(r.body), len(data)))
    assert not torn, f"in-flight PUTs must be absent or whole: {torn}"
    s = b.stats()
    assert s["unique_blocks"] >= len(base) + len(load.acked), s
    # the repaired store takes new writes
    assert b.put("after-kill", b"x" * 5000).status == 201
    b.assert_consistent()
    print(f"killed under load: {len(load.acked)} acknowledged PUTs and {load.gets} GETs, "
          f"{len(load.inflight)} in flight; all intact after repair")


class PutLoad:
    """PUT threads until the server goes away or each has sent max_puts; every acknowledged
    (201) PUT and every PUT still unanswered when the server went is recorded."""

    def __init__(self, srv, prefix, rng, threads=2, max_puts=15):
        self.max_puts = max_puts
        self.srv = srv
        self.acked = {}
        self.inflight = {}
        self.errors = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        seeds = [rng.getrandbits(32) for _ in range(threads)]
        self.threads = [threading.Thread(target=self.putter, args=(f"{prefix}/{t}", seeds[t]), daemon=True)
                        for t in range(threads)]
        for th in self.threads:
            th.start()

    def putter(self, prefix, seed):
        rng = random.Random(seed)
        conn = self.srv.connection(timeout=5)
        n = 0
        while not self.stopped.is_set() and n < self.max_puts:
            n += 1
            key = f"{prefix}/{n:05d}"
            data = rng.randbytes(rng.choice(SIZES[:8]))
            with self.lock:
                self.inflight[key] = data
            r = http_request(self.srv.host, self.srv.port, "PUT", kv_path(key), body=data, conn=conn, timeout=5)
            if r.status == 0:
                break  # the server is gone: this PUT stays in flight
            with self.lock:
                del self.inflight[key]
                if r.status == 201:
                    self.acked[key] = data
                else:
                    self.errors.append((key, r.status))
        conn.close()

    def join(self):
        self.stopped.set()
        for th in self.threads:
            th.join(15 * SLOW)


class PrimedServer(GroupServer):
    """A GroupServer whose process is forked ahead (a shell waiting on a pipe) and execs the
    binary when released: its start follows whatever came just before by no more than an exec,
    as a restart loop's would (a fork of the test process alone takes some ms). The thread that
    forks it lives as long as the server: the harness's PR_SET_PDEATHSIG fires when the forking
    thread ends."""

    def prime(self):
        r, self._go = os.pipe()
        self._outcome = []
        self._done = threading.Event()
        orig = subprocess.Popen

        def popen(argv, *a, **kw):
            kw["stdin"] = r
            return orig(["/bin/sh", "-c", 'read go; exec "$@" </dev/null', "sh", *argv], *a, **kw)

        def run():
            subprocess.Popen = popen
            try:
                self.start()
                self._outcome.append(None)
            except BaseException as e:  # noqa: B036 (pytest.fail raises a BaseException)
                self._outcome.append(e)
            finally:
                subprocess.Popen = orig
            self._done.wait()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        wait_until(lambda: self.proc is not None, 10 * SLOW, interval=0.001, what="the primed binary to be spawned")
        os.close(r)
        return self

    def release(self):
        """Lets the binary run, and returns once it serves (or raises why it did not)."""
        os.write(self._go, b"go\n")
        os.close(self._go)
        wait_until(lambda: self._outcome, 60 * SLOW, interval=0.005, what="the primed server to start")
        if self._outcome[0] is not None:
            raise self._outcome[0]
        return self

    def stop(self, grace=None):
        rc = super().stop(grace)
        if hasattr(self, "_done"):
            self._done.set()
            if threading.current_thread() is not self._thread:  # a failed start stops from there
                self._thread.join(10)
        return rc


def _half_sent_puts(srv, prefix, n, length=50000):
    """n connections, each with a PUT whose body is a tenth sent: receives pending in the
    workers' rings at the kill, which the kernel has to cancel while it tears them down."""
    socks = []
    for i in range(n):
        s = socket.create_connection((srv.host, srv.port), timeout=5 * SLOW)
        s.sendall(f"PUT {kv_path(f'{prefix}/{i:03d}')} HTTP/1.1\r\nHost: t\r\nContent-Length: {length}\r\n\r\n"
                  .encode() + b"h" * (length // 10))
        socks.append(s)
    return socks


def _heads_read(srv, socks, body_sent):
    """True when the server has read at least each request's head: no more than the body
    bytes sent are left in its receive queue of each connection."""
    unread = {r["remote"][1]: r["rx_queue"] for r in tcp_sockets(srv.port) if r["local"][1] == srv.port}
    return all(unread.get(s.getsockname()[1], 1 << 30) <= body_sent for s in socks)


def test_restart_right_after_sigkill_of_the_group_waits_for_the_lock(tmp_path, seg_path):
    """Issue 20: the kernel tears the killed processes' io_uring rings down after they are gone,
    and until then the file's flock is still held (some tens of ms with receives pending). 20
    restarts, each started the moment the whole process group of the one before was SIGKILLed
    under PUT load with 64 PUTs half sent, all come up (the new supervisor waits for the lock,
    since its holder is no live kvrelay), and every block acknowledged in any round is there
    byte for byte; a PUT in flight at a kill is absent or whole, a half-sent one absent."""
    rounds = 20
    rng = random.Random(2001)
    args = ["--segment-path", str(seg_path), "--memory", "32M", "--workers", "2"]
    acked, refusals, waited, started = {}, [], 0, []
    t0 = time.monotonic()

    def start(name):
        srv = GroupServer(tmp_path, args=args, name=name)
        started.append(srv)
        return srv.start()

    def primed(name):
        srv = PrimedServer(tmp_path, args=args, name=name)
        started.append(srv)
        return srv.prime()

    try:
        srv = start("lock0")
        for rnd in range(1, rounds + 1):
            srv.kills_expected = True
            load = PutLoad(srv, f"r{rnd:02d}", rng)
            wait_until(lambda: len(load.acked) >= 10, 5 * SLOW, interval=0.005,
                       what=f"round {rnd}: 10 PUTs acknowledged")
            half = _half_sent_puts(srv, f"half/r{rnd:02d}", 64)
            nxt = primed(f"lock{rnd}")
            # the workers have read the heads and wait for the bodies (or for the budget)
            wait_until(lambda: _heads_read(srv, half, 50000 // 10), 10 * SLOW,
                       what=f"round {rnd}: the workers to read the 64 half-sent PUTs' heads")
            os.killpg(srv.pid, signal.SIGKILL)  # the supervisor and all its children, at once
            # the next start goes at once, before the killed group is reaped or gone
            try:
                nxt.release()
            except pytest.fail.Exception as e:
                refusals.append((rnd, str(e)[-600:]))
                nxt = None
            srv.proc.wait(10)
            load.join()
            srv.stop()
            for sk in half:
                sk.close()
            assert not load.errors, load.errors[:5]
            assert len(load.acked) >= 10, f"round {rnd}: only {len(load.acked)} PUTs acknowledged"
            acked.update(load.acked)
            srv = nxt if nxt is not None else start(f"lock{rnd}-again")
            log = srv.log_text()
            assert "re-attached" in log, srv.log_tail(30)
            waited += "for its lock" in log
            check_blocks(srv, {k: (d, 0) for k, d in acked.items()}, f"acknowledged PUTs after restart {rnd}")
            torn = []
            for key, data in load.inflight.items():
                r = srv.get(key)
                if not (r.status == 404 or (r.status == 200 and r.body == data)):
                    torn.append((key, r.status, len(r.body), len(data)))
            assert not torn, f"round {rnd}: in-flight PUTs must be absent or whole: {torn}"
            present = [i for i in range(0, 64, 7) if srv.get(f"half/r{rnd:02d}/{i:03d}").status != 404]
            assert not present, f"round {rnd}: half-sent PUTs stored: {present}"
        srv.assert_consistent()
        assert srv.stats()["evictions"] == 0, "an eviction would hide a lost block"
    finally:
        for s in started:
            s.stop()
    print(f"{rounds} restarts right after a SIGKILL of the group: {len(refusals)} refused, {waited} waited for "
          f"the lock; {len(acked)} acknowledged blocks intact; {time.monotonic() - t0:.1f}s")
    assert not refusals, f"{len(refusals)} of {rounds} restarts refused: {refusals[:2]}"

# Holds the file's flock in a child that outlives the process that took it (so /proc/locks
# names a pid that is gone), then lets go after the given seconds.
_ORPHAN_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
if os.fork() == 0:
    os.write(1, b"held\\n")
    time.sleep(float(sys.argv[2]))  # holds the lock this long: the duration under test
    os._exit(0)
os._exit(0)
"""


def test_a_lock_whose_holder_is_gone_is_waited_for(servers, seg_path):
    """The supervisor waits (bounded) for a lock held on behalf of a process that is gone, as
    the kernel holds a killed run's lock until it has torn its processes down; it logs when it
    starts waiting and when it got the lock."""
    a = servers(seg_path, "--memory", "32M", "--workers", "1", name="w0")
    assert a.put("w-key", b"w" * 3000).status == 201
    assert a.stop() == 0
    hold = subprocess.Popen([sys.executable, "-c", _ORPHAN_HOLDER, str(seg_path), "1.0"], stdout=subprocess.PIPE)
    try:
        assert hold.stdout.readline() == b"held\n"
        assert hold.wait(10) == 0  # the process that took the lock is gone (reaped), its child holds it
        t0 = time.monotonic()
        b = servers(seg_path, "--memory", "32M", "--workers", "1", name="w1")
        took = time.monotonic() - t0
    finally:
        hold.stdout.close()
    log = b.log_text()
    assert f"is locked (holder pid {hold.pid}: gone): waiting up to" in log, b.log_tail(20)
    assert "got its lock after" in log, b.log_tail(20)
    assert took >= 0.5, f"started after {took:.2f}s, while the lock was held for 1 s"
    assert b.get("w-key").body == b"w" * 3000


def refused(seg, *args):
    p = run_binary(["--segment-path", str(seg), "--http-bind", "127.0.0.1:0", "--grpc-bind", "off", *args],
                   timeout=30)
    err = p.stderr.decode(errors="replace") + p.stdout.decode(errors="replace")
    assert p.returncode != 0, f"expected a refusal, the server ran: {err}"
    return err


def test_geometry_mismatch_is_refused_and_reset_starts_empty(servers, seg_path):
    a = servers(seg_path, "--memory", "32M", name="g0")
    assert a.put("g-key", b"g" * 1000).status == 201
    t0 = time.monotonic()
    err = refused(seg_path, "--memory", "32M")
    assert "in use by another running kvrelay" in err and f"(pid {a.pid}, kvr supervisor)" in err, err
    # a live kvrelay's lock is refused at once, not after the wait for a killed run's lock
    assert time.monotonic() - t0 < 3 * SLOW, f"refused only after {time.monotonic() - t0:.1f}s"
    assert "for its lock" not in err, err
    assert a.stop() == 0
    err = refused(seg_path, "--memory", "64M")
    assert "geometry differs" in err and "arena bytes (--memory) 33554432 in the file, 67108864 configured" in err, err
    err = refused(seg_path, "--memory", "32M", "--max-blocks", "1000")
    assert "geometry differs" in err and "--max-blocks" in err, err
    err = refused(seg_path, "--memory", "32M", "--page-size", "8K")
    assert "geometry differs" in err and "--page-size" in err, err
    b = servers(seg_path, "--memory", "32M", name="g1")
    assert b.get("g-key").body == b"g" * 1000, "a refused start does not touch the file"
    b.stop()
    c = servers(seg_path, "--memory", "64M", "--segment-reset", name="g2")
    assert "--segment-reset: discarding" in c.log_text()
    assert c.get("g-key").status == 404 and c.stats()["unique_blocks"] == 0
    c.assert_consistent()


def test_corrupted_header_and_foreign_files_are_refused(servers, seg_path):
    a = servers(seg_path, "--memory", "32M", name="c0")
    assert a.put("c-key", b"c" * 1000).status == 201
    assert a.stop() == 0
    raw = bytearray(seg_path.read_bytes()[:4096])
    with open(seg_path, "r+b") as f:
        f.seek(48)  # max_blocks: a geometry field
        f.write(bytes([raw[48] ^ 0x5A]))
    err = refused(seg_path, "--memory", "32M")
    assert "header is corrupted (checksum" in err, err
    with open(seg_path, "r+b") as f:
        f.seek(48)
        f.write(bytes([raw[48]]))
        f.seek(8)  # layout_version
        f.write((99).to_bytes(4, "little"))
    err = refused(seg_path, "--memory", "32M")
    assert "layout version 99, this build reads version" in err, err
    with open(seg_path, "r+b") as f:
        f.seek(0)
        f.write(b"NOTKVREL")
    err = refused(seg_path, "--memory", "32M")
    assert "not a kvrelay segment or its header is corrupted" in err, err
    with open(seg_path, "r+b") as f:
        f.write(bytes(raw[:12]))
    b = servers(seg_path, "--memory", "32M", name="c1")
    assert b.get("c-key").body == b"c" * 1000, "restored header: the file attaches again"
    b.stop()
    os.truncate(seg_path, 1 << 20)
    err = refused(seg_path, "--memory", "32M")
    assert "truncated or corrupted" in err, err
    small = seg_path.with_suffix(".small")
    small.write_bytes(b"x" * 100)
    try:
        err = refused(small, "--memory", "32M")
        assert "smaller than a header" in err, err
    finally:
        small.unlink()
    disk = Path("/var/tmp") / f"kvrelay-e2e-{uuid.uuid4().hex[:8]}.seg"
    try:
        err = refused(disk, "--memory", "32M")
        assert "must be on tmpfs or hugetlbfs" in err, err
    finally:
        if disk.exists():
            disk.unlink()


def test_hugetlbfs_segment_file_is_reattached(servers):
    """On hugetlbfs the segment is in 2 MiB pages; needs a mount with free pages, given as
    KVRELAY_TEST_HUGETLBFS (e.g. echo 64 > /proc/sys/vm/nr_hugepages; mount -t hugetlbfs none DIR)."""
    d = os.environ.get("KVRELAY_TEST_HUGETLBFS")
    if not d:
        pytest.skip("KVRELAY_TEST_HUGETLBFS (a hugetlbfs mount with >= 30 free 2 MiB pages) is not set")
    seg = Path(d) / f"kvrelay-e2e-{uuid.uuid4().hex[:8]}.seg"
    try:
        a = servers(seg, "--memory", "16M", "--workers", "1", name="huge0")
        assert "on hugetlb 2 MiB pages, new file" in a.log_text(), a.log_tail(10)
        assert a.put("h-key", b"h" * 100000).status == 201
        assert a.stop() == 0
        err = refused(seg, "--memory", "16M", "--hugepages", "off")
        assert "is on hugetlbfs but --hugepages is off" in err, err
        b = servers(seg, "--memory", "16M", "--workers", "1", name="huge1")
        assert "re-attached" in b.log_text() and "on hugetlb 2 MiB pages" in b.log_text()
        assert b.get("h-key").body == b"h" * 100000
        b.assert_consistent()
    finally:
        if seg.exists():
            seg.unlink()


# ---------------------------------------------------------------------------------------------
# Re-attach time of a full segment (by hand: python3 tests/e2e/test_warm_restart.py --measure 4)


def _measure(gib, block):
    import tempfile

    seg = Path("/dev/shm") / f"kvrelay-measure-{os.getpid()}.seg"
    td = tempfile.mkdtemp(prefix="kvrelay-measure-")
    args = ["--memory", f"{gib}G", "--workers", "2", "--grpc-bind", "127.0.0.1:0", "--segment-path", str(seg)]
    try:
        t0 = time.monotonic()
        a = Server(td, args=args, name="fill").start()
        cold = time.monotonic() - t0
        blk = os.urandom(block)
        conn = a.connection()
        n = min((gib << 30) // block - 8, (gib << 30) // 4096 // 2 - 8)  # the arena or the index, whichever fills first
        t0 = time.monotonic()
        for i in range(n):  # every page of the arena written once (touched)
            r = a.request("PUT", kv_path(f"m{i:07d}"), body=blk[:-8] + i.to_bytes(8, "little"), conn=conn)
            assert r.status == 201, r
        fill_s = time.monotonic() - t0
        conn.close()
        st = a.stats()
        a.stop()
        t0 = time.monotonic()
        b = Server(td, args=args, name="reattach").start()
        warm = time.monotonic() - t0
        line = [ln for ln in b.log_text().splitlines() if "re-attach and repair" in ln]
        assert b.stats()["unique_blocks"] == st["unique_blocks"]
        b.stop()
        print(f"segment {seg.stat().st_size} bytes, {st['unique_blocks']} blocks of {block} bytes ({st['resident_bytes']} bytes) "
              f"filled in {fill_s:.1f} s")
        print(f"empty start to /readyz: {cold * 1000:.0f} ms; re-attach start to /readyz: {warm * 1000:.0f} ms")
        print(line[-1] if line else "(no re-attach timing line)")
    finally:
        if seg.exists():
            seg.unlink()


if __name__ == "__main__":
    if "--measure" in sys.argv:
        rest = [a for a in sys.argv[1:] if a != "--measure"]
        _measure(int(rest[0]) if rest else 4, int(rest[1]) if len(rest) > 1 else 2 * MiB)
