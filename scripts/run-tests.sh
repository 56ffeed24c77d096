#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds (with CUDA where nvcc
# is present), runs every test with ctest, then builds a CPU-only tree
# (-DRECPS_CUDA=OFF) with clang, whose -Werror=thread-safety checks every
# lock annotation, and runs the tests there too (but for the deploy and the
# two long end-to-end suites). GPU tests skip without a GPU.
# Last, the fuzz targets run RECPS_FUZZ_SECONDS (default 10) each.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test  # and promtool, for the metrics test
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"

echo "== CPU-only tree, clang with -Werror=thread-safety (-DRECPS_CUDA=OFF)"
CC=clang CXX=clang++ BUILD_DIR=build-clang-cpu scripts/build.sh -DRECPS_CUDA=OFF \
  -DRECPS_REQUIRE_CUDA=OFF -DRECPS_BUILD_BENCHMARKS=OFF
# Once, in the first tree only: the deploy tests (they check files and the
# binaries' flags, not the compiler), the end-to-end suites (label e2e:
# process orchestration through the same sources, the slowest of the suite)
# and the test of the 30 s default client timeout. The other process tests
# (recps local, clusters, TLS, the worker end to end) still run here, on the
# CPU-only binaries, but for the slowest tests of how the launcher and the
# coordinator handle a process that dies or hangs (restarts, timeouts: the
# same sources, no compiler- or CUDA-specific path). Whole run on a 2-vCPU
# AMD EPYC, 2026-12-07: install 0 s (installed), g++ build 895 s, its tests
# 684 s, clang build 378 s, its tests 144 s (before these exclusions),
# fuzzing ~240 s.
slow_failure_tests='HungCoordinatorOverTlsWithTheDefaultTimeout'
slow_failure_tests+='|LaunchMaxRestartsResumesTheNodeFromTheNewestCheckpoint'
slow_failure_tests+='|TrainingSurvivesACoordinatorRestart|KilledCoordinatorIsRestarted'
slow_failure_tests+='|RebalanceApplyReportsACoordinatorThatDied|CancelledBarriersAreReleased'
ctest --test-dir build-clang-cpu --output-on-failure -j "$(nproc)" \
  -LE 'deploy|e2e' -E "$slow_failure_tests"

# Every parser of untrusted bytes under libFuzzer with ASan + UBSan, a short
# fixed time each on the committed seed corpus (docs/fuzzing.md); a crash
# fails the tests and leaves its input in build-fuzz/artifacts/<target>/.
echo "== fuzz targets (clang, ASan + UBSan), ${RECPS_FUZZ_SECONDS:-10}s each"
scripts/fuzz.sh --seconds "${RECPS_FUZZ_SECONDS:-10}"
