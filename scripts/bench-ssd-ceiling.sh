#!/usr/bin/env bash
# bench-ssd-ceiling.sh — the disk tier's ceiling (issue 26, acceptance 1): what fio from Debian gets
# from a file system with the block sizes and the queue depth the tier uses, so that the tier's
# GET of disk-resident blocks and its demotion writes can be compared with it on the same file
# system, in the same run.
#
#   scripts/bench-ssd-ceiling.sh [--path DIR] [--file-size SIZE] [--block-sizes "2M 32M"]
#                                [--bytes-in-flight SIZE] [--runtime SEC] [--json FILE] [--keep]
#
#   --path DIR              the directory (on the file system to test) that gets the test file
#                           (default /var/tmp)
#   --file-size SIZE        the test file (default 4G; a multiple of every block size)
#   --block-sizes "S..."    the block sizes, one pair of fio runs each (default "2M 32M")
#   --bytes-in-flight SIZE  the queue depth of a block size is SIZE / block size, at least 1
#                           (default 64M: 32 at 2M, 2 at 32M); printed for every block size
#   --runtime SEC           the random-read pass's length (default 10)
#   --json FILE             also write the figures as JSON to FILE
#   --keep                  keep the test file (its path is printed); removed otherwise, on any exit
# SIZE: bytes, or a number with K, M or G (binary: 2M = 2 MiB).
#
# For each block size, one fio job (ioengine=io_uring, direct=1, numjobs=1, iodepth as above):
#   1. write:    rw=write, sequential, one pass over a fresh file of --file-size preallocated with
#                fallocate (unwritten extents, as the tier's own file is), --size caps it at one
#                pass; no --runtime (the whole file must be written before step 2), bounded by
#                `timeout`: 120 s plus 1 s per 16 MiB of file (a 16 MB/s floor).
#   2. randread: rw=randread over the same file, now holding real blocks, --time_based for
#                --runtime seconds (bounded by `timeout` at --runtime plus 60 s).
# One table line per (op, block size) from fio's JSON (--output-format=json): GB/s (decimal,
# 10^9 bytes), IOPS, mean and p99 completion latency (clat) in ms, fio's usr+sys CPU in percent
# of one core over the job's runtime, and CPU seconds per GB moved.
# A file system that refuses O_DIRECT (probed with `dd oflag=direct` on the test file: EINVAL;
# e.g. tmpfs before Linux 6.6, ramfs) gets direct=0 instead, with a line saying so: those
# figures go through the page cache and are no disk ceiling.
# JSON: {"path", "fs_type" (stat -f -c %T), "direct", "file_size" (bytes), "bytes_in_flight"
# (bytes), "results": [{"op": "write"|"randread", "block_size" (bytes), "iodepth", "gb_per_s",
# "iops", "lat_mean_ms", "lat_p99_ms", "cpu_pct", "cpu_s_per_gb"}], "fio_version", "command"}.
# fio comes from Debian's fio package (scripts/install-deps.sh bench); fio's JSON is read with
# /usr/bin/python3 (stdlib only). docs/performance.md, "Disk tier ceiling (fio)".
set -euo pipefail

# No cd: --path and --json are taken relative to the caller's directory.
INVOCATION="scripts/bench-ssd-ceiling.sh$(printf ' %q' "$@")" # as given, for the JSON
DIR=/var/tmp
FILE_SIZE=4G
BLOCK_SIZES="2M 32M"
BIF=64M
RUNTIME=10
JSON=""
KEEP=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
    --path) DIR=${2:?--path takes a directory}; shift ;;
    --file-size) FILE_SIZE=${2:?--file-size takes a size}; shift ;;
    --block-sizes) BLOCK_SIZES=${2:?--block-sizes takes sizes}; shift ;;
    --bytes-in-flight) BIF=${2:?--bytes-in-flight takes a size}; shift ;;
    --runtime) RUNTIME=${2:?--runtime takes seconds}; shift ;;
    --json) JSON=${2:?--json takes a file}; shift ;;
    --keep) KEEP=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench-ssd-ceiling: unknown argument $1 (--help lists them)" >&2; exit 2 ;;
    esac
    shift
done

