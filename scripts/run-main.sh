#!/usr/bin/env bash
# The main job: installs dependencies, builds, and trains the small example
# DLRM (examples/small.textproto, synthetic data) with one shard server and
# one worker on 127.0.0.1. Pass another job config as the first argument.
# (scripts/run-bench.sh runs the benchmarks.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
JOB=${1:-examples/small.textproto}

work=$(mktemp -d)
shard_pid=""
cleanup() {
  if [[ -n $shard_pid ]]; then kill -TERM "$shard_pid" 2>/dev/null || true; wait "$shard_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

"$BUILD_DIR/server/recps-shard" --job="$JOB" --standalone --world_size=1 \
  --listen=127.0.0.1:0 --port_file="$work/ports" &
shard_pid=$!
for _ in $(seq 100); do [[ -s $work/ports ]] && break; sleep 0.1; done
[[ -s $work/ports ]] || { echo "shard server did not start" >&2; exit 1; }
port=$(cut -d' ' -f1 "$work/ports")
"$BUILD_DIR/worker/recps-worker" --config="$JOB" --shards="127.0.0.1:$port" \
  --rank=0 --world_size=1
