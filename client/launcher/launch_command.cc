// `recps launch`: start this node's workers of a cluster (docs/cluster.md).
#include "client/launcher/launch_command.h"

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/launcher/launch_topology.h"
#include "client/launcher/process.h"
#include "client/launcher/supervise.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/rpc/tls_flags.h"

// Defined in recps_main.cc, so that `recps --help` lists them.
ABSL_DECLARE_FLAG(std::string, bin_dir);
ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(std::string, gpus);
ABSL_DECLARE_FLAG(std::string, log_dir);
ABSL_DECLARE_FLAG(int, max_restarts);
ABSL_DECLARE_FLAG(int, nnodes);
ABSL_DECLARE_FLAG(int, node_rank);
ABSL_DECLARE_FLAG(int, nproc_per_node);
ABSL_DECLARE_FLAG(absl::Duration, stop_timeout);

namespace recps::client {
namespace {

}  // namespace

int RunLaunch(const std::vector<std::string>& positional,
              const std::vector<std::string>& worker_args, FileSystem* fs) {
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  if (coordinator.empty()) {
    LogError("recps launch needs --coordinator=host:port (the cluster's coordinator)");
    return 2;
  }
  if (positional.size() > 1) {
    LogError("recps launch takes at most one job config, got ", positional.size());
    return 2;
  }
  LaunchFlags flags;
  flags.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
  flags.nnodes = absl::GetFlag(FLAGS_nnodes);
  flags.node_rank = absl::GetFlag(FLAGS_node_rank);
  absl::StatusOr<LaunchTopology> topology =
      ResolveLaunchTopology(flags, [](const char* name) { return std::getenv(name); });
  if (!topology.ok()) {
    LogError(topology.status().message());
    return 2;
  }
  const std::string worker_bin = FindBinary("recps-worker", absl::GetFlag(FLAGS_bin_dir));
  if (worker_bin.empty()) {
    LogError("cannot find recps-worker; set --bin_dir");
    return 2;
  }
  const std::vector<std::string> gpus = ParseGpuList(absl::GetFlag(FLAGS_gpus));
  const int local_workers = static_cast<int>(topology->workers.size());
  if (!gpus.empty() && topology->local_world_size > static_cast<int>(gpus.size())) {
    LogWarning(topology->local_world_size, " workers per node share ", gpus.size(),
               " GPU(s)");
  }
  // CPU workers share the cores (their pools and OpenBLAS).
  const int threads = std::max(
      1, static_cast<int>(std::thread::hardware_concurrency()) / local_workers);
  LogInfo("node ", topology->node_rank, " of ", topology->nnodes, " (from ",
          topology->source, "): starting ", local_workers, " worker(s) of ",
          topology->world_size, ", coordinator ", coordinator,
          gpus.empty() ? ", no GPUs" : ", GPUs " + absl::StrJoin(gpus, ","));

  const int max_restarts = absl::GetFlag(FLAGS_max_restarts);
  if (max_restarts < 0) {
    LogError("--max_restarts=", max_restarts, ": must be >= 0");
    return 2;
  }
  // One start of this node's workers; they ask the coordinator where to
  // resume (GetResumeState).
  auto run_attempt = [&](std::string* failure) -> int {
  std::vector<ChildProcess> workers;
  std::vector<std::string> names;
  for (const LaunchedWorker& w : topology->workers) {
    std::vector<std::string> env = {
        absl::StrCat("RANK=", w.rank), absl::StrCat("LOCAL_RANK=", w.local_rank),
        absl::StrCat("WORLD_SIZE=", topology->world_size),
        absl::StrCat("LOCAL_WORLD_SIZE=", topology->local_world_size),
        absl::StrCat("GROUP_RANK=", topology->node_rank)};
    // Each local rank sees only its GPU and trains on it (--device=cuda:0).
    const GpuAssignment assigned = AssignGpu(gpus, w.local_rank);
    env.insert(env.end(), assigned.env.begin(), assigned.env.end());
    const std::string& where = assigned.where;
    if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) {
      env.push_back(absl::StrCat("OPENBLAS_NUM_THREADS=", threads));
    }
    std::vector<std::string> args = {"--coordinator=" + coordinator,
                                     absl::StrCat("--threads=", threads),
                                     w.rank == 0 ? "--progress_every=2s"
                                                 : "--progress_every=1000h"};
    if (!positional.empty()) args.push_back("--config=" + positional[0]);
    args.insert(args.end(), assigned.args.begin(), assigned.args.end());
    // The node's worker certificate (or --insecure) goes to every worker.
    const rpc::TlsFlagValues tls = rpc::GetTlsFlags();
    if (tls.insecure) args.push_back("--insecure");
    if (!tls.ca.empty()) args.push_back("--tls_ca=" + tls.ca);
    if (!tls.cert.empty()) args.push_back("--tls_cert=" + tls.cert);
    if (!tls.key.empty()) args.push_back("--tls_key=" + tls.key);
    args.insert(args.end(), worker_args.begin(), worker_args.end());  // last wins
    std::string log;
    if (const std::string dir = absl::GetFlag(FLAGS_log_dir); !dir.empty()) {
      // The child opens its log (after fork, outside the seam); the
      // directory is ours to make.
      if (absl::Status s = fs->CreateDirs(dir); !s.ok()) {
        LogError("--log_dir: ", s.message());
        return 1;  // the ones already started stop with `workers`
      }
      log = absl::StrCat(dir, "/worker", w.rank, ".log");
    }
    absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(worker_bin, args, log, env);
    if (!child.ok()) {
      LogError(child.status().message());
      return 1;  // the ones already started stop with `workers`
    }
    LogInfo("rank ", w.rank, " (local rank ", w.local_rank, ", ", where, "): pid ",
            child->pid(), log.empty() ? "" : ", log " + log);
    workers.push_back(*std::move(child));
    names.push_back(absl::StrCat("rank ", w.rank, " (local rank ", w.local_rank, ")"));
  }
  return Supervise(workers, names, nullptr, "the workers on this node", nullptr, failure,
                   max_restarts > 0 ? SIGKILL : SIGTERM, absl::GetFlag(FLAGS_stop_timeout));
  };
  int exit_code = 0;
  for (int attempt = 0;; ++attempt) {
    std::string failure;
    exit_code = run_attempt(&failure);
    if (exit_code != 1 || failure.empty()) break;
    if (attempt >= max_restarts) {
      if (max_restarts > 0) LogError("giving up after ", max_restarts, " restart(s): ", failure);
      break;
    }
    LogWarning("restart ", attempt + 1, "/", max_restarts, " after ", failure,
               ": restarting this node's workers; they resume where the coordinator says");
  }
  if (exit_code == kExitFinalCheckpointFailed) {
    LogError("the workers trained every step and wrote their results, but the final "
             "checkpoint failed (their error above says why); not restarted");
  }
  if (exit_code == kExitStoppedForPeer) {
    LogWarning("the workers stopped at a pre-emption checkpoint another node's rank asked "
               "for: start this node again (with the others) to resume from it");
  }
  if (exit_code == 0) LogInfo("all ", local_workers, " worker(s) finished");
  return exit_code;
}

}  // namespace recps::client
