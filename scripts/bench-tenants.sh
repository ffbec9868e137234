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
# The three servers run side by side for the whole run, so that every repetition compares the
# same three instances (the instance, its memory placement and first touches, is what made runs
# of fresh servers spread by up to 40 %): each is started (--memory, one worker per core,
# --grpc-bind off) and filled past --memory with PUTs of new keys (not measured), so it is full
# and evicting. Then every repetition, in a rotated order, puts each configuration's GET set back
# (not measured: the PUTs before evicted it), measures a GET run and a run of PUTs of new keys,
# while the other two servers are idle. The tenants server has --max-pools 64: the pool of each
# of its 63 namespaces is made when the file is loaded (docs/tenancy.md, "Pools"). Each
# measured run also takes the server's CPU time (the on-CPU nanoseconds of every thread of the
# supervisor and its children, /proc/PID/task/TID/schedstat) and divides it by the requests: CPU
# per request does not depend on what the client or the other servers got of the two cores.
# Prints one line per run and, at the end, each configuration's median ratio to "open" over the
# repetitions (pairs from the same repetition), in requests/s and in server CPU per request
# (scripts/bench_tenants_report.py); the raw JSON stays in build/bench-runs/<date>-tenants/.
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

declare -A PORT_OF SPID_OF

start() { # config -> PORT_OF[config], SPID_OF[config]
    local cfg=$1 pf=$RUN/port.$1 args=() spid port
    case $cfg in
    open) ;;
    token) args=(--token tok-single) ;;
    tenants) args=(--tenants "$TENANTS" --admin-token tok-admin --max-pools 64) ;; # a pool per namespace
    esac
    rm -f "$pf"
    "$SRV" --http-bind 127.0.0.1:0 --grpc-bind off --memory "$MEM" --log-level warn --port-file "$pf" \
        "${args[@]}" 2>>"$RUN/server.$cfg.log" &
    spid=$!
    PIDS+=("$spid")
    for _ in $(seq 1 200); do
        [ -s "$pf" ] && grep -q '^http=' "$pf" && break
        sleep 0.05 # polling the port file the server writes once it listens
    done
    port=$(sed -n 's/^http=.*://p' "$pf")
    [ -n "$port" ] || { echo "bench-tenants: $cfg did not start" >&2; exit 1; }
    for _ in $(seq 1 200); do
        if curl -fs "http://127.0.0.1:$port/readyz" >/dev/null; then
            PORT_OF[$cfg]=$port
            SPID_OF[$cfg]=$spid
            return 0
        fi
        sleep 0.05 # polling /readyz until every worker serves
    done
    echo "bench-tenants: $cfg never ready" >&2
    exit 1
}

# On-CPU nanoseconds so far of every thread of the supervisor spid and of its children.
server_cpu_ns() {
    local spid=$1 t sum=0 pids
    pids="$spid $(cat /proc/"$spid"/task/*/children 2>/dev/null)"
    for p in $pids; do
        for t in /proc/"$p"/task/*/schedstat; do
            [ -r "$t" ] && sum=$((sum + $(cut -d' ' -f1 "$t")))
        done
    done
    echo "$sum"
}

tok_of() { case $1 in open) echo "" ;; token) echo tok-single ;; tenants) echo "$TOKEN_TENANT" ;; esac; }

bench() { # cfg rep label -- kvrelay-bench args
    local cfg=$1 rep=$2 label=$3
    shift 4
    local tok
    tok=$(tok_of "$cfg")
    "$BENCH" --target "127.0.0.1:${PORT_OF[$cfg]}" ${tok:+--token "$tok"} --connections "$CONNS" --quiet \
        --json "$RUN/$cfg.$rep.$label.json" "$@" >/dev/null
}

measured() { # cfg rep label -- kvrelay-bench args: the run, and the server's CPU ns in .cpu
    local cfg=$1 rep=$2 label=$3 before after
    before=$(server_cpu_ns "${SPID_OF[$cfg]}")
    bench "$@"
    after=$(server_cpu_ns "${SPID_OF[$cfg]}")
    echo $((after - before)) >"$RUN/$cfg.$rep.$label.cpu"
}

CONFIGS=(open token tenants)
for cfg in "${CONFIGS[@]}"; do
    start "$cfg"
    bench "$cfg" 0 fill -- --workload put --size 16K --key-prefix fill --duration 3s
done
for rep in $(seq 1 "$REPS"); do
    for k in 0 1 2; do
        cfg=${CONFIGS[$(((k + rep) % 3))]}
        # the GET set back in (the last repetition's PUTs evicted it), not measured
        bench "$cfg" "$rep" preload -- --workload get --size 16K --keys "$KEYS" --preload --duration 1s
        measured "$cfg" "$rep" get -- --workload get --size 16K --keys "$KEYS" --duration "$DUR"
        measured "$cfg" "$rep" put -- --workload put --size 16K --key-prefix "new$rep" --duration "$DUR"
        for op in get put; do
            python3 "$ROOT/scripts/bench_tenants_report.py" line "$RUN/$cfg.$rep.$op" "$cfg" "$rep" "$op"
        done
    done
done
for cfg in "${CONFIGS[@]}"; do
    kill "${SPID_OF[$cfg]}"
    wait "${SPID_OF[$cfg]}" 2>/dev/null || true
done
python3 "$ROOT/scripts/bench_tenants_report.py" table "$RUN" "$REPS"
