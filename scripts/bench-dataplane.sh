#!/usr/bin/env bash
# bench-dataplane.sh — the data plane's figures (issue 10, acceptance 6; small blocks: issue 25):
# kvrelay, memcached, Redis 7 and a null server that stores nothing (bench/null_server.c, the
# ceiling of the client on this machine), in one run, every store driven by the same client over
# loopback: build/kvrelay-bench, or with --client lean build/bench/lean_client (bench/lean/, a
# second client written apart from kvrelay-bench, to check that it does not flatter kvrelay).
#
#   scripts/bench-dataplane.sh [--quick] [--profile] [--no-ceilings] [--out DIR] [--memory SIZE] [--reps N]
#                              [--sizes "256K 2M 32M 80M"] [--variant NAME=ARGS]...
#                              [--hugepages COUNT] [--null-memory] [--small-only]
#                              [--client kvrelay-bench|lean]
#
# For 16 KiB and every block size (256 KiB, 2 MiB, 32 MiB, 80 MiB), every repetition and every
# store, one store at a time, started fresh (so one store's memory never weighs on another's run,
# and each median is over as many server instances as repetitions):
#   1. warm:  PUT the GET set (256 keys at 16 KiB, 64 below 32 MiB, 16 from 32 MiB), then GET it
#             for a moment (not measured)
#   2. GET:   16 connections, GETs of those resident blocks, every body verified (kvrelay-bench:
#             XXH3 of every byte; lean_client: length, stamp and two sampled words)
#   3. fill:  PUT new keys worth 1.5 x --memory (not measured; reported apart): every store's
#             memory is touched once, so this VM's first-touch page faults do not decide step 4,
#             and the store is full
#   4. PUT:   16 connections, PUTs of NEW keys (never PUT before: no dedup hit), the store full
#             and evicting all along (SET for Redis and memcached): "PUT-new"
# The small blocks (issue 25), 16 KiB and 256 KiB, take steps 2 and 4 at 16 and then at 64
# connections (one fill between). --small-only runs those two sizes only (at --quick, under
# 90 s). --client lean: lean_client drives every store instead, all else equal (its GETs of
# the null server check the length only: that server answers kvrelay-bench's bytes).
# Measured runs have no warmup of their own (steps 1 and 3 are the warmup), so the server CPU
# read from /proc around a run (utime+stime of the server and every process under it, and of
# children it has reaped) is the CPU of the measured requests.
#
# Stores: kvrelay (defaults: one worker per core; --memory M, evicting), memcached (-m M
# -I 128m -t 2), Redis 7 (no persistence, allkeys-lru; maxmemory unlimited during the GET steps
# because Redis counts its clients' query and reply buffers — 16 x 80 MiB and more — as used
# memory and would evict the GET set; maxmemory M from the fill on), the null server (2 worker
# processes with SO_REUSEPORT, epoll; GET bodies of the run's size).
# --profile: after the figures of every store at each size, one more
# GET and one more PUT run (2 s each, not figures) under `strace -c -f` attached to every process
# of the server (system calls per request), and another under `perf record` (where the server's
# CPU goes: copies, page faults, locks); the report gets both, the raw files go to the run's
# data directory (below; never into bench/results). Adds about a minute per size.
# --null-memory: one more store, null-mem, the null server receiving PUT bodies into --memory
# of shared memory touched at its start (null_server --put-memory), one body after another, as
# a store must, instead of one 256 KiB buffer that stays in the CPU cache; it shows how much of
# the gap to the null server is that alone (PUT figures only; its GET is the null server's).
# --variant NAME=ARGS: one more kvrelay, named NAME in the report, run with ARGS added (e.g.
# --variant "kvrelay-hp=--hugepages require" or --variant "kvrelay-zc=--send-zc-min 1M"; ARGS
# that begin with @PATH run the binary at PATH, e.g. "kvrelay-base=@/tmp/old/kvrelay-supervisor"); its
# figures go in a section of their own (the targets are kvrelay's defaults). --hugepages COUNT
# sets vm.nr_hugepages to COUNT for the run (root; the old value is restored at exit); the
# default kvrelay then runs with --hugepages off, so that it still shows a machine without them.
# Ceilings, first (each a few seconds): loopback TCP, 1 stream of 1 MiB writes (iperf3), and memcpy
# bandwidth (build/bench/bench_store): what no store on this machine can beat. --no-ceilings skips them.
# --quick: 1 repetition of 1 s per figure, about 4 minutes (--small-only: under 90 s). Full: 3
# repetitions of 4 s (--reps N: N of them), medians by GB/s, about 16 minutes (the small blocks at
# 64 connections and 16 KiB's fill add about 6 to the 10 of the other sizes; more with
# --profile); the report gives every repetition's figure beside the median, since on this VM the
# server instance moves a figure.
# Output: DIR/<date>-dataplane.md (every figure, the targets, the commands, versions), beside it
# one SVG per figure family, DIR/<date>-dataplane-<family>.svg (gbps, p99, cpu: drawn by gnuplot,
# embedded in the report), and name=value lines on stdout. The data the report is made from (every
# run's JSON, versions, store command lines, ceilings, profiles, the report's arguments) goes to
# build/bench-runs/<date>-dataplane/ (never into bench/results: git keeps the report and its
# plots only); `scripts/bench_dataplane_report.py --from THAT_DIR [--plots-only]` draws them again.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
INVOCATION="scripts/bench-dataplane.sh$(printf ' %q' "$@")" # as given, for the report's Run: line
SMALL_ONLY=0
CLIENT=kvrelay-bench
QUICK=0
PROFILE=0
OUT=bench/results
RUNS=$ROOT/build/bench-runs
MEM=2G
SIZES="256K 2M 32M 80M"
VARIANTS=()
HUGEPAGES=""
REPS_ARG=""
NULLMEM=""
CEILINGS=1
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) QUICK=1 ;;
    --profile) PROFILE=1 ;;
    --out) OUT=$2; shift ;;
    --memory) MEM=$2; shift ;;
    --sizes) SIZES=$2; shift ;;
    --variant) VARIANTS+=("$2"); shift ;;
    --hugepages) HUGEPAGES=$2; shift ;;
    --reps) REPS_ARG=$2; shift ;;
    --null-memory) NULLMEM=" null-mem" ;;
    --no-ceilings) CEILINGS=0 ;;
    --small-only) SMALL_ONLY=1 ;;
    --client)
        case $2 in kvrelay-bench | lean) CLIENT=$2 ;; *) echo "bench-dataplane: --client is kvrelay-bench or lean ($2)" >&2; exit 2 ;; esac
        shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "bench-dataplane: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

