#!/usr/bin/python3
"""bench_dataplane_report.py — turns scripts/bench-dataplane.sh's raw results into the Markdown
report and name=value lines on stdout.

Input: one JSON object per line (kvrelay-bench's --json output plus system/op/size/conns/rep,
the server CPU seconds measured around the run and the command line); op is get, put or fill
(the unmeasured PUTs that fill each store before its PUT figure, shown apart). Repetitions are
reduced to the one of median GB/s (req/s for 16 KiB). With --iperf and --memcpy the report opens
with the machine's ceilings (loopback TCP, memcpy). The targets are those of issue 10, acceptance 6.

Plots: beside the report, one SVG per figure family, <report-stem>-<family>.svg, drawn by gnuplot
(Debian package gnuplot-nox) from the same medians as the table they sit next to: gbps (GB/s by
block size), p99 (p99 latency by block size) and cpu (server CPU s/GB by block size), each with a
GET and a PUT panel and one line per store, the size axis logarithmic.

    bench_dataplane_report.py --from DIR [--md FILE] [--plots-only]

reads a run's saved data (build/bench-runs/<date>-dataplane/, written by the pipeline: run.json
with the report's arguments, results.jsonl, versions.txt, stores.txt, iperf.json, memcpy.txt,
profiles/) and writes the report and its plots again (to run.json's md, or FILE); --plots-only
writes the SVGs only and leaves the Markdown as it is.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

SIZES = ["16K", "256K", "2M", "32M", "80M"]
SYSTEMS = ["null", "kvrelay", "memcached", "redis"]
OPS = ["get", "put", "fill", "warm"]
BIG = ("32M", "80M")


def g(r, *path, default=0.0):
    """r[path[0]][path[1]]..., or default where a member is missing."""
    for p in path:
        if not isinstance(r, dict) or p not in r:
            return default
        r = r[p]
    return r


def gbps(r):
    return float(g(r, "throughput", "gb_per_s"))


def rps(r):
    return float(g(r, "throughput", "requests_per_s"))


def p99_ms(r):
    return float(g(r, "latency_ms", "p99"))


def errors(r):
    return int(g(r, "total_errors", default=g(r, "errors", default=0)) or 0)


def p50_ms(r):
    return float(g(r, "latency_ms", "p50"))


def moved_gb(r):
    return float(g(r, "bytes", default=0)) / 1e9


def cpu_per_gb(r):
    m = moved_gb(r)
    return r.get("server_cpu_s", 0.0) / m if m > 0 else None


COPY = ("copy_user", "copy_to_user", "copy_from_user", "memcpy", "memmove", "copy_page", "rep_movs",
        "_copy_to_iter", "_copy_from_iter", "copyout", "copyin")
FAULT = ("clear_page", "page_fault", "handle_mm_fault", "do_anonymous_page", "do_fault", "exc_page_fault",
         "shmem_fault", "shmem_get_folio", "__handle_mm_fault")


def strace_calls(path):
    """{syscall: calls} from `strace -c` output."""
    calls = {}
    try:
        for line in open(path):
            f = line.split()
            if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
                try:
                    calls[f[-1]] = int(f[3])
                except ValueError:
                    pass
    except OSError:
        pass
    return calls


PERF_HZ = 499  # perf record -F in scripts/bench-dataplane.sh


def perf_shares(path):
    """(copy %, page-fault %, top lines, samples) of the server's samples from
    `perf report -n --sort dso,sym` (percent, sample count, dso, symbol per line)."""
    copy = fault = 0.0
    samples = 0
    top = []
    try:
        for line in open(path):
            f = line.split()
            if len(f) < 2 or not f[0].endswith("%"):
                continue
            try:
                pct = float(f[0].rstrip("%"))
                n = int(f[1])
            except ValueError:
                continue
            samples += n
            sym = " ".join(f[2:])
            if any(c in sym for c in COPY):
                copy += pct
            elif any(c in sym for c in FAULT):
                fault += pct
            if len(top) < 12:
                top.append(line.rstrip())
    except OSError:
        pass
    return copy, fault, top, samples


def run_gb(run_json):
    """GB of payload a profiled run moved (kvrelay-bench's --json), or None."""
    try:
        gb = moved_gb(json.load(open(run_json)))
    except (OSError, ValueError):
        return None
    return gb if gb > 0 else None


def ms_per_gb(samples, gb):
    """CPU ms per GB: perf samples (at PERF_HZ) over the payload moved."""
    return samples / PERF_HZ * 1000.0 / gb


def per_gb(samples, share_pct, run_json):
    """CPU ms per GB of payload: perf samples x share over the bytes the perf run moved."""
    gb = run_gb(run_json)
    if gb is None or samples <= 0:
        return None
    return ms_per_gb(samples * share_pct / 100.0, gb)


def read_index(pdir):
    """[(op, system, size, base)] of a profiles index; a relative base is relative to the index."""
    index = os.path.join(pdir or "", "index.txt")
    if not pdir or not os.path.exists(index):
        return []
    return [(op, sysname, size, os.path.join(pdir, base)) for op, sysname, size, base in
            (l.split() for l in open(index) if l.strip())]


def profiles_section(w, pdir, short):
    entries = read_index(pdir)
    if not entries:
        return
    w("## Profiles (--profile; not figures: strace slows the server)\n")
    w("System calls per request: `strace -c -f` attached to every process of the server during a 2 s run "
      "(calls / requests of that run; operations submitted through io_uring show only as io_uring_enter). "
      "CPU shares: `perf record -F 499` on the server's processes during another 2 s run, self time; "
      "copy = kernel and libc copy routines, fault = page-fault handling and page clearing.\n")
    w("Copy and total ms per GB: the same perf run's samples (1/%d s each), the copy routines' share and all of "
      "them, over the payload that run moved: where two stores differ in CPU per GB, these say whether the "
      "difference is in the copy itself (e.g. a destination in memory rather than in the CPU cache) or "
      "elsewhere.\n" % PERF_HZ)
    w("| op | size | store | requests | syscalls / request (top) | copy % | fault % | copy ms/GB | total ms/GB |")
    w("|---|---|---|---:|---|---:|---:|---:|---:|")
    for op, sysname, size, base in entries:
        try:
            reqs = int(json.load(open(base + ".strace.json")).get("requests", 0))
        except (OSError, ValueError):
            reqs = 0
        calls = strace_calls(base + ".strace")
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:6]
        per = ", ".join(f"{n} {c / reqs:.1f}" for n, c in top) if reqs else "-"
        copy, fault, _, samples = perf_shares(base + ".perf.txt")
        cms = per_gb(samples, copy, base + ".perf.json")
        tms = per_gb(samples, 100.0, base + ".perf.json")
        fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
        w(f"| {op.upper()} | {size} | {sysname} | {reqs} | {per} | {copy:.1f} | {fault:.1f} | {fmt(cms)} | {fmt(tms)} |")
    w("")
    w("Where the server's CPU went (perf, top symbols by self time):\n")
    for op, sysname, size, base in entries:
        _, _, top, _ = perf_shares(base + ".perf.txt")
        if top:
            w(f"{op.upper()} {size} {sysname}:")
            w("```")
            w("\n".join(top))
            w("```")
    w("")


