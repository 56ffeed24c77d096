#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs `recps local`: a
# coordinator, 2 shard servers and 2 workers on 127.0.0.1 training the small
# example DLRM (examples/small.textproto, synthetic data, sync mode).
# Arguments go to `recps local`, e.g. --workers=1 --shards=3 --job=FILE.
# (scripts/run-bench.sh runs the benchmarks.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec "${BUILD_DIR:-build}/bin/recps" local "$@"
