// recps: the launcher.
//
//   recps local [--job=FILE] [--shards=2] [--workers=2] [--consistency=sync]
//               [--in_process [--one_process]] [-- WORKER FLAGS]
//
//   recps launch --coordinator=HOST:PORT --nproc_per_node=N [--nnodes=M
//                --node_rank=R] [CONFIG] [-- WORKER FLAGS]
//
// `local` starts a coordinator, S shard servers and W workers as processes on
// 127.0.0.1 (ports picked by the OS), trains the job, shows one progress view
// (rank 0's progress and every worker's evaluations; the servers log to files
// in the work directory), and stops everything at the end or on Ctrl-C. A
// coordinator that dies is restarted on its port with its state (up to
// --coordinator_restarts times); a shard server that dies stops the run,
// named by index and address. WORK/pids lists every child's pid; the last
// line gives rank 0's final held-out AUC. With --in_process no shard server
// processes are started: each worker embeds one (recps-worker
// --embedded_shard), shards = workers, and a worker's death is its shard's;
// with --one_process too, one worker process runs every rank as a thread
// around one embedded shard server (recps-worker --local_ranks).
// With no flags it trains examples/small.textproto with 2 shards and 2
// workers in sync mode. `--resume` restores the newest complete checkpoint of
// training.checkpoint.dir; `--max_restarts=N` restarts the whole job from it
// when a process dies (docs/operations.md).
//
// `launch` starts this node's workers of a cluster whose coordinator and
// shard servers run elsewhere, like torchrun: RANK, LOCAL_RANK, WORLD_SIZE
// and LOCAL_WORLD_SIZE set, one GPU each; it forwards SIGINT/SIGTERM and
// fails (stopping the rest) naming the first rank that failed.
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "absl/time/time.h"
#include "client/launcher/launch_command.h"
#include "client/launcher/launch_topology.h"
#include "client/launcher/local_cluster.h"
#include "common/flags_usage.h"
#include "common/log.h"
#include "common/stop_signals.h"
#include "common/rpc/tls_flags.h"

ABSL_FLAG(std::string, job, "",
          "job config (text-format recps.v1.JobConfig); default: "
          "examples/small.textproto");
ABSL_FLAG(int, shards, 0,
          "shard servers to start (0: 2, or with --in_process one per worker)");
ABSL_FLAG(int, replication, 0,
          "local: copies of every embedding row (0: the job's `replication`, "
          "else 1); each slot's primary and replication - 1 backups are "
          "different shard servers, so it needs separate shard servers, at "
          "least this many (docs/replication.md)");
ABSL_FLAG(bool, in_process, false,
          "local: no shard server processes; each worker embeds one "
          "(recps-worker --embedded_shard) and reaches its own without gRPC, "
          "the other workers' over gRPC; shards = workers. A worker that "
          "dies takes its rows with it: the run stops (or restarts from the "
          "last checkpoint with --max_restarts)");
ABSL_FLAG(bool, one_process, false,
          "local, with --in_process: all workers run as threads of one "
          "recps-worker process (--local_ranks) around one embedded shard "
          "server, so that no row crosses gRPC (shards = 1); the workers' "
          "ranks, batches, allreduce and synchronous step are those of "
          "separate processes");
ABSL_FLAG(int, workers, 2, "workers to start (data parallel, Gloo allreduce)");
ABSL_FLAG(std::string, sync_prefetch, "auto",
          "local: the workers' --sync_prefetch (auto: off, since the shard "
          "servers run on this machine's cores)");
ABSL_FLAG(std::string, sharding, "planned",
          "local: how the coordinator places the tables on the shard servers: "
          "planned (the sharding planner, from each server's memory and "
          "device; docs/planner.md) or even (every table row-wise over every "
          "server)");
ABSL_FLAG(std::string, shard_device, "cpu",
          "local: where the shard servers keep their rows (recps-shard "
          "--device): cpu, or cuda:N for the GPU store (docs/gpu.md); the "
          "workers' device is a worker flag (-- --device=cuda:N)");
ABSL_FLAG(std::string, consistency, "",
          "override the job's consistency: sync, bounded or async");
ABSL_FLAG(int, staleness, 1, "steps of staleness with --consistency=bounded");
ABSL_FLAG(int64_t, steps, 0, "override the job's training.steps (0: keep)");
ABSL_FLAG(std::string, bin_dir, "",
          "where recps-coordinator, recps-shard and recps-worker are (default: "
          "next to this binary, or the build tree's server/ and worker/)");
