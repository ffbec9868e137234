#!/usr/bin/env bash
# bench-kv-events.sh — what the KV events cost and how fast they arrive (docs/kv-events.md), in
# one run, against two servers of the same build side by side:
#
#   off  no --kv-events-bind
#   on   --kv-events-bind and --kv-events-replay-bind, one subscriber reading every batch
#        (a pyzmq SUB, scripts/kv_events_sink.py) for the whole run
#
#   scripts/bench-kv-events.sh [--reps N] [--duration S] [--memory SIZE] [--rate R]
#
# 1. Throughput: each repetition, in a rotated order, runs PUTs of new 16 KiB keys (16 keep-alive
#    connections, kvrelay-bench, unpaced) against each server while the other is idle; both are
#    filled past --memory first (not measured), so every PUT evicts and makes a BlockStored and
#    a BlockRemoved. Also the server's CPU per PUT (schedstat of every thread). Ratio on/off per
#    repetition, median over the repetitions.
# 2. Latency at --rate PUT/s (10,000): kvrelay-bench's relay workload with 4 gRPC relay
#    subscribers on both servers, plus on "on" one KV events subscriber: the relay's publish
#    latency off vs on, and the events' latency (201 -> BlockStored at the subscriber).
# 3. A subscriber that never reads: the "on" publisher's RSS before and after a paced run with
#    one SUB socket connected and subscribed that reads nothing (ZMQ queues up to
#    --kv-events-hwm messages for it), against the same run without it.
# Prints one line per measurement and a summary; the raw JSON stays in
# build/bench-runs/<date>-kv-events/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=5
DUR=5
MEM=1G
RATE=10000
while [ $# -gt 0 ]; do
    case "$1" in
    --reps) REPS=$2; shift ;;
    --duration) DUR=$2; shift ;;
    --memory) MEM=$2; shift ;;
    --rate) RATE=$2; shift ;;
    *) echo "usage: $0 [--reps N] [--duration S] [--memory SIZE] [--rate R]" >&2; exit 2 ;;
    esac
    shift
done
SRV=$ROOT/build/kvrelay-supervisor
BENCH=$ROOT/build/kvrelay-bench
[ -x "$SRV" ] && [ -x "$BENCH" ] || { echo "bench-kv-events: build first (make)" >&2; exit 2; }
PY=/usr/bin/python3
$PY -c 'import zmq' 2>/dev/null || { echo "bench-kv-events: needs python3-zmq (scripts/install-deps.sh test)" >&2; exit 2; }
RUN=$ROOT/build/bench-runs/$(date -u +%Y-%m-%d-%H%M)-kv-events
mkdir -p "$RUN"

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

declare -A HTTP_OF GRPC_OF EV_OF SPID_OF

start() { # config
    local cfg=$1 pf=$RUN/port.$1 args=() spid
    [ "$cfg" = on ] && args=(--kv-events-bind 'tcp://127.0.0.1:*' --kv-events-replay-bind 'tcp://127.0.0.1:*')
    rm -f "$pf"
    "$SRV" --http-bind 127.0.0.1:0 --grpc-bind 127.0.0.1:0 --memory "$MEM" --log-level warn --port-file "$pf" \
        "${args[@]}" 2>>"$RUN/server.$cfg.log" &
    spid=$!
    PIDS+=("$spid")
    for _ in $(seq 1 200); do
        [ -s "$pf" ] && grep -q '^grpc=' "$pf" && break
        sleep 0.05 # polling the port file the server writes once it listens
    done
    HTTP_OF[$cfg]=$(sed -n 's/^http=//p' "$pf")
    GRPC_OF[$cfg]=$(sed -n 's/^grpc=//p' "$pf")
    EV_OF[$cfg]=$(sed -n 's/^kv_events=//p' "$pf")
    SPID_OF[$cfg]=$spid
    for _ in $(seq 1 200); do
        curl -fs "http://${HTTP_OF[$cfg]}/readyz" >/dev/null && return 0
        sleep 0.05 # polling /readyz until every worker serves
    done
    echo "bench-kv-events: $cfg never ready" >&2
    exit 1
}

server_cpu_ns() { # every thread of the supervisor and its children
    local spid=$1 sum=0 pids
    pids="$spid $(cat /proc/"$spid"/task/*/children 2>/dev/null)"
    for p in $pids; do
        for t in /proc/"$p"/task/*/schedstat; do
            [ -r "$t" ] && sum=$((sum + $(cut -d' ' -f1 "$t")))
        done
    done
    echo "$sum"
}

publisher_pid() { # the child of the supervisor titled "kvrelay: publisher"
    local spid=$1
    for p in $(cat /proc/"$spid"/task/*/children 2>/dev/null); do
        tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | grep -q publisher && { echo "$p"; return 0; }
    done
    return 1
}

rss_kb() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/"$1"/status; }

bench() { # cfg label -- kvrelay-bench args
    local cfg=$1 label=$2
    shift 3
    "$BENCH" --target "${HTTP_OF[$cfg]}" --quiet --json "$RUN/$cfg.$label.json" "$@" >"$RUN/$cfg.$label.out"
}

start off
start on
# one subscriber reads the "on" server's events for the whole run
$PY "$ROOT/scripts/kv_events_sink.py" "tcp://127.0.0.1:${EV_OF[on]}" >"$RUN/sink.out" 2>&1 &
SINK=$!
PIDS+=("$SINK")
for cfg in off on; do
    bench "$cfg" fill -- --workload put --size 16K --key-prefix fill --connections 16 --duration 3s
