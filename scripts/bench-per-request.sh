#!/usr/bin/env bash
# bench-per-request.sh — what one small request costs the server, two builds side by side
# (issue 25: "a copy, a syscall, a lock or a context switch per request, before and after").
#
#   scripts/bench-per-request.sh BASE_SUPERVISOR [PAIRS] [CONNS] [SIZE]
#   (defaults: 2 pairs, 16 connections, 16K)
#
# Each pair runs build/kvrelay-supervisor ("new") and BASE_SUPERVISOR ("base", e.g. a worktree
# of main before a change), the order swapped every pair. Each server starts alone
# (--memory 1G, --grpc-bind off, its own process group), is filled with 1.5 GiB of PUTs of new
# keys (every arena page touched once: no first touch is measured), gets 256 keys for the GETs, then
# runs two measured 4 s runs of build/kvrelay-bench: GETs of those 256 resident keys, and PUTs
# of keys never PUT before (the store full and evicting). During each, `perf stat` counts over
# the server's processes: task-clock, context switches, page faults and the system calls that
# make up a worker's loop turn and the store lock's sleeps (io_uring_enter, epoll_wait, read,
# sched_yield, futex). Printed per request, with the rate and p99, one line per run.
# Needs perf with the syscalls tracepoints (root). Servers are stopped by PID.
set -euo pipefail
base=${1:?BASE_SUPERVISOR}; pairs=${2:-2}; conns=${3:-16}; size=${4:-16K}
root=$(cd "$(dirname "$0")/.." && pwd)
fill=$((3 * (1 << 29) / $(numfmt --from=iec "$size"))) # PUTs worth 1.5 GiB: every page of the 1 GiB arena
bench=$root/build/kvrelay-bench
tmp=$(mktemp -d); pid=""
cleanup() {
  if [ -n "$pid" ]; then kill -TERM -- "-$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
events=task-clock,context-switches,page-faults,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_epoll_wait
events=$events,syscalls:sys_enter_read,syscalls:sys_enter_sched_yield,syscalls:sys_enter_futex

one() { # NAME SUPERVISOR
  local name=$1 bin=$2 port pids wl
  : >"$tmp/port"
  setsid "$bin" --http-bind 127.0.0.1:0 --grpc-bind off --port-file "$tmp/port" --memory 1G \
    >"$tmp/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    port=$(grep -o 'http=[^:]*:[0-9]*' "$tmp/port" 2>/dev/null | grep -o '[0-9]*$' || true)
    [ -n "$port" ] && curl -sf -o /dev/null "http://127.0.0.1:$port/readyz" && break
    sleep 0.1
  done
  pids=$( (echo "$pid"; ps -o pid= --ppid "$pid") | tr -d ' ' | paste -sd,)
  "$bench" --target "127.0.0.1:$port" --workload put --size "$size" --keys 10000000 \
    --key-prefix "fill-$RANDOM" --connections 16 --requests "$fill" --quiet >/dev/null
  "$bench" --target "127.0.0.1:$port" --workload get --size "$size" --keys 256 --preload \
    --key-prefix "get-$size" --connections 16 --duration 1 --quiet >/dev/null
  for wl in get put; do
    local args=(--keys 256 --key-prefix "get-$size")
    [ "$wl" = put ] && args=(--keys 10000000 --key-prefix "new-$RANDOM")
    perf stat -x, -e "$events" -p "$pids" -o "$tmp/perf" -- sleep 4 &
    local pp=$!
    "$bench" --target "127.0.0.1:$port" --workload "$wl" --size "$size" "${args[@]}" \
      --connections "$conns" --duration 4 --json "$tmp/json" --quiet >/dev/null
    wait "$pp"
    python3 - "$name" "$wl" "$tmp/json" "$tmp/perf" <<'PY'
import json, sys
name, wl, jf, pf = sys.argv[1:]
j = json.load(open(jf))
n = j["requests"]
c = {}
for line in open(pf):
    p = line.strip().split(",")
    if len(p) > 3 and p[0][:1].isdigit():
        c[p[2].split(":")[-1].replace("sys_enter_", "")] = float(p[0])
per = " ".join(f"{k} {v / n * (1000 if k == 'task-clock' else 1):.3f}" for k, v in c.items())
print(f"{name:4} {wl:3} {j['throughput']['requests_per_s']:9.0f} req/s  p99 {j['latency_ms']['p99']:.2f} ms"
      f"  errors {j['total_errors']}  per request: {per} (task-clock in us)")
PY
  done
  kill -TERM -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=""
}

echo "size $size, $conns connections, new = $root/build/kvrelay-supervisor, base = $base"
for p in $(seq "$pairs"); do
  if [ $((p % 2)) = 1 ]; then one new "$root/build/kvrelay-supervisor"; one base "$base"
  else one base "$base"; one new "$root/build/kvrelay-supervisor"; fi
done
