#!/bin/sh
# Installs every Debian package that kvrelay's build, tests and benchmarks use, naming each one:
# nothing relies on a package's Recommends (apt-get runs with --no-install-recommends).
#
#   scripts/install-deps.sh           build + tests (what `make`, `make run` and `make test` need)
#   scripts/install-deps.sh --bench   also the peers and clients of scripts/bench-peers.sh
#   scripts/install-deps.sh --container   also podman and mmdebstrap (tests/e2e/test_podman.py)
#
# Idempotent and quiet when everything is present; needs root (or sudo) otherwise.
set -eu

# Build: compiler, libraries (-dev), code generators, the sources compiled from a package.
# libprotobuf-dev carries google/protobuf/descriptor.proto, which protoc-c needs; it is only a
# Recommends of protobuf-compiler.
BUILD="build-essential pkg-config clang libclang-rt-14-dev
libxxhash-dev liburing-dev libh2o-evloop-dev libssl-dev zlib1g-dev libyaml-dev libnghttp2-dev
libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler librust-blake3-dev"
# Tests: unit framework, the e2e runner and the real clients it drives.
TESTS="libcriterion-dev python3 python3-pytest python3-xxhash python3-grpcio python3-protobuf
protobuf-compiler-grpc curl nghttp2-client prometheus openssl procps redis-server memcached
python3-venv python3-setuptools python3-wheel python3-pip
python3-kubernetes python3-yaml"
# Benchmarks: the peers and their own clients (scripts/bench-peers.sh).
BENCH="redis-server redis-tools memcached libmemcached-tools nginx-light iperf3 wrk gnuplot-nox
linux-perf strace"

# Containers: tests/e2e/test_podman.py (the image from a minimal Debian 12 root, kube play).
CONTAINER="podman runc catatonit mmdebstrap"

PKGS="$BUILD $TESTS"
[ "${1:-}" = "--bench" ] && PKGS="$PKGS $BENCH"
[ "${1:-}" = "--container" ] && PKGS="$PKGS $CONTAINER"

missing=""
for p in $PKGS; do
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
