#!/usr/bin/env bash
# Samples/s of training with the step time split into data, lookup, forward,
# backward, push, allreduce and optimizer (ms/step, rank 0's; lk_wait: waiting
# for an overlapped lookup; prefetch: sync mode's read of the next step beside
# the step, not part of its time), next to an
# anchor measured in the same run (memcpy GB/s of 256 MiB), since a shared
# machine is noisy: compare x_memcpy = (samples/s) / (memcpy GB/s) across runs.
#
#   bench/worker_bench.sh [STEPS] [CONFIG...]
#     default: 300 steps of examples/small.textproto and examples/criteo.textproto
#   WORKERS=2 SHARDS=2 bench/worker_bench.sh 20 bench/configs/s_p1_w2.textproto
#     W > 1 or S > 1 runs through `recps local` (coordinator, Gloo allreduce).
#   BIN_DIR=/path/to/bin   binaries to run (default build/bin), e.g. an old
#     build to interleave before/after runs.
#   SYNC_PREFETCH=0|1      passes --sync_prefetch to the workers (if set; default
#     auto: off with an embedded shard, on otherwise).
#   IN_PROCESS=1           each worker embeds its shard server and reaches it
#     without gRPC (W1: recps-worker --embedded_shard alone; W > 1: recps
#     local --in_process, S = W). Default 0: separate recps-shard processes.
#   ONE_PROCESS=1          with IN_PROCESS=1 and W > 1: every worker a thread of
#     one process around one embedded shard server (recps local --one_process).
#   TLS=1                  the same over mutual TLS (default plaintext).
#   REPLICATION=N          recps local --replication (copies of each row;
#     needs SHARDS >= N separate shard servers).
#   SHARDING=planned|even  recps local --sharding (default: recps local's,
#     planned): how the coordinator places the tables.
#   WORKER_FLAGS="..."     more recps-worker flags (e.g. --threads=2; after
#     `recps local`'s own, so they win).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN_DIR=${BIN_DIR:-${BUILD_DIR:-build}/bin}
STEPS=${1:-300}
shift || true
CONFIGS=("$@")
[[ ${#CONFIGS[@]} -gt 0 ]] || CONFIGS=(examples/small.textproto examples/criteo.textproto)
WORKERS=${WORKERS:-1}
SHARDS=${SHARDS:-1}
work=$(mktemp -d)
trap 'kill -TERM $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
extra=()
[[ -n ${SYNC_PREFETCH:-} ]] && extra+=("--sync_prefetch=$SYNC_PREFETCH")
# shellcheck disable=SC2206  # word splitting wanted: several flags
[[ -n ${WORKER_FLAGS:-} ]] && extra+=(${WORKER_FLAGS})
shard_tls=(--insecure)
worker_tls=(--insecure)
local_tls=(--insecure)
if [[ ${TLS:-0} == 1 ]]; then
  "$BIN_DIR/recpsctl" certs init "$work/certs" >/dev/null
  shard_tls=(--tls_ca="$work/certs/ca.crt" --tls_cert="$work/certs/shard.crt" --tls_key="$work/certs/shard.key")
  worker_tls=(--tls_ca="$work/certs/ca.crt" --tls_cert="$work/certs/worker.crt" --tls_key="$work/certs/worker.key")
  local_tls=()  # recps local makes its own certificates
fi

memcpy_gbps() {
  /usr/bin/python3 -c '
import time
b = bytearray(b"x" * (256 << 20)); c = bytearray(len(b)); m = memoryview(c); best = 1e9
for _ in range(5):
    t = time.perf_counter(); m[:] = b; best = min(best, time.perf_counter() - t)
print(f"{len(b) / best / 1e9:.2f}")'
}

local_extra=()
[[ ${ONE_PROCESS:-0} == 1 ]] && local_extra+=(--one_process)
[[ -n ${SHARDING:-} ]] && local_extra+=(--sharding="$SHARDING")
[[ -n ${REPLICATION:-} ]] && local_extra+=(--replication="$REPLICATION")
[[ ${IN_PROCESS:-0} == 1 ]] && SHARDS="$WORKERS(in-process)"
[[ ${ONE_PROCESS:-0} == 1 ]] && SHARDS="1(one-process)"
printf '%-10s W%s S%s %6s %5s %9s %7s %8s | %7s %7s %7s %7s %7s %7s %7s %7s %8s  (ms/step)\n' \
  job "$WORKERS" "$SHARDS" batch steps samples/s memcpy x_memcpy data lookup forward backward \
  push allred optim lk_wait prefetch
for config in "${CONFIGS[@]}"; do
  job=$(basename "$config" .textproto)
  anchor=$(memcpy_gbps)
  rm -rf "$work/out" && mkdir -p "$work/out"
  if [[ ${IN_PROCESS:-0} == 1 && $WORKERS == 1 ]]; then
    "$BIN_DIR/recps-worker" --config="$config" --embedded_shard \
      --steps="$STEPS" --result_json="$work/out/result0.json" "${extra[@]}" \
      "${worker_tls[@]}" 2>/dev/null
  elif [[ ${IN_PROCESS:-0} == 1 ]]; then
    "$BIN_DIR/recps" local --job="$config" --workers="$WORKERS" --in_process \
      "${local_extra[@]}" --steps="$STEPS" --bin_dir="$BIN_DIR" --work_dir="$work/local" \
      --result_dir="$work/out" "${local_tls[@]}" -- "${extra[@]}" >/dev/null 2>&1
  elif [[ $WORKERS == 1 && $SHARDS == 1 ]]; then
    rm -f "$work/ports"
    "$BIN_DIR/recps-shard" --job="$config" --standalone --world_size=1 \
      --port_file="$work/ports" "${shard_tls[@]}" 2>/dev/null &
    for _ in $(seq 100); do [[ -s $work/ports ]] && break; sleep 0.1; done
    port=$(cut -d' ' -f1 "$work/ports")
    "$BIN_DIR/recps-worker" --config="$config" --shards="127.0.0.1:$port" \
      --steps="$STEPS" --result_json="$work/out/result0.json" "${extra[@]}" \
      "${worker_tls[@]}" 2>/dev/null
    kill -TERM %1; wait %1 || true
  else
    "$BIN_DIR/recps" local --job="$config" --workers="$WORKERS" --shards="$SHARDS" \
      "${local_extra[@]}" --steps="$STEPS" --bin_dir="$BIN_DIR" --work_dir="$work/local" \
      --result_dir="$work/out" "${local_tls[@]}" -- "${extra[@]}" >/dev/null 2>&1
  fi
  /usr/bin/python3 - "$work/out" "$job" "$config" "$anchor" <<'PY'
import glob, json, re, sys
results = [json.load(open(p)) for p in sorted(glob.glob(sys.argv[1] + "/result*.json"))]
r = results[0]
batch = int(re.search(r"batch_size:\s*(\d+)", open(sys.argv[3]).read()).group(1))
# Global samples/s over the timed steps (after the warm-up, evaluations
# excluded: each worker's timed_samples_per_second, summed); binaries that
# predate it: every step.
if all("timed_samples_per_second" in x for x in results):
    rate = sum(x["timed_samples_per_second"] for x in results)
else:
    rate = batch * len(results) * len(r["step_seconds"]) / sum(r["step_seconds"])
t = {k: 1e3 * v / r["steps"] for k, v in r["times"].items()}
anchor = float(sys.argv[4])
print(f'{sys.argv[2]:<10} {"":5} {batch:>6} {r["steps"]:>5} {rate:>9.0f} {anchor:>7.2f} '
      f'{rate / anchor:>8.0f} | '
      f'{t["data"]:7.2f} {t["lookup"]:7.2f} {t["forward"]:7.2f} {t["backward"]:7.2f} '
      f'{t["push"]:7.2f} {t["allreduce"]:7.2f} {t["optimizer"]:7.2f} {t["lookup_wait"]:7.2f} '
      f'{t.get("prefetch", 0):8.2f}')
PY
done
