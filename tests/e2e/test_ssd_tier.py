"""
The disk tier (issue 26; docs/ssd-tier.md), end to end on the real supervisor with
--ssd-path on /var/tmp (O_DIRECT):

  - a working set 4x the arena, every block read once (admitted), then every block read back
    byte-exact: most of them from the disk tier, each promoted back into RAM;
  - SIGKILL of the whole process group while blocks are being PUT, read and demoted; a start on
    the same file with a fresh segment: every block is byte-exact or absent (never torn or
    another's), and at least as many are back as /kv/stats counted on disk just before the kill;
  - HEAD, /exists and DELETE answer for disk blocks, and a delete holds across a restart;
  - a byte flipped in a record on the file: that block is a miss (404), logged, its neighbours
    are served;
  - a block on disk only stays in the relay's filter (/debug/filter), and leaves it when it is
    deleted;
  - a burst of copies is synced once the writer runs out of work, not only by the clock;
  - a page two thirds live is compacted before its recycle: its live blocks are served after
    it, and after a restart;
  - a file that is not a disk tier file is refused at start, untouched.

Every loop is bounded in count and time; servers are stopped by PID.
"""

import hashlib
import os
import re
import signal
import struct
import sys
import time
from array import array
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import SLOW, GroupServer, Server, kv_path, run_binary  # noqa: E402
from harness import wait_until  # noqa: E402
from relay.kvrelay_consumer import filter_contains  # noqa: E402

MiB = 1 << 20
ARENA = "32M"
# --ssd-window as large as the arena: every block read is copied soon, so fill() can pace the
# PUTs by the copies (with the default, a quarter of the arena, only the coldest are copied)
SSD = ("--ssd-size", "200M", "--ssd-page-size", "16M", "--ssd-window", ARENA)


@pytest.fixture
def ssd_dir():
    d = Path(f"/var/tmp/kvr-e2e-ssd-{os.getpid()}-{time.monotonic_ns()}")
    d.mkdir()
    yield d
    for f in d.iterdir():
        f.unlink()
    d.rmdir()


@pytest.fixture
def start(tmp_path):
    started = []

    def run(ssd, *args, name=None, cls=Server):
        srv = cls(tmp_path, args=["--memory", ARENA, "--workers", "2", "--ssd-path", str(ssd), *SSD, *args],
                  name=name or f"ssd{len(started)}")
        started.append(srv)
        return srv.start()

    yield run
    for s in started:
        s.stop()


