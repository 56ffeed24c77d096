// Which workers `recps launch` starts on this node, and with which ranks:
// from its flags, else from the scheduler's environment (SLURM, a
// Kubernetes indexed Job). A plain function of flags and environment, so
// it is tested without starting anything.
#ifndef RECPS_CLIENT_LAUNCHER_LAUNCH_TOPOLOGY_H_
#define RECPS_CLIENT_LAUNCHER_LAUNCH_TOPOLOGY_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recps::client {

// -1: not given (take it from the environment or the default).
struct LaunchFlags {
  int nproc_per_node = -1;
  int nnodes = -1;
  int node_rank = -1;
};

struct LaunchedWorker {
  int rank = 0;        // RANK: 0 .. world_size - 1
  int local_rank = 0;  // LOCAL_RANK: index on this node (picks the GPU)
};

struct LaunchTopology {
  int world_size = 1;        // WORLD_SIZE
  int local_world_size = 1;  // LOCAL_WORLD_SIZE: workers per node
  int nnodes = 1;
  int node_rank = 0;
  std::vector<LaunchedWorker> workers;  // the ones this launcher starts
  // Where the node rank came from, for the start-up log: "--node_rank",
  // "SLURM_NODEID", "SLURM_PROCID (one task per worker)",
  // "JOB_COMPLETION_INDEX" or "default".
  std::string source;
};

// Returns the environment variable's value, or null when unset.
using GetEnv = std::function<const char*(const char*)>;

// Flags win over the environment. Without --node_rank the node rank is
// SLURM_NODEID (with SLURM_NNODES as --nnodes) or a Kubernetes indexed
// Job's JOB_COMPLETION_INDEX. When SLURM started one task per worker
// (SLURM_NTASKS > SLURM_NNODES) and --nproc_per_node is not given, this
// launcher starts just its task's worker: RANK = SLURM_PROCID, LOCAL_RANK =
// SLURM_LOCALID, WORLD_SIZE = SLURM_NTASKS. INVALID_ARGUMENT for values out
// of range, a malformed variable, or several nodes without a node rank.
absl::StatusOr<LaunchTopology> ResolveLaunchTopology(const LaunchFlags& flags,
                                                     const GetEnv& getenv);

// What local rank `local_rank` gets of `gpus` (the --gpus list, reused
// round-robin when shorter): CUDA_VISIBLE_DEVICES=<its GPU> and
// --device=cuda:0 (the one GPU it then sees), so the worker trains on it and
// allreduces with NCCL. Empty `gpus`: CPU workers, nothing added.
struct GpuAssignment {
  std::vector<std::string> env;   // NAME=value
  std::vector<std::string> args;  // worker flags, before the user's (last wins)
  std::string where;              // "GPU <id>" or "CPU", for the log
};
GpuAssignment AssignGpu(const std::vector<std::string>& gpus, int local_rank);

// The GPUs a --gpus value names, one per local rank: a list such as 0,1,2,3;
// "none" (CPU workers); or "auto": the inherited CUDA_VISIBLE_DEVICES, else
// every /dev/nvidiaN. Empty: CPU workers.
std::vector<std::string> ParseGpuList(const std::string& flag);

}  // namespace recps::client

#endif  // RECPS_CLIENT_LAUNCHER_LAUNCH_TOPOLOGY_H_
