"""
bench/bench_ssd_demote.py, the disk tier's demotion benchmark, run small (32 blocks of 1 MiB):
it starts the real supervisor, admits the blocks with a GET of each (the publisher, whose
thread the disk writer is, stopped meanwhile), and prints the
copies and their rate. Checks that it runs and that its figures are figures, not their size.
"""

import re
import subprocess
import sys
from pathlib import Path

from harness import BINARY  # noqa: E402  (tests/e2e/harness.py)

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_ssd_demote.py"


def test_bench_ssd_demote_runs_small():
    p = subprocess.run([sys.executable, str(BENCH), "--size", "1M", "--blocks", "32", "--build", str(BINARY.parent)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"demotion 1 MiB blocks: (\d+) copies of 32, ([\d.]+) GB in ([\d.]+) s: ([\d.]+) GB/s", p.stdout)
    assert m, p.stdout
    assert int(m.group(1)) >= 28 and float(m.group(4)) > 0, p.stdout
    print(p.stdout)


GET_BENCH = BENCH.parent / "bench_ssd_get.py"


def test_bench_ssd_get_runs_small():
    """bench/bench_ssd_get.py at 128 blocks of 1 MiB through a 32 MiB arena for 2 s: most GETs
    read the disk, and the figures it prints are numbers. (An arena of a few blocks may answer
    a GET 507 now and then, every block pinned by sends and the disk writer: at most 1 %.)"""
    p = subprocess.run([sys.executable, str(GET_BENCH), "--size", "1M", "--blocks", "128", "--duration", "2",
                        "--build", str(BINARY.parent)], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"disk GET 1 MiB blocks, 128 keys, arena 1/4, 4 connections: ([\d.]+) GB/s through HTTP, "
                  r"p99 ([\d.]+) ms, (\d+) errors; (\d+) of (\d+) GETs from disk", p.stdout)
    assert m, p.stdout
    assert float(m.group(1)) > 0 and int(m.group(3)) <= int(m.group(5)) // 100, p.stdout
    assert int(m.group(4)) > int(m.group(5)) // 2, f"most GETs should read the disk: {p.stdout}"
    print(p.stdout)