def block(i, size=MiB):
    seed = hashlib.sha256(b"ssd-%d" % i).digest()
    return (seed * (size // 32 + 1))[:size]


def get(conn, key):
    conn.request("GET", kv_path(key))
    r = conn.getresponse()
    return r.status, r.read()


def seqhash(i):
    return 0x5EED0000 + i


def put_and_read(srv, conn, i):
    key = f"ssd/{i:05d}"
    conn.request("PUT", kv_path(key), body=block(i), headers={"X-KV-Sequence-Hash": str(seqhash(i))})
    r = conn.getresponse()
    r.read()
    assert r.status in (200, 201), (key, r.status)
    status, body = get(conn, key)  # read once: admitted to the disk tier
    assert status == 200 and body == block(i), key


def fill(srv, n, behind=12):
    """PUTs and reads n blocks of 1 MiB, keeping the disk writer at most `behind` blocks
    behind (bounded wait per block), so that nothing is evicted uncopied."""
    conn = srv.connection()
    for i in range(n):
        put_and_read(srv, conn, i)
        if i >= behind:
            wait_until(lambda: srv.stats().get("disk_blocks", 0) >= i + 1 - behind, 10 * SLOW, interval=0.01,
                       what=f"the disk writer to copy block {i - behind}")
    conn.close()


def test_a_working_set_4x_the_arena_reads_back_byte_exact(start, ssd_dir):
    srv = start(ssd_dir / "tier")
    n = 128  # 128 MiB through a 32 MiB arena
    fill(srv, n)
    before = srv.stats()
    assert before["evictions"] >= n - 32, before
    conn = srv.connection()
    bad = [i for i in range(n) if get(conn, f"ssd/{i:05d}") != (200, block(i))]
    conn.close()
    after = srv.stats()
    print(f"4x: {n} blocks, {after['disk_blocks']} on disk, {before['unique_blocks']} in RAM before the reads, "
          f"{after['evictions'] - before['evictions']} evictions while reading back")
    assert not bad, f"blocks not served byte-exact: {bad[:10]}"
    assert after["disk_blocks"] >= n - 12
    assert after["evictions"] > before["evictions"], "the reads promoted blocks back into RAM"


def test_sigkill_of_the_group_then_restart_serves_what_was_on_disk(start, ssd_dir):
    tier = ssd_dir / "tier"
    a = start(tier, name="killed", cls=GroupServer)
    a.kills_expected = True
    conn = a.connection()
    n = 0
    t_end = time.monotonic() + 10 * SLOW
    while n < 80 and time.monotonic() < t_end:  # PUT and read until 80 blocks, 10 s at most
        put_and_read(a, conn, n)
        n += 1
    on_disk = a.stats()["disk_blocks"]
    os.killpg(a.pid, signal.SIGKILL)  # mid-demotion: the writer is copying the latest reads
    a.proc.wait(10)
    conn.close()
    # unpaced, the writer may fall behind and drop blocks (a PUT never waits for the disk); some
    # copies must have been made for the kill to fall in the middle of demotion
    assert on_disk >= 8, f"hardly any block was copied: {on_disk} of {n}"

    b = start(tier, name="after")
    assert "blocks restored" in b.log_text()
    conn = b.connection()
    ok = miss = 0
    for i in range(n):
        status, body = get(conn, f"ssd/{i:05d}")
        if status == 404:
            miss += 1
            continue
        assert status == 200 and body == block(i), f"block {i}: {status}, {len(body)} bytes: torn or another's"
        ok += 1
    conn.close()
    print(f"sigkill: {n} PUT, {on_disk} on disk before the kill, {ok} served after the restart, {miss} gone")
    assert ok >= on_disk, f"{ok} served, {on_disk} were on disk before the kill"


def test_head_exists_delete_and_a_delete_holds_across_restarts(start, ssd_dir):
    tier = ssd_dir / "tier"
    a = start(tier)
    fill(a, 64)
    key = "ssd/00002"  # long evicted from RAM: on disk only
    assert a.request("HEAD", kv_path(key)).status == 200
    assert a.request("GET", kv_path(key) + "/exists").json()["exists"] is True
    r = a.delete(key)
    assert r.status == 200, r
    assert a.get(key).status == 404
    assert a.request("HEAD", kv_path(key)).status == 404
    a.stop()  # a clean stop: the writer reaps what is left before it seals
    b = start(tier, name="again")
    assert b.get(key).status == 404, "the delete holds across the restart"
    assert b.get("ssd/00003").body == block(3)


def test_a_flipped_byte_is_a_miss_and_its_neighbours_are_served(start, ssd_dir):
    tier = ssd_dir / "tier"
    a = start(tier)
    fill(a, 48)
    a.stop()  # a clean stop: every page sealed
    data = bytearray(tier.read_bytes())
    hdr = data.find(b"ssd/00005", 0)  # the key's copy in its record header (offset 256)
    assert hdr > 0
    rec = hdr - 256
    data_off = rec + 4096 + 9 + 1000  # the body: key (9 bytes), then payload
    with open(tier, "r+b") as f:
        f.seek(data_off)
        f.write(bytes([data[data_off] ^ 0x20]))
    b = start(tier, name="flipped")
    assert b.get("ssd/00005").status == 404, "a corrupted block is never served"
    assert b.get("ssd/00004").body == block(4)
    assert b.get("ssd/00006").body == block(6)
    wait_until(lambda: "torn or not this key's" in b.log_text(), 5 * SLOW, what="the corruption logged")


def disk_metrics(srv):
    body = srv.request("GET", "/metrics").body.decode()
    return {k: float(v) for k, v in re.findall(r"^(kvrelay_(?:disk_reads|get_hits|get_misses)_total) (\S+)$", body, re.M)}


def test_a_batch_get_serves_disk_blocks_and_the_client_loads_them(start, ssd_dir):
    """POST /batch/get of blocks on disk only, in RAM and nowhere: each disk block is read back
    (promoted) and framed byte-exact with the others; the missing one alone is not found. The
    Python client's get_many_into (LMCache's and SGLang's batched loads) fills every buffer of
    disk-only blocks the same way (docs/ssd-tier.md, "Reads and promotion")."""
    a = start(ssd_dir / "tier")
    fill(a, 64)
    assert a.stats()["evictions"] >= 32
    want = [2, 3, None, 63, 4]  # on disk only, on disk only, nowhere, in RAM, on disk only
    keys = [f"ssd/{i:05d}" if i is not None else "ssd/nothing" for i in want]
    m0 = disk_metrics(a)
    r = a.request("POST", "/batch/get", body="\n".join(keys).encode())
    assert r.status == 200, r
    body = r.body
    assert body[:4] == b"KVRB" and int.from_bytes(body[4:8], "little") == len(keys), body[:8]
    pos, got = 8, []
    for _ in keys:
        found, length = body[pos], int.from_bytes(body[pos + 8:pos + 16], "little")
        pos += 16
        got.append(body[pos:pos + length] if found else None)
        pos += length
    assert pos == len(body), (pos, len(body))
    for i, g in zip(want, got):
        assert g == (block(i) if i is not None else None), f"block {i}: {None if g is None else len(g)} bytes"
    m1 = disk_metrics(a)
    d = {k: m1[k] - m0[k] for k in m1}
    assert d == {"kvrelay_disk_reads_total": 3, "kvrelay_get_hits_total": 4, "kvrelay_get_misses_total": 1}, d

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python"))
    from kvrelay import Client

    idx = list(range(5, 13))  # on disk only
    bufs = [bytearray(MiB) for _ in idx]
    with Client(url=f"http://{a.host}:{a.port}") as c:
        ok = c.get_many_into([f"ssd/{i:05d}" for i in idx], bufs)
    assert ok == [True] * len(idx), ok
    assert all(bytes(b) == block(i) for i, b in zip(idx, bufs))
    assert disk_metrics(a)["kvrelay_disk_reads_total"] - m1["kvrelay_disk_reads_total"] == len(idx)


def ns_metric(srv, name, ns):
    m = re.search(rf'^{name}{{namespace="{ns}"}} (\S+)$', srv.request("GET", "/metrics").body.decode(), re.M)
    return float(m.group(1)) if m else None


def test_an_ssd_quota_drops_its_namespace_s_oldest_disk_copies_only(start, ssd_dir, tmp_path):
    """ssd= in the tenants file (docs/ssd-tier.md, "Namespaces"): namespace a (ssd=8M) and b
    (none) each store 40 blocks of 1 MiB through a 32 MiB arena; a keeps at most 8 MiB on disk,
    its newest, and its oldest are gone from both tiers; b keeps all it copied; a's scoped
    /kv/stats shows its own disk bytes only; a restart on the same file keeps the quota."""
    tenants = tmp_path / "tenants"
    tenants.write_text("a tok-a ssd=8M\nb tok-b\n")
    tier = ssd_dir / "tier"

    def run(name):
        return start(tier, "--tenants", str(tenants), "--admin-token", "tok-admin", name=name,
                     cls=lambda *a, **k: Server(*a, token="tok-admin", **k))

    srv = run("quota")
    for i in range(40):
        for ns in ("a", "b"):
            key, tok = f"q/{i:03d}", f"tok-{ns}"
            r = srv.request("PUT", kv_path(key), body=block(1000 * (ns == "b") + i), token=tok)
            assert r.status == 201, (ns, key, r.status)
            assert srv.request("GET", kv_path(key), token=tok).status == 200  # read once: admitted
        wait_until(lambda: disk_metrics_all(srv)["kvrelay_disk_writes_total"] >= 2 * (i + 1) - 12, 10 * SLOW,
                   interval=0.01, what=f"the disk writer to keep up with block {i}")
    # every block copied (the writer drops a's oldest at the end of each round: a round's copies
    # may take a past its quota until then)
    wait_until(lambda: disk_metrics_all(srv)["kvrelay_disk_writes_total"] >= 80, 10 * SLOW, what="every copy")
    wait_until(lambda: ns_metric(srv, "kvrelay_namespace_disk_bytes", "a") <= 8 * MiB, 5 * SLOW,
               what=lambda: f"a within its quota: {ns_metric(srv, 'kvrelay_namespace_disk_bytes', 'a')}")
    a_bytes = ns_metric(srv, "kvrelay_namespace_disk_bytes", "a")
    b_bytes = ns_metric(srv, "kvrelay_namespace_disk_bytes", "b")
    m = disk_metrics_all(srv)
    print(f"ssd=8M: a {a_bytes / MiB:.0f} MiB on disk, b {b_bytes / MiB:.0f} MiB; "
          f"{m['kvrelay_disk_quota_evictions_total']:.0f} dropped for the quota")
    assert 0 < a_bytes <= 8 * MiB, a_bytes
    assert m["kvrelay_disk_quota_evictions_total"] >= 40 - 12 - 8, m
    assert ns_metric(srv, "kvrelay_namespace_ssd_quota_bytes", "a") == 8 * MiB
    assert ns_metric(srv, "kvrelay_namespace_ssd_quota_bytes", "b") == 0
    st = srv.request("GET", "/kv/stats", token="tok-a").json()
    assert st["namespace"] == "a" and st["disk_bytes"] == a_bytes, st
    # a's oldest are gone from both tiers; its newest and all of b's copies are served
    assert srv.request("GET", kv_path("q/000"), token="tok-a").status == 404
    assert srv.request("GET", kv_path("q/039"), token="tok-a").body == block(39)
    assert srv.request("GET", kv_path("q/000"), token="tok-b").body == block(1000)
    srv.stop()

    again = run("quota-again")
    assert ns_metric(again, "kvrelay_namespace_disk_bytes", "a") <= 8 * MiB, "the quota holds after a restart"
    assert again.request("GET", kv_path("q/001"), token="tok-b").body == block(1001)
    assert again.request("GET", kv_path("q/038"), token="tok-a").body == block(38)


def disk_metrics_all(srv):
    body = srv.request("GET", "/metrics").body.decode()
    return {k: float(v) for k, v in re.findall(r"^(kvrelay_disk_[a-z_]+) (\S+)$", body, re.M)}


def test_a_burst_of_copies_is_synced_once_the_writer_runs_out_of_work(start, ssd_dir):
    """--ssd-sync-interval 60m: no sync is due by the clock, yet once the writer has copied a
    burst and has nothing left to copy, it syncs the file (docs/ssd-tier.md, "Syncs"): a flush
    stalls the writes behind it, so it waits for the writer's idle time. With nothing written
    since, an idle writer does not sync again."""
    srv = start(ssd_dir / "tier", "--ssd-sync-interval", "60m")
    syncs0 = disk_metrics_all(srv)["kvrelay_disk_syncs_total"]
    conn = srv.connection()
    for i in range(20):  # 20 MiB: a 16 MiB page sealed, the next one open
        put_and_read(srv, conn, i)
    conn.close()
    wait_until(lambda: disk_metrics_all(srv)["kvrelay_disk_writes_total"] >= 20, 10 * SLOW,
               what="the writer to copy the 20 blocks")

    def syncs():
        return disk_metrics_all(srv)["kvrelay_disk_syncs_total"]

    def settled():  # above the start, and unchanged for 1 s (the metric follows the writer's rounds)
        a = syncs()
        time.sleep(1.0)
        return a > syncs0 and syncs() == a and a

    # the copies' sync, then the sealed page's header's at a later idle round
    synced = wait_until(settled, 10 * SLOW, what="syncs once the writer had nothing left to copy")
    time.sleep(1.0)  # 100 idle rounds of the writer (10 ms each)
    assert syncs() == synced, "an idle writer with nothing new synced again"


def test_a_mostly_live_page_is_compacted_before_it_is_recycled(start, ssd_dir):
    """Four pages of 16 MiB (15 blocks of 1 MiB each), a 32 MiB arena. Blocks 0-39 fill pages 0
    and 1 and part of 2; 0-4 are deleted, so page 0 is two thirds live. When the last free page
    opens, the writer copies page 0's 10 live records to it (docs/ssd-tier.md, "Compaction");
    15 more blocks then fill that page and recycle page 0. Blocks 5-14, long gone from RAM, are
    served from their copies, byte-exact, and again after a restart; 0-4 stay deleted."""
    tier = ssd_dir / "tier"
    a = start(tier, "--ssd-size", "65M")  # 1 MiB of superblock and 4 pages
    conn = a.connection()

    def writes():
        return disk_metrics_all(a)["kvrelay_disk_writes_total"]

    def put_paced(i):
        # the writer up to 8 copies behind: a round writes several records, and the one that
        # does not fit opens a page; compaction is tried right then, while that page is empty
        # (docs/ssd-tier.md, "Compaction"; before, only at the next round's start, and 1 run in
        # 3 to 8 found the page already past the room it needs), and nothing is evicted uncopied
        put_and_read(a, conn, i)
        wait_until(lambda: writes() >= i + 1 - 8, 10 * SLOW, interval=0.005, what=f"the copy of block {i - 8}")

    for i in range(40):
        put_paced(i)
    for i in range(5):
        assert a.delete(f"ssd/{i:05d}").status == 200
    i = 40
    while disk_metrics_all(a)["kvrelay_disk_compacted_pages_total"] < 1 and i < 70:  # the 4th page opens near 45
        put_paced(i)
        i += 1
    wait_until(lambda: disk_metrics_all(a)["kvrelay_disk_compacted_pages_total"] >= 1, 10 * SLOW,
               what="page 0 to be compacted")
    for k in range(i, i + 15):  # fill the compacted copies' page: page 0 is recycled for the next
        put_paced(k)
    wait_until(lambda: writes() >= i + 15, 10 * SLOW, what="the last copies")
    m = disk_metrics_all(a)
    assert m["kvrelay_disk_compacted_blocks_total"] >= 10, m
    print(f"compaction: a page compacted after block {i - 1}, {m['kvrelay_disk_compacted_blocks_total']:.0f} "
          f"blocks copied, {m['kvrelay_disk_evictions_total']:.0f} dropped with recycled pages")
    # page 0's header (after the 1 MiB superblock: magic, index, version, little-endian; see
    # src/wire/ssdfmt.c): the first pass over the four pages opened versions 1 to 4, so a
    # higher version means page 0 was recycled for new records
    with open(tier, "rb") as f:
        f.seek(MiB)
        magic, page, version = struct.unpack("<8sQQ", f.read(24))
    assert magic == b"KVRSSDPG" and page == 0, (magic, page)
    assert version > 4, f"page 0 not recycled yet (version {version})"
    conn.close()

    def check(srv):
        c = srv.connection()
        for j in range(5):
            assert get(c, f"ssd/{j:05d}")[0] == 404, f"deleted block {j} came back"
        bad = [j for j in range(5, 15) if get(c, f"ssd/{j:05d}") != (200, block(j))]
        c.close()
        assert not bad, f"page 0's live blocks not served byte-exact after its recycle: {bad}"

    reads = disk_metrics_all(a)["kvrelay_disk_reads_total"]
    check(a)
    assert disk_metrics_all(a)["kvrelay_disk_reads_total"] >= reads + 10, "blocks 5-14 were read from disk"
    a.stop()
    check(start(tier, "--ssd-size", "65M", name="again"))


def in_filter(srv, i):
    r = srv.request("GET", "/debug/filter", timeout=30)
    assert r.status == 200, r
    words = array("Q")
    words.frombytes(r.body)
    return filter_contains(words, seqhash(i))


def test_a_block_on_disk_only_stays_visible_to_routers(start, ssd_dir):
    a = start(ssd_dir / "tier")
    fill(a, 64)
    key = "ssd/00002"  # evicted from RAM long ago: on disk only
    assert a.stats()["evictions"] >= 32
    wait_until(lambda: all(in_filter(a, i) for i in range(64)), 5 * SLOW,
               what="every block, RAM or disk, in the relay's filter")
    # the exact lookup by hash (docs/kv-lookup.md) holds the disk blocks too
    assert lookup(a, list(range(64)) + [999]) == ([True] * 64 + [False], 64)
    assert a.delete(key).status == 200
    wait_until(lambda: not in_filter(a, 2), 5 * SLOW, what="the deleted block out of the filter")
    assert in_filter(a, 3)
    assert lookup(a, range(6)) == ([True, True, False, True, True, True], 2)


def lookup(srv, idx):
    r = srv.request("POST", "/batch/lookup", body="\n".join(str(seqhash(i)) for i in idx).encode())
    assert r.status == 200, r
    j = r.json()
    return j["held"], j["prefix"]


def refused(*args):
    p = run_binary(["--http-bind", "127.0.0.1:0", "--grpc-bind", "off", "--memory", ARENA, *args], timeout=30)
    err = p.stderr.decode(errors="replace") + p.stdout.decode(errors="replace")
    assert p.returncode == 2, f"expected a refusal (exit 2), got {p.returncode}: {err}"
    return err


def test_a_file_that_is_not_a_tier_or_of_another_size_is_refused_untouched(start, ssd_dir):
    other = ssd_dir / "precious"
    other.write_bytes(b"not a disk tier" * 1000)
    err = refused("--ssd-path", str(other), *SSD)
    assert "is not a kvrelay disk tier file" in err, err
    assert other.read_bytes() == b"not a disk tier" * 1000

    tier = ssd_dir / "tier"
    start(tier).stop()
    err = refused("--ssd-path", str(tier), "--ssd-size", "300M", "--ssd-page-size", "16M")
    assert "give the size and page size it was made with" in err, err
    err = refused("--ssd-path", "relative/path", *SSD)
    assert "must be an absolute path" in err, err
    err = refused("--ssd-path", str(tier), "--ssd-size", "20M", "--ssd-page-size", "16M")
    assert "must hold 1 MiB and two pages" in err, err