bytes_of() { case $1 in *K) echo $(( ${1%K} * 1024 ));; *M) echo $(( ${1%M} * 1048576 ));; *G) echo $(( ${1%G} * 1073741824 ));; *) echo "$1";; esac; }
MEMB=$(bytes_of "$MEM")
MEMMB=$(( MEMB >> 20 ))

# ---------------------------------------------------------------- dependencies and build
"$ROOT/scripts/install-deps.sh" --bench
make -s all build/bench/null_server build/bench/bench_store >/dev/null
BENCH=$ROOT/build/kvrelay-bench
[ "$CLIENT" = lean ] && BENCH=$ROOT/build/bench/lean_client
NULL=$ROOT/build/bench/null_server
for b in "$BENCH" "$NULL" "$ROOT/build/kvrelay-supervisor"; do
    [ -x "$b" ] || { echo "bench-dataplane: $b is missing" >&2; exit 1; }
done

if [ "$QUICK" = 1 ]; then REPS=1; DUR=1; WARM=0.5; else REPS=3; DUR=4; WARM=1; fi
if [ -n "$REPS_ARG" ]; then
    case $REPS_ARG in '' | *[!0-9]* | 0) echo "bench-dataplane: --reps takes a count >= 1 ($REPS_ARG)" >&2; exit 2 ;; esac
    REPS=$REPS_ARG
fi
CONNS=16
# 16 KiB always (issue 25); with --small-only the small blocks alone
if [ "$SMALL_ONLY" = 1 ]; then
    SIZES="16K 256K"
else
    s16=16K
    for z in $SIZES; do [ "$z" = 16K ] || s16="$s16 $z"; done
    SIZES=$s16
fi
# the connection counts of a size's GET and PUT steps: the small blocks at 16 and 64
conns_of() { case $1 in 16K | 256K) echo "16 64" ;; *) echo 16 ;; esac; }
# what the client needs for a store: lean_client checks only the length of the null server's
# GET bodies (it answers kvrelay-bench's bytes, not lean_client's)
client_args() { [ "$CLIENT" = lean ] && case $1 in null*) echo "--no-verify" ;; esac; return 0; }
VNAMES=""
for v in "${VARIANTS[@]}"; do
    n=${v%%=*}
    case $n in kvrelay-*) ;; *) echo "bench-dataplane: a variant's name starts with kvrelay- ($n)" >&2; exit 2 ;; esac
    VNAMES="$VNAMES $n"
