#!/usr/bin/env bash
# bench-ssd-ram-get.sh — GET of RAM-resident blocks with the disk tier off and on (issue 26,
# acceptance 1: "unchanged, +-3 %"), same binary, same client, interleaved off/on twice.
#
#   scripts/bench-ssd-ram-get.sh SIZE KEYS [PATH]
#   (ROUNDS=N: N pairs, default 2; FIRST=on: each pair runs the tier on first)
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
set -euo pipefail
size=${1:?SIZE}; keys=${2:?KEYS}; dir=${3:-/var/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
pf=$(mktemp); log=$(mktemp); file="$dir/kvr-ram-get-$$.ssd"; pid=""
cleanup() { [ -n "$pid" ] && kill -TERM -- "-$pid" 2>/dev/null; rm -f "$pf" "$log" "$file"; }
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