def perf_symbols(path):
    """{symbol: samples} of one perf report file."""
    out = {}
    try:
        for line in open(path):
            f = line.split()
            if len(f) < 3 or not f[0].endswith("%") or not f[1].isdigit():
                continue
            sym = " ".join(f[3:]) if len(f) > 3 else f[2]
            out[sym] = out.get(sym, 0) + int(f[1])
    except OSError:
        pass
    return out


def differences_section(w, pdir):
    """kvrelay against each profiled peer at the same op and size, in CPU ms per GB moved: the
    copy routines, everything else, and the symbols where kvrelay spends the most beyond the
    peer. This is the profile that explains a CPU-per-GB or throughput gap."""
    bases = {(op, sysname, size): base for op, sysname, size, base in read_index(pdir)}
    rows = []
    for (op, sysname, size), base in sorted(bases.items()):
        if sysname != "kvrelay":
            continue
        mine, gb_mine = perf_symbols(base + ".perf.txt"), run_gb(base + ".perf.json")
        for peer in ("null", "memcached", "redis"):
            pb = bases.get((op, peer, size))
            if pb is None:
                continue
            theirs, gb_theirs = perf_symbols(pb + ".perf.txt"), run_gb(pb + ".perf.json")
            if gb_mine is None or gb_theirs is None or not mine or not theirs:
                continue
            ms = ms_per_gb
            is_copy = lambda sym: any(c in sym for c in COPY)  # noqa: E731
            cm = ms(sum(n for k, n in mine.items() if is_copy(k)), gb_mine)
            ct = ms(sum(n for k, n in theirs.items() if is_copy(k)), gb_theirs)
            om = ms(sum(n for k, n in mine.items() if not is_copy(k)), gb_mine)
            ot = ms(sum(n for k, n in theirs.items() if not is_copy(k)), gb_theirs)
            extra = sorted(((ms(mine.get(k, 0), gb_mine) - ms(theirs.get(k, 0), gb_theirs), k)
                            for k in set(mine) | set(theirs) if not is_copy(k)), reverse=True)[:4]
            top = ", ".join(f"{k.split()[-1]} +{d:.0f}" for d, k in extra if d > 0) or "-"
            rows.append(f"| {op.upper()} | {size} | {peer} | {cm:.0f} / {ct:.0f} | {om:.0f} / {ot:.0f} | {top} |")
    if not rows:
        return
    w("### kvrelay against each peer, in the profiles' CPU ms per GB\n")
    w("From the perf runs above (not figures; one 2 s run each). copy: the copy routines (for a PUT, the "
      "kernel's receive copy into the store's memory); other: every other sample; beyond the peer: the "
      "non-copy symbols where kvrelay spends the most more than the peer, ms per GB.\n")
    w("| op | size | peer | copy kvrelay / peer | other kvrelay / peer | beyond the peer |")
    w("|---|---|---|---:|---:|---|")
    for r in rows:
        w(r)
    w("")


