#!/usr/bin/env bash
# bench-tenants.sh — what a namespace lookup costs (docs/tenancy.md): 16 KiB GET and 16 KiB
# PUT of new keys against the same build in three configurations, in one run, interleaved:
#
#   open     no token at all (every request in "default", as before tenants existed)
#   token    --token T (one bearer token, namespace "default")
#   tenants  --tenants FILE with 1,024 tokens over 63 namespaces and --admin-token; the client
#            uses one of the last tokens of the file (the table is scanned whole anyway)
#
#   scripts/bench-tenants.sh [--reps N] [--duration S] [--memory SIZE] [--connections N] [--keys N]
#
# For every repetition the three configurations run in a rotated order, each on a fresh server
# (--memory, one worker per core, --grpc-bind off): a preload of the GET set (not measured), a
# GET run, then PUTs of new keys past --memory so the store is full and evicting (not
# measured), then the measured PUT run. build/kvrelay-bench drives all of them the same way
# (16 connections by default, every GET body verified). Prints one line per run and, at the
# end, the medians and each configuration's ratio to "open"; the raw JSON stays in
# build/bench-runs/<date>-tenants/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=3
DUR=5
MEM=1G
CONNS=16
KEYS=20000 # the GET set: 20,000 x 16 KiB = 328 MB, resident in the default 1G
while [ $# -gt 0 ]; do
    case "$1" in
    --reps) REPS=$2; shift ;;
    --duration) DUR=$2; shift ;;
    --memory) MEM=$2; shift ;;
    --connections) CONNS=$2; shift ;;
    --keys) KEYS=$2; shift ;;
    *) echo "usage: $0 [--reps N] [--duration S] [--memory SIZE] [--connections N] [--keys N]" >&2; exit 2 ;;
    esac
    shift
done
SRV=$ROOT/build/kvrelay-supervisor
BENCH=$ROOT/build/kvrelay-bench
[ -x "$SRV" ] && [ -x "$BENCH" ] || { echo "bench-tenants: build first (make)" >&2; exit 2; }
RUN=$ROOT/build/bench-runs/$(date -u +%Y-%m-%d-%H%M)-tenants
mkdir -p "$RUN"

# The tenants file: 1,024 tokens, 16 per namespace over 63 namespaces and 16 more in "default".
TENANTS=$RUN/tenants
for i in $(seq 0 1023); do
    ns=$((i / 16))
    if [ $ns -ge 63 ]; then echo "default tok-$i"; else echo "team-$ns tok-$i"; fi
done > "$TENANTS"
TOKEN_TENANT=tok-1000 # namespace team-62: near the end of the table

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start() { # config -> sets PORT and SPID
    local cfg=$1 pf=$RUN/port.$1 args=()
    case $cfg in
    open) ;;
    token) args=(--token tok-single) ;;
    tenants) args=(--tenants "$TENANTS" --admin-token tok-admin) ;;
    esac
    rm -f "$pf"
    "$SRV" --http-bind 127.0.0.1:0 --grpc-bind off --memory "$MEM" --log-level warn --port-file "$pf" \
        "${args[@]}" 2>>"$RUN/server.$cfg.log" &
    SPID=$!
    PIDS+=("$SPID")
    for _ in $(seq 1 200); do
        [ -s "$pf" ] && grep -q '^http=' "$pf" && break
        sleep 0.05 # polling the port file the server writes once it listens
    done
    PORT=$(sed -n 's/^http=.*://p' "$pf")
    [ -n "$PORT" ] || { echo "bench-tenants: $cfg did not start" >&2; exit 1; }
    for _ in $(seq 1 200); do
        curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null && return 0
        sleep 0.05 # polling /readyz until every worker serves
    done
    echo "bench-tenants: $cfg never ready" >&2
    exit 1
}

stop() {
    kill "$SPID"
    wait "$SPID" 2>/dev/null || true
}

tok_of() { case $1 in open) echo "" ;; token) echo tok-single ;; tenants) echo "$TOKEN_TENANT" ;; esac; }

bench() { # cfg rep label -- kvrelay-bench args
    local cfg=$1 rep=$2 label=$3
    shift 4
    local tok
    tok=$(tok_of "$cfg")
    "$BENCH" --target "127.0.0.1:$PORT" ${tok:+--token "$tok"} --connections "$CONNS" --quiet \
        --json "$RUN/$cfg.$rep.$label.json" "$@" >/dev/null
}

CONFIGS=(open token tenants)
for rep in $(seq 1 "$REPS"); do
    for k in 0 1 2; do
        cfg=${CONFIGS[$(((k + rep) % 3))]}
        start "$cfg"
        bench "$cfg" "$rep" preload -- --workload get --size 16K --keys "$KEYS" --preload --duration 1s
        bench "$cfg" "$rep" get -- --workload get --size 16K --keys "$KEYS" --duration "$DUR"
        bench "$cfg" "$rep" fill -- --workload put --size 16K --key-prefix fill --duration 3s
        bench "$cfg" "$rep" put -- --workload put --size 16K --key-prefix new --duration "$DUR"
        stop
        for op in get put; do
            python3 - "$RUN/$cfg.$rep.$op.json" "$cfg" "$rep" "$op" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"run {sys.argv[3]} {sys.argv[2]:8} {sys.argv[4]}: {d['throughput']['requests_per_s']:10.0f} req/s "
      f"{d['throughput']['gb_per_s']:.3f} GB/s p99 {d['latency_ms']['p99']:.3f} ms errors {d['errors']}")
EOF
        done
    done
done

python3 - "$RUN" "$REPS" <<'EOF'
import json, statistics, sys
run, reps = sys.argv[1], int(sys.argv[2])
med = {}
for cfg in ("open", "token", "tenants"):
    for op in ("get", "put"):
        xs = [json.load(open(f"{run}/{cfg}.{r}.{op}.json"))["throughput"]["requests_per_s"] for r in range(1, reps + 1)]
        med[cfg, op] = statistics.median(xs)
print()
print("| 16 KiB, req/s (median of %d) | GET | PUT-new | GET / open | PUT-new / open |" % reps)
print("| --- | --- | --- | --- | --- |")
for cfg in ("open", "token", "tenants"):
    print(f"| {cfg} | {med[cfg, 'get']:.0f} | {med[cfg, 'put']:.0f} | {med[cfg, 'get'] / med['open', 'get']:.3f} "
          f"| {med[cfg, 'put'] / med['open', 'put']:.3f} |")
print(f"\nraw: {run}")
EOF
