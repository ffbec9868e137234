#!/usr/bin/env bash
# bench-ssd-ram-get.sh — GET of RAM-resident blocks with the disk tier off and on (issue 26,
# acceptance 1: "unchanged, +-3 %"), same binary, same client, interleaved off/on twice.
#
#   scripts/bench-ssd-ram-get.sh SIZE KEYS [PATH]
#
# Each run starts build/kvrelay-supervisor (--memory 1536M --workers 2; with the tier:
# --ssd-path PATH/kvr-ram-get.ssd --ssd-size 2G --ssd-page-size 256M), then build/kvrelay-bench
# --workload get --size SIZE --keys KEYS --preload --no-verify --connections 4 --duration 8
# --quiet (KEYS x SIZE must fit the arena: every GET is a RAM hit), and prints the bench's
# one-line summary (requests, req/s, GB/s, p99) after "tier off:" or "tier on:". With the tier on, the GETs admit the blocks and the disk writer
# copies the coldest --ssd-window (a quarter of the arena) during the run: that is the cost
# measured. Servers are stopped by PID (their process group); the tier file is removed.
# docs/performance.md §5.
set -euo pipefail
size=${1:?SIZE}; keys=${2:?KEYS}; dir=${3:-/var/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
pf=$(mktemp); file="$dir/kvr-ram-get-$$.ssd"; pid=""
cleanup() { [ -n "$pid" ] && kill -TERM -- "-$pid" 2>/dev/null; rm -f "$pf" "$file"; }
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
    --preload --no-verify --connections 4 --duration 8 --quiet | sed "s/^/tier $tier: /"
  kill -TERM -- "-$pid"; wait "$pid" 2>/dev/null || true; pid=""
}
for _ in 1 2; do run off; run on; done
