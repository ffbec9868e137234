#!/bin/sh
# test-check-layers.sh — tests scripts/check-layers.py itself (run by `make check-layers`): on a
# copy of src/, tools/ and bench/ it must pass as the tree does, and fail, naming file:line, on
# each deliberately bad include: a lower layer including a higher one, wire and shm including
# each other, an I/O header in wire/; on io/ touching a shared struct's field; and on a circle
# planted in tools/ (a module including one that includes it) and in bench/-style headers (a
# header declaring what another module defines, the bench tool's old main.c <-> relay.c) and
# inside one layer of src/. Then scripts/check-size.py: a long function without its reason and a
# long file are refused. Bounded: one copy of the three directories, fourteen runs of checkers.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "${1:-$here/../src}/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test-check-layers: $*" >&2; exit 1; }

for d in src tools bench; do cp -r "$root/$d" "$tmp/$d"; done
layers() { "$here/check-layers.py" "$tmp/src"; }
circles() { "$here/check-layers.py" --circles --src "$tmp/src" "$tmp/tools" "$tmp/bench"; }
srccircles() { "$here/check-layers.py" --circles "$tmp/src"; }
layers >/dev/null || fail "a copy of the clean src/ does not pass"
circles >/dev/null || fail "a copy of the clean tools/ and bench/ does not pass"

# expect_bad CHECK FILE LINE_TEXT: insert LINE_TEXT as line 2 of FILE (relative to the copy);
# CHECK (layers or circles) must exit 1 and name FILE:2; then the file is restored.
expect_bad() {
    f=$tmp/$2
    cp "$f" "$tmp/saved"
    { head -n 1 "$tmp/saved"; echo "$3"; tail -n +2 "$tmp/saved"; } > "$f"
    rc=0
    out=$($1 2>&1) || rc=$?
    [ "$rc" -eq 1 ] || fail "exit status $rc (not 1) with '$3' in $2"
    case $out in
    *"$tmp/$2:2"*) ;;
    *) fail "did not name $2:2 for '$3'; it printed: $out" ;;
    esac
    cp "$tmp/saved" "$f"
    echo "ok: '$3' in $2 is refused ($2:2)"
}

expect_bad layers src/shm/stats.c '#include "io/uring.h"'
expect_bad layers src/wire/cbi1.c '#include "shm/segment.h"'
expect_bad layers src/core/config.c '#include "proc/supervisor.h"'
expect_bad layers src/wire/json.c '#include <sys/socket.h>'
expect_bad layers src/io/metrics.c 'static int f(kvr_seg_t *seg) { return seg->hdr->backing; }'
# a circle by includes: json.c uses relay.h, and relay.c includes json.h
expect_bad circles tools/kvrelay-bench/json.c '#include "relay.h"'
# a circle through a declaration: hist.h promises a function of report.c, and report includes hist
expect_bad circles tools/kvrelay-bench/hist.h 'void kvb_sum_totals(const struct kvb_stats *s, struct kvb_totals *t);'
# a circle inside one layer of src/: stats.c calls into the segment, which includes stats.h
expect_bad srccircles src/shm/stats.c '#include "shm/segment.h"'

# check-size: a function of 131 lines with no comment saying why it is long is refused, and the
# same function passes once its comment says so; a file of 801 lines is refused.
{ echo "int f(void)"; echo "{"; i=0; while [ $i -lt 128 ]; do echo "    g();"; i=$((i+1)); done; echo "}"; } > "$tmp/long.c"
out=$("$here/check-size.py" "$tmp/long.c" 2>&1) && fail "check-size passed a 131-line function: $out"
case $out in *"long.c:1: f() is 131 lines"*) ;; *) fail "check-size said: $out" ;; esac
{ echo "/* Long because it is a test. */"; cat "$tmp/long.c"; } > "$tmp/long2.c" && mv "$tmp/long2.c" "$tmp/long.c"
"$here/check-size.py" "$tmp/long.c" >/dev/null || fail "check-size refused a long function with its reason"
yes "int x;" | head -n 801 > "$tmp/big.h"
"$here/check-size.py" "$tmp/big.h" >/dev/null && fail "check-size passed an 801-line file"
echo "ok: check-size refuses a long function without a reason and a long file"

layers >/dev/null || fail "the restored src/ does not pass"
circles >/dev/null || fail "the restored tools/ and bench/ do not pass"
echo "test-check-layers: ok"
