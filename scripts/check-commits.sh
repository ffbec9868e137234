#!/usr/bin/env bash
# check-commits.sh [RANGE] — every commit in RANGE has a subject of at most 72 characters, and
# every commit that is not a merge says why in a body. RANGE defaults to the commits after
# 6d5c07f, the last one written before the rule (the older history is left as it was: rewriting
# it would change every hash the docs and bench reports cite).
#   --self-test  builds a throw-away repository with one good and two bad commits and checks
#                that the bad ones are refused and the good one is not.
set -euo pipefail
FIRST_UNDER_RULE_PARENT=6d5c07f

check() { # $1: range; prints offenders, returns 1 if any
    local bad=0 c subj body parents
    for c in $(git rev-list "$1"); do
        subj=$(git log -1 --format=%s "$c")
        parents=$(git log -1 --format=%P "$c" | wc -w)
        if [ "${#subj}" -gt 72 ]; then
            echo "check-commits: ${c:0:7}: subject is ${#subj} characters (at most 72): $subj"
            bad=1
        fi
        body=$(git log -1 --format=%b "$c" | grep -c . || true)
        if [ "$parents" -lt 2 ] && [ "$body" -eq 0 ]; then
            echo "check-commits: ${c:0:7}: no body saying why: $subj"
            bad=1
        fi
    done
    return $bad
}

if [ "${1:-}" = --self-test ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    git -C "$tmp" init -q
    git -C "$tmp" -c user.name=t -c user.email=t@t commit -q --allow-empty -m base
    git -C "$tmp" -c user.name=t -c user.email=t@t commit -q --allow-empty -m "good: short" -m "Because."
    good=$(git -C "$tmp" rev-parse HEAD)
    git -C "$tmp" -c user.name=t -c user.email=t@t commit -q --allow-empty -m "no body"
    git -C "$tmp" -c user.name=t -c user.email=t@t commit -q --allow-empty \
        -m "$(printf 'x%.0s' $(seq 73))" -m "A body."
    out=$(cd "$tmp" && check "HEAD~3..$good") || { echo "self-test: a good commit refused: $out"; exit 1; }
    if out=$(cd "$tmp" && check "$good..HEAD"); then
        echo "self-test: bad commits passed"; exit 1
    fi
    grep -q "no body" <<<"$out" && grep -q "73 characters" <<<"$out" ||
        { echo "self-test: wrong complaints: $out"; exit 1; }
    echo "check-commits: self-test ok"
    exit 0
fi

range=${1:-$FIRST_UNDER_RULE_PARENT..HEAD}
if ! git rev-parse -q --verify "${range%%..*}^{commit}" >/dev/null 2>&1; then
    echo "check-commits: SKIPPED, not checked: ${range%%..*} is not in this checkout (no git history?)"
    exit 0
fi
check "$range"
echo "check-commits: $(git rev-list --count "$range") commits in $range ok"
