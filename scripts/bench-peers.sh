#!/usr/bin/env bash
# bench-peers.sh — kvrelay measured side by side with the stores users would pick instead,
# in one run on this machine, every store driven by the same client (build/kvrelay-bench).
#
#   scripts/bench-peers.sh [--quick] [--out DIR]
#
# Starts on loopback (ephemeral ports), measures, and stops by PID: kvrelay, Redis 7 (no
# persistence), memcached (-I 64m), nginx (static files for GET/HEAD, dav_methods PUT for PUT),
# plus the ceilings: 1-stream iperf3 loopback TCP with 1 MiB writes, and memcpy bandwidth.
# Each peer also gets its own best client as a second opinion (redis-benchmark, memaslap,
# wrk and h2load), reported but not used for the ratios.
#
# Full run: sizes 16 KiB, 256 KiB, 2 MiB, 32 MiB; 16 and 64 connections; GET and PUT (and
# HEAD of 16 KiB blocks for the HTTP stores); 3 repetitions of 3 s, medians. --quick: 16 KiB and
# 2 MiB, the connection counts of the targets, 1 repetition of 2 s: under 5 minutes.
# Output: DIR/<date>.md (every figure, every ratio to kvrelay, command lines, versions, CPU
# used by server and client) and DIR/<date>-gbps.svg (throughput by size per store).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
QUICK=0
OUT=bench/results
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) QUICK=1 ;;
    --out) OUT=$2; shift ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "bench-peers: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

# ---------------------------------------------------------------- dependencies and build
"$ROOT/scripts/install-deps.sh" --bench
make -s all build/bench/bench_store >/dev/null
BENCH=$ROOT/build/kvrelay-bench
[ -x "$BENCH" ] || { echo "bench-peers: $BENCH is missing" >&2; exit 1; }

if [ "$QUICK" = 1 ]; then
    SIZES="16K 2M"; REPS=1; DUR=2
else
    SIZES="16K 256K 2M 32M"; REPS=3; DUR=3
fi

WORK=$(mktemp -d /dev/shm/kvrelay-peers.XXXXXX)   # tmpfs: nginx's files never touch a disk
RES=$WORK/results.jsonl
: > "$RES"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for _ in $(seq 1 50); do   # up to 5 s to stop (kvrelay drains its connections first)
        alive=0
        for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 1 100); do
        python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "bench-peers: nothing listens on $1" >&2; return 1
}
# utime+stime (clock ticks) of a process and all its descendants
cpu_ticks() {
    python3 - "$1" <<'EOF'
import os, sys
root = int(sys.argv[1]); kids = {}
for d in os.listdir('/proc'):
    if d.isdigit():
        try:
            f = open(f'/proc/{d}/stat').read().rsplit(')', 1)[1].split()
            kids.setdefault(int(f[1]), []).append((int(d), int(f[11]) + int(f[12])))
        except OSError:
            pass
def tot(p):
    t = 0
    try:
        f = open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()
        t = int(f[11]) + int(f[12])
    except OSError:
        return 0
    return t + sum(tot(c) for c, _ in kids.get(p, []))
print(tot(root))
EOF
}

# ---------------------------------------------------------------- the stores
KP=$(free_port); RP=$(free_port); MP=$(free_port); NP=$(free_port); IP=$(free_port)

"$ROOT/build/kvrelay-supervisor" --http-bind 127.0.0.1:$KP --grpc-bind off --memory 4G --max-block-size 64M \
    --log-level warn 2>"$WORK/kvrelay.log" &
PIDS+=($!); KPID=$!
redis-server --port $RP --bind 127.0.0.1 --save '' --appendonly no --protected-mode no \
    --maxmemory 4gb --maxmemory-policy allkeys-lru --proto-max-bulk-len 64mb --client-query-buffer-limit 128mb \
    --logfile "$WORK/redis.log" &
