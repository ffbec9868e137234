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
admit a block), then admits them the way clients do, with GETs: build/kvrelay-bench, 4
connections, uniform over the keys, for 2 s. From the first GET it samples
kvrelay_disk_write_bytes_total every 5 ms until 90 % of the blocks are copied (at most 120 s)
and prints copies, bytes, seconds and GB/s (decimal), and the publisher's CPU seconds (its
disk writer is a thread of it) per GB copied. The figure is a floor: the GETs that admit the
blocks run on the same two cores for the first 2 s.

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=size_arg, default=size_arg("2M"))
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--path", default="/var/tmp")
    ap.add_argument("--build", default=str(Path(__file__).resolve().parent.parent / "build"))
    a = ap.parse_args()
    size, n, build = a.size, a.blocks, Path(a.build)
    work = Path(a.path) / f"kvr-bench-demote-{os.getpid()}"
    work.mkdir()
    tier, port_file, log = work / "tier", work / "port", work / "log"
    mem = size * n + (256 << 20)
    args = [str(build / "kvrelay-supervisor"), "--http-bind", "127.0.0.1:0", "--grpc-bind", "off",
            "--port-file", str(port_file), "--memory", str(mem), "--workers", "2", "--max-block-size", str(size),
            "--ssd-path", str(tier), "--ssd-size", str(2 * size * n + (1 << 30)), "--ssd-window", str(mem)]
    p = subprocess.Popen(args, stderr=open(log, "w"), stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (port_file.exists() and re.search(r":(\d+)", port_file.read_text())):
            assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        port = int(re.search(r":(\d+)", port_file.read_text()).group(1))
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            c.request("GET", "/readyz")
            r = c.getresponse()
            r.read()
            if r.status == 200:
                break
            assert time.monotonic() < deadline, "not ready"
            time.sleep(0.05)
        pub = int(re.search(r"publisher started \(pid (\d+)", log.read_text()).group(1))
        hugetlb = "on hugetlb" in log.read_text()
        body = bytearray(os.urandom(size))
        for i in range(n):
            body[:8] = i.to_bytes(8, "little")
            c.request("PUT", f"/kv/d-{i}", body=bytes(body))
            r = c.getresponse()
            r.read()
            assert r.status in (200, 201), r.status

        def written():
            c.request("GET", "/metrics")
            t = c.getresponse().read().decode()
            g = lambda k: float(re.search(rf"^{k} (\S+)$", t, re.M).group(1))  # noqa: E731
            return g("kvrelay_disk_writes_total"), g("kvrelay_disk_write_bytes_total")

        w0, b0 = written()
        cpu0, t0 = cpu_seconds(pub), time.monotonic()
        bench = subprocess.Popen([str(build / "kvrelay-bench"), "--target", f"127.0.0.1:{port}", "--workload", "get",
                                  "--size", str(size), "--keys", str(n), "--key-prefix", "d", "--no-verify",
                                  "--connections", "4", "--duration", "2"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        want = int(0.9 * n)
        w, b = w0, b0
        while w - w0 < want and time.monotonic() - t0 < LIMIT_S:
            time.sleep(0.005)
            w, b = written()
        el = time.monotonic() - t0
        cpu = cpu_seconds(pub) - cpu0
        out = bench.communicate(timeout=60)[0]
        assert bench.returncode == 0, out
        gb = (b - b0) / 1e9
        print(f"demotion {size >> 20} MiB blocks: {w - w0:.0f} copies of {n}, {gb:.3f} GB in {el:.2f} s: "
              f"{gb / el:.3f} GB/s; publisher CPU {cpu:.2f} s ({cpu / gb if gb else 0:.3f} s per GB); "
              f"segment on {'hugetlb 2 MiB pages' if hugetlb else '4 KiB pages (no huge pages reserved)'}")
        if w - w0 < want:
            sys.exit(f"only {w - w0:.0f} of {want} blocks copied in {LIMIT_S} s; the log ends:\n{log.read_text()[-3000:]}")
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(60)
        for f in work.iterdir():
            f.unlink()
        work.rmdir()


if __name__ == "__main__":
    main()
