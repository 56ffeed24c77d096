#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan, CPU-only,
# a tree of its own: FUZZ_BUILD_DIR, default build-fuzz) and runs each for
# a fixed time on its seed corpus (tests/fuzz/corpus/<target>/) and the
# inputs earlier runs found (FUZZ_BUILD_DIR/corpus/<target>/).
#
#   scripts/fuzz.sh [--seconds N] [--jobs J] [--no-build] [TARGET...]
#
# --seconds: per target (default 300); --jobs: targets run at once (default:
# the CPU count). A crash, a sanitizer report, a leak or a failed check
# stops that target and fails the script; the input that did it is left in
# FUZZ_BUILD_DIR/artifacts/<target>/ (crash-*, leak-*, timeout-*, oom-*),
# named in the output. Replay one with: FUZZ_BUILD_DIR/fuzz/<target> FILE.
# docs/fuzzing.md says more.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=300
jobs=$(nproc)
build=1
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
dir=${FUZZ_BUILD_DIR:-build-fuzz}

if [[ $build == 1 ]]; then
  # Only the fuzz targets and the libraries they link: no tests, benches,
  # daemons or CUDA.
  CC=clang CXX=clang++ cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release \
    -DRECPS_CUDA=OFF -DRECPS_REQUIRE_CUDA=OFF -DRECPS_BUILD_TESTS=OFF \
    -DRECPS_BUILD_BENCHMARKS=OFF -DRECPS_FUZZ=ON >/dev/null
  cmake --build "$dir" -j "$(nproc)" --target recps_fuzzers
fi
if [[ ${#targets[@]} == 0 ]]; then
  for seeds in tests/fuzz/corpus/*/; do targets+=("$(basename "$seeds")"); done
fi

# One target: fuzz for $seconds, then say how it went. The whole log is
# kept in $dir/logs/<target>.log.
run_one() {
  local t=$1 bin=$dir/fuzz/$1
  [[ -x $bin ]] || { echo "FAIL $t: no binary $bin"; return 1; }
  mkdir -p "$dir/corpus/$t" "$dir/artifacts/$t" "$dir/logs"
  local dict=()
  [[ -f tests/fuzz/$t.dict ]] && dict=(-dict="tests/fuzz/$t.dict")
  local log=$dir/logs/$t.log rc=0
  # New inputs go to the first corpus directory only; the seeds stay as
  # committed. -timeout: one input running 10 s is a hang; -rss_limit_mb:
  # one using 2 GiB is a memory bug.
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "${dict[@]}" \
    -artifact_prefix="$dir/artifacts/$t/" \
    "$dir/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  local stats
  stats=$(grep -aE '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 | \
          sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+).*exec\/s: ([0-9]+).*/cov \1 ft \2 exec\/s \3/')
  local execs
  execs=$(grep -aE '^stat::number_of_executed_units' "$log" | awk '{print $2}')
  if [[ $rc != 0 ]]; then
    echo "FAIL $t (exit $rc): $(grep -ahoE "(Test unit written to|artifact_prefix.*; Test unit written to) [^ ]+" "$log" | tail -1)"
    grep -aE "ERROR: |FUZZ CHECK FAILED|runtime error:|SUMMARY:" "$log" | head -5 | sed 's/^/    /'
    echo "    log: $log"
    return 1
  fi
  echo "ok   $t: ${execs:-?} runs in ${seconds}s, $stats"
}
export -f run_one
export dir seconds

echo "== fuzzing ${targets[*]}: ${seconds}s each, $jobs at a time"
failed=0
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}' || failed=1
if [[ $failed != 0 ]]; then
  echo "fuzz.sh: a target failed; its input is in $dir/artifacts/<target>/" >&2
  exit 1
fi
