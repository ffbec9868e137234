#!/usr/bin/env python3
"""bench_tenants_report.py — the figures of scripts/bench-tenants.sh from its raw files.

  bench_tenants_report.py line PREFIX CFG REP OP   one run: PREFIX.json (kvrelay-bench --json)
                                                    and PREFIX.cpu (the server's on-CPU ns)
  bench_tenants_report.py table RUN_DIR REPS       the medians and the paired ratios to "open"
"""
import json
import statistics
import sys

CONFIGS = ("open", "token", "tenants")


def load(prefix):
    """(requests/s, server CPU us per request, the document) of one measured run."""
    d = json.load(open(prefix + ".json"))
    cpu_ns = int(open(prefix + ".cpu").read())
    reqs = sum(op["requests"] for op in d["ops"].values())
    return d["throughput"]["requests_per_s"], cpu_ns / reqs / 1000.0, d


def line(prefix, cfg, rep, op):
    rate, cpu, d = load(prefix)
    print(f"run {rep} {cfg:8} {op}: {rate:10.0f} req/s {d['throughput']['gb_per_s']:.3f} GB/s "
          f"p99 {d['latency_ms']['p99']:.3f} ms errors {d['errors']} server CPU {cpu:.2f} us/req")


def table(run, reps):
    rate, cpu = {}, {}
    for cfg in CONFIGS:
        for op in ("get", "put"):
            for r in range(1, reps + 1):
                rate[cfg, op, r], cpu[cfg, op, r], _ = load(f"{run}/{cfg}.{r}.{op}")
    rs = range(1, reps + 1)
    print()
    print(f"| 16 KiB, median of {reps} | GET req/s | PUT-new req/s | GET CPU us/req | PUT CPU us/req "
          "| GET rate / open | PUT rate / open | GET CPU / open | PUT CPU / open |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for cfg in CONFIGS:
        cells = [statistics.median(rate[cfg, op, r] for r in rs) for op in ("get", "put")]
        cells += [statistics.median(cpu[cfg, op, r] for r in rs) for op in ("get", "put")]
        cells += [statistics.median(rate[cfg, op, r] / rate["open", op, r] for r in rs) for op in ("get", "put")]
        cells += [statistics.median(cpu[cfg, op, r] / cpu["open", op, r] for r in rs) for op in ("get", "put")]
        print(f"| {cfg} | {cells[0]:.0f} | {cells[1]:.0f} | {cells[2]:.2f} | {cells[3]:.2f} | {cells[4]:.3f} "
              f"| {cells[5]:.3f} | {cells[6]:.3f} | {cells[7]:.3f} |")
    print(f"\nraw: {run}")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "line":
        line(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "table":
        table(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
