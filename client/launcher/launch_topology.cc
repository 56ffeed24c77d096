#include "client/launcher/launch_topology.h"

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace recps::client {
namespace {

// nullopt when unset or empty; INVALID_ARGUMENT when not a number >= 0.
absl::StatusOr<std::optional<int>> EnvInt(const GetEnv& getenv, const char* name) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return std::optional<int>();
  int value = 0;
  if (!absl::SimpleAtoi(v, &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", v,
                     "' is not a non-negative integer"));
  }
  return std::optional<int>(value);
}

}  // namespace

absl::StatusOr<LaunchTopology> ResolveLaunchTopology(const LaunchFlags& flags,
                                                     const GetEnv& getenv) {
  ASSIGN_OR_RETURN(std::optional<int> slurm_nodeid, EnvInt(getenv, "SLURM_NODEID"));
  ASSIGN_OR_RETURN(std::optional<int> slurm_nnodes, EnvInt(getenv, "SLURM_NNODES"));
  ASSIGN_OR_RETURN(std::optional<int> slurm_ntasks, EnvInt(getenv, "SLURM_NTASKS"));
  ASSIGN_OR_RETURN(std::optional<int> slurm_procid, EnvInt(getenv, "SLURM_PROCID"));
  ASSIGN_OR_RETURN(std::optional<int> slurm_localid, EnvInt(getenv, "SLURM_LOCALID"));
  ASSIGN_OR_RETURN(std::optional<int> k8s_index, EnvInt(getenv, "JOB_COMPLETION_INDEX"));

  LaunchTopology t;
  // SLURM with one task per worker: this launcher is one of several on the
  // node and starts exactly its own task's worker.
  if (flags.nproc_per_node < 0 && flags.node_rank < 0 && slurm_procid && slurm_ntasks &&
      slurm_nnodes && *slurm_ntasks > *slurm_nnodes) {
    if (*slurm_procid >= *slurm_ntasks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SLURM_PROCID ", *slurm_procid, " is outside [0, SLURM_NTASKS ",
          *slurm_ntasks, ")"));
    }
    if (*slurm_ntasks % *slurm_nnodes != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SLURM_NTASKS ", *slurm_ntasks, " is not a multiple of SLURM_NNODES ",
          *slurm_nnodes, ": give every node the same number of tasks"));
    }
    t.world_size = *slurm_ntasks;
    t.nnodes = *slurm_nnodes;
    t.local_world_size = *slurm_ntasks / *slurm_nnodes;
    t.node_rank = slurm_nodeid.value_or(*slurm_procid / t.local_world_size);
    const int local = slurm_localid.value_or(*slurm_procid % t.local_world_size);
    t.workers.push_back({*slurm_procid, local});
    t.source = "SLURM_PROCID (one task per worker)";
    return t;
  }

  t.local_world_size = flags.nproc_per_node >= 0 ? flags.nproc_per_node : 1;
  if (t.local_world_size < 1) {
    return absl::InvalidArgumentError("--nproc_per_node must be >= 1");
  }
  if (flags.nnodes >= 0) {
    t.nnodes = flags.nnodes;
  } else if (slurm_nnodes) {
    t.nnodes = *slurm_nnodes;
  }
  if (t.nnodes < 1) return absl::InvalidArgumentError("--nnodes must be >= 1");
  if (flags.node_rank >= 0) {
    t.node_rank = flags.node_rank;
    t.source = "--node_rank";
  } else if (slurm_nodeid) {
    t.node_rank = *slurm_nodeid;
    t.source = "SLURM_NODEID";
  } else if (k8s_index) {
    t.node_rank = *k8s_index;
    t.source = "JOB_COMPLETION_INDEX";
  } else if (t.nnodes == 1) {
    t.node_rank = 0;
    t.source = "default";
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nnodes ", t.nnodes, " needs this node's rank: give --node_rank, or run "
        "under SLURM (SLURM_NODEID) or as a Kubernetes indexed Job "
        "(JOB_COMPLETION_INDEX)"));
  }
  if (t.node_rank >= t.nnodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node rank ", t.node_rank, " (from ", t.source, ") is outside [0, nnodes ",
        t.nnodes, ")"));
  }
  t.world_size = t.nnodes * t.local_world_size;
  for (int local = 0; local < t.local_world_size; ++local) {
    t.workers.push_back({t.node_rank * t.local_world_size + local, local});
  }
  return t;
}

GpuAssignment AssignGpu(const std::vector<std::string>& gpus, int local_rank) {
  GpuAssignment a;
  if (gpus.empty() || local_rank < 0) {
    a.where = "CPU";
    return a;
  }
  const std::string& gpu = gpus[static_cast<size_t>(local_rank) % gpus.size()];
  a.env.push_back("CUDA_VISIBLE_DEVICES=" + gpu);
  a.args.push_back("--device=cuda:0");
  a.where = "GPU " + gpu;
  return a;
}

std::vector<std::string> ParseGpuList(const std::string& flag) {
  if (flag == "none") return {};
  if (flag != "auto") return absl::StrSplit(flag, ',', absl::SkipEmpty());
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr && *v != '\0') {
    return absl::StrSplit(v, ',', absl::SkipEmpty());
  }
  // std::filesystem: device nodes, not files the seam reads or writes.
  std::vector<std::string> gpus;
  for (int i = 0; std::filesystem::exists(absl::StrCat("/dev/nvidia", i)); ++i) {
    gpus.push_back(absl::StrCat(i));
  }
  return gpus;
}

}  // namespace recps::client
