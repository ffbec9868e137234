#!/bin/sh
# test-check-layers.sh — tests scripts/check-layers.py itself (run by `make check-layers`): on a
# copy of src/ it must pass as src/ does, and fail, naming file:line, on each deliberately bad
# include: a lower layer including a higher one, wire and shm including each other, an I/O
# header in wire/; and on io/ touching a shared struct's field. Bounded: one copy of src/, six runs of the checker.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-$here/../src}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test-check-layers: $*" >&2; exit 1; }

cp -r "$src" "$tmp/src"
"$here/check-layers.py" "$tmp/src" >/dev/null || fail "a copy of the clean tree does not pass"

# expect_bad FILE LINE_TEXT: insert LINE_TEXT as line 2 of FILE; the checker must exit 1 and
# name FILE:2; then the file is restored.
expect_bad() {
    f=$tmp/src/$1
    cp "$f" "$tmp/saved"
    { head -n 1 "$tmp/saved"; echo "$2"; tail -n +2 "$tmp/saved"; } > "$f"
    rc=0
    out=$("$here/check-layers.py" "$tmp/src" 2>&1) || rc=$?
    [ "$rc" -eq 1 ] || fail "exit status $rc (not 1) with '$2' in $1"
    case $out in
    *"$tmp/src/$1:2:"*) ;;
    *) fail "did not name $1:2 for '$2'; it printed: $out" ;;
    esac
    cp "$tmp/saved" "$f"
    echo "ok: '$2' in $1 is refused ($1:2)"
}

expect_bad shm/stats.c '#include "io/uring.h"'
expect_bad wire/cbi1.c '#include "shm/segment.h"'
expect_bad core/config.c '#include "proc/supervisor.h"'
expect_bad wire/json.c '#include <sys/socket.h>'
expect_bad io/metrics.c 'static int f(kvr_seg_t *seg) { return seg->hdr->backing; }'
"$here/check-layers.py" "$tmp/src" >/dev/null || fail "the restored copy does not pass"
echo "test-check-layers: ok"
