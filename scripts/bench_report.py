#!/usr/bin/python3
"""bench_report.py — turns bench-peers.sh's raw results into the Markdown report and the SVG chart.

Input: one JSON object per line (kvrelay-bench's --json output plus system/op/size/conns/rep,
the server CPU seconds measured around the run and the command line). Repetitions are reduced
to their median by GB/s. Ratios are kvrelay / peer for the same op, size and connections.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

SIZES = ["16K", "256K", "2M", "32M"]
SYSTEMS = ["kvrelay", "redis", "memcached", "nginx"]


def g(r, *path, default=0.0):
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


def main():
    ap = argparse.ArgumentParser()
    for a in ("results", "iperf", "memcpy", "second", "versions", "md", "svg", "plot-data"):
        ap.add_argument("--" + a, required=True)
    ap.add_argument("--quick", default="0")
    a = ap.parse_args()

    rows = [json.loads(l) for l in open(a.results) if l.strip()]
    groups = {}
    for r in rows:
        groups.setdefault((r["system"], r["op"], r["size"], r["conns"]), []).append(r)
    med = {}
    for k, rs in groups.items():
        rs = sorted(rs, key=gbps)
        med[k] = rs[len(rs) // 2]

    iperf = json.load(open(a.iperf))
    ceiling = iperf["end"]["sum_received"]["bits_per_second"] / 8e9
    memcpy = 0.0
    for line in open(a.memcpy):
        if line.startswith("memcpy_gbps"):
            memcpy = float(line.split()[1])

    out = []
    w = out.append
    w("# kvrelay and its peers, measured side by side\n")
    w(f"Mode: {'quick' if a.quick == '1' else 'full'}; every store driven by `kvrelay-bench` over loopback; "
      "medians of the repetitions; ratios are kvrelay / peer for the same operation, size and connections.\n")
    w("## Ceilings\n")
    w(f"- loopback TCP, 1 stream, 1 MiB writes (iperf3): **{ceiling:.2f} GB/s**")
    w(f"- memcpy: **{memcpy:.2f} GB/s**\n")
    w("## Every figure\n")
    w("CPU columns: seconds of CPU (user + system, the server with all its processes) per GB of payload "
      "moved, and microseconds per request (the useful figure for HEAD, which moves no payload).\n")
    w("| op | size | conns | store | req/s | GB/s | p99 ms | errors | server CPU s/GB | server CPU us/req | client CPU s/GB | kvrelay / store |")
    w("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    keys = sorted({(k[1], k[2], k[3]) for k in med},
                  key=lambda t: (["get", "put", "head"].index(t[0]) if t[0] in ("get", "put", "head") else 9,
                                 SIZES.index(t[1]) if t[1] in SIZES else 9, t[2]))
    for op, size, conns in keys:
        base = med.get(("kvrelay", op, size, conns))
        for s in SYSTEMS:
            r = med.get((s, op, size, conns))
            if r is None:
                continue
            gb = gbps(r)
            dur = float(g(r, "duration_s", default=1.0) or 1.0)
            moved = gb * dur
            scpu = f"{r.get('server_cpu_s', 0.0) / moved:.3f}" if moved > 0 else "-"
            reqs = rps(r) * dur
            sreq = f"{1e6 * r.get('server_cpu_s', 0.0) / reqs:.1f}" if reqs > 0 else "-"
            ccpu = f"{float(g(r, 'cpu', 'total_s', default=0.0)) / moved:.3f}" if moved > 0 else "-"
            if base is not None and s != "kvrelay":
                ratio = (gbps(base) / gb) if gb > 0 else (rps(base) / rps(r) if rps(r) > 0 else None)
            else:
                ratio = None
            w(f"| {op.upper()} | {size} | {conns} | {s} | {rps(r):,.0f} | {gb:.2f} | {p99_ms(r):.2f} | {errors(r)} | "
              f"{scpu} | {sreq} | {ccpu} | {'' if ratio is None else f'{ratio:.2f}'} |")
    w("")

    def fig(s, op, size, conns):
        r = med.get((s, op, size, conns))
        return (gbps(r), rps(r)) if r else (None, None)

    def line(name, value, target, ok):
        w(f"| {name} | {value} | {target} | {'met' if ok else 'MISSED'} |")

    w("## The targets\n")
    w("| target | measured | wanted | |")
    w("|---|---|---|---|")
    kg, _ = fig("kvrelay", "get", "2M", 16)
    rg, _ = fig("redis", "get", "2M", 16)
    if kg and rg:
        line("GET 2 MiB, 16 conns vs Redis GET", f"{kg / rg:.2f}x", ">= 1.2x", kg / rg >= 1.2)
    if kg:
        line("GET 2 MiB, 16 conns vs the iperf3 ceiling", f"{kg / ceiling:.2f}", ">= 0.85", kg / ceiling >= 0.85)
    kp, _ = fig("kvrelay", "put", "2M", 16)
    rp, _ = fig("redis", "put", "2M", 16)
    np_, _ = fig("nginx", "put", "2M", 16)
    if kp and rp:
        line("PUT 2 MiB, 16 conns vs Redis SET", f"{kp / rp:.2f}x", ">= 1.0x", kp / rp >= 1.0)
    if kp and np_:
        line("PUT 2 MiB, 16 conns vs nginx PUT", f"{kp / np_:.2f}x", ">= 1.2x", kp / np_ >= 1.2)
    _, k16 = fig("kvrelay", "get", "16K", 64)
    _, n16 = fig("nginx", "get", "16K", 64)
    _, r16 = fig("redis", "get", "16K", 64)
    if k16 and n16:
        line("GET 16 KiB, 64 conns vs nginx GET (req/s)", f"{k16 / n16:.2f}x", ">= 1.3x", k16 / n16 >= 1.3)
    if k16 and r16:
        line("GET 16 KiB, 64 conns vs Redis GET (req/s)", f"{k16 / r16:.2f}x", ">= 0.9x", k16 / r16 >= 0.9)
    _, kh = fig("kvrelay", "head", "16K", 64)
    if kh and n16:
        line("HEAD 16 KiB, 64 conns vs nginx 16 KiB GET (req/s)", f"{kh / n16:.2f}x", ">= 1.5x", kh / n16 >= 1.5)
    k32, _ = fig("kvrelay", "get", "32M", 16)
    if k32:
        line("GET 32 MiB, 16 conns vs the iperf3 ceiling", f"{k32 / ceiling:.2f}", ">= 0.85", k32 / ceiling >= 0.85)
    w("")

    w("## Second opinions (each peer's own client; not used for the ratios)\n")
    w("```")
    w(open(a.second).read().rstrip())
    w("```\n")
    w("## Versions and machine\n")
    w("```")
    w(open(a.versions).read().rstrip())
    w("```\n")
    w("## Command lines\n")
    w("```")
    seen = set()
    for r in rows:
        c = r.get("command", "")
        if c and c not in seen:
            seen.add(c)
            w(c)
    w("```")

    # chart: GET GB/s by size, 16 connections, one line per store
    with open(a.plot_data, "w") as f:
        f.write("size " + " ".join(SYSTEMS) + "\n")
        for size in SIZES:
            vals = [fig(s, "get", size, 16)[0] for s in SYSTEMS]
            if all(v is None for v in vals):
                continue
            f.write(size + " " + " ".join("NaN" if v is None else f"{v:.3f}" for v in vals) + "\n")
    script = f"""
set terminal svg size 800,480 dynamic background rgb 'white'
set output '{a.svg}'
set title 'GET throughput by block size, 16 connections (kvrelay-bench, loopback)'
set ylabel 'GB/s'
set xlabel 'block size'
set key top left
set grid ytics
set style data linespoints
set yrange [0:*]
plot for [i=2:{len(SYSTEMS) + 1}] '{a.plot_data}' using i:xtic(1) title columnheader(i) lw 2, {ceiling:.3f} title 'iperf3 ceiling' dt 2
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    w(f"\n![GET throughput by size]({os.path.basename(a.svg)})")
    open(a.md, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    sys.exit(main())