done
SYSTEMS="null$NULLMEM kvrelay$VNAMES memcached redis"
variant_args() { for v in "${VARIANTS[@]}"; do [ "${v%%=*}" = "$1" ] && echo "${v#*=}"; done; return 0; }
# A variant whose ARGS begin with @PATH runs the kvrelay-supervisor at PATH (another build, e.g.
# the commit before a change, for an A/B in one run) with the rest of ARGS.
variant_bin() {
    local a
    a=$(variant_args "$1")
    case $a in @*) a=${a%% *}; echo "${a#@}" ;; *) echo "$ROOT/build/kvrelay-supervisor" ;; esac
}
variant_flags() {
    local a
    a=$(variant_args "$1")
    case $a in @*" "*) echo "${a#* }" ;; @*) ;; *) echo "$a" ;; esac
}

WORK=$(mktemp -d /tmp/kvrelay-dataplane.XXXXXX)
RES=$WORK/results.jsonl
: > "$RES"
SPID=""
stop_store() {
    [ -n "$SPID" ] || return 0
    kill "$SPID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SPID" 2>/dev/null || true
    wait "$SPID" 2>/dev/null || true
    SPID=""
}
HP_OLD=""
if [ -n "$HUGEPAGES" ]; then
    HP_OLD=$(cat /proc/sys/vm/nr_hugepages)
    echo "$HUGEPAGES" > /proc/sys/vm/nr_hugepages
    echo "bench-dataplane: vm.nr_hugepages $HP_OLD -> $(cat /proc/sys/vm/nr_hugepages) for this run" >&2
fi
cleanup() { stop_store; rm -rf "$WORK"; [ -z "$HP_OLD" ] || echo "$HP_OLD" > /proc/sys/vm/nr_hugepages; }
trap cleanup EXIT

# Debian's python3 (a pyenv shim in PATH costs ~100 ms a call; two calls frame every run)
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 1 100); do
        $PY -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "bench-dataplane: nothing listens on $1" >&2; return 1
}
# CPU clock ticks of a server's process tree, and of its publisher: scripts/bench_proc.py.
cpu_ticks() { $PY "$ROOT/scripts/bench_proc.py" cpu "$1"; }

# ---------------------------------------------------------------- the stores
PORT=0
PROTO=http
start_store() { # system size
    local sys=$1 size=$2 u=""
    local -a cmd
    PORT=$(free_port)
    case $sys in
    null)
        cmd=("$NULL" --bind "127.0.0.1:$PORT" --workers 2 --get-size "$size")
        PROTO=http ;;
    null-mem)
        cmd=("$NULL" --bind "127.0.0.1:$PORT" --workers 2 --get-size "$size" --put-memory "$MEM")
        PROTO=http ;;
    kvrelay*)
        # The default kvrelay takes reserved huge pages when there are any: with --hugepages
        # (reserved for a variant) it is told not to, so that its figures stay those of a
        # machine without reserved pages, and the variant alone shows what the pages give.
        [ "$sys" = kvrelay ] && [ -n "$HUGEPAGES" ] && u="--hugepages off"
        # shellcheck disable=SC2207,SC2206
        cmd=("$(variant_bin "$sys")" --http-bind "127.0.0.1:$PORT" --grpc-bind off --memory "$MEM"
             --shutdown-grace 2s --log-level warn $u $(variant_flags "$sys"))
        PROTO=http ;;
    memcached)
        [ "$(id -u)" -eq 0 ] && u="-u nobody"
        # shellcheck disable=SC2206
        cmd=(memcached $u -l 127.0.0.1 -p $PORT -U 0 -m $MEMMB -I 128m -t 2 -c 4096)
        PROTO=memcache ;;
    redis)
        cmd=(redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --protected-mode no
             --maxmemory 0 --maxmemory-policy allkeys-lru --logfile "$WORK/redis.log")
        PROTO=resp ;;
    esac
    "${cmd[@]}" 2>>"$WORK/$sys.log" &
    SPID=$!
    echo "$size: ${cmd[*]}" >> "$WORK/stores.txt"
    if ! wait_port "$PORT"; then
        echo "bench-dataplane: $sys did not start; its log:" >&2
        tail -20 "$WORK/$sys.log" >&2 2>/dev/null || true
        exit 1
    fi
}

