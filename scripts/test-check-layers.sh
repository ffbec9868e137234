#!/bin/sh
# test-check-layers.sh — tests scripts/check-layers.py itself (run by `make check-layers`): on a
# copy of src/, tools/ and bench/ it must pass as the tree does, and fail, naming file:line, on
# each deliberately bad include: a lower layer including a higher one, wire and shm including
# each other, an I/O header in wire/; on io/ touching a shared struct's field; and on a circle
# planted in tools/ (a module including one that includes it) and in bench/-style headers (a
# header declaring what another module defines, the bench tool's old main.c <-> relay.c).
# Bounded: one copy of the three directories, ten runs of the checker.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "${1:-$here/../src}/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test-check-layers: $*" >&2; exit 1; }

for d in src tools bench; do cp -r "$root/$d" "$tmp/$d"; done
layers() { "$here/check-layers.py" "$tmp/src"; }
circles() { "$here/check-layers.py" --circles --src "$tmp/src" "$tmp/tools" "$tmp/bench"; }
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
layers >/dev/null || fail "the restored src/ does not pass"
circles >/dev/null || fail "the restored tools/ and bench/ do not pass"
echo "test-check-layers: ok"
