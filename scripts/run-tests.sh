#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds (with CUDA where nvcc
# is present), runs every test with ctest, then builds a CPU-only tree
# (-DRECPS_CUDA=OFF) with clang, whose -Werror=thread-safety checks every
# lock annotation, and runs the tests there too. GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test  # and promtool, for the metrics test
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"

echo "== CPU-only tree, clang with -Werror=thread-safety (-DRECPS_CUDA=OFF)"
CC=clang CXX=clang++ BUILD_DIR=build-clang-cpu scripts/build.sh -DRECPS_CUDA=OFF \
  -DRECPS_REQUIRE_CUDA=OFF -DRECPS_BUILD_BENCHMARKS=OFF
# The deploy tests check files and binaries' flags, not the compiler: once.
ctest --test-dir build-clang-cpu --output-on-failure -j "$(nproc)" -LE deploy
