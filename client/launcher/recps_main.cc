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
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/launcher/launch_command.h"
#include "client/launcher/process.h"
#include "client/launcher/supervise.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/rpc/channels.h"
#include "common/rpc/identity.h"
#include "common/rpc/tls_flags.h"
#include "common/security/certs.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "common/config/job_config.h"
#include "common/flags_usage.h"

ABSL_FLAG(std::string, job, "",
          "job config (text-format recps.v1.JobConfig); default: "
          "examples/small.textproto");
ABSL_FLAG(int, shards, 0,
          "shard servers to start (0: 2, or with --in_process one per worker)");
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
          "local: the workers' --sync_prefetch (auto: the worker's own "
          "default, off with --in_process)");
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
          "launch: GPUs for the local ranks (CUDA_VISIBLE_DEVICES=one each): "
          "auto (the inherited CUDA_VISIBLE_DEVICES, else every /dev/nvidiaN), "
          "none, or a list such as 0,1,2,3");
ABSL_FLAG(std::string, log_dir, "",
          "launch: write each worker's output to DIR/worker<rank>.log (default: "
          "this terminal)");
ABSL_FLAG(absl::Duration, start_timeout, absl::Seconds(60),
          "how long servers may take to start");

namespace recps::client {
namespace {

std::string DefaultJob() {
  for (const std::string& p :
       {std::string("examples/small.textproto"),
        SelfDirectory() + "/../../examples/small.textproto"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "examples/small.textproto";
}

// Waits until `server` has a shard map (the coordinator pushes it once every
// shard has registered).
absl::Status WaitForShardMap(const std::string& server) {
  auto stub = v1::ShardAdmin::NewStub(
      rpc::MakeChannel(server, rpc::ChannelKind::kControl));
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_start_timeout);
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(absl::Seconds(2), &ctx);
    v1::GetShardMapRequest req;
    v1::ShardMap map;
    if (stub->GetShardMap(&ctx, req, &map).ok() && map.epoch() > 0) {
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "shard server ", server, " received no shard map from the coordinator"));
}

// ": held-out AUC 0.7803, log loss 0.4721 after step 600 (rank 0)" from a
// worker's --result_json (its last evaluation), or "" without one.
std::string FinalEvaluation(const std::string& result_json) {
  std::ifstream in(result_json);
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
  const size_t auc = json.rfind("\"auc\":");
  const size_t step = json.rfind("\"step\":", auc);
  const size_t log_loss = json.find("\"log_loss\":", auc);
  if (auc == std::string::npos || step == std::string::npos ||
      log_loss == std::string::npos) {
    return "";
  }
  return absl::StrFormat(": held-out AUC %.4f, log loss %.4f after step %d (rank 0)",
                         std::atof(json.c_str() + auc + 6),
                         std::atof(json.c_str() + log_loss + 11),
                         std::atoll(json.c_str() + step + 7));
}

// The step of the newest complete checkpoint under `root` (a directory
// step-<N> holding its MANIFEST, which is written last), or -1. Which one the
// coordinator restores is its decision (it validates the manifest); this is
// for the launcher's messages and whether to ask for a restore at all.
int64_t NewestCompleteCheckpoint(const std::string& root) {
  int64_t newest = -1;
  std::error_code ec;
  if (root.empty()) return newest;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    int64_t step = 0;
    if (!absl::SimpleAtoi(name.substr(5), &step) || step < 0) continue;
    if (!std::filesystem::exists(entry.path() / "MANIFEST", ec)) continue;
    newest = std::max(newest, step);
  }
  return newest;
}

// The transport-security flags of each `recps local` child: its role's
// certificate from `certs` (made by SetUpLocalSecurity), or --insecure.
struct LocalSecurity {
  bool insecure = false;
  std::string dir;
  std::vector<std::string> Args(const std::string& name) const {
    if (insecure) return {"--insecure"};
    return {"--tls_ca=" + dir + "/ca.crt", "--tls_cert=" + dir + "/" + name + ".crt",
            "--tls_key=" + dir + "/" + name + ".key"};
  }
};

// The worker certificate of the process that runs ranks first.. (one, or
// all with --one_process): its name binds it to them (rpc::BoundRanks), so
// a worker cannot act as another's rank.
std::string WorkerCertName(int first, int ranks_per_process, int num_workers) {
  return rpc::RankCertificateName(first, std::min(first + ranks_per_process, num_workers) - 1);
}

// TLS by default: a CA and certificates in <work>/certs (one per worker
// process, named after its ranks, so that per-client limits count each
// worker alone and each acts for its own ranks only); this process calls
// as admin. --insecure: plaintext everywhere.
absl::StatusOr<LocalSecurity> SetUpLocalSecurity(const std::string& work, int num_workers,
                                                  bool in_process, int ranks_per_process) {
  const rpc::TlsFlagValues flags = rpc::GetTlsFlags();
  LocalSecurity security;
  if (!flags.ca.empty() || !flags.cert.empty() || !flags.key.empty()) {
    return absl::InvalidArgumentError(
        "recps local makes its own certificates (in its work directory): drop "
        "--tls_ca/--tls_cert/--tls_key, or pass --insecure for plaintext");
  }
  if (flags.insecure) {
    security.insecure = true;
    rpc::SetProcessSecurity(rpc::TransportSecurity::Insecure());
    LogWarning("INSECURE: --insecure given: the local cluster runs plaintext gRPC "
               "with no roles");
    return security;
  }
  security.dir = work + "/certs";
  security::CertOptions options;
  options.cluster = "local";
  if (!std::filesystem::exists(security.dir + "/ca.key")) {
    if (absl::Status s = security::InitCertDir(security.dir, options); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("creating certificates for the local "
                                                 "cluster (--insecure skips TLS): ",
                                                 s.message()));
    }
  }
  for (int r = 0; r < num_workers; r += ranks_per_process) {
    // --in_process: each worker's embedded shard server gets a shard
    // certificate of its own (its peers accept slot-move calls from the
    // shard role only).
    for (const char* role : {"worker", "shard"}) {
      if (std::strcmp(role, "shard") == 0 && !in_process) continue;
      const std::string name = std::strcmp(role, "worker") == 0
                                   ? WorkerCertName(r, ranks_per_process, num_workers)
                                   : absl::StrCat(role, "-", r);
      if (std::filesystem::exists(security.dir + "/" + name + ".crt")) continue;
      if (absl::Status s = security::IssueCert(security.dir, security.dir, role, name, options);
          !s.ok()) {
        return s;
      }
    }
  }
  rpc::SetProcessSecurity(rpc::TransportSecurity::Tls(
      security.dir + "/ca.crt", security.dir + "/admin.crt", security.dir + "/admin.key"));
  LogInfo("mutual TLS with certificates in ", security.dir, " (--insecure: plaintext)");
  return security;
}

