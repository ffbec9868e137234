#!/bin/sh
# Installs the Debian packages that kvrelay's build, tests and benchmarks use, by set, naming each
# one: nothing relies on a package's Recommends (apt-get runs with --no-install-recommends).
#
#   scripts/install-deps.sh [SET...]     SET: build (the default; always included), test, bench,
#                                        container, format
#
#   build      compile and run: what `make` and `make run` need, nothing else
#   test       the unit framework, the e2e runner and the real clients and servers the tests drive,
#              clang for the fuzz drivers (`make test`, `make test-*`, `make check-layers`,
#              `make fuzz`)
#   bench      the peers and tools of scripts/bench-dataplane.sh, and fio for
#              scripts/bench-ssd-ceiling.sh (`make bench` installs them too)
#   container  podman and mmdebstrap (tests/e2e/test_podman.py, scripts/fresh-machine-check.sh)
#   format     clang-format (`make format`, `make check-format`)
#
# The top Makefile picks the sets from its goals. --bench and --container are the old spellings of
# `build bench` and `build container`. Idempotent and quiet when everything is present; needs root
# (or sudo) otherwise.
set -eu

# Build: compiler, libraries (-dev), code generators, the sources compiled from a package.
# libprotobuf-dev carries google/protobuf/descriptor.proto, which protoc-c needs; it is only a
# Recommends of protobuf-compiler. Containerfile's build stage installs the same list.
BUILD="build-essential pkg-config
libxxhash-dev liburing-dev libh2o-evloop-dev libssl-dev zlib1g-dev libyaml-dev libnghttp2-dev
libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler librust-blake3-dev
libzmq3-dev libmsgpack-dev"
# Tests: unit framework, the e2e runner and the real clients and servers it drives (grpcio, curl,
# nghttp, promtool, redis-server and memcached for kvrelay-bench's other protocols, the Kubernetes
# client for the manifests), the check-layers script, clang + its runtime for the fuzz drivers,
# gnuplot (tests/e2e/test_bench_report.py draws the bench report's plots), fio
# (tests/e2e/test_bench_ssd_ceiling.py runs scripts/bench-ssd-ceiling.sh) and clang-format
# (`make test` runs `make check-format` first).
TEST="libcriterion-dev python3 python3-pytest python3-xxhash python3-grpcio python3-protobuf
protobuf-compiler-grpc curl nghttp2-client prometheus openssl procps redis-server memcached
python3-venv python3-setuptools python3-wheel python3-pip
python3-kubernetes python3-yaml python3-zmq python3-msgpack clang libclang-rt-14-dev gnuplot-nox clang-format
fio"
# Benchmarks: scripts/bench-dataplane.sh's peers (Redis with redis-cli, memcached), its ceilings
# (iperf3), profiles (perf, strace), plots (gnuplot: the report's SVGs) and helpers (python3, curl
# for kvrelay's /metrics); fio, the disk tier's ceiling (scripts/bench-ssd-ceiling.sh).
BENCH="python3 curl redis-server redis-tools memcached iperf3 linux-perf strace gnuplot-nox fio"
# Containers: tests/e2e/test_podman.py (the image from a minimal Debian 12 root, kube play).
CONTAINER="podman runc catatonit mmdebstrap"
FORMAT="clang-format"

PKGS="$BUILD"
for set in "$@"; do
    case $set in
    build) ;;
    test) PKGS="$PKGS $TEST" ;;
    bench | --bench) PKGS="$PKGS $BENCH" ;;
    container | --container) PKGS="$PKGS $CONTAINER" ;;
    format) PKGS="$PKGS $FORMAT" ;;
    *) echo "install-deps: unknown set $set (build, test, bench, container, format)" >&2; exit 2 ;;
    esac
done

missing=""
for p in $PKGS; do
    case " $missing " in *" $p "*) continue ;; esac
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

[ -z "$missing" ] && exit 0

echo "install-deps: installing:$missing" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