def ceilings_section(w, put_kv, iperf, memcpy):
    """Loopback TCP (iperf3 -J output) and memcpy (bench_store's memcpy_gbps line), when given."""
    tcp = mem = None
    try:
        tcp = json.load(open(iperf))["end"]["sum_received"]["bits_per_second"] / 8e9
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        for line in open(memcpy):
            if line.startswith("memcpy_gbps"):
                mem = float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    if tcp is None and mem is None:
        return
    w("## Ceilings\n")
    if tcp is not None:
        w(f"- loopback TCP, 1 stream, 1 MiB writes (iperf3): **{tcp:.2f} GB/s**")
        put_kv("ceiling_loopback_tcp_gbps", f"{tcp:.3f}")
    if mem is not None:
        w(f"- memcpy, 2 MiB into a warm destination (bench_store): **{mem:.2f} GB/s**")
        put_kv("ceiling_memcpy_gbps", f"{mem:.3f}")
    w("")


# ---------------------------------------------------------------- plots

# (family, title, y label, figure of a run, logarithmic y, ops: one panel each)
FAMILIES = [
    ("gbps", "Throughput by block size", "GB/s", gbps, False, ("get", "put")),
    ("p99", "p99 latency by block size", "p99 ms", p99_ms, True, ("get", "put")),
    ("cpu", "Server CPU per GB by block size", "server CPU s/GB", cpu_per_gb, False, ("get", "put")),
    ("fill", "Fill (first PUTs into fresh memory) by block size", "GB/s", gbps, False, ("fill",)),
]
# The stores' colours and dash types: the same store looks the same in every plot.
STYLE = {"kvrelay": 'lc rgb "#d62728" lw 2.5 pt 7', "null": 'lc rgb "#7f7f7f" dt 2 lw 1.5 pt 6',
         "null-mem": 'lc rgb "#7f7f7f" dt 3 lw 1.5 pt 4', "memcached": 'lc rgb "#1f77b4" lw 1.8 pt 5',
         "redis": 'lc rgb "#2ca02c" lw 1.8 pt 9'}