done

# 1. throughput, interleaved
CONFIGS=(off on)
for rep in $(seq 1 "$REPS"); do
    for k in 0 1; do
        cfg=${CONFIGS[$(((k + rep) % 2))]}
        before=$(server_cpu_ns "${SPID_OF[$cfg]}")
        bench "$cfg" "put.$rep" -- --workload put --size 16K --key-prefix "new$rep" --connections 16 --duration "$DUR"
        after=$(server_cpu_ns "${SPID_OF[$cfg]}")
        echo $((after - before)) >"$RUN/$cfg.put.$rep.cpu"
        $PY - "$RUN/$cfg.put.$rep" "$cfg" "$rep" <<'EOF'
import json, sys
p, cfg, rep = sys.argv[1:]
d = json.load(open(p + ".json")); cpu = int(open(p + ".cpu").read())
print(f"put16k {cfg} rep {rep}: {d['throughput']['requests_per_s']:.0f} PUT/s, {d['throughput']['gb_per_s']:.3f} GB/s, "
      f"p99 {d['latency_ms']['p99']:.3f} ms, server CPU {cpu / max(d['requests'], 1) / 1000:.1f} us/PUT, errors {d['errors']}")
EOF
    done
done

# 2. latency at RATE PUT/s: the relay's 4 subscribers on both, the events' subscriber on "on"
for cfg in off on; do
    ev=()
    [ "$cfg" = on ] && ev=(--events "tcp://127.0.0.1:${EV_OF[on]}")
    bench "$cfg" paced -- --workload relay --grpc "${GRPC_OF[$cfg]}" --subscribers 4 "${ev[@]}" --rate "$RATE" \
        --size 16K --connections 16 --duration 10s
    $PY - "$RUN/$cfg.paced.json" "$cfg" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1])); r = d["relay"]; lat = r["publish_latency_ms"]
line = (f"paced {sys.argv[2]}: {d['throughput']['requests_per_s']:.0f} PUT/s, relay publish p50/p99 "
        f"{lat['p50']:.3f}/{lat['p99']:.3f} ms, never published {r['unpublished']}, streams ended {r['ended_streams']}")
if r["event_subscribers"]:
    ev = r["events_latency_ms"]
    line += f", KV events p50/p99/max {ev['p50']:.3f}/{ev['p99']:.3f}/{ev['max']:.3f} ms"
print(line)
EOF
done

# 3. a subscriber that never reads: the publisher's RSS around a paced run, without and with it
PUB=$(publisher_pid "${SPID_OF[on]}")
for stuck in 0 1; do
    STUCK=""
    if [ "$stuck" = 1 ]; then
        $PY "$ROOT/scripts/kv_events_sink.py" --never-read "tcp://127.0.0.1:${EV_OF[on]}" >"$RUN/stuck.out" 2>&1 &
        STUCK=$!
        PIDS+=("$STUCK")
        sleep 0.5 # the subscription reaches the publisher (ZMQ sends it after the connect)
    fi
    r0=$(rss_kb "$PUB")
    bench on "stuck$stuck" -- --workload relay --subscribers 0 --events "tcp://127.0.0.1:${EV_OF[on]}" --rate "$RATE" \
        --size 16K --connections 16 --duration 10s
    r1=$(rss_kb "$PUB")
    echo "never-reading subscribers $stuck: publisher RSS $r0 kB -> $r1 kB after $((RATE * 10)) paced PUTs"
    [ -n "$STUCK" ] && kill "$STUCK"
done
curl -fs "http://${HTTP_OF[on]}/metrics" | grep '^kvrelay_kv_events_' | grep -v _bucket >"$RUN/on.metrics"
sed 's/^/on metrics: /' "$RUN/on.metrics"
kill "$SINK"
for cfg in off on; do
    kill "${SPID_OF[$cfg]}"
    wait "${SPID_OF[$cfg]}" 2>/dev/null || true
done

$PY - "$RUN" "$REPS" <<'EOF'
import json, statistics, sys
run, reps = sys.argv[1], int(sys.argv[2])
def put(cfg, r):
    d = json.load(open(f"{run}/{cfg}.put.{r}.json"))
    return d["throughput"]["requests_per_s"], int(open(f"{run}/{cfg}.put.{r}.cpu").read()) / max(d["requests"], 1)
rate = [put("on", r)[0] / put("off", r)[0] for r in range(1, reps + 1)]
cpu = [put("on", r)[1] / put("off", r)[1] for r in range(1, reps + 1)]
print(f"16 KiB PUT-new, events on / off over {reps} repetitions: rate median {statistics.median(rate):.3f} "
      f"(each {', '.join(f'{x:.3f}' for x in rate)}), server CPU per PUT median {statistics.median(cpu):.3f}")
for cfg in ("off", "on"):
    rl = json.load(open(f"{run}/{cfg}.paced.json"))["relay"]
    line = f"paced {cfg}: relay publish p50/p99 {rl['publish_latency_ms']['p50']:.3f}/{rl['publish_latency_ms']['p99']:.3f} ms"
    if rl["event_subscribers"]:
        line += f", KV events p50/p99/max {rl['events_latency_ms']['p50']:.3f}/{rl['events_latency_ms']['p99']:.3f}/{rl['events_latency_ms']['max']:.3f} ms ({rl['events_samples']} samples)"
    print(line)
EOF
echo "raw: $RUN"
