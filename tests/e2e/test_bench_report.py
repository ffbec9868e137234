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