VARIANT_COLOURS = ("#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
GNUPLOT_PACKAGE = "gnuplot-nox"


class PlotError(Exception):
    pass


def size_bytes(size):
    """'256K' -> 262144 (K, M, G: powers of 1024); None if it is not a size."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:].upper(), 1)
    digits = size[:-1] if mult > 1 else size
    return int(digits) * mult if digits.isdigit() else None


def series(med, systems, op, fn):
    """[(store, [(bytes, value)])] of one op: the median run's figure at every size, one store a
    line, in the report's order; sizes measured with more than one connection count take 16."""
    out = []
    for s in systems:
        pts = {}
        for (sysname, o, size, conns), r in med.items():
            b = size_bytes(size)
            if sysname != s or o != op or b is None:
                continue
            v = fn(r)
            if v is None or (b in pts and conns != 16):
                continue
            pts[b] = float(v)
        if pts:
            out.append((s, sorted(pts.items())))
    return out


def gp_str(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def plot_script(path, title, ylabel, logy, panels, notes=None):
    """gnuplot commands that draw panels [(op, series)] side by side into the SVG at path."""
    data = {b for _, ss in panels for _, pts in ss for b, _ in pts}
    sizes = sorted(data | {size_bytes(x) for x in SIZES})
    label = lambda b: (f"{b >> 20}M" if b % (1 << 20) == 0 else f"{b >> 10}K")  # noqa: E731
    g = [f'set terminal svg size {600 * len(panels) + 40},440 font "sans,11" background "white"',
         f"set output {gp_str(path)}",
         "set encoding utf8", "set logscale x", f"set xrange [{sizes[0] / 1.4:.0f}:{sizes[-1] * 1.4:.0f}]",
         "set xtics (" + ", ".join(f'"{label(b)}" {b}' for b in sizes) + ")",
         "set grid", "set key outside right top vertical font \",9\"",
         f"set ylabel {gp_str(ylabel)}", "set yrange [0:*]" if not logy else "set logscale y"]
    variant = 0
    for pi, (op, ss) in enumerate(panels):
        for si, (s, pts) in enumerate(ss):
            g.append(f"$d{pi}_{si} << EOD")
            g.extend(f"{b} {v:.6g}" for b, v in pts)
            g.append("EOD")
    g.append(f"set multiplot layout 1,{len(panels)} title {gp_str(title)}")
    for pi, (op, ss) in enumerate(panels):
        g.append(f"set title {gp_str(op.upper())}")
        g.append("set xlabel " + gp_str("block size" + (notes or {}).get(op, "")))
        plots = []
        for si, (s, _) in enumerate(ss):
            style = STYLE.get(s)
            if style is None:
                style = f'lc rgb "{VARIANT_COLOURS[variant % len(VARIANT_COLOURS)]}" lw 1.8 pt 13'
                variant += 1
            plots.append(f"$d{pi}_{si} using 1:2 with linespoints {style} title {gp_str(s)}")
        g.append("plot " + ", \\\n     ".join(plots))
    g.append("unset multiplot")
    return "\n".join(g) + "\n"


def draw_plots(med, systems, md):
    """Writes <md stem>-<family>.svg beside md for every family with data; returns
    {family: (file name, caption)} of those drawn. Raises PlotError when gnuplot is missing or fails."""
    stem = os.path.splitext(md)[0]
    drawn = {}
    for fam, title, ylabel, fn, logy, ops in FAMILIES:
        panels = [(op, ss) for op in ops for ss in [series(med, systems, op, fn)] if ss]
        if logy:  # no zero or negative figure on a logarithmic axis
            panels = [(op, [(s, [(b, v) for b, v in pts if v > 0]) for s, pts in ss]) for op, ss in panels]
            panels = [(op, [(s, pts) for s, pts in ss if pts]) for op, ss in panels]
            panels = [(op, ss) for op, ss in panels if ss]
        if not panels:
            continue
        path = f"{stem}-{fam}.svg"
        # a 16 KiB point measured at 64 connections only (runs before issue 25) says so
        notes = {op: " (16K: 64 connections)" for op, _ in panels
                 if any(k[1] == op and k[2] == "16K" for k in med)
                 and not any(k[1] == op and k[2] == "16K" and k[3] == 16 for k in med)}
        script = plot_script(path, title, ylabel, logy, panels, notes)
        try:
            p = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True, timeout=60)
        except FileNotFoundError:
            raise PlotError(f"gnuplot is missing: install Debian's {GNUPLOT_PACKAGE} "
                            "(scripts/install-deps.sh bench)") from None
        if p.returncode != 0 or not os.path.exists(path):
            raise PlotError(f"gnuplot failed on {path}: {p.stderr.strip()}")
        caption = f"{title}: " + ", ".join(op.upper() for op, _ in panels) + ", one line per store"
        drawn[fam] = (os.path.basename(path), caption)
    return drawn


# How each client checks a GET body (the report's opening paragraph).
VERIFIED = {"kvrelay-bench": "every GET body verified by XXH3",
            "lean_client": "bench/lean/, written apart from kvrelay-bench; every GET body's length, "
                           "stamp and two sampled words checked, the null server's length only"}

def small_section(w, put_kv, fig, client):
    """The small blocks' targets (issue 25): 16 KiB GET, 16 KiB and 256 KiB PUT-new at 16 and 64
    connections against the best of memcached and Redis, 256 KiB PUT-new against the null server,
    the server CPU per GB at 16 KiB and the p99 at 16 KiB over 64 connections against memcached.
    Only for runs that measured 16 KiB PUTs (issue 25 on); returns (met, missed)."""
    if not any(fig("kvrelay", "put", "16K", c) for c in (16, 64)):
        return 0, 0
    w("## Small blocks (issue 25)\n")
    w(f"Client: `{client}`. PUT-new: every PUT a key never stored before, the store full and evicting. "
      "Issue 25 wants these met in one run with kvrelay-bench and in one with lean_client "
      "(`--client lean`).\n")
    w("| target | conns | kvrelay | against | ratio | wanted | |")
    w("|---|---:|---:|---|---:|---|---|")
    met = missed = 0

    def row(tag, what, conns, mine, against, value, wanted, ok):
        nonlocal met, missed
        if value is None:
            w(f"| {what} | {conns} | - | - | - | {wanted} | not measured |")
            put_kv(f"small_{tag}_c{conns}", "not_measured")
            return
        verdict = "met" if ok else "MISSED"
        met, missed = met + ok, missed + (not ok)
        w(f"| {what} | {conns} | {mine} | {against} | {value:.2f} | {wanted} | {verdict} |")
        put_kv(f"small_ratio_{tag}_c{conns}", f"{value:.3f}")
        put_kv(f"small_target_{tag}_c{conns}", verdict)

    for op, size in (("get", "16K"), ("put", "16K"), ("put", "256K")):
        name = f"{size} {'GET' if op == 'get' else 'PUT-new'}"
        for conns in (16, 64):
            k = fig("kvrelay", op, size, conns)
            peers = [(p, fig(p, op, size, conns)) for p in ("memcached", "redis")]
            peers = [(p, r) for p, r in peers if r is not None and rps(r) > 0]
            if k is None or not peers:
                row(f"{op}{size}_vs_best_peer", f"{name}: kvrelay / best of memcached, Redis", conns, "", "",
                    None, ">= 1.0", False)
                continue
            bp, br = max(peers, key=lambda pr: rps(pr[1]))
            v = rps(k) / rps(br)
            row(f"{op}{size}_vs_best_peer", f"{name}: kvrelay / best of memcached, Redis", conns,
                f"{rps(k):,.0f} req/s", f"{bp} {rps(br):,.0f} req/s", v, ">= 1.0", v >= 1.0)
    for conns in (16, 64):
        k, n = fig("kvrelay", "put", "256K", conns), fig("null", "put", "256K", conns)
        ok = k is not None and n is not None and gbps(n) > 0
        row("put256K_vs_null", "256K PUT-new: kvrelay / null", conns, f"{gbps(k):.2f} GB/s" if ok else "",
            f"null {gbps(n):.2f} GB/s" if ok else "", gbps(k) / gbps(n) if ok else None, ">= 0.85",
            ok and gbps(k) / gbps(n) >= 0.85)
    for op in ("get", "put"):
        for conns in (16, 64):
            k, m = fig("kvrelay", op, "16K", conns), fig("memcached", op, "16K", conns)
            kc, mc = (cpu_per_gb(k) if k else None), (cpu_per_gb(m) if m else None)
            ok = kc is not None and mc is not None and mc > 0
            row(f"cpu_{op}16K_vs_memcached", f"16K {op.upper()}: server CPU s/GB, kvrelay / memcached", conns,
                f"{kc:.3f}" if ok else "", f"memcached {mc:.3f}" if ok else "", kc / mc if ok else None,
                "<= 1.0", ok and kc <= mc)
    for op in ("get", "put"):
        k, m = fig("kvrelay", op, "16K", 64), fig("memcached", op, "16K", 64)
        ok = k is not None and m is not None and p99_ms(m) > 0
        row(f"p99_{op}16K_vs_memcached", f"16K {op.upper()}: p99, kvrelay / memcached", 64,
            f"{p99_ms(k):.3f} ms" if ok else "", f"memcached {p99_ms(m):.3f} ms" if ok else "",
            p99_ms(k) / p99_ms(m) if ok else None, "<= 1.0", ok and p99_ms(k) <= p99_ms(m))
    w("")
    w(f"{met} met, {missed} missed.\n")
    put_kv("small_targets_met", met)
    put_kv("small_targets_missed", missed)
    return met, missed


REQUIRED = ("results", "versions", "stores", "work", "root", "md", "memory", "reps", "duration", "elapsed",
            "invocation")


def load_run(a):
    """Fills a's missing arguments from a run's data directory (--from DIR)."""
    d = a.run
    try:
        saved = json.load(open(os.path.join(d, "run.json")))
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench_dataplane_report: {d} holds no readable run.json ({e})")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if a.md is None and not os.path.isabs(saved.get("md", "/")):
        saved["md"] = os.path.join(repo, saved["md"])
    files = {"results": "results.jsonl", "versions": "versions.txt", "stores": "stores.txt",
             "iperf": "iperf.json", "memcpy": "memcpy.txt", "profiles": "profiles"}
    for k, f in files.items():
        if not getattr(a, k) and os.path.exists(os.path.join(d, f)):
            setattr(a, k, os.path.join(d, f))
    for k, v in saved.items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="run", default="", help="a run's data directory (build/bench-runs/...)")
    ap.add_argument("--plots-only", action="store_true", help="write the SVGs only, not the Markdown")
    for a in REQUIRED:
        ap.add_argument("--" + a)
    ap.add_argument("--quick")
    ap.add_argument("--client", help="the client that drove every store (default kvrelay-bench)")
    ap.add_argument("--profiles", default="")
    ap.add_argument("--iperf", default="")
    ap.add_argument("--memcpy", default="")
    a = ap.parse_args()
    if a.run:
        load_run(a)
    missing = [k for k in REQUIRED if getattr(a, k) is None]
    if missing:
        ap.error("missing " + ", ".join("--" + k for k in missing) + " (or --from DIR)")
    if a.quick is None:
        a.quick = "0"
    if not a.client:  # runs before --client: always kvrelay-bench
        a.client = "kvrelay-bench"
    client = "lean_client" if a.client == "lean" else a.client
    os.makedirs(os.path.dirname(os.path.abspath(a.md)), exist_ok=True)

    rows = [json.loads(l) for l in open(a.results) if l.strip()]
    groups = {}
    for r in rows:
        groups.setdefault((r["system"], r["op"], r["size"], r["conns"]), []).append(r)
    med = {}
    for k, rs in groups.items():
        rs = sorted(rs, key=lambda r: (gbps(r), rps(r)))
        med[k] = rs[len(rs) // 2]

    def fig(s, op, size, conns=16):
        return med.get((s, op, size, conns))

    variants = sorted({k[0] for k in med if k[0].startswith("kvrelay-")})
    SYSTEMS[2:2] = [v for v in variants if v not in SYSTEMS]
    if any(k[0] == "null-mem" for k in med):  # --null-memory
        SYSTEMS.insert(1, "null-mem")
    SYSTEMS.extend(sorted({k[0] for k in med} - set(SYSTEMS)))  # any other store: after the known ones

    plot_error = None
    try:
        plots = draw_plots(med, SYSTEMS, a.md)
    except PlotError as e:
        plots, plot_error = {}, str(e)
    if a.plots_only:
        for fam, (name, _) in plots.items():
            print(f"plot_{fam}={os.path.join(os.path.dirname(a.md), name)}")
        if plot_error:
            print(f"bench_dataplane_report: {plot_error}", file=sys.stderr)
            return 1
        return 0

    def embed(*fams):
        for fam in fams:
            if fam in plots:
                name, caption = plots[fam]
                w(f"![{caption}]({name})\n")

    kv = []  # name=value lines

    def put_kv(name, value):
        kv.append(f"{name}={value}")

    out = []
    w = out.append
    mode = "quick" if a.quick == "1" else "full"
    w(f"# The data plane: kvrelay, memcached, Redis and a null server, measured side by side by {client}\n")
    w(f"Mode: {mode} ({a.reps} repetition(s) of {a.duration} s per figure, the median by GB/s); "
      f"store memory {a.memory}; the whole run took {a.elapsed} s. Every store is driven by `{client}` "
      f"over loopback ({VERIFIED.get(client, 'every GET body verified')}), one store at a time, each started fresh for every "
      "block size and repetition, the stores taking turns (so a median is over as many server instances, "
      "spread over the run). The null server (`bench/null_server.c`) stores nothing: its GET answers the expected bytes "
      "from one preallocated pool, its PUT receives the body into a 256 KiB scratch buffer — the ceiling of "
      "this client on this machine.\n")
    w(f"Run: `{a.invocation}` (client: `{client}`)\n")
    put_kv("client", client)
    w("Method per block size, repetition and store: PUT the GET set and read it for a moment (unmeasured); **GET** of those "
      "resident blocks; **fill**: PUT new keys worth 1.5x the store's memory (unmeasured for the targets, shown "
      "below: it pays this VM's first-touch page faults and fills the store); **PUT** of new keys, the store "
      "full and evicting. Server CPU: utime+stime of the server's whole process tree (kvrelay: supervisor and "
      "workers), read from /proc around each measured run, per GB of payload the run moved.\n")

    ceilings_section(w, put_kv, a.iperf, a.memcpy)

    w("## Every figure\n")
    w("The median's repetition gives every column; *each instance* lists the GB/s (req/s at 16 KiB) of every "
      "repetition in run order, each a server instance of its own, to show how far one instance moves a figure.\n")
    w("| op | size | conns | store | req/s | GB/s | each instance | p50 ms | p99 ms | errors | server CPU s/GB "
      "| client CPU s/GB | kvrelay / store |")
    w("|---|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    keys = sorted({(k[1], k[2], k[3]) for k in med if k[1] in ("get", "put")},
                  key=lambda t: (OPS.index(t[0]), t[2], SIZES.index(t[1]) if t[1] in SIZES else 9))
    for op, size, conns in keys:
        base = fig("kvrelay", op, size, conns)
        for s in SYSTEMS:
            r = fig(s, op, size, conns)
            if r is None:
                continue
            cg = cpu_per_gb(r)
            m = moved_gb(r)
            ccpu = float(g(r, "cpu", "total_s", default=0.0)) / m if m > 0 else None
            ratio = ""
            if base is not None and s != "kvrelay":
                if size == "16K" and rps(r) > 0:
                    ratio = f"{rps(base) / rps(r):.2f}"
                elif gbps(r) > 0:
                    ratio = f"{gbps(base) / gbps(r):.2f}"
            reps = sorted(groups[(s, op, size, conns)], key=lambda x: int(x.get("rep", 0)))
            each = " / ".join(f"{rps(x):,.0f}" if size == "16K" else f"{gbps(x):.2f}" for x in reps)
            name = f"{op}_{size}_c{conns}_{s}"
            put_kv(name + "_gbps", f"{gbps(r):.3f}")
            put_kv(name + "_rps", f"{rps(r):.1f}")
            put_kv(name + "_p50_ms", f"{p50_ms(r):.3f}")
            put_kv(name + "_p99_ms", f"{p99_ms(r):.3f}")
            put_kv(name + "_errors", errors(r))
            put_kv(name + "_server_cpu_s_per_gb", "" if cg is None else f"{cg:.3f}")
            w(f"| {op.upper()} | {size} | {conns} | {s} | {rps(r):,.1f} | {gbps(r):.2f} | {each} | {p50_ms(r):.2f} | "
              f"{p99_ms(r):.2f} | {errors(r)} | {'-' if cg is None else f'{cg:.3f}'} | "
              f"{'-' if ccpu is None else f'{ccpu:.3f}'} | {ratio} |")
    w("")
    embed("gbps", "p99", "cpu")

    w("## Fill (first PUTs into fresh memory; not a target figure)\n")
    w("| size | store | req/s | GB/s | p99 ms | errors | server CPU s/GB |")
    w("|---|---|---:|---:|---:|---:|---:|")
    for size in SIZES:
        for s in SYSTEMS:
            r = fig(s, "fill", size)
            if r is None:
                continue
            cg = cpu_per_gb(r)
            w(f"| {size} | {s} | {rps(r):,.1f} | {gbps(r):.2f} | {p99_ms(r):.2f} | {errors(r)} | "
              f"{'-' if cg is None else f'{cg:.3f}'} |")
    w("")
    embed("fill")

    w("## The targets (issue 10, acceptance 6)\n")
    w("| target | size | measured | wanted | |")
    w("|---|---|---:|---|---|")
    met = missed = 0

    def target(tag, what, size, value, wanted, ok, fmt="{:.2f}"):
        nonlocal met, missed
        if value is None:
            w(f"| {what} | {size} | - | {wanted} | not measured |")
            put_kv(f"target_{tag}_{size}", "not_measured")
            return
        verdict = "met" if ok else "MISSED"
        met += ok
        missed += not ok
        w(f"| {what} | {size} | {fmt.format(value)} | {wanted} | {verdict} |")
        put_kv(f"ratio_{tag}_{size}", fmt.format(value))
        put_kv(f"target_{tag}_{size}", verdict)

    def ratio(op, size, peer, fn=gbps, conns=16):
        k, p = fig("kvrelay", op, size, conns), fig(peer, op, size, conns)
        if k is None or p is None or fn(p) <= 0:
            return None
        return fn(k) / fn(p)

    for size in SIZES[1:]:
        if fig("kvrelay", "get", size) is None:
            continue
        r = ratio("get", size, "null")
        target("get_vs_null", "kvrelay GET / null GET", size, r, ">= 0.95", r is not None and r >= 0.95)
        r = ratio("get", size, "memcached")
        target("get_vs_memcached", "kvrelay GET / memcached GET", size, r, ">= 1.0", r is not None and r >= 1.0)
        r = ratio("put", size, "null")
        target("put_vs_null", "kvrelay PUT / null PUT", size, r, ">= 0.85", r is not None and r >= 0.85)
        r = ratio("put", size, "memcached")
        target("put_vs_memcached", "kvrelay PUT / memcached SET", size, r, ">= 1.0", r is not None and r >= 1.0)
        if size in BIG:
            r = ratio("put", size, "redis")
            target("put_vs_redis", "kvrelay PUT / Redis SET", size, r, ">= 2.0", r is not None and r >= 2.0)
            for op in ("get", "put"):
                k, m = fig("kvrelay", op, size), fig("memcached", op, size)
                if k is not None and m is not None:
                    target(f"p99_{op}_vs_memcached", f"{op.upper()} p99 kvrelay / memcached (ms: "
                           f"{p99_ms(k):.0f} vs {p99_ms(m):.0f})", size, p99_ms(k) / p99_ms(m) if p99_ms(m) else None,
                           "<= 1.0", p99_ms(m) > 0 and p99_ms(k) <= p99_ms(m))
        if size != "256K":
            for op in ("get", "put"):
                k = fig("kvrelay", op, size)
                kc = cpu_per_gb(k) if k else None
                peers = [(p, cpu_per_gb(fig(p, op, size))) for p in ("memcached", "redis") if fig(p, op, size)]
                peers = [(p, c) for p, c in peers if c is not None]
                if kc is None or not peers:
                    continue
                best = min(c for _, c in peers)
                shown = ", ".join(f"{p} {c:.3f}" for p, c in peers)
                target(f"cpu_{op}_vs_peers", f"{op.upper()} server CPU s/GB, kvrelay / lowest peer "
                       f"(kvrelay {kc:.3f}; {shown})", size, kc / best if best > 0 else None, "< 1.0", kc < best)
    r = ratio("get", "16K", "memcached", fn=rps, conns=64)
    target("get16k_c64_vs_memcached", "kvrelay GET / memcached GET, 64 conns (req/s)", "16K", r, ">= 1.0",
           r is not None and r >= 1.0)
    w("")
    w(f"{met} met, {missed} missed.\n")
    put_kv("targets_met", met)
    put_kv("targets_missed", missed)

    small_section(w, put_kv, fig, client)

    if any(k[0] == "null-mem" for k in med):
        w("## PUT against the null server receiving into memory (--null-memory)\n")
        w("null-mem is the null server receiving every PUT body into the next slice of --memory of shared "
          "memory (touched at its start), as a store must, instead of one 256 KiB buffer that stays in the "
          "CPU cache; nothing else changes. A store's ratio to null-mem is its cost beyond the memory "
          "traffic itself.\n")
        w("| size | null GB/s | null-mem GB/s | null-mem / null | kvrelay / null-mem | memcached / null-mem "
          "| redis / null-mem |")
        w("|---|---:|---:|---:|---:|---:|---:|")
        for size in SIZES:
            nm, nl = fig("null-mem", "put", size), fig("null", "put", size)
            if nm is None or gbps(nm) <= 0:
                continue
            cols = []
            for peer in ("kvrelay", "memcached", "redis"):
                p = fig(peer, "put", size)
                cols.append("-" if p is None else f"{gbps(p) / gbps(nm):.2f}")
                if p is not None:
                    put_kv(f"put_{size}_{peer}_vs_null_mem", f"{gbps(p) / gbps(nm):.3f}")
            own = "-" if nl is None or gbps(nl) <= 0 else f"{gbps(nm) / gbps(nl):.2f}"
            w(f"| {size} | {'-' if nl is None else f'{gbps(nl):.2f}'} | {gbps(nm):.2f} | {own} | " + " | ".join(cols) + " |")
        w("")

    if any(fig("kvrelay", op, size) is not None for op in ("get", "put") for size in SIZES):
        w("## kvrelay's server CPU and its publisher's share\n")
        w("The publisher consumes the change log and publishes the filter's deltas (while events "
          "come, it looks once every --publication-delay, 1 ms by default, and publishes a delta per 16 events); "
          "GETs append no events, each new "
          "block's PUT appends two once the store is full (its insert and an eviction). Its CPU is "
          "part of the server CPU above.\n")
        w("| op | size | server CPU s/GB | publisher CPU s/GB | publisher share |")
        w("|---|---|---:|---:|---:|")
        for op in ("get", "put"):
            for size in SIZES:
                r = fig("kvrelay", op, size)
                if r is None or moved_gb(r) <= 0 or "publisher_cpu_s" not in r:
                    continue
                tot, pub = r["server_cpu_s"] / moved_gb(r), r["publisher_cpu_s"] / moved_gb(r)
                share = f"{100 * pub / tot:.0f} %" if tot > 0 else "-"
                w(f"| {op.upper()} | {size} | {tot:.3f} | {pub:.3f} | {share} |")
                put_kv(f"{op}_{size}_kvrelay_publisher_cpu_s_per_gb", f"{pub:.4f}")
        w("")

    if variants:  # kvrelay with other options, beside the default and the peers of the same run
        w("## kvrelay variants (same run; the targets above are the default's)\n")
        w("| variant | op | size | conns | GB/s | req/s | p99 ms | server CPU s/GB | / kvrelay | / null | / memcached |")
        w("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for v in variants:
            for op, size, conns in keys:
                r = fig(v, op, size, conns)
                if r is None:
                    continue
                fn = rps if size == "16K" else gbps
                cols = []
                for peer in ("kvrelay", "null", "memcached"):
                    p = fig(peer, op, size, conns)
                    cols.append(f"{fn(r) / fn(p):.2f}" if p is not None and fn(p) > 0 else "-")
                cg = cpu_per_gb(r)
                w(f"| {v} | {op.upper()} | {size} | {conns} | {gbps(r):.2f} | {rps(r):,.1f} | {p99_ms(r):.2f} | "
                  f"{'-' if cg is None else f'{cg:.3f}'} | " + " | ".join(cols) + " |")
        w("")

    def short(c):  # paths relative to the repository; the run's scratch directory as $WORK
        return c.replace(a.work, "$WORK").replace(a.root + "/", "")

    profiles_section(w, a.profiles, short)
    differences_section(w, a.profiles)

    errs = [(k, errors(r)) for k, r in med.items() if errors(r)]
    if errs:
        w("## Errors\n")
        for k, n in sorted(errs):
            r = med[k]
            w(f"- {k[0]} {k[1]} {k[2]} x{k[3]}: {n} errors: {json.dumps(r.get('error_samples', {}))}")
        w("")

    w("## Versions and machine\n")
    w("```")
    w(open(a.versions).read().rstrip())
    w("```\n")
    w("## Command lines\n")
    w("The stores, as started (block size: command line; ports are ephemeral):\n")
    w("```")
    w(short(open(a.stores).read().rstrip()))
    w("```\n")
    w("The client runs, in order (warm and fill runs are not figures):\n")
    w("```")
    for r in rows:
        c = r.get("command", "")
        if c:
            w(f"[{r['op']}] {short(c)}")
    w("```")
    open(a.md, "w").write("\n".join(out) + "\n")
    print("\n".join(kv))
    for fam, (name, _) in plots.items():
        print(f"plot_{fam}={os.path.join(os.path.dirname(a.md), name)}")
    if plot_error:  # the report is written, without plots: say why, and fail
        print(f"bench_dataplane_report: {plot_error}; the report has no plots", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
