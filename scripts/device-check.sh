#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, configures and builds the
# GPU tests and benchmarks (CUDA required), runs every GPU test and the GPU
# benchmarks, prints a summary and writes the results as JSON under
# RESULTS_DIR. Exits non-zero when a step fails, or when a GPU test skips on
# a machine that has a GPU. Without a GPU it builds, says so and exits 0.
# Fits in about 8 minutes on 16 cores (most of it the first build); with a
# build made elsewhere (PREBUILT) in about 4.
#
#   scripts/device-check.sh [RESULTS_DIR]     (default: device-check-results)
#   BUILD_DIR (default build-gpu) and JOBS (default nproc) override.
#   PREBUILT=path/bundle.tar.gz runs a build packed by device-bundle.sh
#   instead of building (for GPU machines without the Debian -dev packages).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# ---- What runs: the one place to add GPU tests and benchmarks. ----
# ctest -R regex of the GPU test names (gtest suites/cases).
GPU_TEST_REGEX='Cuda|Nccl|Gpu|Device'
# Cases that check the start-up error without a GPU (they skip on a GPU).
NO_GPU_TEST_REGEX='WithoutAGpu'
# The targets holding them, built before ctest runs.
GPU_TEST_TARGETS=(
  recps_kernels_cuda_test
  recps_device_store_test
  recps_device_store_process_test
  recps_device_memory_test
  recps_worker_model_device_test
  recps_trainer_device_test
  recps_collectives_test
  recps_coordinator_kv_store_test
  recps-shard
  recps-worker
  recps-coordinator
  recps
)
# End to end: `recps local`, one worker and one shard, "name|job|steps|the
# launcher's device flags -- the worker's": GPU worker and GPU shard (host
# pooling, then pooling on the GPU), the same with every table stored as
# BF16 with stochastic rounding (the job's *_bf16 copy, written into the
# results folder), then the job on the CPU (samples/s and held-out AUC side
# by side). E2E_STEP_SCALE scales every run's steps; RESULTS is replaced by
# the results folder.
E2E_RUNS=(
  "small-gpu|examples/small.textproto|2000|--shard_device=cuda:0 -- --device=cuda:0"
  "small-gpu-pool|examples/small.textproto|2000|--shard_device=cuda:0 -- --device=cuda:0 --pool_on_device"
  "small-gpu-bf16|RESULTS/small_bf16.textproto|2000|--shard_device=cuda:0 -- --device=cuda:0"
  "small-cpu|examples/small.textproto|2000|--shard_device=cpu -- --device=cpu"
  "m_p1-gpu|bench/configs/m_p1.textproto|300|--shard_device=cuda:0 -- --device=cuda:0"
  "m_p1-gpu-pool|bench/configs/m_p1.textproto|300|--shard_device=cuda:0 -- --device=cuda:0 --pool_on_device"
  "m_p1-gpu-bf16|RESULTS/m_p1_bf16.textproto|300|--shard_device=cuda:0 -- --device=cuda:0"
  "m_p1-cpu|bench/configs/m_p1.textproto|300|--shard_device=cpu -- --device=cpu"
)
# The jobs whose BF16 copies E2E_RUNS uses.
BF16_JOBS=(examples/small.textproto bench/configs/m_p1.textproto)
E2E_STEP_SCALE=${E2E_STEP_SCALE:-1}
# Benchmarks: "target|arguments" (RESULTS is replaced by the results folder).
GPU_BENCHES=(
  "recps_device_store_bench|--json=RESULTS/device_store_bench.json"
  # The GPU store through a real recps-shard (lookups, then pushes).
  "recps_shard_bench|--shard_flag=--device=cuda:0 --op=lookup --ids=65536 --seconds_per_case=2 --rounds=2"
  "recps_shard_bench|--shard_flag=--device=cuda:0 --op=push --ids=65536 --seconds_per_case=2 --rounds=2 --optimizer=adagrad"
)
# ---------------------------------------------------------------------

