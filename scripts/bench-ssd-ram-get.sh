#!/usr/bin/env bash
# bench-ssd-ram-get.sh — GET of RAM-resident blocks with the disk tier off and on (issue 26,
# acceptance 1: "unchanged, +-3 %"), same binary, same client, interleaved off/on twice.
#
#   scripts/bench-ssd-ram-get.sh SIZE KEYS [PATH]
#   (ROUNDS=N: N pairs, default 2; FIRST=on: each pair runs the tier on first)
#   (WINDOWS=N [WINDOW=S] [CONNS=C]: interleaved instead, below)
#
# Each run starts build/kvrelay-supervisor (--memory 1536M --workers 2; with the tier:
# --ssd-path PATH/kvr-ram-get.ssd --ssd-size 2G --ssd-page-size 256M), then build/kvrelay-bench
# --workload get --size SIZE --keys KEYS --preload --no-verify --connections 4 --duration 8
# --quiet --warmup 3 (KEYS x SIZE must fit the arena: every GET is a RAM hit), and prints the
# bench's one-line summary (requests, req/s, GB/s, p99) after "tier off:" or "tier on:". With
# the tier on, the warm-up's GETs admit the blocks and the disk writer copies the coldest
# --ssd-window (a quarter of the arena, well under a second): the 8 s measured are the steady
# state of a tier that holds copies and an idle writer. Pairs alternate off, on; at the end
# each pair's on/off ratio and their median. Servers are stopped by PID (their process
# group); the tier file is removed. docs/performance.md §5.
#
# WINDOWS=N: both servers run at once (4 GiB of RAM), each preloaded and warmed up 3 s, then N
# pairs of short windows (WINDOW seconds each, default 2; CONNS connections, default 4), off and
# on back to back, the order
# swapped every pair, so that the machine's slow drift falls on both halves of a pair alike.
# Each window also reads the server's CPU seconds (its process group, /proc). At the end: the
# on/off ratios of GB/s and of CPU seconds per GB, their medians, and a 95 % interval of each
# median (bootstrap over the pairs, 2000 resamples, seeded).
set -euo pipefail
size=${1:?SIZE}; keys=${2:?KEYS}; dir=${3:-/var/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
pf=$(mktemp); log=$(mktemp); file="$dir/kvr-ram-get-$$.ssd"; pid=""
cleanup() { # also when a server already exited: a failed kill must not skip the rm (set -e)
  if [ -n "$pid" ]; then kill -TERM -- "-$pid" 2>/dev/null || true; fi
  rm -f "$pf" "$log" "$file"
}
trap cleanup EXIT
run() {
  local tier=$1 extra=()
  : >"$pf"; rm -f "$file"
  [ "$tier" = on ] && extra=(--ssd-path "$file" --ssd-size 2G --ssd-page-size 256M)
  setsid "$root/build/kvrelay-supervisor" --http-bind 127.0.0.1:0 --grpc-bind off --port-file "$pf" \
    --memory 1536M --workers 2 "${extra[@]}" 2>/dev/null &
  pid=$!
  for _ in $(seq 1 300); do [ -s "$pf" ] && break; sleep 0.1; done
  local port; port=$(grep -o ':[0-9]*' "$pf" | head -1 | tr -d :)
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
  "$root/build/kvrelay-bench" --target "127.0.0.1:$port" --workload get --size "$size" --keys "$keys" \
    --preload --no-verify --connections 4 --warmup 3 --duration 8 --quiet | sed "s/^/tier $tier: /" | tee -a "$log"
  kill -TERM -- "-$pid"; wait "$pid" 2>/dev/null || true; pid=""
}

# --- WINDOWS=N: both servers at once, short windows back to back ---------------------------
cpu_of() { # CPU seconds of process group $1 (its live processes)
  python3 -c '
import os, sys
g, t = int(sys.argv[1]), 0
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[2]) == g:
            t += int(f[11]) + int(f[12])
print(t / os.sysconf("SC_CLK_TCK"))' "$1"
}
if [ -n "${WINDOWS:-}" ]; then
  pf2=$(mktemp); pid2=""; file2="$dir/kvr-ram-get-$$-on.ssd"
  trap 'cleanup; if [ -n "$pid2" ]; then kill -TERM -- "-$pid2" 2>/dev/null || true; fi; rm -f "$pf2" "$file2"' EXIT
  boot() { # boot PORTFILE [tier args...]: starts a server, prints its pid
    local p=$1; shift
    setsid "$root/build/kvrelay-supervisor" --http-bind 127.0.0.1:0 --grpc-bind off --port-file "$p" \
      --memory 1536M --workers 2 "$@" >/dev/null 2>&1 &
    echo $!
  }
  port_of() {
    local p
    for _ in $(seq 1 300); do [ -s "$1" ] && break; sleep 0.1; done
    p=$(grep -o ':[0-9]*' "$1" | head -1 | tr -d :)
    for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$p/readyz" >/dev/null && break; sleep 0.1; done
    echo "$p"
  }
  : >"$pf"; : >"$pf2"; rm -f "$file2"
  pid=$(boot "$pf"); pid2=$(boot "$pf2" --ssd-path "$file2" --ssd-size 2G --ssd-page-size 256M)
  declare -A port=([off]=$(port_of "$pf") [on]=$(port_of "$pf2")) group=([off]=$pid [on]=$pid2)
  bench() { "$root/build/kvrelay-bench" --target "127.0.0.1:${port[$1]}" --workload get --size "$size" \
    --keys "$keys" --no-verify --connections "${CONNS:-4}" --quiet "${@:2}"; }
  for t in off on; do bench $t --preload --warmup 3 --duration 1 >/dev/null; done
  for w in $(seq 1 "$WINDOWS"); do
    if [ $((w % 2)) = 1 ]; then order="off on"; else order="on off"; fi
    for t in $order; do
      c0=$(cpu_of "${group[$t]}")
      out=$(bench $t --duration "${WINDOW:-2}")
      c1=$(cpu_of "${group[$t]}")
      echo "pair $w tier $t: cpu $(python3 -c "print(round($c1 - $c0, 3))") s, $out" | tee -a "$log"
    done
  done
  python3 - "$log" "$WINDOWS" <<'PY'
