"""
build/bench/bench_ssd_scan, the disk tier's restart scan benchmark, run small (a 64 MiB file of
64 KiB records under /var/tmp): a check that it runs, scans every record it wrote at both
depths, from the headers and from the summaries (it exits 1 when a scan finds another count, or
did not read the summaries it wrote), and prints its figures; never a figure.
"""

import re
import subprocess
from pathlib import Path

from harness import BINARY, SLOW

BENCH = BINARY.parent / "bench" / "bench_ssd_scan"


def test_bench_ssd_scan_runs_small():
    p = subprocess.run([str(BENCH), "--path", "/var/tmp", "--file-size", "64M", "--sizes", "64K"],
                       capture_output=True, text=True, timeout=60 * SLOW, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = dict(re.findall(r"^(scan_\S+) ([0-9.]+) ", p.stdout, re.M))
    for how in ("headers", "summary"):
        for depth in (1, 32):
            assert float(lines[f"scan_64K_{how}_depth{depth}_records_per_s"]) > 0, p.stdout
            assert float(lines[f"scan_64K_{how}_depth{depth}_1tib_s"]) > 0, p.stdout
    assert not list(Path("/var/tmp").glob("kvrelay-bench-ssd-scan.*")), "file left behind"
