#!/usr/bin/env python3
"""
bench_ssd_demote.py — the disk tier's demotion rate (issue 26, acceptance 1; docs/performance.md,
"Disk tier"): how fast the disk writer copies admitted blocks to the tier's file, to be read
next to fio's sequential write on the same file system in the same run
(scripts/bench-ssd-ceiling.sh).

    bench/bench_ssd_demote.py --size 2M --blocks 1024 [--path DIR] [--build DIR]

It starts build/kvrelay-supervisor (--workers 2, an arena that holds every block, --ssd-window
as large as the arena, the tier file on DIR, default /var/tmp; huge pages when vm.nr_hugepages
provides them: said in the output), PUTs the blocks (Python, not measured: a PUT alone does not
admit a block), then stops the publisher (SIGSTOP: the disk writer is its thread) and admits the
blocks the way clients do, with a GET of each (Python, not measured). Then it lets the publisher go on (SIGCONT) and samples kvrelay_disk_write_bytes_total
every 5 ms until 90 % of the blocks are copied (at most 120 s): the writer copies what was
admitted with the cores to itself, as fio writes. It prints copies, bytes, seconds (from the
SIGCONT to the sample that saw them) and GB/s (decimal), and the publisher's CPU seconds per GB
copied. (Before, the GETs ran while the writer copied, and the writer waited on them: half its
rounds found nothing admitted yet.)

Every process it starts is stopped by PID (its own process group); the file is removed.
"""

import argparse
import http.client
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

LIMIT_S = float(os.environ.get("BENCH_LIMIT_S", 120))


def size_arg(s):
    m = re.fullmatch(r"(\d+)([KMG]?)", s)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {s}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def cpu_seconds(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """build/kvrelay-supervisor on 127.0.0.1 with a disk tier in a fresh directory under path
    (removed by stop()); extra: more arguments."""

    def __init__(self, build, path, name, extra):
        self.work = Path(path) / f"kvr-bench-{name}-{os.getpid()}"
        self.work.mkdir()
        self.tier, port_file, self.log = self.work / "tier", self.work / "port", self.work / "log"
        args = [str(Path(build) / "kvrelay-supervisor"), "--http-bind", "127.0.0.1:0", "--grpc-bind", "off",
                "--port-file", str(port_file), "--workers", "2", "--ssd-path", str(self.tier), *extra]
        self.p = subprocess.Popen(args, stderr=open(self.log, "w"), stdout=subprocess.DEVNULL,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not (port_file.exists() and re.search(r":(\d+)", port_file.read_text())):
                assert self.p.poll() is None and time.monotonic() < deadline, self.log.read_text()[-2000:]
                time.sleep(0.05)
            self.port = int(re.search(r":(\d+)", port_file.read_text()).group(1))
            self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            while self.status("GET", "/readyz") != 200:
                assert time.monotonic() < deadline, "not ready"
                time.sleep(0.05)
            self.pub = int(re.search(r"publisher started \(pid (\d+)", self.log.read_text()).group(1))
            self.hugetlb = "on hugetlb" in self.log.read_text()
        except BaseException:
            self.stop()
            raise

    def status(self, method, path, body=None):
        """One request on the kept connection; the body is read (1 MiB at a time) and dropped."""
        self.c.request(method, path, body=body)
        r = self.c.getresponse()
        while r.read(1 << 20):
            pass
        return r.status

    def metrics(self, *names):
        self.c.request("GET", "/metrics")
        t = self.c.getresponse().read().decode()
        return [float(re.search(rf"^{k} (\S+)$", t, re.M).group(1)) for k in names]

    def pages(self):
        if self.hugetlb:
            return "hugetlb 2 MiB pages"
        if "the workers collapse the arena" in self.log.read_text():  # docs/dataplane.md, "Huge pages"
            return "shmem collapsed into transparent huge pages by the workers (no huge pages reserved)"
        return "4 KiB pages (no huge pages reserved)"

    def stop(self):
        os.killpg(self.p.pid, signal.SIGTERM)
        self.p.wait(60)
        for f in self.work.iterdir():
            f.unlink()
        self.work.rmdir()


def put_blocks(srv, size, n, prefix):
    """PUTs n random blocks of size bytes as /kv/<prefix>-<i> (the first 8 bytes: i)."""
    body = bytearray(os.urandom(size))
    for i in range(n):
        body[:8] = i.to_bytes(8, "little")
        assert srv.status("PUT", f"/kv/{prefix}-{i}", bytes(body)) in (200, 201)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=size_arg, default=size_arg("2M"))
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--path", default="/var/tmp")
    ap.add_argument("--build", default=str(Path(__file__).resolve().parent.parent / "build"))
    ap.add_argument("--server-arg", action="append", default=[],
                    help="one more flag for the server, e.g. --server-arg=--ssd-page-size=1G (repeatable)")
    a = ap.parse_args()
    size, n = a.size, a.blocks
    mem = size * n + (256 << 20)
    srv = Server(a.build, a.path, "demote", ["--memory", str(mem), "--max-block-size", str(size),
                                             "--ssd-size", str(2 * size * n + (1 << 30)), "--ssd-window", str(mem),
                                             "--hang-timeout", "60s", *a.server_arg])  # the publisher is stopped meanwhile
    try:
        put_blocks(srv, size, n, "d")
        os.kill(srv.pub, signal.SIGSTOP)
        try:
            for i in range(n):  # one GET each: every block admitted
                assert srv.status("GET", f"/kv/d-{i}") == 200
            w0, b0 = srv.metrics("kvrelay_disk_writes_total", "kvrelay_disk_write_bytes_total")
        finally:
            os.kill(srv.pub, signal.SIGCONT)
        cpu0, t0 = cpu_seconds(srv.pub), time.monotonic()
        want = int(0.9 * n)
        w, b, last = w0, b0, t0
        while w - w0 < want and time.monotonic() - t0 < LIMIT_S:
            time.sleep(0.005)
            nw, nb = srv.metrics("kvrelay_disk_writes_total", "kvrelay_disk_write_bytes_total")
            if nw != w:
                w, b, last = nw, nb, time.monotonic()
        el = last - t0
        cpu = cpu_seconds(srv.pub) - cpu0
        gb = (b - b0) / 1e9
        print(f"demotion {size >> 20} MiB blocks: {w - w0:.0f} copies of {n}, {gb:.3f} GB in {el:.2f} s: "
              f"{gb / el if el > 0 else 0:.3f} GB/s; publisher CPU {cpu:.2f} s ({cpu / gb if gb else 0:.3f} s per GB); "
              f"segment on {srv.pages()}")
        if w - w0 < want:
            sys.exit(f"only {w - w0:.0f} of {want} blocks copied in {LIMIT_S} s; the log ends:\n"
                     f"{srv.log.read_text()[-3000:]}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
