#!/usr/bin/env python3
"""
bench_ssd_get.py — GETs of blocks on the disk tier (issue 26, acceptance 1; docs/performance.md
§5), to be read next to fio's random read of the same block size on the same file system in
the same run (scripts/bench-ssd-ceiling.sh).

    bench/bench_ssd_get.py --size 2M --blocks 512 [--ratio 4] [--connections 4] [--duration 8]
                           [--path DIR] [--build DIR]

It starts build/kvrelay-supervisor (bench_ssd_demote.Server: --workers 2, the tier file on DIR,
default /var/tmp; huge pages when vm.nr_hugepages provides them: said in the output) with an
arena of 1/ratio of the blocks and --ssd-window as large as the arena, PUTs the blocks and GETs
each once (Python, not measured: admitted, and copied by the disk writer, which the fill waits
for when it is more than 16 blocks behind), waits until all are on disk, then runs
build/kvrelay-bench --workload get, uniform over the keys, for --duration seconds. So about
(ratio - 1) / ratio of the GETs find their block on disk only: they read it on the worker's ring
and promote it to RAM, evicting another, which is on disk already.

It prints the client's figures (GB/s of bodies through HTTP on loopback, p99, errors), how many
of the GETs read the disk (kvrelay_disk_reads_total) and at what rate (kvrelay_disk_read_bytes_total),
and the server's CPU seconds (every process of its group) per GB served, and the client's errors
with the first of each kind. Every process it starts is stopped by PID; the file is removed.
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ssd_demote import LIMIT_S, Server, cpu_seconds, size_arg  # noqa: E402


def group_cpu(pgid):
    """CPU seconds of every process in process group pgid (the supervisor and its children)."""
    total = 0.0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                f = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
                if int(f[2]) == pgid:
                    total += cpu_seconds(int(d))
            except (OSError, IndexError):
                pass
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=size_arg, default=size_arg("2M"))
    ap.add_argument("--blocks", type=int, default=512)
    ap.add_argument("--ratio", type=int, default=4, help="blocks per block the arena holds")
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--path", default="/var/tmp")
    ap.add_argument("--build", default=str(Path(__file__).resolve().parent.parent / "build"))
    a = ap.parse_args()
    size, n = a.size, a.blocks
    mem = size * n // a.ratio
    srv = Server(a.build, a.path, "get", ["--memory", str(mem), "--max-block-size", str(size),
                                          "--ssd-size", str(2 * size * n + (1 << 30)), "--ssd-window", str(mem)])
    try:
        blob = bytearray(os.urandom(size))
        for i in range(n):
            blob[:8] = i.to_bytes(8, "little")
            assert srv.status("PUT", f"/kv/g-{i}", bytes(blob)) in (200, 201)
            assert srv.status("GET", f"/kv/g-{i}") == 200  # admitted
            deadline = time.monotonic() + LIMIT_S
            while srv.metrics("kvrelay_disk_writes_total")[0] < i + 1 - 16:
                assert time.monotonic() < deadline, "the disk writer does not keep up"
                time.sleep(0.005)
        deadline = time.monotonic() + LIMIT_S
        while srv.metrics("kvrelay_disk_blocks")[0] < n:
            assert time.monotonic() < deadline, f"not every block reached the disk: {srv.log.read_text()[-2000:]}"
            time.sleep(0.01)
        r0, rb0 = srv.metrics("kvrelay_disk_reads_total", "kvrelay_disk_read_bytes_total")
        cpu0 = group_cpu(srv.p.pid)
        out = subprocess.run([str(Path(a.build) / "kvrelay-bench"), "--target", f"127.0.0.1:{srv.port}",
                              "--workload", "get", "--size", str(size), "--keys", str(n), "--key-prefix", "g",
                              "--no-verify", "--connections", str(a.connections), "--duration", str(a.duration),
                              "--quiet"], capture_output=True, text=True, timeout=a.duration + 120)
        cpu = group_cpu(srv.p.pid) - cpu0
        r1, rb1 = srv.metrics("kvrelay_disk_reads_total", "kvrelay_disk_read_bytes_total")
        # the client exits 1 when a GET failed; its summary says how many (an arena of a few
        # blocks can refuse a promotion its room while every block is pinned: 507)
        m = re.search(r"(\d+) requests in ([\d.]+) s, [\d.]+ req/s, ([\d.]+) GB/s, p99 ([\d.]+) ms, (\d+) errors",
                      out.stdout)
        assert m and out.returncode in (0, 1), out.stdout + out.stderr
        reqs, secs, gbs = int(m.group(1)), float(m.group(2)), float(m.group(3))
        print(f"disk GET {size >> 20} MiB blocks, {n} keys, arena 1/{a.ratio}, {a.connections} connections: "
              f"{gbs:.3f} GB/s through HTTP, p99 {m.group(4)} ms, {m.group(5)} errors; "
              f"{r1 - r0:.0f} of {reqs} GETs from disk ({(r1 - r0) / reqs if reqs else 0:.0%}), "
              f"disk reads {(rb1 - rb0) / 1e9 / secs:.3f} GB/s; "
              f"server CPU {cpu:.2f} s ({cpu / (gbs * secs) if gbs else 0:.3f} s per GB served); "
              f"segment on {srv.pages()}")
        if int(m.group(5)):
            print(out.stdout[m.end():].strip())
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
