#!/usr/bin/env bash
# Builds and runs the benchmarks: kernels vs memcpy, the table store vs a
# bare row gather, the shard server vs raw loopback TCP, and one worker against one shard server on the small and the
# Criteo-sized examples. Figures are ratios to anchors measured in the same
# run (docs/kernels.md, docs/shard-server.md, docs/training.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
"$BUILD_DIR/bench/recps_kernels_bench" --benchmark_filter='memcpy|dim64'
"$BUILD_DIR/bench/recps_store_bench"
"$BUILD_DIR/bench/recps_shard_bench"
bench/worker_bench.sh
