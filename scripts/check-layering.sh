#!/usr/bin/env bash
# Checks that layers only point down (docs/architecture.md):
#   base (common/*) <- kernels <- config (common/config) ; wire (common/wire)
#   <- rpc (common/rpc) <- server/*, client/*, worker/
# by the #include lines of every source file, and, given a build directory,
# that each binary links only the libraries of its own role.
#   scripts/check-layering.sh [BUILD_DIR]
# Prints every broken rule and exits 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-}
broken=0

# includes DIR REGEX WHY: no file under DIR may include a quoted path
# matching REGEX.
forbid() {
  local where=$1 pattern=$2 why=$3 hits
  hits=$(grep -rnE --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' \
           "^#include \"($pattern)" $where 2>/dev/null || true)
  if [[ -n $hits ]]; then
    echo "layering: $why:"
    echo "$hits" | sed 's/^/  /'
    broken=1
  fi
}
# Top-level files of common/ only (the base library), not its subfolders.
base_files=$(find common -maxdepth 1 -type f \( -name '*.h' -o -name '*.cc' \))

forbid "$base_files" 'common/[a-z_]+/|kernels/|server/|client/|worker/|recps/v1/|google/protobuf/|grpcpp/|prometheus/|rocksdb/' \
  "the base library (common/*.h) includes only itself, abseil and the standard library"
forbid kernels 'common/[a-z_]+/|server/|client/|worker/|recps/v1/|google/protobuf/|grpcpp/|prometheus/|rocksdb/' \
  "kernels include only kernels/ and the base library"
forbid common/wire 'common/(config|rpc)/|kernels/|server/|client/|worker/|grpcpp/' \
  "the wire library includes only the base library and the protos"
forbid common/config 'common/(wire|rpc)/|server/|client/|worker/|grpcpp/' \
  "the config library includes only the base library, kernels' parameter types and the protos"
forbid common/rpc 'common/config/|kernels/|server/|client/|worker/' \
  "the RPC layer includes only the base and wire libraries and gRPC"
# recps-worker --embedded_shard runs a whole shard server in the worker
# (docs/architecture.md, "Embedded shard servers"): the binary's own files
# (worker_main.cc, embedded_shard.h/.cc) alone may include
# server/shard/shard_process.h (checked precisely below); the worker's
# libraries stay server-free.
worker_main_files='worker/worker_main.cc worker/embedded_shard.h worker/embedded_shard.cc'
worker_files=$(find worker -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) \
  | grep -vE '^worker/(worker_main\.cc|embedded_shard\.(h|cc))$')
forbid "$worker_files" 'server/|client/launcher/|client/admin/' \
  "the worker includes no server internals, launcher or admin CLI"
forbid "$worker_main_files" 'client/launcher/|client/admin/' \
  "the worker includes no launcher or admin CLI"
forbid server/shard 'server/coordinator/|server/planner/|worker/|client/launcher/|client/admin/' \
  "the shard server includes no coordinator, planner, worker, launcher or admin code"
forbid server/checkpoint 'server/coordinator/|server/planner/|worker/|client/' \
  "checkpoint storage uses the store's interface only, no daemon internals"
# The checkpoint format library (every file but the store-facing ones)
# links no store: the coordinator and recpsctl use it.
checkpoint_store_files='server/checkpoint/(checkpoint|store_rows)\.h'
checkpoint_format_files=$(find server/checkpoint -type f \( -name '*.h' -o -name '*.cc' \) \
  | grep -vE 'server/checkpoint/(checkpoint|store_rows)\.(h|cc)$')
forbid "$checkpoint_format_files" "server/shard/|$checkpoint_store_files|kernels/" \
  "the checkpoint format library reads and writes files only, without the store"
forbid "server/coordinator client" "$checkpoint_store_files" \
  "the coordinator and the clients use the checkpoint format headers only (no store)"
forbid server/coordinator 'server/shard/|worker/|client/' \
  "the coordinator reaches shard servers through the protos only"
forbid server/planner 'server/coordinator/|worker/|client/' \
  "the planner sees the store only through server/shard/store_footprint.h"
forbid client 'server/(shard|coordinator)/|worker/' \
  "client code includes no server or worker internals"
forbid client/launcher 'server/|client/admin/' \
  "the launcher starts the daemons as processes and links none of them"

# grep -E has no look-ahead: the planner rule above would refuse
# store_footprint.h too; check it precisely here instead.
planner_hits=$(grep -rnE '^#include "server/shard/' server/planner | grep -v 'server/shard/store_footprint.h' || true)
# shellcheck disable=SC2086
worker_main_hits=$(grep -nE '^#include "server/' $worker_main_files | grep -v 'server/shard/shard_process.h' || true)
if [[ -n $worker_main_hits ]]; then
  echo "layering: recps-worker's main includes server code other than server/shard/shard_process.h:"
  echo "$worker_main_hits" | sed 's/^/  /'
  broken=1
fi
if [[ -n $planner_hits ]]; then
  echo "layering: the planner includes store internals:"; echo "$planner_hits" | sed 's/^/  /'
  broken=1
fi

if [[ -n $build_dir ]]; then
  # links BINARY_LINK_TXT FORBIDDEN_LIB...: the binary's link line names none.
  links() {
    local link_txt=$build_dir/$1; shift
    if [[ ! -f $link_txt ]]; then
      echo "layering: $link_txt missing (is $build_dir a recps build?)"; broken=1; return
    fi
    for lib in "$@"; do
      if grep -qE "(^| |/)lib$lib\.(a|so)( |$)" "$link_txt"; then
        echo "layering: $(dirname "$1") links lib$lib, which it does not use"
        broken=1
      fi
    done
  }
  # recps-worker links the shard server (recps_shard_process, recps_server,
  # recps_server_store) for --embedded_shard; nothing of the coordinator's.
  links worker/CMakeFiles/recps-worker.dir/link.txt recps_coordinator recps_planner recps_launcher recps_admin
  links client/launcher/CMakeFiles/recps.dir/link.txt recps_worker recps_server recps_server_store recps_coordinator recps_client
  links client/admin/CMakeFiles/recpsctl.dir/link.txt recps_worker recps_server recps_server_store recps_coordinator recps_checkpoint
  links server/shard/CMakeFiles/recps-shard.dir/link.txt recps_worker recps_coordinator recps_planner recps_admin
  links server/coordinator/CMakeFiles/recps-coordinator.dir/link.txt recps_worker recps_server recps_server_store recps_admin recps_checkpoint
  # The kernels' own tests link no protobuf or gRPC.
  links tests/CMakeFiles/recps_kernels_test.dir/link.txt recps_proto protobuf grpc++
fi

if [[ $broken == 0 ]]; then echo "layering: all rules hold"; fi
exit $broken