die() { echo "bench-ssd-ceiling: $*" >&2; exit 1; }
bytes_of() { # SIZE -> bytes; exits 2 on anything else
    case $1 in
    '' | *[!0-9KMG]* | [KMG]* | *[KMG]?*) echo "bench-ssd-ceiling: not a size: '$1' (bytes, or N with K, M or G)" >&2; exit 2 ;;
    *K) echo $(( 10#${1%K} << 10 )) ;;
    *M) echo $(( 10#${1%M} << 20 )) ;;
    *G) echo $(( 10#${1%G} << 30 )) ;;
    *) echo $(( 10#$1 )) ;;
    esac
}
FILE_B=$(bytes_of "$FILE_SIZE")
BIF_B=$(bytes_of "$BIF")
case $RUNTIME in '' | *[!0-9]* | 0) echo "bench-ssd-ceiling: --runtime takes whole seconds >= 1 ($RUNTIME)" >&2; exit 2 ;; esac
[ -n "$BLOCK_SIZES" ] || { echo "bench-ssd-ceiling: --block-sizes is empty" >&2; exit 2; }
for bs in $BLOCK_SIZES; do
    b=$(bytes_of "$bs")
    if [ "$b" -lt 4096 ] || [ $((b % 4096)) -ne 0 ] || [ $((FILE_B % b)) -ne 0 ]; then
        echo "bench-ssd-ceiling: block size $bs must be a multiple of 4K and divide --file-size $FILE_SIZE" >&2
        exit 2
    fi
done
if [ ! -d "$DIR" ] || [ ! -w "$DIR" ]; then die "--path $DIR is not a writable directory"; fi
command -v fio >/dev/null || die "fio is missing (Debian package fio: scripts/install-deps.sh bench)"
PY=/usr/bin/python3
[ -x "$PY" ] || die "$PY is missing (Debian package python3)"

DIR=$(cd "$DIR" && pwd -P)
FS_TYPE=$(stat -f -c %T "$DIR")
FIO_VERSION=$(fio --version)
FILE=$DIR/kvrelay-fio-ceiling.$$
WORK=$(mktemp -d /tmp/kvrelay-fio-ceiling.XXXXXX)
cleanup() {
    rm -rf "$WORK"
    if [ "$KEEP" = 1 ]; then
        [ -e "$FILE" ] && echo "bench-ssd-ceiling: test file kept: $FILE"
    else
        rm -f "$FILE"
    fi
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Room for the file where the file system states a size (ramfs states none).
read -r fs_size fs_avail <<< "$(df -B1 --output=size,avail "$DIR" | tail -n 1)"
if [ "${fs_size:-0}" -gt 0 ] && [ "${fs_avail:-0}" -lt "$FILE_B" ]; then
    die "$DIR ($FS_TYPE) has $fs_avail bytes free, --file-size $FILE_SIZE needs $FILE_B"
fi

# O_DIRECT: one aligned 4 KiB write with dd oflag=direct; EINVAL (at open) is a file system that
# refuses it, anything else (no space, no permission) stops the run.
DIRECT=1
if ! LC_ALL=C dd if=/dev/zero of="$FILE" bs=4096 count=1 oflag=direct status=none 2>"$WORK/probe.err"; then
    if grep -q 'Invalid argument' "$WORK/probe.err"; then
        DIRECT=0
    else
        die "the O_DIRECT probe failed on $FILE: $(cat "$WORK/probe.err")"
    fi
fi

echo "bench-ssd-ceiling: $DIR ($FS_TYPE), file $FILE_SIZE, $BIF in flight, $FIO_VERSION, ioengine io_uring, direct=$DIRECT"
if [ "$DIRECT" = 0 ]; then
    echo "bench-ssd-ceiling: FALLBACK: $DIR ($FS_TYPE) refuses O_DIRECT ($(head -n 1 "$WORK/probe.err")):" \
        "fio runs with direct=0 (buffered, through the page cache); these figures are no disk ceiling"
fi

RESULTS=$WORK/results.jsonl
: >"$RESULTS"
FIO_COMMON=(--ioengine=io_uring --direct="$DIRECT" --numjobs=1 --filename="$FILE" --size="$FILE_B"
            --fallocate=none --output-format=json)
WRITE_LIMIT=$((120 + FILE_B / (16 << 20)))
READ_LIMIT=$((RUNTIME + 60))

# One fio run, bounded by timeout; its figures go to the table and to $RESULTS.
fio_pass() { # op bs_bytes depth limit_s -- more fio args
    local op=$1 bsb=$2 depth=$3 limit=$4 out rc=0
    shift 5
    out=$WORK/$op-$bsb.json
    timeout --kill-after=10 "$limit" fio --name="$op" --rw="$op" --bs="$bsb" --iodepth="$depth" \
        "${FIO_COMMON[@]}" --output="$out" "$@" 2>"$WORK/fio.err" || rc=$?
    if [ "$rc" -ne 0 ]; then
        [ "$rc" -eq 124 ] && echo "bench-ssd-ceiling: fio $op at $bsb bytes did not finish within $limit s" >&2
        echo "bench-ssd-ceiling: fio $op at $bsb bytes failed (exit $rc):" >&2
        cat "$WORK/fio.err" "$out" >&2 2>/dev/null || true
        exit 1
    fi
    # the figures: one JSON line appended to $RESULTS, one table line on stdout
    "$PY" - "$out" "$op" "$bsb" "$depth" "$RESULTS" <<'EOF'
import json, sys
out, op, bs, depth, results = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
text = open(out).read()
j = json.loads(text[text.index("{"):])  # fio may put a note line before its JSON
job = j["jobs"][0]
if job.get("error"):
    sys.exit(f"bench-ssd-ceiling: fio {op} reported error {job['error']}")
side = job["read" if op == "randread" else "write"]
if not side["io_bytes"]:
    sys.exit(f"bench-ssd-ceiling: fio {op} moved no bytes")
clat = side["clat_ns"]
cpu_pct = job["usr_cpu"] + job["sys_cpu"]  # percent of one core over the job's runtime
cpu_s = cpu_pct / 100 * job["job_runtime"] / 1000
r = dict(op=op, block_size=bs, iodepth=depth, gb_per_s=side["bw_bytes"] / 1e9, iops=side["iops"],
         lat_mean_ms=clat["mean"] / 1e6, lat_p99_ms=clat["percentile"]["99.000000"] / 1e6,
         cpu_pct=cpu_pct, cpu_s_per_gb=cpu_s / (side["io_bytes"] / 1e9))
with open(results, "a") as f:
    f.write(json.dumps(r) + "\n")
print(f"{op:<9} {bs >> 10:>8}K {depth:>5} {r['gb_per_s']:>8.3f} {r['iops']:>10.1f} {r['lat_mean_ms']:>9.3f}"
      f" {r['lat_p99_ms']:>9.3f} {cpu_pct:>6.1f} {r['cpu_s_per_gb']:>9.3f}")
EOF
}

for bs in $BLOCK_SIZES; do
    bsb=$(bytes_of "$bs")
    depth=$((BIF_B / bsb))
    [ "$depth" -ge 1 ] || depth=1
    echo "bench-ssd-ceiling: block $bs: queue depth $depth ($BIF in flight / $bs, at least 1)"
    # A fresh file for every block size, so that each write pass meets the same unwritten extents.
    rm -f "$FILE"
    if ! fallocate -l "$FILE_B" "$FILE" 2>"$WORK/fallocate.err"; then
        echo "bench-ssd-ceiling: fallocate refused on $FS_TYPE ($(head -n 1 "$WORK/fallocate.err")): the write pass allocates it as it writes"
    fi
    printf '%-9s %9s %5s %8s %10s %9s %9s %6s %9s\n' op block depth GB/s IOPS mean-ms p99-ms cpu% cpu-s/GB
    fio_pass write "$bsb" "$depth" "$WRITE_LIMIT" --
    fio_pass randread "$bsb" "$depth" "$READ_LIMIT" -- --time_based --runtime="$RUNTIME"
done

if [ -n "$JSON" ]; then
    "$PY" - "$RESULTS" "$JSON" "$DIR" "$FS_TYPE" "$DIRECT" "$FILE_B" "$BIF_B" "$FIO_VERSION" "$INVOCATION" <<'EOF'
import json, sys
res, out, path, fs, direct, fsize, bif, ver, cmd = sys.argv[1:10]
results = [json.loads(l) for l in open(res) if l.strip()]
doc = dict(path=path, fs_type=fs, direct=direct == "1", file_size=int(fsize), bytes_in_flight=int(bif),
           results=results, fio_version=ver, command=cmd)
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
EOF
    echo "bench-ssd-ceiling: json=$JSON"
fi