ABSL_FLAG(std::string, work_dir, "",
          "directory for logs, the coordinator's state and the job copy "
          "(default: a new /tmp/recps-local-* directory)");
ABSL_FLAG(std::string, result_dir, "",
          "local: each worker writes its --result_json to DIR/result<rank>.json "
          "(samples/s, per-phase step times, evaluations)");
ABSL_FLAG(int, coordinator_restarts, 3,
          "local: how often the coordinator is restarted (same port, same "
          "state) when it dies, before the run fails");
ABSL_FLAG(bool, resume, false,
          "local: resume the job from the newest complete checkpoint in its "
          "training.checkpoint.dir (the coordinator restores it with "
          "--restore); from scratch when there is none");
ABSL_FLAG(int, max_restarts, 0,
          "local and launch (as torchrun's): when a process of the job dies, "
          "stop the rest and restart the whole job from the newest complete "
          "checkpoint (from scratch without one), at most this many times; "
          "then fail with the last failure");
ABSL_FLAG(absl::Duration, stop_timeout, absl::Seconds(120),
          "after SIGTERM/SIGINT: how long workers of a job with checkpoints "
          "get to take their final checkpoint and exit before they are "
          "killed (10 s without checkpoints)");
ABSL_FLAG(std::string, coordinator, "",
          "launch: the cluster's coordinator, host:port (required)");
ABSL_FLAG(int, nproc_per_node, -1,
          "launch: workers to start on this node (default 1; or one per SLURM "
          "task, see docs/cluster.md)");
ABSL_FLAG(int, nnodes, -1, "launch: nodes in the job (default: $SLURM_NNODES, else 1)");
ABSL_FLAG(int, node_rank, -1,
          "launch: this node's index (default: $SLURM_NODEID, else "
          "$JOB_COMPLETION_INDEX, else 0 with one node)");
ABSL_FLAG(std::string, gpus, "auto",
          "GPUs for the workers, one each (CUDA_VISIBLE_DEVICES=its GPU, "
          "--device=cuda:0): auto (the inherited CUDA_VISIBLE_DEVICES, else "
          "every /dev/nvidiaN), none, or a list such as 0,1,2,3. launch: "
          "default auto, for the local ranks. local: CPU workers unless given; "
          "then one worker per GPU unless --workers is given too");
ABSL_FLAG(std::string, log_dir, "",
          "launch: write each worker's output to DIR/worker<rank>.log (default: "
          "this terminal)");
ABSL_FLAG(absl::Duration, start_timeout, absl::Seconds(60),
          "how long servers may take to start");

