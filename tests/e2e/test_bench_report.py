"""
scripts/bench_dataplane_report.py on a saved run (tests/data/bench/, a quick run of
scripts/bench-dataplane.sh trimmed to a few KB): the report it writes into a temporary directory
embeds one SVG per figure family, every embedded SVG exists beside it and is an SVG a browser
opens (parsed here: the svg root, a size, one drawn line per store), --plots-only draws the same
files without touching the Markdown, and a machine without gnuplot gets a report without plots, a
failure and the package's name.

gnuplot (Debian package gnuplot-nox, in the test set of scripts/install-deps.sh) is a dependency of
this test: without it the test FAILS, naming the package; it never skips.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REPORT = REPO / "scripts" / "bench_dataplane_report.py"
RUN = REPO / "tests" / "data" / "bench" / "quick-dataplane"
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SVG = "{http://www.w3.org/2000/svg}"
# which runs each family draws (one line per store that has them)
FAMILY_OPS = {"gbps": ("get", "put"), "p99": ("get", "put"), "cpu": ("get", "put"), "fill": ("fill",)}
STEM = "2026-01-01-0000-dataplane"


def need_gnuplot():
    if shutil.which("gnuplot") is None:
        pytest.fail("gnuplot is missing: the report's plots need Debian's gnuplot-nox "
                    "(scripts/install-deps.sh test)")


def render(tmp_path, *extra, env=None):
    md = tmp_path / f"{STEM}.md"
    p = subprocess.run([PY, str(REPORT), "--from", str(RUN), "--md", str(md), *extra], capture_output=True,
                       text=True, timeout=120, env=env)
    return md, p


def stores_with(ops):
    rows = [json.loads(l) for l in open(RUN / "results.jsonl") if l.strip()]
    return {r["system"] for r in rows if r["op"] in ops}


def embedded(md):
    """[(alt text, file)] of every image the Markdown embeds."""
    return re.findall(r"!\[([^\]]*)\]\(([^)]+)\)", md.read_text())


def check_svg(path, stores):
    root = ET.parse(path).getroot()
    assert root.tag == SVG + "svg", f"{path.name}: root element {root.tag}, not an SVG"
    assert (root.get("width") and root.get("height")) or root.get("viewBox"), f"{path.name}: no size"
    # gnuplot draws each series in a group titled with its key entry: the store's name
    drawn = {}
    for g in root.iter(SVG + "g"):
        t = g.find(SVG + "title")
        if t is None or not t.text:
            continue
        lines = [e for e in g.iter() if e.tag in (SVG + "path", SVG + "polyline")]
        drawn[t.text] = drawn.get(t.text, 0) + len(lines)
    for s in stores:
        assert drawn.get(s, 0) > 0, f"{path.name}: no line drawn for {s} (series: {drawn})"


def test_report_embeds_valid_svgs(tmp_path):
    need_gnuplot()
    md, p = render(tmp_path)
    assert p.returncode == 0, p.stderr
    images = embedded(md)
    files = [f for _, f in images]
    assert len(files) == len(set(files)), f"an SVG embedded twice: {files}"
    fams = {f[len(STEM) + 1:-len(".svg")] for f in files}
    assert {"gbps", "p99"} <= fams, f"the report embeds {files}"
    for alt, f in images:
        assert f.endswith(".svg") and "/" not in f, f"{f}: not an SVG beside the report"
        assert alt, f"{f} has no alt text"
        fam = f[len(STEM) + 1:-len(".svg")]
        assert fam in FAMILY_OPS, f"{f}: unknown family"
        check_svg(tmp_path / f, stores_with(FAMILY_OPS[fam]))
        assert f"plot_{fam}={tmp_path / f}" in p.stdout
    # every SVG written is embedded, and each sits next to the table it draws
    assert sorted(x.name for x in tmp_path.glob("*.svg")) == sorted(files)
    text = md.read_text()
    assert text.index("## Every figure") < text.index(f"{STEM}-gbps.svg") < text.index("## Fill")


def test_plots_only_rewrites_the_svgs_alone(tmp_path):
    need_gnuplot()
    md, p = render(tmp_path, "--plots-only")
    assert p.returncode == 0, p.stderr
    assert not md.exists(), "--plots-only wrote the Markdown"
    svgs = sorted(x.name for x in tmp_path.glob("*.svg"))
    assert f"{STEM}-gbps.svg" in svgs and f"{STEM}-p99.svg" in svgs, svgs
    for name in svgs:
        check_svg(tmp_path / name, stores_with(FAMILY_OPS[name[len(STEM) + 1:-len(".svg")]]))


def test_without_gnuplot_the_report_fails_naming_the_package(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path / "empty"))
    md, p = render(tmp_path, env=env)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "gnuplot-nox" in p.stderr, p.stderr
    assert md.exists() and not embedded(md), "a report without plots should still be written, embedding none"
    assert not list(tmp_path.glob("*.svg"))


def test_latest_committed_report_has_valid_svgs_and_the_readme_links_them():
    """The newest data-plane report in bench/results embeds its plots, each a valid SVG beside it
    with a line for every store of its table, and the README's performance section links that
    report and its plots (the figures an operator sees first are the latest)."""
    results = REPO / "bench" / "results"
    reports = sorted(results.glob("*-dataplane.md"))
    assert reports, "no data-plane report in bench/results"
    md = reports[-1]
    stem = md.name[:-len(".md")]
    images = embedded(md)
    fams = {f[len(stem) + 1:-len(".svg")] for _, f in images}
    assert {"gbps", "p99", "cpu"} <= fams, f"{md.name} embeds {images}"
    # the stores of the table: | op | size | conns | store | ...
    rows = re.findall(r"^\| (GET|PUT) \| [^|]+ \| \d+ \| ([\w-]+) \|", md.read_text(), re.M)
    stores = {s for _, s in rows}
    assert {"kvrelay", "memcached"} <= stores, stores
    for alt, f in images:
        assert alt and f.startswith(stem + "-") and f.endswith(".svg"), f
        check_svg(results / f, stores if f[len(stem) + 1:-len(".svg")] != "fill" else set())
    readme = (REPO / "README.md").read_text()
    perf = readme[readme.index("## Performance"):readme.index("## Layout")]
    assert f"bench/results/{md.name}" in perf, "the README's table does not link the latest report"
    for fam in ("gbps", "p99", "cpu"):
        assert f"bench/results/{stem}-{fam}.svg" in perf, f"the README does not link the {fam} plot"


def test_small_blocks_section_and_the_client(tmp_path):
    """A run of the small blocks (issue 25) by lean_client: the title and the Run: line name the
    client, and the section "Small blocks (issue 25)" has every target with its verdict; the saved
    fixture (before --client) still says kvrelay-bench and has no such section."""
    run = tmp_path / "run"
    run.mkdir()
    for f in ("versions.txt", "stores.txt"):
        shutil.copy(RUN / f, run / f)
    # req/s per (store, op, size); kvrelay beats the peers at GET, not at PUT
    rate = {"null": (60000, 60000, 12000), "kvrelay": (70000, 30000, 11000),
            "memcached": (50000, 50000, 14000), "redis": (52000, 40000, 13000)}
    rows = []
    for s, (get16, put16, put256) in rate.items():
        for conns in (16, 64):
            for op, size, rps in (("get", "16K", get16), ("put", "16K", put16), ("put", "256K", put256),
                                  ("get", "256K", put256)):
                b = 16384 if size == "16K" else 262144
                rows.append({"system": s, "op": op, "size": size, "conns": conns, "rep": 1, "bytes": rps * b,
                             "errors": 0, "server_cpu_s": (0.5 if s == "kvrelay" and op == "get" else 1.0) * rps * b / 1e9,
                             "throughput": {"requests_per_s": rps, "gb_per_s": rps * b / 1e9},
                             "latency_ms": {"p50": 0.5, "p99": 2.0 if s == "kvrelay" else 3.0},
                             "cpu": {"total_s": 0.5}})
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    saved = json.loads((RUN / "run.json").read_text())
    saved.update(client="lean", invocation="scripts/bench-dataplane.sh --quick --small-only --client lean")
    (run / "run.json").write_text(json.dumps(saved))
    md = tmp_path / f"{STEM}.md"
    p = subprocess.run([PY, str(REPORT), "--from", str(run), "--md", str(md)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 or shutil.which("gnuplot") is None, p.stderr
    text = md.read_text()
    assert text.splitlines()[0].endswith("side by side by lean_client"), text.splitlines()[0]
    assert "(client: `lean_client`)" in text and "client=lean_client" in p.stdout
    small = text.split("## Small blocks (issue 25)")[1].split("\n## ")[0]
    verdicts = re.findall(r"\| (met|MISSED|not measured) \|", small)
    assert len(verdicts) == 14 and "not measured" not in verdicts, small
    assert "| 16K GET: kvrelay / best of memcached, Redis | 64 | 70,000 req/s | redis 52,000 req/s | 1.35 |" in small
    assert "| 16K PUT-new: kvrelay / best of memcached, Redis | 16 | 30,000 req/s | memcached 50,000 req/s | 0.60 |" in small
    assert "small_target_put256K_vs_null_c64=met" in p.stdout  # 11000 / 12000 >= 0.85
    assert "small_target_cpu_put16K_vs_memcached_c16=met" in p.stdout  # equal CPU per GB
    assert "small_target_cpu_get16K_vs_memcached_c64=met" in p.stdout
    assert "small_target_p99_get16K_vs_memcached_c64=met" in p.stdout
    assert "10 met, 4 missed." in small, small
    old, q = render(tmp_path)
    assert "side by side by kvrelay-bench" in old.read_text() and "Small blocks" not in old.read_text(), q.stderr
