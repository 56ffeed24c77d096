#!/usr/bin/env bash
# Checks that layers only point down (docs/architecture.md):
#   base (common/*) <- kernels <- config (common/config) ; wire (common/wire)
#   <- rpc (common/rpc) <- server/*, client/*, worker/
# by the #include lines of every source file against an allow-list
# (scripts/layering.py), and, given a build directory, that each binary
# links only the libraries of its own role.
#   scripts/check-layering.sh [BUILD_DIR]
# Prints every broken rule and exits 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-}
broken=0

# Every #include against the allow-list: each module lists the modules,
# exact headers and libraries it may include; anything unlisted fails
# (scripts/layering.py, the table in docs/architecture.md).
if ! python3 scripts/layering.py; then broken=1; fi

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