import random, re, statistics, sys
pairs = {}
for line in open(sys.argv[1]):
    m = re.search(r"pair (\d+) tier (off|on): cpu ([0-9.]+) s, .*?([0-9.]+) GB/s, p99", line)
    if m:
        n = int(re.search(r"get: (\d+) requests", line).group(1))
        pairs.setdefault(int(m.group(1)), {})[m.group(2)] = (float(m.group(4)), float(m.group(3)), n)
ok = [p for p in pairs.values() if len(p) == 2]
if len(ok) < int(sys.argv[2]):
    print(f"{int(sys.argv[2]) - len(ok)} of {sys.argv[2]} pairs not parsed (a window failed): left out")
gb = [p["on"][0] / p["off"][0] for p in ok]
# CPU seconds per GB: cpu / (GB/s x window); the window cancels in the ratio
cpu = [(p["on"][1] / p["on"][0]) / (p["off"][1] / p["off"][0]) for p in ok]
rng = random.Random(26)
def ci(x):
    meds = sorted(statistics.median(rng.choices(x, k=len(x))) for _ in range(2000))
    return meds[50], meds[1949]
for name, x in (("GB/s on/off", gb), ("CPU s per GB on/off", cpu)):
    lo, hi = ci(x)
    print(f"{name} per pair: " + " ".join(f"{v:.3f}" for v in x))
    print(f"{name}: median {statistics.median(x):.3f}, 95 % interval of the median {lo:.3f} to {hi:.3f} ({len(x)} pairs)")
print(f"median GB/s off {statistics.median(p['off'][0] for p in ok):.3f}, on {statistics.median(p['on'][0] for p in ok):.3f}")
PY
  exit 0
fi

for _ in $(seq 1 "${ROUNDS:-2}"); do
  if [ "${FIRST:-off}" = on ]; then run on; run off; else run off; run on; fi
done
python3 - "$log" <<'PY'
import re, statistics, sys
gb = {"off": [], "on": []}
for line in open(sys.argv[1]):
    m = re.search(r"tier (off|on): .*?([0-9.]+) GB/s", line)
    if m:
        gb[m.group(1)].append(float(m.group(2)))
r = [b / a for a, b in zip(gb["off"], gb["on"])]
print("on/off per pair:", " ".join(f"{x:.3f}" for x in r))
if r:
    print(f"median on/off {statistics.median(r):.3f}; median GB/s off {statistics.median(gb['off']):.3f}, "
          f"on {statistics.median(gb['on']):.3f}")
PY