namespace recps::client {
namespace {

// Whether --`name` (or --no`name`, a boolean flag's "false") is on the
// command line, argv[1..argc) before "--". abseil's IsSpecifiedOnCommandLine
// is private in Debian's abseil, and comparing with the default would miss
// a value given equal to it.
bool OnCommandLine(absl::string_view name, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (!absl::ConsumePrefix(&a, "--") && !absl::ConsumePrefix(&a, "-")) continue;
    a = a.substr(0, a.find('='));
    if (a == name || (absl::StartsWith(a, "no") && a.substr(2) == name)) return true;
  }
  return false;
}

// The first flag on the command line (argv[1..argc), before "--") that
// `command` ("local" or "launch") does not read, or "".
std::string FlagOfTheOtherCommand(const std::string& command, int argc, char** argv) {
  static constexpr const char* kLocalOnly[] = {
      "job",         "shards",        "in_process", "one_process",
      "workers",     "sync_prefetch", "shard_device", "sharding", "consistency",
      "staleness",   "steps",         "work_dir",   "result_dir",
      "coordinator_restarts", "resume", "start_timeout", "replication"};
  static constexpr const char* kLaunchOnly[] = {"coordinator", "nproc_per_node", "nnodes",
                                                "node_rank", "log_dir"};
  absl::Span<const char* const> others;
  if (command == "launch") others = kLocalOnly;
  if (command == "local") others = kLaunchOnly;
  for (const char* name : others) {
    if (OnCommandLine(name, argc, argv)) return name;
  }
  return "";
}

// `recps local`'s flags, as RunLocal takes them (it checks them).
LocalClusterOptions LocalOptionsFromFlags(std::vector<std::string> worker_args, int argc,
                                          char** argv) {
  LocalClusterOptions o;
  o.job = absl::GetFlag(FLAGS_job);
  o.shards = absl::GetFlag(FLAGS_shards);
  o.replication = absl::GetFlag(FLAGS_replication);
  o.workers = absl::GetFlag(FLAGS_workers);
  // CPU workers unless --gpus is given (launch's default, auto, would turn
  // every local run on a GPU machine into a GPU run); one worker per GPU
  // unless --workers is given too.
  if (OnCommandLine("gpus", argc, argv)) {
    o.gpus = ParseGpuList(absl::GetFlag(FLAGS_gpus));
    if (!o.gpus.empty() && !OnCommandLine("workers", argc, argv)) {
      o.workers = static_cast<int>(o.gpus.size());
    }
  }
  o.in_process = absl::GetFlag(FLAGS_in_process);
  o.one_process = absl::GetFlag(FLAGS_one_process);
  o.sync_prefetch = absl::GetFlag(FLAGS_sync_prefetch);
  o.shard_device = absl::GetFlag(FLAGS_shard_device);
  o.sharding = absl::GetFlag(FLAGS_sharding);
  o.consistency = absl::GetFlag(FLAGS_consistency);
  o.staleness = absl::GetFlag(FLAGS_staleness);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  o.result_dir = absl::GetFlag(FLAGS_result_dir);
  o.coordinator_restarts = absl::GetFlag(FLAGS_coordinator_restarts);
  o.resume = absl::GetFlag(FLAGS_resume);
  o.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  o.stop_timeout = absl::GetFlag(FLAGS_stop_timeout);
  o.start_timeout = absl::GetFlag(FLAGS_start_timeout);
  o.tls = rpc::GetTlsFlags();
  o.worker_args = std::move(worker_args);
  return o;
}

// absl flags are spelled with '_'; accept torchrun's '-' spelling too
// (--nproc-per-node). Stops at "--": what follows goes to the workers.
void NormalizeFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* a = argv[i];
    if (std::strcmp(a, "--") == 0) return;
    if (a[0] != '-' || a[1] != '-') continue;
    for (char* c = a + 2; *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
}

}  // namespace
}  // namespace recps::client

int main(int argc, char** argv) {
  recps::SetFlagsUsageFromMainFile(__FILE__);
  absl::SetProgramUsageMessage(
      "recps launcher.\n"
      "  recps local [--job=FILE] [--shards=N] [--workers=N] [--gpus=0,1,..] "
      "[--in_process [--one_process]] "
      "[--insecure] "
      "[--consistency=sync|bounded|async] [--steps=N] [--resume] [--max_restarts=N] "
      "[-- WORKER FLAGS]\n"
      "    start a coordinator, shard servers and workers on 127.0.0.1 and "
      "train the job (default: examples/small.textproto, 2 shards, 2 workers, "
      "sync)\n"
      "  recps launch --coordinator=HOST:PORT [--nproc_per_node=N] [--nnodes=M "
      "--node_rank=R] [--gpus=auto|none|0,1,..] [--max_restarts=N] [CONFIG] "
      "[-- WORKER FLAGS]\n"
      "    start this node's workers of a cluster (RANK, LOCAL_RANK, WORLD_SIZE, "
      "LOCAL_WORLD_SIZE set; node rank also from SLURM or JOB_COMPLETION_INDEX)");
  // Signals are taken with sigtimedwait; block them before any thread starts.
  recps::BlockStopSignals();
  // Everything after "--" is for the workers (recps launch).
  std::vector<std::string> worker_args;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") != 0) continue;
    worker_args.assign(argv + i + 1, argv + argc);
    argc = i;
    break;
  }
  recps::client::NormalizeFlagNames(argc, argv);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  recps::SetLogTag("recps");
  const std::string command = args.size() >= 2 ? args[1] : "";
  // A flag of the other command would be silently ignored (`recps launch
  // --steps=100` ran the job's full length): refuse it, naming it.
  if (const std::string wrong = recps::client::FlagOfTheOtherCommand(command, argc, argv);
      !wrong.empty()) {
    std::fprintf(stderr, "recps %s: --%s is a flag of recps %s only; it would be ignored\n",
                 command.c_str(), wrong.c_str(), command == "local" ? "launch" : "local");
    return 2;
  }
  if (command == "local" && args.size() == 2) {
    return recps::client::RunLocal(
        recps::client::LocalOptionsFromFlags(worker_args, argc, argv));
  }
  if (command == "launch") {
    return recps::client::RunLaunch(std::vector<std::string>(args.begin() + 2, args.end()),
                                    worker_args);
  }
  std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
  return 2;
}