PIDS+=($!); RPID=$!
MCUSER=""; [ "$(id -u)" -eq 0 ] && MCUSER="-u nobody"
# memcached's slab classes keep the memory they took: once small items filled it, large ones
# get "out of memory", so it starts afresh for every block size (start_memcached below).
start_memcached() {
    # shellcheck disable=SC2086
    memcached $MCUSER -l 127.0.0.1 -p $MP -U 0 -m 4096 -I 64m -t 2 -c 4096 2>>"$WORK/memcached.log" &
    MPID=$!
    PIDS+=($MPID)
}
start_memcached
mkdir -p "$WORK/nginx/www/kv" "$WORK/nginx/tmp" "$WORK/nginx/logs"
NGUSER=""; [ "$(id -u)" -eq 0 ] && NGUSER="user root;"   # its workers write the PUT files here
cat > "$WORK/nginx/nginx.conf" <<EOF
$NGUSER
worker_processes 2;
error_log $WORK/nginx/logs/error.log warn;
pid $WORK/nginx/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    client_body_temp_path $WORK/nginx/tmp;
    server {
        listen 127.0.0.1:$NP;
        root $WORK/nginx/www;
        client_max_body_size 64m;
        client_body_buffer_size 64m;
        location /kv/ { dav_methods PUT DELETE; create_full_put_path on; }
    }
}
EOF
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' 2>"$WORK/nginx/logs/stderr" &
PIDS+=($!); NPID=$!
for svc in kvrelay:$KP redis:$RP memcached:$MP nginx:$NP; do
    if ! wait_port "${svc#*:}"; then
        echo "bench-peers: ${svc%%:*} did not start; its logs:" >&2
        cat "$WORK"/*.log "$WORK"/nginx/logs/* 2>/dev/null | tail -20 >&2
        exit 1
    fi
done

declare -A TARGET=([kvrelay]=127.0.0.1:$KP [redis]=127.0.0.1:$RP [memcached]=127.0.0.1:$MP [nginx]=127.0.0.1:$NP)
declare -A PROTO=([kvrelay]=http [redis]=resp [memcached]=memcache [nginx]=http)
declare -A SPID=([kvrelay]=$KPID [redis]=$RPID [memcached]=$MPID [nginx]=$NPID)

# ---------------------------------------------------------------- ceilings
iperf3 -s -p $IP -1 >/dev/null 2>&1 &
PIDS+=($!)
sleep 1   # no probe connection: with -1 it would be the one test the server accepts
iperf3 -c 127.0.0.1 -p $IP -l 1M -P 1 -t $((DUR + 1)) -J > "$WORK/iperf.json"
KVR_BENCH_ONLY=memcpy "$ROOT/build/bench/bench_store" > "$WORK/memcpy.txt"

# ---------------------------------------------------------------- the matrix
bytes_of() { case $1 in *K) echo $(( ${1%K} * 1024 ));; *M) echo $(( ${1%M} * 1048576 ));; *) echo "$1";; esac; }

run_one() { # system op size conns rep
    local sys=$1 op=$2 size=$3 conns=$4 rep=$5 keys pre="" out c0 c1 cmd
    # reads: a few keys per connection, preloaded. Writes: new keys all the way (a repeated
    # key would be a cheap dedup hit for kvrelay), the stores evicting as they fill; nginx
    # writes files into tmpfs, so its keys wrap at 2 GiB and are overwritten (204).
    keys=$(( conns * 4 )); [ "$(bytes_of "$size")" -ge $((32 << 20)) ] && keys=$conns
    if [ "$op" = put ]; then
        keys=1000000
        [ "$sys" = nginx ] && keys=$(( (2 << 30) / $(bytes_of "$size") )) && [ $keys -lt $conns ] && keys=$conns
    fi
    [ "$op" != put ] && pre="--preload"
    out=$WORK/run-$sys-$op-$size-$conns-$rep.json
    cmd="$BENCH --protocol ${PROTO[$sys]} --target ${TARGET[$sys]} --workload $op --size $size --keys $keys --key-prefix $sys-$size-$rep --connections $conns --duration $DUR --warmup 1 $pre --json $out --quiet"
    # Redis's sampled LRU may evict the keys just preloaded once earlier runs filled
    # maxmemory: start each Redis read run empty (the other stores evict only older keys)
    [ "$sys" = redis ] && [ "$op" != put ] && redis-cli -p "$RP" flushall >/dev/null
    c0=$(cpu_ticks "${SPID[$sys]}")
    if ! $cmd > "$WORK/last.txt" 2>&1; then
        echo "bench-peers: $sys $op $size x$conns failed:" >&2; cat "$WORK/last.txt" >&2
    fi
    c1=$(cpu_ticks "${SPID[$sys]}")
    [ "$sys" = nginx ] && [ "$op" = put ] && rm -rf "$WORK/nginx/www/kv/$sys-$size-$rep"* 2>/dev/null || true
    python3 - "$out" "$sys" "$op" "$size" "$conns" "$rep" "$((c1 - c0))" "$cmd" >> "$RES" <<'EOF'
import json, os, sys
out, sysname, op, size, conns, rep, ticks, cmd = sys.argv[1:9]
r = json.load(open(out)) if os.path.exists(out) else {}
r.update(system=sysname, op=op, size=size, conns=int(conns), rep=int(rep),
         server_cpu_s=int(ticks) / os.sysconf('SC_CLK_TCK'), command=cmd)
print(json.dumps(r))
EOF
}

for size in $SIZES; do
    # a fresh memcached and an empty nginx tree per size (see start_memcached)
    kill "$MPID" 2>/dev/null || true
    wait "$MPID" 2>/dev/null || true
    start_memcached
    wait_port "$MP"
    SPID[memcached]=$MPID
    rm -rf "$WORK/nginx/www/kv/"* 2>/dev/null || true
    for conns in 16 64; do
        [ "$QUICK" = 1 ] && [ "$size" != 16K ] && [ "$conns" = 64 ] && continue
        for op in get put head; do
            [ "$op" = head ] && { [ "$size" != 16K ] || [ "$conns" != 64 ]; } && continue
            for sys in kvrelay redis memcached nginx; do
                [ "$op" = head ] && [ "${PROTO[$sys]}" != http ] && continue
                for rep in $(seq 1 $REPS); do run_one "$sys" "$op" "$size" "$conns" "$rep"; done
            done
        done
    done
done

# ---------------------------------------------------------------- second opinions
SECOND=$WORK/second.txt
: > "$SECOND"
for size in $SIZES; do
    b=$(bytes_of "$size"); n=$(( 2000000000 / (b + 1) )); [ $n -gt 200000 ] && n=200000; [ $n -lt 64 ] && n=64
    {
        echo "## $size"
        echo "\$ redis-benchmark -p $RP -d $b -t set,get -c 16 -n $n -q"
        timeout 120 redis-benchmark -p $RP -d "$b" -t set,get -c 16 -n $n -q 2>&1 | tr '\r' '\n' | grep -E 'requests per second' || true
        echo "\$ memaslap -s 127.0.0.1:$MP -T 2 -c 16 -X $b -t ${DUR}s"
        timeout 120 memcaslap -s 127.0.0.1:$MP -T 2 -c 16 -X "$b" -t ${DUR}s 2>&1 | grep -E '^(Get|Set|Total) Statistics|Ops|TPS|Net_rate|^Run time' | head -12 || true
        for sys in kvrelay nginx; do
            key=$sys-$size-1-0
            echo "\$ wrk -t 2 -c 16 -d ${DUR}s http://${TARGET[$sys]}/kv/$key"
            timeout 120 wrk -t 2 -c 16 -d ${DUR}s "http://${TARGET[$sys]}/kv/$key" 2>&1 | grep -E 'Requests/sec|Transfer/sec|Non-2xx' || true
            echo "\$ h2load --h1 -c 16 -D $DUR http://${TARGET[$sys]}/kv/$key"
            timeout 120 h2load --h1 -c 16 -D "$DUR" "http://${TARGET[$sys]}/kv/$key" 2>&1 | grep -E '^finished|^status codes' || true
        done
    } >> "$SECOND"
done

# ---------------------------------------------------------------- report
mkdir -p "$OUT"
STAMP=$(date -u +%Y-%m-%d-%H%M)
VERS=$WORK/versions.txt
{
    echo "kvrelay $(git -C "$ROOT" rev-parse --short HEAD)"
    redis-server --version; memcached -V; nginx -v 2>&1; iperf3 --version | head -1
    wrk -v 2>&1 | head -1 || true; h2load --version 2>&1 | head -1
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') x $(nproc); kernel $(uname -r)"
} > "$VERS" 2>&1
python3 "$ROOT/scripts/bench_report.py" --results "$RES" --iperf "$WORK/iperf.json" --memcpy "$WORK/memcpy.txt" \
    --second "$SECOND" --versions "$VERS" --quick "$QUICK" --md "$OUT/$STAMP.md" --svg "$OUT/$STAMP-gbps.svg" \
    --plot-data "$WORK/plot.dat"
echo "bench-peers: wrote $OUT/$STAMP.md and $OUT/$STAMP-gbps.svg"
