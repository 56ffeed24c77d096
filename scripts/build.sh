#!/usr/bin/env bash
# Configures and builds recps into BUILD_DIR (default: build/).
# CUDA kernels are built whenever nvcc is present (/usr/local/cuda), and a
# CUDA compile error then fails the build. Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
cuda_flags=()
# -DRECPS_CUDA=OFF among the arguments asks for a CPU-only tree.
cpu_only=0
for arg in "$@"; do [[ "$arg" == -DRECPS_CUDA=OFF ]] && cpu_only=1; done
if [[ $cpu_only == 0 ]] && { [[ -x /usr/local/cuda/bin/nvcc ]] || command -v nvcc >/dev/null; }; then
  cuda_flags=(-DRECPS_REQUIRE_CUDA=ON)
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "${cuda_flags[@]}" "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"
