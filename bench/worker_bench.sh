#!/usr/bin/env bash
# Samples/s of one worker against one shard server, on the small example and
# the Criteo-sized one (synthetic data), with the step time split into data,
# lookup, forward, backward, push and optimizer.
#   bench/worker_bench.sh [STEPS]   (default 300 steps each)
#   TLS=1 bench/worker_bench.sh     the same over mutual TLS (default plaintext)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
STEPS=${1:-300}
work=$(mktemp -d)
trap 'kill -TERM $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
shard_tls=(--insecure)
worker_tls=(--insecure)
if [[ ${TLS:-0} == 1 ]]; then
  "$BUILD_DIR/bin/recpsctl" certs init "$work/certs" >/dev/null
  shard_tls=(--tls_ca="$work/certs/ca.crt" --tls_cert="$work/certs/shard.crt" --tls_key="$work/certs/shard.key")
  worker_tls=(--tls_ca="$work/certs/ca.crt" --tls_cert="$work/certs/worker.crt" --tls_key="$work/certs/worker.key")
fi

printf '%-14s %6s %8s %11s | %8s %8s %8s %8s %8s %8s  (ms/step)\n' \
  job batch steps samples/s data lookup forward backward push optim
for job in small criteo; do
  config=examples/$job.textproto
  rm -f "$work/ports"
  "$BUILD_DIR/bin/recps-shard" --job="$config" --standalone --world_size=1 \
    --port_file="$work/ports" "${shard_tls[@]}" 2>/dev/null &
  for _ in $(seq 100); do [[ -s $work/ports ]] && break; sleep 0.1; done
  port=$(cut -d' ' -f1 "$work/ports")
  "$BUILD_DIR/bin/recps-worker" --config="$config" --shards="127.0.0.1:$port" \
    --steps="$STEPS" --result_json="$work/$job.json" "${worker_tls[@]}" 2>/dev/null
  kill -TERM %1; wait %1 || true
  /usr/bin/python3 - "$work/$job.json" "$job" "$config" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1]))
batch = re.search(r"batch_size:\s*(\d+)", open(sys.argv[3]).read()).group(1)
t = {k: 1e3 * v / r["steps"] for k, v in r["times"].items()}
print(f'{sys.argv[2]:<14} {batch:>6} {r["steps"]:>8} {r["samples_per_second"]:>11.0f} | '
      f'{t["data"]:8.2f} {t["lookup"]:8.2f} {t["forward"]:8.2f} {t["backward"]:8.2f} '
      f'{t["push"]:8.2f} {t["optimizer"]:8.2f}')
PY
done