RESULTS=${1:-device-check-results}
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
summary=()
failed=0
step() {  # step NAME STATUS DETAIL
  summary+=("$(printf '%-34s %-6s %s' "$1" "$2" "$3")")
  [[ $2 == FAIL ]] && failed=1
}
finish() {
  echo
  echo "== device-check summary"
  printf '%s\n' "${summary[@]}"
  {
    echo "{\"failed\": $failed, \"steps\": ["
    local first=1
    for s in "${summary[@]}"; do
      [[ $first == 1 ]] || echo ","
      first=0
      printf '  "%s"' "$(echo "$s" | sed 's/"/\\"/g')"
    done
    echo "]}"
  } > "$RESULTS/summary.json"
  exit $failed
}

start=$(date +%s)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
bench_targets=()
for b in "${GPU_BENCHES[@]}"; do bench_targets+=("${b%%|*}"); done
mapfile -t bench_targets < <(printf "%s\n" "${bench_targets[@]}" | sort -u)
if [[ -n ${PREBUILT:-} ]]; then
  # A build made elsewhere (scripts/device-bundle.sh): unpack it at the path
  # it was built at, which ctest's files and the tests name, with that
  # path's source root linked to this checkout.
  unpack=$(mktemp -d)
  tar -xzf "$PREBUILT" -C "$unpack"
  BUILD_DIR=$(cat "$unpack/.bundle-build-dir")
  src_root=$(dirname "$BUILD_DIR")
  if [[ ! -e $src_root ]]; then
    mkdir -p "$(dirname "$src_root")" && ln -s "$PWD" "$src_root"
  fi
  if [[ $(cd "$src_root" && pwd -P) != $(pwd -P) ]]; then
    step prebuilt FAIL "$src_root exists and is not this checkout"
    finish
  fi
  # Replace only an earlier unpacked bundle, never a real build tree (the
  # machine that made the bundle has one at this very path).
  if [[ -e $BUILD_DIR && ! -e $BUILD_DIR/.bundle-build-dir ]]; then
    step prebuilt FAIL "$BUILD_DIR is a build tree, not a bundle: run PREBUILT on the GPU machine"
    finish
  fi
  rm -rf "$BUILD_DIR" && mv "$unpack" "$BUILD_DIR"
  export LD_LIBRARY_PATH="$BUILD_DIR/.bundle-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # NCCL and cuBLAS come from this machine: the toolkit's, else a Python
  # package's (PyTorch images ship them there).
  for lib in libnccl.so.2 libcublas.so.13 libcudart.so.13; do
    if ! ldconfig -p | grep -q "$lib" && [[ ! -e /usr/local/cuda/lib64/$lib ]]; then
      found=$(find / -xdev -name "$lib" -path '*nvidia*' 2>/dev/null | head -1)
      [[ -n $found ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
    fi
  done
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64"
  missing=$(find "$BUILD_DIR" -type f -perm -u+x -not -path '*/.bundle-lib/*' -print0 |
              xargs -0 ldd 2>/dev/null | grep 'not found' | sort -u)
  if [[ -n $missing ]]; then
    echo "$missing"
    step prebuilt FAIL "libraries not found (above)"
    finish
  fi
  step prebuilt ok "$(cat "$BUILD_DIR/.bundle-commit" 2>/dev/null | cut -c1-12) at $BUILD_DIR"
else
  if ! cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DRECPS_REQUIRE_CUDA=ON \
       "${launcher[@]}" > "$RESULTS/configure.log" 2>&1; then
    tail -30 "$RESULTS/configure.log"
    step configure FAIL "see $RESULTS/configure.log"
    finish
  fi
  if ! cmake --build "$BUILD_DIR" -j "$JOBS" --target "${GPU_TEST_TARGETS[@]}" \
       "${bench_targets[@]}" > "$RESULTS/build.log" 2>&1; then
    grep -E "error|Error" "$RESULTS/build.log" | head -30
    step build FAIL "see $RESULTS/build.log"
    finish
  fi
  step build ok "$(( $(date +%s) - start )) s"
fi

gpu_present=0
if ls /dev/nvidia[0-9]* >/dev/null 2>&1 || nvidia-smi -L >/dev/null 2>&1; then
  gpu_present=1
fi
if [[ $gpu_present == 0 ]]; then
  echo "no GPU present (no /dev/nvidia*, no nvidia-smi): built only, no GPU test run"
  step gpu-tests skip "no GPU present"
  finish
fi
nvidia-smi -L 2>/dev/null | head -4

# GPU tests: every one must pass, none may skip (a GPU is present).
t0=$(date +%s)
ctest --test-dir "$BUILD_DIR" -R "$GPU_TEST_REGEX" -E "_NOT_BUILT|$NO_GPU_TEST_REGEX" -V \
  -j "${GPU_TEST_JOBS:-4}" --timeout 120 > "$RESULTS/gpu-tests.log" 2>&1
rc=$?
skipped=$(grep -c '\[  SKIPPED \]' "$RESULTS/gpu-tests.log")
total_line=$(grep -E 'tests passed' "$RESULTS/gpu-tests.log" | tail -1)
if [[ $rc != 0 ]]; then
  grep -E '\*\*\*Failed|Failed  |FAILED' "$RESULTS/gpu-tests.log" | head -20
  step gpu-tests FAIL "$total_line (see gpu-tests.log)"
elif [[ $skipped != 0 ]]; then
  grep -B2 '\[  SKIPPED \]' "$RESULTS/gpu-tests.log" | head -20
  step gpu-tests FAIL "$skipped skipped with a GPU present"
else
  step gpu-tests ok "$total_line, $(( $(date +%s) - t0 )) s"
fi

n=0
for b in "${GPU_BENCHES[@]}"; do
  n=$((n + 1))
  target=${b%%|*}
  args=${b#*|}
  args=${args//RESULTS/$RESULTS}
  bin=$(find "$BUILD_DIR" -type f -name "$target" -perm -u+x | head -1)
  t0=$(date +%s)
  # shellcheck disable=SC2086
  log="$RESULTS/bench-$n-$target.log"
  echo "== $target $args"
  if timeout 120 "$bin" $args > "$log" 2>&1; then
    tail -12 "$log"
    step "$n. $target" ok "$(( $(date +%s) - t0 )) s"
  else
    tail -20 "$log"
    step "$n. $target" FAIL "see $(basename "$log")"
  fi
done
for job in "${BF16_JOBS[@]}"; do
  # Fields of a text proto may come in any order: the precision goes first.
  sed 's/tables {/tables { precision: BF16 stochastic_rounding: true/' "$job" \
    > "$RESULTS/$(basename "$job" .textproto)_bf16.textproto"
done
for run in "${E2E_RUNS[@]}"; do
  IFS='|' read -r name job steps flag_words <<< "$run"
  job=${job//RESULTS/$RESULTS}
  steps=$(awk -v s="$steps" -v k="$E2E_STEP_SCALE" 'BEGIN{print int(s*k)}')
  read -r -a flags <<< "$flag_words"
  log="$RESULTS/local-$name.log"
  t0=$(date +%s)
  echo "== recps local $name: $steps steps of $job ($flag_words)"
  if timeout 150 "$BUILD_DIR/bin/recps" local --insecure --workers=1 --shards=1 \
       --job="$job" --steps="$steps" "${flags[@]}" > "$log" 2>&1; then
    rate=$(grep -o 'done: [0-9]* steps, [0-9]* samples/s' "$log" | tail -1 | awk '{print $4}')
    auc=$(grep -o 'held-out AUC [0-9.]*' "$log" | tail -1 | awk '{print $3}')
    split=$(grep -o 'per step: .*' "$log" | tail -1 | cut -c11-)
    echo "$split"
    step "local-$name" ok "${rate:-?} samples/s, AUC ${auc:-?}, $(( $(date +%s) - t0 )) s"
  else
    tail -20 "$log"
    step "local-$name" FAIL "see $(basename "$log")"
  fi
done
step total ok "$(( $(date +%s) - start )) s"
finish
