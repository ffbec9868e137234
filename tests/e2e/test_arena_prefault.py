"""Each worker maps the arena into its own page tables ahead of use (--arena-prefault,
src/proc/prefault.c): after a fill, a PUT into pages another worker wrote pays no page fault.
The workers' minor-fault counts (/proc/PID/stat) are read around a run of PUTs; the same run
with the thread off shows the faults it saves, so the check can fail."""
import http.client
import random
import time

from conftest import SLOW, kv_path

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


def test_puts_after_a_fill_do_not_fault(kvrelay):
    srv = kvrelay("--memory", "32M", "--workers", "2")
    fill(srv)
    deadline = time.monotonic() + 10 * SLOW
    while srv.log_text().count("arena mapped into this worker's page tables") < 2:
        assert time.monotonic() < deadline, srv.log_tail()
        time.sleep(0.1)
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
