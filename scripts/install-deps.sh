#!/usr/bin/env bash
# Installs the Debian packages recps builds with (see docs/building.md).
# With --test, also the packages only the tests use (TEST_PACKAGES; CI
# passes it). Skips apt entirely when everything is already installed.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config curl
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libabsl-dev librocksdb-dev prometheus-cpp-dev libgloo-dev
  libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
  # `recpsctl certs` and `recps local` make TLS certificates with it; every
  # process reads its own certificate's identity with libcrypto.
  openssl libssl-dev
)
# Test-only, not runtime dependencies of any recps binary: promtool
# (Debian's prometheus package) lints every daemon's /metrics in
# tests/worker/metrics_test.cc and the deploy tests (skipped without it);
# clang builds the CPU-only tree with -Werror=thread-safety
# (scripts/run-tests.sh); python3-venv holds the deploy tests' pinned PyPI
# tools (tests/deploy/setup.sh, which also fetches kubectl's kustomize);
# iproute2 (ip, tc) builds the hosts of tests/deploy/multihost_test.py.
TEST_PACKAGES=(
  prometheus clang python3-venv iproute2
)

if [[ ${1:-} == --test ]]; then PACKAGES+=("${TEST_PACKAGES[@]}"); fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
    missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) != 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
  --no-install-recommends "${missing[@]}"