# kvrelay-bench once; its figures, labelled (warm, get, fill, put), and the server CPU measured
# around it go into the results.
bench() { # label sys size conns -- kvrelay-bench args...
    local label=$1 sys=$2 size=$3 conns=$4 rep=$5 out c0 c1 p0 p1 cmd
    shift 5
    out=$WORK/run-$label-$sys-$size-$conns-$rep.json
    cmd="$BENCH --protocol $PROTO --target 127.0.0.1:$PORT --size $size --connections $conns $* $(client_args "$sys") --json $out --quiet"
    read -r c0 p0 <<< "$(cpu_ticks "$SPID")"
    # shellcheck disable=SC2086
    if ! $cmd > "$WORK/last.txt" 2>&1; then
        echo "bench-dataplane: $sys $label $size x$conns failed:" >&2; cat "$WORK/last.txt" >&2
    fi
    read -r c1 p1 <<< "$(cpu_ticks "$SPID")"
    $PY - "$out" "$sys" "$label" "$size" "$conns" "$rep" "$((c1 - c0))" "$cmd" "$((p1 - p0))" >> "$RES" <<'EOF'
import json, os, sys
out, sysname, op, size, conns, rep, ticks, cmd, pticks = sys.argv[1:10]
r = json.load(open(out)) if os.path.exists(out) else {}
r.update(system=sysname, op=op, size=size, conns=int(conns), rep=int(rep),
         server_cpu_s=int(ticks) / os.sysconf('SC_CLK_TCK'),
         publisher_cpu_s=int(pticks) / os.sysconf('SC_CLK_TCK'), command=cmd)
print(json.dumps(r))
EOF
}

# ---------------------------------------------------------------- profiles (--profile)
PDIR=$WORK/profiles
mkdir -p "$PDIR"
tree_pids() { $PY "$ROOT/scripts/bench_proc.py" tree "$1"; } # the server and every process under it
# One run under strace -c, one under perf record; PUTs get a key prefix of their own per run
# (a repeated key would be a dedup hit for kvrelay).
profile() { # op sys size -- kvrelay-bench args
    local op=$1 sys=$2 size=$3 pids base tpid tool pfx
    shift 3
    pids=$(tree_pids "$SPID")
    base=$PDIR/$sys-$op-$size
    for tool in strace perf; do
        pfx=()
        [ "$op" = put ] && pfx=(--key-prefix "$sys-$size-prof-$tool")
        if [ $tool = strace ]; then
            # shellcheck disable=SC2046,SC2086
            strace -c -f -qq -o "$base.strace" $(printf -- '-p %s ' ${pids//,/ }) &
            tpid=$!
            sleep 0.5
        else
            perf record -q -F 499 -o "$base.perf" -p "$pids" -- sleep 2.5 >/dev/null 2>&1 &
            tpid=$!
            sleep 0.2
        fi
        # shellcheck disable=SC2046
        "$BENCH" --protocol $PROTO --target "127.0.0.1:$PORT" --size "$size" --connections $CONNS "$@" "${pfx[@]}" $(client_args "$sys") \
            --duration 2 --json "$base.$tool.json" --quiet >/dev/null 2>&1 || true
        [ $tool = strace ] && kill -INT $tpid 2>/dev/null
        wait $tpid 2>/dev/null || true
    done
    # every symbol line (-n: with its sample count), so that the report can total the samples
    perf report -i "$base.perf" --stdio --no-children -n --sort dso,sym 2>/dev/null | grep -v '^#' | grep . \
        > "$base.perf.txt" || true
    # the base name only: the report reads it relative to the index (the folder is copied to the
    # run's data directory at the end)
    echo "$op $sys $size ${base##*/}" >> "$PDIR/index.txt"
}

# What each store says it evicted by the end of its PUT steps (the PUT figures are of a full store).
evictions() { # system size
    local n=""
    case $1 in
    kvrelay) n=$(curl -s "http://127.0.0.1:$PORT/metrics" | sed -n 's/^kvrelay_evictions_total //p') ;;
    memcached)
        exec 3<>"/dev/tcp/127.0.0.1/$PORT"
        printf 'stats\r\nquit\r\n' >&3
        n=$(tr -d '\r' <&3 | sed -n 's/^STAT evictions //p')
        exec 3<&- ;;
    redis) n=$(redis-cli -p "$PORT" info stats | tr -d '\r' | sed -n 's/^evicted_keys://p') ;;
    *) return 0 ;;
    esac
    echo "evictions $1 $2: ${n:-unknown}"
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(date +%s)
if [ "$CEILINGS" = 1 ]; then
    # iperf3 -1: the server takes one test and exits; no probe connection (it would be that test)
    IPORT=$(free_port)
    iperf3 -s -p "$IPORT" -1 >/dev/null 2>&1 &
    SPID=$!
    sleep 1
    iperf3 -c 127.0.0.1 -p "$IPORT" -l 1M -P 1 -t $((DUR + 1)) -J > "$WORK/iperf.json" || true
    stop_store
    KVR_BENCH_ONLY=memcpy "$ROOT/build/bench/bench_store" > "$WORK/memcpy.txt" || true
