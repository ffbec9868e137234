"""
bench/bench_ssd_demote.py, the disk tier's demotion benchmark, run small (32 blocks of 1 MiB):
it starts the real supervisor, admits the blocks with kvrelay-bench's GETs, and prints the
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
