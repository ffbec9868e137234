"""Each worker maps the arena into its own page tables ahead of use (--arena-prefault,
src/proc/prefault.c): after a fill, a PUT into pages another worker wrote pays no page fault.
The workers' minor-fault counts (/proc/PID/stat) are read around a run of PUTs; the same run
with the thread off shows the faults it saves, so the check can fail."""
import http.client
import random
import time

import pytest

from conftest import SLOW, kv_path
from harness import wait_until

BLOCK = 16 << 10
ARENA = 32 << 20


def minflt(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])  # field 10, minflt


def put_many(srv, prefix, count, conns=8):
    """PUTs count new 16 KiB blocks over `conns` keep-alive connections, each PUT on one
    picked at random: both workers take some (each connection belongs to one worker), and the
    block a PUT evicts, whose pages it takes, may be either worker's (a fixed rotation could
    pair every PUT with an evictee of its own worker)."""
    pick = random.Random(count)
    body = bytes(range(256)) * (BLOCK // 256)
    cs = [http.client.HTTPConnection(srv.host, srv.port, timeout=10 * SLOW) for _ in range(conns)]
    try:
        for i in range(count):
            c = cs[pick.randrange(conns)]
            c.request("PUT", kv_path(f"{prefix}-{i}"), body=body)
            r = c.getresponse()
            r.read()
            assert r.status in (200, 201), (r.status, i)
    finally:
        for c in cs:
            c.close()


def faults_per_put(srv, count):
    pids = srv.worker_pids()
    assert len(pids) == 2, pids
    before = sum(minflt(p) for p in pids)
    put_many(srv, "measure", count)
    return (sum(minflt(p) for p in pids) - before) / count


def fill(srv):
    put_many(srv, "fill", 2 * ARENA // BLOCK)  # twice the arena: evicting, every page written


def wait_mapped(srv, line="arena mapped into this worker's page tables"):
    """Waits until both workers have logged `line` (their prefault thread is done)."""
    wait_until(lambda: srv.log_text().count(line) >= 2, 20 * SLOW, what=lambda: f"two lines {line!r}: {srv.log_tail()}")


def test_puts_after_a_fill_do_not_fault(kvrelay):
    srv = kvrelay("--memory", "32M", "--workers", "2")
    fill(srv)
    wait_mapped(srv)
    per_put = faults_per_put(srv, 1000)
    # a 16 KiB PUT spans 4-5 pages of 4 KiB, and without the thread it faults about once
    # (1.1 here; the next test); what is left is the heap's and the stack's, and in a sanitizer
    # build the shadow memory's too: 0.02 per PUT here, 0.14 under ASan
    assert per_put < 0.25, per_put


def test_without_prefault_puts_fault_into_pages_of_the_other_worker(kvrelay):
    # 4 KiB pages even where vm.nr_hugepages reserves 2 MiB ones: on those a 16 KiB PUT rarely
    # meets a page the other worker has not mapped (one fault per 2 MiB)
    srv = kvrelay("--memory", "32M", "--workers", "2", "--arena-prefault", "0", "--hugepages", "off")
    fill(srv)
    assert "arena mapped" not in srv.log_text()
    assert "collapse" not in srv.log_text()  # --hugepages off: not even announced
    per_put = faults_per_put(srv, 1000)
    assert per_put > 0.5, per_put


def test_prefault_lead_is_bounded_by_the_high_water_mark(kvrelay):
    """With a small lead and nothing stored, a worker maps no more than the lead: an idle
    server does not commit its arena."""
    srv = kvrelay("--memory", "256M", "--workers", "2", "--arena-prefault", "4M")
    time.sleep(0.5)
    for pid in srv.worker_pids():
        with open(f"/proc/{pid}/status") as f:
            shmem = [int(x.split()[1]) for x in f if x.startswith("RssShmem:")][0]
        # the segment's index and maps are shared memory too, touched at start; the arena's
        # 256 MiB are not: well under it
        assert shmem < 96 << 10, shmem


def pmd_mapped_kib(pid):
    """How much of the shared memory this process maps with 2 MiB entries (smaps_rollup)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return [int(x.split()[1]) for x in f if x.startswith("ShmemPmdMapped:")][0]


def fill_checked(srv, count, size=1 << 20):
    """PUTs `count` blocks of distinct bytes, then GETs every one still stored byte-exact;
    returns how many were."""
    blocks = {f"thp-{i}": random.Random(i).randbytes(size) for i in range(count)}
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=10 * SLOW)
    try:
        for k, body in blocks.items():
            c.request("PUT", kv_path(k), body=body)
            r = c.getresponse()
            r.read()
            assert r.status in (200, 201), (r.status, k)
        hits = 0
        for k, body in blocks.items():
            c.request("GET", kv_path(k))
            r = c.getresponse()
            got = r.read()
            assert r.status in (200, 404), (r.status, k)
            if r.status == 200:
                assert got == body, f"{k}: {len(got)} bytes differ from the {len(body)} PUT"
                hits += 1
        return hits
    finally:
        c.close()


def test_the_arena_is_collapsed_into_transparent_huge_pages(kvrelay):
    """No hugetlb pages reserved: each worker collapses the arena it maps into 2 MiB pages
    (MADV_COLLAPSE), here right at the high-water mark (a lead of one page), through blocks
    being written; every block stored still reads back byte-exact."""
    srv = kvrelay("--memory", "32M", "--workers", "2", "--arena-prefault", "4K")
    log = srv.log_text()
    if "hugetlb 2 MiB pages" in log:
        pytest.skip("the segment got reserved hugetlb pages: nothing to collapse")
    hits = fill_checked(srv, 48)
    assert hits >= 16, hits  # a 32 MiB arena of 1 MiB blocks keeps the last 20-odd
    wait_mapped(srv)
    log = srv.log_text()
    if "no transparent huge pages from here on" in log:
        pytest.skip("this kernel does not collapse shmem: " + log.split("no transparent huge pages")[1].split("\n")[0])
    wait_mapped(srv, "this worker collapsed")  # logged just after "arena mapped"
    log = srv.log_text()
    assert log.count("this worker collapsed") == 2, srv.log_tail()
    collapsed = [int(x.split("collapsed ")[1].split(" ")[0]) for x in log.splitlines() if "this worker collapsed" in x]
    assert sum(collapsed) >= 8, collapsed  # 16 ranges of 2 MiB, each taken by one worker or both
    mapped = [pmd_mapped_kib(p) for p in srv.worker_pids()]
    assert max(mapped) >= (ARENA >> 10) // 4, mapped  # 0 on 4 KiB pages; 22-32 MiB seen here
    assert fill_checked(srv, 24) >= 16  # and PUTs into the collapsed arena read back too


def test_hugepages_off_keeps_4k_pages(kvrelay):
    srv = kvrelay("--memory", "32M", "--workers", "2", "--hugepages", "off")
    assert fill_checked(srv, 48) >= 16
    wait_mapped(srv)
    assert "collapse" not in srv.log_text()
    assert srv.log_text().count("4 KiB pages") >= 2, srv.log_tail()
    assert [pmd_mapped_kib(p) for p in srv.worker_pids()] == [0, 0]


def test_without_prefault_nothing_is_collapsed_and_the_log_says_so(kvrelay):
    srv = kvrelay("--memory", "32M", "--workers", "2", "--arena-prefault", "0")
    if "hugetlb 2 MiB pages" in srv.log_text():
        pytest.skip("the segment got reserved hugetlb pages: nothing to collapse")
    assert fill_checked(srv, 48) >= 16
    wait_mapped(srv, "nothing maps the arena ahead, so it stays in 4 KiB pages")
    assert "this worker collapsed" not in srv.log_text()
    assert [pmd_mapped_kib(p) for p in srv.worker_pids()] == [0, 0]