fi
# Every repetition starts every store afresh, in turn (null, kvrelay, ..., redis, then the next
# repetition): on this VM a figure depends on the server instance (where its memory landed) by
# up to 1.5x, and on the minute by less, so each median is over R instances spread over the run.
for size in $SIZES; do
    b=$(bytes_of "$size")
    keys=64; [ "$b" -ge $((32 << 20)) ] && keys=16; [ "$b" -le $((16 << 10)) ] && keys=256
    fill=$(( (MEMB * 3 / 2 + b - 1) / b ))
    for rep in $(seq 1 $REPS); do
        for sys in $SYSTEMS; do
            start_store "$sys" "$size"
            pre=$sys-$size-get
            if [ "$sys" != null-mem ]; then
                bench warm "$sys" "$size" $CONNS "$rep" --workload get --preload --keys $keys --key-prefix "$pre" --duration $WARM
                for c in $(conns_of "$size"); do
                    bench get "$sys" "$size" "$c" "$rep" --workload get --keys $keys --key-prefix "$pre" --duration $DUR
                done
                if [ "$PROFILE" = 1 ] && [ "$rep" = 1 ]; then
                    profile get "$sys" "$size" --workload get --keys $keys --key-prefix "$pre"
                fi
            fi
            [ "$sys" = redis ] && redis-cli -p "$PORT" config set maxmemory "$MEMB" >/dev/null
            bench fill "$sys" "$size" $CONNS "$rep" --workload put --keys 1000000 --key-prefix "$sys-$size-fill" \
                --requests $fill --duration 120 --timeout 30
            for c in $(conns_of "$size"); do
                kp=$sys-$size-put-$rep; [ "$c" = $CONNS ] || kp=$kp-c$c
                bench put "$sys" "$size" "$c" "$rep" --workload put --keys 1000000 --key-prefix "$kp" \
                    --duration $DUR --timeout 30
            done
            if [ "$PROFILE" = 1 ] && [ "$rep" = 1 ]; then
                profile put "$sys" "$size" --workload put --keys 1000000 --timeout 30
            fi
            [ "$rep" = 1 ] && evictions "$sys" "$size" >> "$WORK/evictions.txt"
            stop_store
        done
    done
done
ELAPSED=$(( $(date +%s) - T0 ))

# ---------------------------------------------------------------- report
mkdir -p "$OUT"
STAMP=$(date -u +%Y-%m-%d-%H%M)
VERS=$WORK/versions.txt
{
    echo "client: $CLIENT ($BENCH)"
    echo "kvrelay $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- src 2>/dev/null || echo ' (src/ modified in the working tree)')"
    redis-server --version; memcached -V; [ "$CEILINGS" = 0 ] || iperf3 --version | head -1
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') x $(nproc); kernel $(uname -r); load average at the start: $LOAD0, at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    cat "$WORK/evictions.txt" 2>/dev/null || true
} > "$VERS" 2>&1
# The run's data, kept so that the report and its plots can be made again from it
# (bench_dataplane_report.py --from DIR): the client's JSON per run, the inputs of the report,
# and its arguments (run.json).
RUN=$RUNS/$STAMP-dataplane
mkdir -p "$RUN"
cp "$RES" "$VERS" "$WORK/stores.txt" "$RUN/"
[ "$CEILINGS" = 0 ] || cp "$WORK/iperf.json" "$WORK/memcpy.txt" "$RUN/" 2>/dev/null || true
if [ "$PROFILE" = 1 ]; then
    mkdir -p "$RUN/profiles"
    cp "$PDIR"/index.txt "$PDIR"/*.strace "$PDIR"/*.perf.txt "$PDIR"/*.json "$RUN/profiles/" 2>/dev/null || true
    echo "profiles=$RUN/profiles"
fi
$PY - "$RUN/run.json" "$WORK" "$ROOT" "$QUICK" "$MEM" "$REPS" "$DUR" "$ELAPSED" "$OUT/$STAMP-dataplane.md" \
    "$INVOCATION" "$CLIENT" <<'EOF'
import json, sys
keys = ("work", "root", "quick", "memory", "reps", "duration", "elapsed", "md", "invocation", "client")
json.dump(dict(zip(keys, sys.argv[2:])), open(sys.argv[1], "w"), indent=1)
EOF
echo "data=$RUN"
$PY "$ROOT/scripts/bench_dataplane_report.py" --from "$RUN"
echo "report=$OUT/$STAMP-dataplane.md"
