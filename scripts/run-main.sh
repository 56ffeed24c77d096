#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs the kernel benchmark
# (memcpy anchor, embedding-bag forward, fused optimizer updates).
# Arguments go to the benchmark, e.g. --benchmark_filter=dim64.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec "${BUILD_DIR:-build}/bench/recps_kernels_bench" "$@"