int RunLocal(const std::vector<std::string>& worker_args) {
  const bool in_process = absl::GetFlag(FLAGS_in_process);
  const int num_workers = absl::GetFlag(FLAGS_workers);
  int num_shards = absl::GetFlag(FLAGS_shards);
  if (num_shards < 0 || num_workers < 1) {
    LogError("--shards must be >= 0 (0: the default) and --workers >= 1");
    return 2;
  }
  const std::string sync_prefetch = absl::GetFlag(FLAGS_sync_prefetch);
  bool prefetch = false;
  if (sync_prefetch != "auto" && !absl::SimpleAtob(sync_prefetch, &prefetch)) {
    LogError("--sync_prefetch=", sync_prefetch, ": expected true, false or auto");
    return 2;
  }
  const std::string shard_device = absl::GetFlag(FLAGS_shard_device);
  // The shard server parses and checks it (kernels::ParseDevice); here only
  // the form, so that a typo fails before anything starts.
  int ordinal = 0;
  if (shard_device != "cpu" && shard_device != "cuda" &&
      !(absl::StartsWith(shard_device, "cuda:") &&
        absl::SimpleAtoi(shard_device.substr(5), &ordinal) && ordinal >= 0)) {
    LogError("--shard_device=", shard_device, ": expected cpu, cuda or cuda:N");
    return 2;
  }
  if (in_process && shard_device != "cpu") {
    LogError("--shard_device=", shard_device, " needs separate shard servers: the shard "
             "servers embedded by --in_process keep their rows in host memory");
    return 2;
  }
  const bool one_process = absl::GetFlag(FLAGS_one_process);
  if (one_process && !in_process) {
    LogError("--one_process runs the workers around an embedded shard server: it needs "
             "--in_process");
    return 2;
  }
  if (one_process) {
    // One shard server, inside the one worker process.
    if (num_shards != 0 && num_shards != 1) {
      LogError("--one_process runs one shard server inside the workers' process: --shards=",
               num_shards, " must be 1 (or left out)");
      return 2;
    }
    num_shards = 1;
  } else if (in_process) {
    // One shard server per worker, inside it.
    if (num_shards != 0 && num_shards != num_workers) {
      LogError("--in_process runs one shard server inside each worker: --shards=",
               num_shards, " must equal --workers=", num_workers,
               " (or be left out); drop --in_process for separate shard servers");
      return 2;
    }
    num_shards = num_workers;
  } else if (num_shards == 0) {
    num_shards = 2;
  }
  std::string job_path = absl::GetFlag(FLAGS_job);
  if (job_path.empty()) job_path = DefaultJob();
  absl::StatusOr<v1::JobConfig> job = config::ReadJobConfig(job_path);
  if (!job.ok()) {
    LogError(job.status().message());
    return 2;
  }
  if (const std::string mode = absl::GetFlag(FLAGS_consistency); !mode.empty()) {
    v1::ConsistencyConfig* c = job->mutable_training()->mutable_consistency();
    if (mode == "sync") {
      c->set_mode(v1::ConsistencyConfig::SYNC);
    } else if (mode == "bounded") {
      c->set_mode(v1::ConsistencyConfig::BOUNDED);
      c->set_staleness(absl::GetFlag(FLAGS_staleness));
    } else if (mode == "async") {
      c->set_mode(v1::ConsistencyConfig::ASYNC);
    } else {
      LogError("--consistency=", mode, ": expected sync, bounded or async");
      return 2;
    }
  }
  if (absl::GetFlag(FLAGS_steps) > 0) job->mutable_training()->set_steps(absl::GetFlag(FLAGS_steps));

  const std::string coordinator_bin = FindBinary("recps-coordinator", absl::GetFlag(FLAGS_bin_dir));
  const std::string shard_bin = FindBinary("recps-shard", absl::GetFlag(FLAGS_bin_dir));
  const std::string worker_bin = FindBinary("recps-worker", absl::GetFlag(FLAGS_bin_dir));
  if (coordinator_bin.empty() || (shard_bin.empty() && !in_process) || worker_bin.empty()) {
    LogError("cannot find recps-coordinator, recps-shard and recps-worker; "
             "set --bin_dir");
    return 2;
  }
  std::string work = absl::GetFlag(FLAGS_work_dir);
  if (work.empty()) {
    std::string tmpl = "/tmp/recps-local-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      LogError("cannot create a work directory in /tmp");
      return 1;
    }
    work = tmpl;
  }
  std::filesystem::create_directories(work);
  const std::string job_copy = work + "/job.textproto";
  {
    std::string text;
    google::protobuf::TextFormat::PrintToString(*job, &text);
    std::ofstream(job_copy) << text;
  }
  const std::string checkpoint_root = job->training().checkpoint().dir();
  const int max_restarts = absl::GetFlag(FLAGS_max_restarts);
  if (max_restarts < 0) {
    LogError("--max_restarts=", max_restarts, ": must be >= 0");
    return 2;
  }
  if (absl::GetFlag(FLAGS_resume) && checkpoint_root.empty()) {
    LogError("--resume: the job has no training.checkpoint.dir to resume from");
    return 2;
  }
  if (max_restarts > 0 && checkpoint_root.empty()) {
    LogWarning("--max_restarts=", max_restarts, " without training.checkpoint.dir: a "
               "restarted job starts from step 0");
  }
  LogInfo("local cluster: 1 coordinator, ", num_shards, " shard server(s)",
          one_process  ? " (inside the workers' process, --one_process)"
          : in_process ? " (one inside each worker, --in_process)"
                       : "",
          ", ", num_workers, " worker(s)", one_process ? " as threads of one process" : "",
          "; logs in ", work);
  absl::StatusOr<LocalSecurity> tls = SetUpLocalSecurity(work, num_workers, in_process,
                                                          one_process ? num_workers : 1);
  if (!tls.ok()) {
    LogError(tls.status().message());
    return absl::IsInvalidArgument(tls.status()) ? 2 : 1;
  }

  // Every worker writes its result; rank 0's evaluations give the summary.
  std::string result_dir = absl::GetFlag(FLAGS_result_dir);
  if (result_dir.empty()) result_dir = work;
  std::filesystem::create_directories(result_dir);
  int coordinator_restarts_used = 0;

  // One start of the whole job. `restore`: the coordinator restores the
  // newest complete checkpoint. Returns Supervise's code (or 1 when the
  // start failed) and what failed in `failure`.
  auto run_attempt = [&](int attempt, bool restore, std::string* failure) -> int {
  // Children stop in reverse order of start when this vector is destroyed;
  // workers are stopped explicitly first.
  std::vector<LocalServer> servers;
  std::vector<ChildProcess> workers;
  std::vector<std::string> names;
  const std::string pid_file = work + "/pids";
  auto write_pids = [&] { WritePidFile(pid_file, servers, workers, names); };
  auto fail = [&](const absl::Status& s) {
    LogError(s.message());
    LogError("logs are in ", work);
    return 1;
  };
  // The coordinator listens on `listen`; a restart reuses the port the
  // first start got and the state directory, so the shard servers and
  // workers reconnect to it as to a hand-restarted one. A restart of the
  // whole job starts a fresh coordinator state (the checkpoint holds what
  // the job needs).
  const std::string coord_log = work + "/coordinator.log";
  const std::string coord_ports = work + "/coordinator.ports";
  // A restore starts from an empty state directory: a previous run's (same
  // --work_dir) would bring back its shard map, with the old servers in it.
  const std::string coord_state =
      attempt > 0 ? absl::StrCat(work, "/coordinator-restart", attempt)
                  : restore ? work + "/coordinator-resume" : work + "/coordinator";
  if (restore) {
    std::error_code ec;
    std::filesystem::remove_all(coord_state, ec);
  }
  auto start_coordinator =
      [&, coord_state](const std::string& listen) -> absl::StatusOr<std::pair<ChildProcess, int>> {
    std::error_code ec;
    std::filesystem::remove(coord_ports, ec);  // a stale one is no sign of life
    std::vector<std::string> args = {
        "--state_dir=" + coord_state, "--job=" + job_copy,
        absl::StrCat("--num_shards=", num_shards),
        // Bounds ranks and barrier counts by the job's real size.
        absl::StrCat("--world_size=", num_workers), "--listen=" + listen,
        "--port_file=" + coord_ports};
    if (restore) args.push_back("--restore=" + checkpoint_root);
    for (std::string& a : tls->Args("coordinator")) args.push_back(std::move(a));
    absl::StatusOr<ChildProcess> c = ChildProcess::Spawn(coordinator_bin, args, coord_log);
    if (!c.ok()) return c.status();
    absl::StatusOr<int> port = WaitForPort(*c, coord_ports, coord_log,
                                               absl::GetFlag(FLAGS_start_timeout));
    if (!port.ok()) return port.status();
    return std::make_pair(*std::move(c), *port);
  };
  absl::StatusOr<std::pair<ChildProcess, int>> coordinator =
      start_coordinator("127.0.0.1:0");
  if (!coordinator.ok()) return fail(coordinator.status());
  const int coord_port = coordinator->second;
  const std::string coord_address = absl::StrCat("127.0.0.1:", coord_port);
  servers.push_back(LocalServer{
      std::move(coordinator->first), "coordinator " + coord_address, "coordinator",
      [start_coordinator, coord_address]() -> absl::StatusOr<ChildProcess> {
        absl::StatusOr<std::pair<ChildProcess, int>> again = start_coordinator(coord_address);
        if (!again.ok()) return again.status();
        return std::move(again->first);
      },
      absl::GetFlag(FLAGS_coordinator_restarts)});
  write_pids();

  std::vector<std::string> shard_addresses;
  // --in_process: the workers start their shard servers and wait for the
  // map themselves.
  for (int i = 0; i < num_shards && !in_process; ++i) {
    const std::string log = absl::StrCat(work, "/shard", i, ".log");
    const std::string ports = absl::StrCat(work, "/shard", i, ".ports");
    std::error_code ec;
    std::filesystem::remove(ports, ec);  // the last attempt's is stale
    std::vector<std::string> args = {
        "--job=" + job_copy, absl::StrCat("--world_size=", num_workers),
        "--coordinator=" + coord_address, "--listen=127.0.0.1:0", "--port_file=" + ports,
        "--device=" + shard_device,
        // The coordinator spreads the slots evenly over the servers.
        absl::StrCat("--prefault_fixed_tables=", 1.0 / num_shards)};
    for (std::string& a : tls->Args("shard")) args.push_back(std::move(a));
    absl::StatusOr<ChildProcess> shard = ChildProcess::Spawn(shard_bin, args, log);
    if (!shard.ok()) return fail(shard.status());
    servers.push_back(LocalServer{*std::move(shard), absl::StrCat("shard server ", i),
                                  absl::StrCat("shard-", i), nullptr, 0});
    absl::StatusOr<int> port = WaitForPort(servers.back().process, ports, log,
                                               absl::GetFlag(FLAGS_start_timeout));
    if (!port.ok()) return fail(port.status());
    shard_addresses.push_back(absl::StrCat("127.0.0.1:", *port));
    // Its rows live in its memory only: restarting it alone would lose them,
    // so a shard server that exits stops the run (naming it), and with
    // --max_restarts the whole job restarts from the last checkpoint.
    servers.back().description =
        absl::StrCat("shard server ", i, " (", shard_addresses.back(), ", log ", log, ")");
    write_pids();
  }
  for (const std::string& s : shard_addresses) {
    if (absl::Status st = WaitForShardMap(s); !st.ok()) return fail(st);
  }

  // Share the cores: each worker gets its part for its own pool and for
  // OpenBLAS (whose threads would otherwise oversubscribe the machine).
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                      num_workers);
  setenv("OPENBLAS_NUM_THREADS", absl::StrCat(threads).c_str(), /*overwrite=*/0);
  // --one_process: one worker process running every rank (its threads).
  const int ranks_per_process = one_process ? num_workers : 1;
  for (int r = 0; r < num_workers; r += ranks_per_process) {
    std::vector<std::string> args = {
        "--coordinator=" + coord_address,
        absl::StrCat("--rank=", r), absl::StrCat("--world_size=", num_workers),
        absl::StrCat("--local_ranks=", ranks_per_process),
        absl::StrCat("--threads=", threads),
        "--sync_prefetch=" + sync_prefetch,
        r == 0 ? "--progress_every=2s" : "--progress_every=1000h",
        one_process ? "--result_json=" + result_dir + "/result{rank}.json"
                    : absl::StrCat("--result_json=", result_dir, "/result", r, ".json")};
    if (in_process) {
      const std::string ports = absl::StrCat(work, "/shard", r, ".ports");
      std::error_code ec;
      std::filesystem::remove(ports, ec);  // the last attempt's is stale
      args.push_back("--embedded_shard");
      args.push_back("--embedded_shard_listen=127.0.0.1:0");
      args.push_back("--embedded_shard_port_file=" + ports);
      if (!tls->insecure) {
        const std::string name = absl::StrCat(tls->dir, "/shard-", r);
        args.push_back("--embedded_shard_tls_cert=" + name + ".crt");
        args.push_back("--embedded_shard_tls_key=" + name + ".key");
      }
    }
    for (std::string& a : tls->Args(WorkerCertName(r, ranks_per_process, num_workers))) {
      args.push_back(std::move(a));
    }
    args.insert(args.end(), worker_args.begin(), worker_args.end());  // last wins
    absl::StatusOr<ChildProcess> w = ChildProcess::Spawn(worker_bin, args);
    if (!w.ok()) return fail(w.status());
    workers.push_back(*std::move(w));
    names.push_back(one_process ? absl::StrCat("workers 0-", num_workers - 1)
                                : absl::StrCat("worker ", r));
    write_pids();
  }

  const int code = Supervise(
      workers, names, &servers, "the cluster", write_pids, failure,
      // A restart from a checkpoint discards the workers' state: no point in
      // letting them try to checkpoint a broken job.
      max_restarts > 0 ? SIGKILL : SIGTERM,
      checkpoint_root.empty() ? absl::Seconds(10) : absl::GetFlag(FLAGS_stop_timeout));
  for (auto it = servers.rbegin(); it != servers.rend(); ++it) {
    if (it->process.running()) (void)it->process.Stop(absl::Seconds(10));
  }
  coordinator_restarts_used +=
      absl::GetFlag(FLAGS_coordinator_restarts) - servers.front().restarts_left;
  return code;
  };

  bool restore = false;
  if (absl::GetFlag(FLAGS_resume)) {
    const int64_t step = NewestCompleteCheckpoint(checkpoint_root);
    if (step < 0) {
      LogInfo("--resume: no complete checkpoint in ", checkpoint_root,
              "; starting from step 0");
    } else {
      LogInfo("--resume: resuming from the checkpoint at step ", step, " in ",
              checkpoint_root, " (or the newest intact older one: the coordinator "
              "skips a damaged checkpoint and its log says why)");
      restore = true;
    }
  }
  int exit_code = 0;
  for (int attempt = 0;; ++attempt) {
    std::string failure;
    exit_code = run_attempt(attempt, restore, &failure);
    if (exit_code != 1 || failure.empty()) break;  // done, stopped, or a start-up error
    if (attempt >= max_restarts) {
      if (max_restarts > 0) {
        LogError("giving up after ", max_restarts, " restart(s): ", failure);
      }
      break;
    }
    const int64_t step = checkpoint_root.empty() ? -1 : NewestCompleteCheckpoint(checkpoint_root);
    restore = step >= 0;
    LogWarning("restart ", attempt + 1, "/", max_restarts, " after ", failure, ": ",
               restore ? absl::StrCat("resuming from step ", step)
                       : std::string("no complete checkpoint, starting from step 0"));
  }
  if (exit_code == kExitFinalCheckpointFailed) {
    // Training is done and its results are written; only the last save
    // failed. Training again would end at the same full disk.
    const int64_t step = NewestCompleteCheckpoint(checkpoint_root);
    LogError("trained every step", FinalEvaluation(result_dir + "/result0.json"),
             "; but the final checkpoint failed (the workers' error above says why and "
             "where), so ",
             step >= 0 ? absl::StrCat("the newest complete checkpoint stays step ", step,
                                      " in ", checkpoint_root)
                       : absl::StrCat("there is no complete checkpoint in ", checkpoint_root),
             "; not restarted");
  }
  if (exit_code != 0) LogError("logs are in ", work);
  if (exit_code == 0) {
    const int restarts = coordinator_restarts_used;
    LogInfo("done", FinalEvaluation(result_dir + "/result0.json"),
            restarts > 0 ? absl::StrCat("; the coordinator was restarted ", restarts,
                                        " time(s)")
                         : "",
            "; logs in ", work);
    if (absl::GetFlag(FLAGS_work_dir).empty()) {
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(work, ec)) {
        if (entry.path().filename().string().rfind("coordinator", 0) == 0 &&
            entry.is_directory()) {
          std::filesystem::remove_all(entry.path(), ec);
        }
      }
    }
  }
  return exit_code;
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
      "  recps local [--job=FILE] [--shards=N] [--workers=N] [--in_process [--one_process]] "
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
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
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
  if (command == "local" && args.size() == 2) return recps::client::RunLocal(worker_args);
  if (command == "launch") {
    return recps::client::RunLaunch(std::vector<std::string>(args.begin() + 2, args.end()),
                                    worker_args);
  }
  std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
  return 2;
}
