#!/usr/bin/env bash
# Samples/s of `recps local` (coordinator + S shard servers + W workers on
# this machine) for W, S in {1, 2} and each consistency mode, on the small
# example and the Criteo-sized one (synthetic data), with the step time
# split per phase, averaged over the workers.
#   bench/cluster_bench.sh [SMALL_STEPS] [CRITEO_STEPS]   (default 500, 60)
#   JOBS="small" MODES="sync async" REPEAT=3 bench/cluster_bench.sh
#   INSECURE=1 bench/cluster_bench.sh   plaintext (default: mutual TLS, as
#                                       `recps local` runs by default)
#
# REPEAT (default 1) runs each configuration that many times and keeps the
# fastest run: on a shared machine the slow runs measure the neighbours.
#
# samples/s is the whole job's (all workers), over training time only (the
# evaluations are left out). Columns, in ms per step: data (reading a
# batch), lookup (the Lookup RPCs; in bounded/async modes they overlap
# compute on a helper thread), wait (what the training thread waited for
# that overlapped lookup), compute (dense forward + backward + optimizer and
# pooling), push (PushGradients; in sync mode it includes waiting for the
# slowest worker's push at the shard), allreduce (Gloo, dense gradients).
# Every process shares this machine's cores: on a small machine the numbers
# measure contention as much as the design.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
SMALL_STEPS=${1:-500}
CRITEO_STEPS=${2:-60}
JOBS=${JOBS:-small criteo}
MODES=${MODES:-sync bounded async}
REPEAT=${REPEAT:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "# $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| %-7s | %s | %s | %-9s | %5s | %9s | %6s | %6s | %6s | %7s | %6s | %9s | %9s |\n' \
  job W S mode steps samples/s data lookup wait compute push allreduce "final loss"
printf '|%s|\n' "---------|---|---|-----------|-------|-----------|--------|--------|--------|---------|--------|-----------|-----------"
for job in $JOBS; do
  steps=$SMALL_STEPS
  [[ $job == criteo ]] && steps=$CRITEO_STEPS
  for workers in 1 2; do
    for shards in 1 2; do
      for mode in $MODES; do
        out="$work/$job-$workers-$shards-$mode"
        failed=0
        for run in $(seq "$REPEAT"); do
          if ! "$BUILD_DIR/bin/recps" local --job="examples/$job.textproto" \
              --workers="$workers" --shards="$shards" --consistency="$mode" --staleness=1 \
              --steps="$steps" --result_dir="$out/run$run" --work_dir="$out/work$run" \
              ${INSECURE:+--insecure} \
              >"$out.log" 2>&1; then
            echo "| $job | $workers | $shards | $mode | failed: see below |"
            tail -5 "$out.log"
            failed=1
            break
          fi
        done
        [[ $failed == 0 ]] || continue
        /usr/bin/python3 - "$out" "$job" "$workers" "$shards" "$mode" <<'PY'
import glob, json, sys
out, job, w, s, mode = sys.argv[1:]
def load(run):
    return [json.load(open(p)) for p in sorted(glob.glob(run + "/result*.json"))]
def samples_per_second(rs):
    return sum(r["samples"] / max(r["seconds"] - r["times"].get("eval", 0), 1e-9) for r in rs)
rs = max((load(run) for run in sorted(glob.glob(out + "/run*"))), key=samples_per_second)
rate = samples_per_second(rs)
def ms(*keys):
    return sum(1e3 * sum(r["times"].get(k, 0) for k in keys) / r["steps"] for r in rs) / len(rs)
loss = sum(r["last_loss"] for r in rs) / len(rs)
mode = {"bounded": "bounded-1"}.get(mode, mode)
print(f'| {job:<7} | {w} | {s} | {mode:<9} | {rs[0]["steps"]:>5} | {rate:>9.0f} | '
      f'{ms("data"):6.2f} | {ms("lookup"):6.2f} | {ms("lookup_wait"):6.2f} | '
      f'{ms("forward", "backward", "optimizer"):7.2f} | {ms("push"):6.2f} | '
      f'{ms("allreduce"):9.2f} | {loss:9.4f} |')
PY
      done
    done
  done
done
