#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds (with CUDA where nvcc
# is present), runs every test with ctest, then checks that a CPU-only tree
# (-DRECPS_CUDA=OFF) also builds and passes. GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test  # and promtool, for the metrics test
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"

echo "== CPU-only tree (-DRECPS_CUDA=OFF)"
BUILD_DIR=build-cpu-only scripts/build.sh -DRECPS_CUDA=OFF -DRECPS_REQUIRE_CUDA=OFF \
  -DRECPS_BUILD_BENCHMARKS=OFF
ctest --test-dir build-cpu-only --output-on-failure -j "$(nproc)"
