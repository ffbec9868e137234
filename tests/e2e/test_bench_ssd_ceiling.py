"""
scripts/bench-ssd-ceiling.sh, the disk tier's fio ceiling (issue 26, acceptance 1), run with tiny
sizes (a 64 MiB file, 1 MiB and 4 MiB blocks, 8 MiB in flight, 1 s of random reads): a check that
it works, never a figure.

  1. /var/tmp (ext4 on the machines this runs on: O_DIRECT works): for both block sizes a write
     and a randread line, GB/s > 0, queue depths 8 and 2 (8 MiB / block size), "direct": true,
     every field of the JSON, and the test file removed at the end;
  2. /dev/shm (tmpfs): the script's "direct" is what the kernel says of O_DIRECT there, asked
     here with open(O_DIRECT): tmpfs refuses it before Linux 6.6 (the script then falls back to
     direct=0 and says so) and takes it from 6.6 on;
  3. ramfs, which refuses O_DIRECT on every kernel, mounted on a temporary directory for the
     test and unmounted after it: "direct": false, both ops of both sizes still measured, and
     the FALLBACK line.

fio (Debian package fio, in the test and bench sets of scripts/install-deps.sh) is a dependency:
the tests skip, saying so, only where it is missing. Case 3 needs root (a mount); without it
the test fails and says why. Bounded: every run has a timeout (times SLOW).
"""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness import REPO, SLOW

SCRIPT = REPO / "scripts" / "bench-ssd-ceiling.sh"
MiB = 1 << 20
TINY = ["--file-size", "64M", "--runtime", "1", "--bytes-in-flight", "8M"]
DEPTH = {1 * MiB: 8, 4 * MiB: 2}
FIELDS = ("op", "block_size", "iodepth", "gb_per_s", "iops", "lat_mean_ms", "lat_p99_ms", "cpu_pct",
          "cpu_s_per_gb")
LIMIT = 60  # seconds per run of the script (a few seconds each when the machine is idle)


@pytest.fixture(autouse=True)
def need_fio():
    if shutil.which("fio") is None:
        pytest.skip("fio is missing (Debian package fio: scripts/install-deps.sh test)")


def run(argv, timeout=LIMIT):
    p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout * SLOW,
                       stdin=subprocess.DEVNULL)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"exit {p.returncode}:\n{out}"
    return out


def ceiling(path, json_file, block_sizes="1M 4M"):
    return run([str(SCRIPT), "--path", str(path), "--block-sizes", block_sizes, *TINY,
                "--json", str(json_file)])


def check_results(doc, path, sizes):
    assert doc["path"] == os.path.realpath(path), doc
    assert doc["file_size"] == 64 * MiB and doc["bytes_in_flight"] == 8 * MiB, doc
    assert doc["fio_version"].startswith("fio-"), doc
    assert doc["command"].startswith("scripts/bench-ssd-ceiling.sh "), doc
    got = {(r["op"], r["block_size"]): r for r in doc["results"]}
    assert set(got) == {(op, s) for op in ("write", "randread") for s in sizes}, doc["results"]
    for (op, s), r in got.items():
        assert set(FIELDS) <= set(r), r
        assert r["iodepth"] == DEPTH[s], r
        assert r["gb_per_s"] > 0 and r["iops"] > 0, r
        assert r["lat_mean_ms"] > 0 and r["lat_p99_ms"] > 0, r
        assert r["cpu_pct"] >= 0 and r["cpu_s_per_gb"] >= 0, r


def odirect_works(directory):
    """What the kernel says of O_DIRECT in directory: open(O_CREAT | O_DIRECT) succeeds or EINVAL."""
    fd, name = tempfile.mkstemp(dir=directory)
    os.close(fd)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_DIRECT)
    except OSError as e:
        assert e.errno == 22, e  # EINVAL: the file system refuses O_DIRECT; anything else is wrong
        return False
    else:
        os.close(fd)
        return True
    finally:
        os.unlink(name)


def leftovers(directory):
    return sorted(p.name for p in Path(directory).glob("kvrelay-fio-ceiling.*"))


def test_var_tmp_direct(tmp_path):
    d = Path(tempfile.mkdtemp(prefix="kvrelay-fio-test.", dir="/var/tmp"))
    try:
        assert odirect_works(d), f"{d} refuses O_DIRECT: this case needs a disk file system there"
        out = ceiling(d, tmp_path / "ceiling.json")
        doc = json.loads((tmp_path / "ceiling.json").read_text())
        assert doc["direct"] is True, out
        assert "FALLBACK" not in out, out
        assert doc["fs_type"] and doc["fs_type"] != "tmpfs", doc
        check_results(doc, d, (1 * MiB, 4 * MiB))
        assert "queue depth 8 " in out and "queue depth 2 " in out, out
        assert leftovers(d) == [], f"the test file was not removed: {leftovers(d)}"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_dev_shm_follows_the_kernel(tmp_path):
    d = Path(tempfile.mkdtemp(prefix="kvrelay-fio-test.", dir="/dev/shm"))
    try:
        direct = odirect_works(d)
        out = ceiling(d, tmp_path / "ceiling.json", block_sizes="1M")
        doc = json.loads((tmp_path / "ceiling.json").read_text())
        assert doc["fs_type"] == "tmpfs", doc
        assert doc["direct"] is direct, f"open(O_DIRECT) on tmpfs: {direct}; the script: {doc['direct']}\n{out}"
        if direct:
            assert "FALLBACK" not in out, out
        else:
            assert "FALLBACK" in out and "refuses O_DIRECT" in out and "direct=0" in out, out
        check_results(doc, d, (1 * MiB,))
        assert leftovers(d) == [], f"the test file was not removed: {leftovers(d)}"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_ramfs_falls_back_to_buffered(tmp_path):
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    js = tmp_path / "ceiling.json"
    # A plain mount, unmounted in `finally`: a private mount namespace (unshare --mount) is
    # refused inside a chroot, where CI runs this ("cannot change root filesystem propagation").
    m = subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mnt)], capture_output=True, text=True, timeout=30)
    if m.returncode != 0:
        pytest.fail(f"mounting a ramfs needs root (CAP_SYS_ADMIN):\n{m.stdout}{m.stderr}", pytrace=False)
    try:
        assert subprocess.run(["stat", "-f", "-c", "%T", str(mnt)], capture_output=True, text=True).stdout.strip() \
            == "ramfs"
        out = run([str(SCRIPT), "--path", str(mnt), "--block-sizes", "1M 4M", *TINY, "--json", str(js)])
        doc = json.loads(js.read_text())
        assert doc["fs_type"] == "ramfs", doc
        assert doc["direct"] is False, out
        assert "FALLBACK" in out and "refuses O_DIRECT" in out and "direct=0" in out, out
        check_results(doc, mnt, (1 * MiB, 4 * MiB))
        assert leftovers(mnt) == [], f"the test file was not removed: {leftovers(mnt)}"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
