#!/bin/sh
# Installs every Debian package that kvrelay's build, tests and benchmarks need.
# Idempotent and quiet when everything is present; needs root (or sudo) otherwise.
set -eu

PKGS="build-essential pkg-config clang libclang-rt-14-dev
libcriterion-dev libxxhash-dev liburing-dev libh2o-evloop-dev libssl-dev zlib1g-dev libyaml-dev
libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler librust-blake3-dev
protobuf-compiler protobuf-compiler-grpc python3 python3-grpcio python3-protobuf
curl nghttp2-client prometheus openssl procps python3-pytest python3-xxhash
redis-server memcached"

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
