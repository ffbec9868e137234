#!/usr/bin/env bash
# Runs a command in a brand-new minimal Debian 12 root, as a newcomer's machine would be: nothing
# installed beyond git, make and ca-certificates, so a missing step in scripts/install-deps.sh
# fails here instead of hiding behind a machine with leftovers.
#
#   scripts/fresh-machine-check.sh [--run-check | COMMAND]      (as root, from anywhere in the tree)
#
#   COMMAND       a shell command run in the clone inside the root (default: make test)
#   --run-check   runs `make run`, waits for GET /readyz to answer 200 (bash's /dev/tcp: the root
#                 has no curl, and `make run` must not install one), stops the server with SIGTERM
#                 and requires it to exit 0, and that no test or benchmark package was installed
#
# The committed HEAD is cloned into the root (uncommitted work is not part of the check). The root
# is built once with mmdebstrap (--variant=minbase) from the host's apt sources and cached as a
# tarball; every run unpacks it anew. Environment:
#   FRESH_ROOT_CACHE   the cached tarball   (default /var/cache/kvrelay/bookworm-minbase.tar)
#   FRESH_TIMEOUT      seconds the command may take before it is killed   (default 3000)
#   FRESH_KEEP=1       keep the unpacked root afterwards (its path is printed)
# Mounts (/proc, /sys, /dev) and the root are removed on every exit, including SIGINT/SIGTERM.
set -euo pipefail

cache=${FRESH_ROOT_CACHE:-/var/cache/kvrelay/bookworm-minbase.tar}
limit=${FRESH_TIMEOUT:-3000}
proj=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)

say() { echo "fresh-machine-check: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { say "needs root (mmdebstrap, chroot, mounts)"; exit 2; }

case "${1:-}" in
--run-check)
    # make run in the background; poll /readyz; SIGTERM the supervisor (found by walking down
    # the process tree from make's PID), which must drain and exit 0, and make with it.
    cmd='make run >/tmp/make-run.log 2>&1 & pid=$!
ok=0
for i in $(seq 1 900); do
    code=$( { exec 3<>/dev/tcp/127.0.0.1/9130 && printf "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" >&3 && head -n 1 <&3; } 2>/dev/null | cut -d" " -f2)
    [ "$code" = 200 ] && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 1
done
if [ $ok = 1 ]; then echo "make run: /readyz answered 200 after ${i} s"; else echo "make run: /readyz never answered 200"; tail -40 /tmp/make-run.log; fi
sup=""; todo=$pid
for depth in 1 2 3 4 5 6; do
    next=""
    for p in $todo; do
        case "$(readlink /proc/$p/exe 2>/dev/null)" in */kvrelay-supervisor) sup=$p;; esac
        next="$next $(cat /proc/$p/task/*/children 2>/dev/null)"
    done
    [ -n "$sup" ] && break
    todo=$next
done
if [ -n "$sup" ]; then kill -TERM "$sup"; else echo "make run: no kvrelay-supervisor under make"; kill -TERM $pid; fi
rc=0; wait $pid || rc=$?
tail -3 /tmp/make-run.log
echo "make run: exited $rc after SIGTERM"
extra=""
for p in curl python3 libcriterion-dev redis-server memcached prometheus python3-kubernetes iperf3 linux-perf clang fio; do
    dpkg-query -W -f="\${Status}" $p 2>/dev/null | grep -q "install ok installed" && extra="$extra $p"
done
[ -z "$extra" ] || echo "make run: installed what only tests or benchmarks use:$extra"
[ $ok = 1 ] && [ $rc = 0 ] && [ -z "$extra" ]'
    ;;
"") cmd="make test" ;;
*) cmd="$1" ;;
esac

if [ ! -s "$cache" ]; then
    if ! command -v mmdebstrap >/dev/null; then
        say "installing mmdebstrap"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
    fi
    # The host's own apt sources, so that the root reaches the same mirror the host does.
    src=/etc/apt/sources.list.d/debian.sources
    [ -s "$src" ] || src=/etc/apt/sources.list
    mkdir -p "$(dirname "$cache")"
    say "building a minimal Debian 12 root into $cache"
    mmdebstrap --quiet --format=tar --variant=minbase --include=ca-certificates,git,make \
        bookworm "$cache.tmp" "$src"
    mv "$cache.tmp" "$cache"
fi

root=$(mktemp -d /var/tmp/kvrelay-fresh.XXXXXX)
cleanup() {
    trap - EXIT INT TERM
    # Lazy, recursive: a mount held by a process that is still dying goes once it has gone.
    for m in proc sys dev; do umount -R -l "$root/$m" 2>/dev/null || true; done
    if [ "${FRESH_KEEP:-0}" = 1 ]; then say "root kept at $root"; else rm -rf --one-file-system "$root"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

tar -xf "$cache" -C "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
git clone -q "$proj" "$root/src/kvrelay"
say "running in a new Debian 12 root ($root), at most $limit s: $cmd"
start=$(date +%s)
rc=0
timeout --kill-after=30 "$limit" chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 CI=true \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /src/kvrelay && $cmd" </dev/null || rc=$?
say "exit $rc after $(($(date +%s) - start)) s"
exit $rc
