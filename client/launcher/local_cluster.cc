#include "client/launcher/local_cluster.h"

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/launcher/launch_topology.h"
#include "client/launcher/process.h"
#include "client/launcher/supervise.h"
#include "client/launcher/work_dir.h"
#include "common/config/job_config.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/rpc/channels.h"
#include "common/rpc/identity.h"
#include "common/security/certs.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard_admin.grpc.pb.h"

namespace recps::client {
namespace {

// std::filesystem, not the seam: a probe for a file that
// config::ReadJobConfig then reads on its own.
std::string DefaultJob() {
  for (const std::string& p :
       {std::string("examples/small.textproto"),
        SelfDirectory() + "/../../examples/small.textproto"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "examples/small.textproto";
}

// Waits up to `timeout` until `server` has a shard map (the coordinator
// pushes it once every shard has registered).
absl::Status WaitForShardMap(const std::string& server, absl::Duration timeout) {
  auto stub = v1::ShardAdmin::NewStub(
      rpc::MakeChannel(server, rpc::ChannelKind::kControl));
  const absl::Time deadline = absl::Now() + timeout;
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
std::string FinalEvaluation(const std::string& result_json, FileSystem* fs) {
  absl::StatusOr<std::string> text =
      fs->ReadSmallFile(result_json, std::numeric_limits<int64_t>::max());
  if (!text.ok()) return "";
  const std::string& json = *text;
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
int64_t NewestCompleteCheckpoint(const std::string& root, FileSystem* fs) {
  int64_t newest = -1;
  if (root.empty()) return newest;
  absl::StatusOr<std::vector<FileSystem::DirEntry>> entries = fs->ListDir(root);
  if (!entries.ok()) return newest;
  for (const FileSystem::DirEntry& entry : *entries) {
    int64_t step = 0;
    if (!entry.is_dir || !absl::StartsWith(entry.name, "step-") ||
        !absl::SimpleAtoi(entry.name.substr(5), &step) || step < 0 || step <= newest) {
      continue;
    }
    // The seam has no exists(): look for the MANIFEST in the listing.
    absl::StatusOr<std::vector<FileSystem::DirEntry>> files =
        fs->ListDir(absl::StrCat(root, "/", entry.name));
    if (!files.ok()) continue;
    for (const FileSystem::DirEntry& f : *files) {
      if (f.name == "MANIFEST") newest = step;
    }
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
absl::StatusOr<LocalSecurity> SetUpLocalSecurity(const rpc::TlsFlagValues& flags,
                                                  const std::string& work, int num_workers,
                                                  bool in_process, int ranks_per_process) {
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
  // The certificates are written by common/security (OpenSSL), not through
  // the seam, so they are probed as they are written: std::filesystem.
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

// What every start of the job uses: the options, checked and resolved.
struct LocalPlan {
  const LocalClusterOptions* options = nullptr;
  int num_shards = 0;
  // Workers per process: all of them with --one_process, else 1.
  int ranks_per_process = 1;
  v1::JobConfig job;
  std::string coordinator_bin;
  std::string shard_bin;  // "" with --in_process
  std::string worker_bin;
  std::string work;      // logs, states, the job copy
  std::string job_copy;  // the job as the children read it
  std::string checkpoint_root;  // the job's training.checkpoint.dir
  std::string result_dir;
  LocalSecurity tls;
};

// Checks the shape of the cluster and sets plan->num_shards. Returns 0, or
// 2 after logging what is wrong.
int CheckTopology(const LocalClusterOptions& o, LocalPlan* plan) {
  if (o.shards < 0 || o.workers < 1) {
    LogError("--shards must be >= 0 (0: the default) and --workers >= 1");
    return 2;
  }
  bool prefetch = false;
  if (o.sync_prefetch != "auto" && !absl::SimpleAtob(o.sync_prefetch, &prefetch)) {
    LogError("--sync_prefetch=", o.sync_prefetch, ": expected true, false or auto");
    return 2;
  }
  // The shard server parses and checks it (kernels::ParseDevice); here only
  // the form, so that a typo fails before anything starts.
  int ordinal = 0;
  const std::string& device = o.shard_device;
  if (device != "cpu" && device != "cuda" &&
      !(absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &ordinal) &&
        ordinal >= 0)) {
    LogError("--shard_device=", device, ": expected cpu, cuda or cuda:N");
    return 2;
  }
  if (o.in_process && device != "cpu") {
    LogError("--shard_device=", device, " needs separate shard servers: the shard "
             "servers embedded by --in_process keep their rows in host memory");
    return 2;
  }
  if (o.sharding != "planned" && o.sharding != "even") {
    LogError("--sharding=", o.sharding, ": expected planned or even");
    return 2;
  }
  if (o.one_process && !o.gpus.empty()) {
    LogError("--one_process runs every rank in one process; --gpus gives each worker "
             "process its own GPU: drop one of them");
    return 2;
  }
  if (o.one_process && !o.in_process) {
    LogError("--one_process runs the workers around an embedded shard server: it needs "
             "--in_process");
    return 2;
  }
  plan->num_shards = o.shards;
  if (o.one_process) {
    // One shard server, inside the one worker process.
    if (o.shards != 0 && o.shards != 1) {
      LogError("--one_process runs one shard server inside the workers' process: --shards=",
               o.shards, " must be 1 (or left out)");
      return 2;
    }
    plan->num_shards = 1;
  } else if (o.in_process) {
    // One shard server per worker, inside it.
    if (o.shards != 0 && o.shards != o.workers) {
      LogError("--in_process runs one shard server inside each worker: --shards=",
               o.shards, " must equal --workers=", o.workers,
               " (or be left out); drop --in_process for separate shard servers");
      return 2;
    }
    plan->num_shards = o.workers;
  } else if (o.shards == 0) {
    plan->num_shards = 2;
  }
  if (o.replication < 0 || o.replication > 8) {
    LogError("--replication=", o.replication, " must be in 0..8 (0: the job's)");
    return 2;
  }
  if (o.replication > 1 && o.in_process) {
    LogError("--replication=", o.replication, " keeps each row on several shard servers: "
             "it needs separate ones; drop --in_process");
    return 2;
  }
  if (o.replication > plan->num_shards) {
    LogError("--replication=", o.replication, " needs at least ", o.replication,
             " shard servers; --shards=", plan->num_shards);
    return 2;
  }
  plan->ranks_per_process = o.one_process ? o.workers : 1;
  return 0;
}

// Reads the job and applies --consistency and --steps. Returns 0, or 2
// after logging what is wrong.
int ReadJob(const LocalClusterOptions& o, LocalPlan* plan) {
  absl::StatusOr<v1::JobConfig> job =
      config::ReadJobConfig(o.job.empty() ? DefaultJob() : o.job);
  if (!job.ok()) {
    LogError(job.status().message());
    return 2;
  }
  if (!o.consistency.empty()) {
    v1::ConsistencyConfig* c = job->mutable_training()->mutable_consistency();
    if (o.consistency == "sync") {
      c->set_mode(v1::ConsistencyConfig::SYNC);
    } else if (o.consistency == "bounded") {
      c->set_mode(v1::ConsistencyConfig::BOUNDED);
      c->set_staleness(o.staleness);
    } else if (o.consistency == "async") {
      c->set_mode(v1::ConsistencyConfig::ASYNC);
    } else {
      LogError("--consistency=", o.consistency, ": expected sync, bounded or async");
      return 2;
    }
  }
  if (o.steps > 0) job->mutable_training()->set_steps(o.steps);
  plan->job = *std::move(job);
  plan->checkpoint_root = plan->job.training().checkpoint().dir();
  return 0;
}

// Finds the binaries, makes the work directory with the job's copy, checks
// the restart flags and sets up the certificates. Returns 0, or the exit
// code after logging what is wrong.
int Prepare(const LocalClusterOptions& o, LocalPlan* plan) {
  plan->coordinator_bin = FindBinary("recps-coordinator", o.bin_dir);
  plan->shard_bin = FindBinary("recps-shard", o.bin_dir);
  plan->worker_bin = FindBinary("recps-worker", o.bin_dir);
  if (plan->coordinator_bin.empty() || (plan->shard_bin.empty() && !o.in_process) ||
      plan->worker_bin.empty()) {
    LogError("cannot find recps-coordinator, recps-shard and recps-worker; "
             "set --bin_dir");
    return 2;
  }
  std::string job_text;
  google::protobuf::TextFormat::PrintToString(plan->job, &job_text);
  absl::StatusOr<WorkDir> work = PrepareWorkDir(o.work_dir, job_text, o.file_system);
  if (!work.ok()) {
    LogError(work.status().message());
    return 1;
  }
  plan->work = work->dir;
  plan->job_copy = work->job_copy;
  if (o.max_restarts < 0) {
    LogError("--max_restarts=", o.max_restarts, ": must be >= 0");
    return 2;
  }
  if (o.resume && plan->checkpoint_root.empty()) {
    LogError("--resume: the job has no training.checkpoint.dir to resume from");
    return 2;
  }
  if (o.max_restarts > 0 && plan->checkpoint_root.empty()) {
    LogWarning("--max_restarts=", o.max_restarts, " without training.checkpoint.dir: a "
               "restarted job starts from step 0");
  }
  LogInfo("local cluster: 1 coordinator, ", plan->num_shards, " shard server(s)",
          o.one_process  ? " (inside the workers' process, --one_process)"
          : o.in_process ? " (one inside each worker, --in_process)"
                         : "",
          ", ", o.workers, " worker(s)", o.one_process ? " as threads of one process" : "",
          o.gpus.empty() ? "" : absl::StrCat(" on GPUs ", absl::StrJoin(o.gpus, ",")),
          "; logs in ", plan->work);
  absl::StatusOr<LocalSecurity> tls = SetUpLocalSecurity(
      o.tls, plan->work, o.workers, o.in_process, plan->ranks_per_process);
  if (!tls.ok()) {
    LogError(tls.status().message());
    return absl::IsInvalidArgument(tls.status()) ? 2 : 1;
  }
  plan->tls = *std::move(tls);
  // Every worker writes its result; rank 0's evaluations give the summary.
  plan->result_dir = o.result_dir.empty() ? plan->work : o.result_dir;
  if (absl::Status s = o.file_system->CreateDirs(plan->result_dir); !s.ok()) {
    LogError("result directory (--result_dir): ", s.message());
    return 1;
  }
  return 0;
}

// One start of the whole job: the coordinator, the shard servers, the
// workers, supervised until the end. Its children stop when it is
// destroyed, workers first (they are stopped explicitly before that when
// the run ends).
class LocalAttempt {
 public:
  // `restore`: the coordinator restores the newest complete checkpoint.
  LocalAttempt(const LocalPlan& plan, int attempt, bool restore);

  // Supervise's code (or 1 when the start failed); what failed goes to
  // `failure`.
  int Run(std::string* failure);
  // How often the coordinator was restarted (after Run).
  int coordinator_restarts_used() const { return coordinator_restarts_used_; }

 private:
  // The coordinator listening on `listen`, and its port.
  absl::StatusOr<std::pair<ChildProcess, int>> SpawnCoordinator(
      const std::string& listen) const;
  absl::Status StartCoordinator();
  absl::Status StartShards();
  // Copies of each row above one (--replication, else the job's).
  bool Replicated() const {
    return (o_.replication > 0 ? o_.replication : plan_.job.replication()) > 1;
  }
  absl::Status StartWorkers();
  int SuperviseAll(std::string* failure);
  void WritePids() { WritePidFile(pid_file_, servers_, workers_, names_, fs_); }
  // Removes a port file of an earlier start: it is no sign of life.
  void RemoveStalePortFile(const std::string& path) const {
    fs_->RemoveFile(path).IgnoreError();  // mostly NOT_FOUND
  }

  const LocalPlan& plan_;
  const LocalClusterOptions& o_;
  FileSystem* const fs_;
  const bool restore_;
  const std::string pid_file_;
  // The coordinator's files. A restore starts from an empty state
  // directory: a previous run's (same --work_dir) would bring back its
  // shard map, with the old servers in it.
  const std::string coord_log_;
  const std::string coord_ports_;
  const std::string coord_state_;
  std::string coord_address_;
  int coordinator_restarts_used_ = 0;

  // Children stop in reverse order of start when this vector is destroyed;
  // workers are stopped explicitly first.
  std::vector<LocalServer> servers_;
  std::vector<ChildProcess> workers_;
  std::vector<std::string> names_;
};

LocalAttempt::LocalAttempt(const LocalPlan& plan, int attempt, bool restore)
    : plan_(plan),
      o_(*plan.options),
      fs_(plan.options->file_system),
      restore_(restore),
      pid_file_(plan.work + "/pids"),
      coord_log_(plan.work + "/coordinator.log"),
      coord_ports_(plan.work + "/coordinator.ports"),
      // A restart of the whole job starts a fresh coordinator state (the
      // checkpoint holds what the job needs).
      coord_state_(attempt > 0 ? absl::StrCat(plan.work, "/coordinator-restart", attempt)
                   : restore   ? plan.work + "/coordinator-resume"
                               : plan.work + "/coordinator") {}

int LocalAttempt::Run(std::string* failure) {
  if (restore_) fs_->RemoveTree(coord_state_).IgnoreError();  // best effort, as ever
  absl::Status started = StartCoordinator();
  if (started.ok()) started = StartShards();
  if (started.ok()) started = StartWorkers();
  if (!started.ok()) {
    LogError(started.message());
    LogError("logs are in ", plan_.work);
    return 1;
  }
  return SuperviseAll(failure);
}

absl::StatusOr<std::pair<ChildProcess, int>> LocalAttempt::SpawnCoordinator(
    const std::string& listen) const {
  RemoveStalePortFile(coord_ports_);
  std::vector<std::string> args = {
      "--state_dir=" + coord_state_, "--job=" + plan_.job_copy,
      absl::StrCat("--num_shards=", plan_.num_shards),
      // Bounds ranks and barrier counts by the job's real size.
      absl::StrCat("--world_size=", o_.workers), "--listen=" + listen,
      "--sharding=" + o_.sharding,
      "--port_file=" + coord_ports_};
  if (restore_) args.push_back("--restore=" + plan_.checkpoint_root);
  if (o_.replication > 0) args.push_back(absl::StrCat("--replication=", o_.replication));
  // Replicated shard servers: a lost one is failed over once its lease
  // runs out; 2 s (heartbeats every 0.67 s) keeps that within seconds on
  // one machine (docs/replication.md, Failover).
  if (Replicated()) args.push_back("--lease=2s");
  for (std::string& a : plan_.tls.Args("coordinator")) args.push_back(std::move(a));
  absl::StatusOr<ChildProcess> c = ChildProcess::Spawn(plan_.coordinator_bin, args, coord_log_);
  if (!c.ok()) return c.status();
  absl::StatusOr<int> port = WaitForPort(*c, coord_ports_, coord_log_, o_.start_timeout, fs_);
  if (!port.ok()) return port.status();
  return std::make_pair(*std::move(c), *port);
}

// The coordinator listens on a port the OS picks; a restart reuses that
// port and the state directory, so the shard servers and workers
// reconnect to it as to a hand-restarted one.
absl::Status LocalAttempt::StartCoordinator() {
  absl::StatusOr<std::pair<ChildProcess, int>> coordinator = SpawnCoordinator("127.0.0.1:0");
  if (!coordinator.ok()) return coordinator.status();
  coord_address_ = absl::StrCat("127.0.0.1:", coordinator->second);
  servers_.push_back(LocalServer{
      std::move(coordinator->first), "coordinator " + coord_address_, "coordinator",
      [this]() -> absl::StatusOr<ChildProcess> {
        absl::StatusOr<std::pair<ChildProcess, int>> again = SpawnCoordinator(coord_address_);
        if (!again.ok()) return again.status();
        return std::move(again->first);
      },
      o_.coordinator_restarts});
  WritePids();
  return absl::OkStatus();
}

// --in_process: none; the workers start their shard servers and wait for
// the map themselves.
absl::Status LocalAttempt::StartShards() {
  std::vector<std::string> shard_addresses;
  for (int i = 0; i < plan_.num_shards && !o_.in_process; ++i) {
    const std::string log = absl::StrCat(plan_.work, "/shard", i, ".log");
    const std::string ports = absl::StrCat(plan_.work, "/shard", i, ".ports");
    RemoveStalePortFile(ports);  // the last attempt's
    std::vector<std::string> args = {
        "--job=" + plan_.job_copy, absl::StrCat("--world_size=", o_.workers),
        "--coordinator=" + coord_address_, "--listen=127.0.0.1:0", "--port_file=" + ports,
        "--device=" + o_.shard_device,
        // The coordinator spreads the slots evenly over the servers.
        absl::StrCat("--prefault_fixed_tables=", 1.0 / plan_.num_shards)};
    for (std::string& a : plan_.tls.Args("shard")) args.push_back(std::move(a));
    absl::StatusOr<ChildProcess> shard = ChildProcess::Spawn(plan_.shard_bin, args, log);
    if (!shard.ok()) return shard.status();
    servers_.push_back(LocalServer{*std::move(shard), absl::StrCat("shard server ", i),
                                   absl::StrCat("shard-", i), nullptr, 0});
    absl::StatusOr<int> port =
        WaitForPort(servers_.back().process, ports, log, o_.start_timeout, fs_);
    if (!port.ok()) return port.status();
    shard_addresses.push_back(absl::StrCat("127.0.0.1:", *port));
    // Its rows live in its memory only: restarting it alone would lose them,
    // so a shard server that exits stops the run (naming it), and with
    // --max_restarts the whole job restarts from the last checkpoint;
    // unless they have copies on other servers (replication).
    servers_.back().replicated = Replicated();
    servers_.back().description =
        absl::StrCat("shard server ", i, " (", shard_addresses.back(), ", log ", log, ")");
    WritePids();
  }
  for (const std::string& s : shard_addresses) {
    RETURN_IF_ERROR(WaitForShardMap(s, o_.start_timeout));
  }
  return absl::OkStatus();
}

absl::Status LocalAttempt::StartWorkers() {
  // Share the cores: each worker gets its part for its own pool and for
  // OpenBLAS (whose threads would otherwise oversubscribe the machine).
  const int threads =
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / o_.workers);
  setenv("OPENBLAS_NUM_THREADS", absl::StrCat(threads).c_str(), /*overwrite=*/0);
  // --one_process: one worker process running every rank (its threads).
  const int ranks_per_process = plan_.ranks_per_process;
  for (int r = 0; r < o_.workers; r += ranks_per_process) {
    std::vector<std::string> args = {
        "--coordinator=" + coord_address_,
        absl::StrCat("--rank=", r), absl::StrCat("--world_size=", o_.workers),
        absl::StrCat("--local_ranks=", ranks_per_process),
        absl::StrCat("--threads=", threads),
        // auto with separate shard servers: off too (the worker turns it
        // off for embedded ones). They are processes of this machine, so
        // the overlapped lookup is CPU work on the cores the step needs
        // (2 vCPUs, service form, interleaved pairs: S-p20 17108/14565 ->
        // 18648/16130 samples/s, U-var 2691/2426 -> 2970/3193; forward and
        // backward back to the one-process form's).
        "--sync_prefetch=" + (o_.sync_prefetch == "auto" && !o_.in_process
                                  ? std::string("false")
                                  : o_.sync_prefetch),
        r == 0 ? "--progress_every=2s" : "--progress_every=1000h",
        o_.one_process ? "--result_json=" + plan_.result_dir + "/result{rank}.json"
                       : absl::StrCat("--result_json=", plan_.result_dir, "/result", r, ".json")};
    if (o_.in_process) {
      const std::string ports = absl::StrCat(plan_.work, "/shard", r, ".ports");
      RemoveStalePortFile(ports);  // the last attempt's
      args.push_back("--embedded_shard");
      args.push_back("--embedded_shard_listen=127.0.0.1:0");
      args.push_back("--embedded_shard_port_file=" + ports);
      if (!plan_.tls.insecure) {
        const std::string name = absl::StrCat(plan_.tls.dir, "/shard-", r);
        args.push_back("--embedded_shard_tls_cert=" + name + ".crt");
        args.push_back("--embedded_shard_tls_key=" + name + ".key");
      }
    }
    for (std::string& a : plan_.tls.Args(WorkerCertName(r, ranks_per_process, o_.workers))) {
      args.push_back(std::move(a));
    }
    // Each worker sees only its GPU and trains on it (--device=cuda:0).
    const GpuAssignment gpu = AssignGpu(o_.gpus, r);
    args.insert(args.end(), gpu.args.begin(), gpu.args.end());
    if (!o_.gpus.empty()) LogInfo("worker ", r, ": ", gpu.where);
    args.insert(args.end(), o_.worker_args.begin(), o_.worker_args.end());  // last wins
    absl::StatusOr<ChildProcess> w = ChildProcess::Spawn(plan_.worker_bin, args, "", gpu.env);
    if (!w.ok()) return w.status();
    workers_.push_back(*std::move(w));
    names_.push_back(o_.one_process ? absl::StrCat("workers 0-", o_.workers - 1)
                                    : absl::StrCat("worker ", r));
    WritePids();
  }
  return absl::OkStatus();
}

int LocalAttempt::SuperviseAll(std::string* failure) {
  const int code = Supervise(
      workers_, names_, &servers_, "the cluster", [this] { WritePids(); }, failure,
      // A restart from a checkpoint discards the workers' state: no point in
      // letting them try to checkpoint a broken job.
      o_.max_restarts > 0 ? SIGKILL : SIGTERM,
      plan_.checkpoint_root.empty() ? absl::Seconds(10) : o_.stop_timeout);
  for (auto it = servers_.rbegin(); it != servers_.rend(); ++it) {
    if (it->process.running()) (void)it->process.Stop(absl::Seconds(10));
  }
  coordinator_restarts_used_ = o_.coordinator_restarts - servers_.front().restarts_left;
  return code;
}

// Starts the job, and again from the newest checkpoint after a failure, up
// to --max_restarts times. Returns the last attempt's code; adds the
// coordinator's restarts to `coordinator_restarts`.
int RunAttempts(const LocalPlan& plan, int* coordinator_restarts) {
  const LocalClusterOptions& o = *plan.options;
  bool restore = false;
  if (o.resume) {
    const int64_t step = NewestCompleteCheckpoint(plan.checkpoint_root, o.file_system);
    if (step < 0) {
      LogInfo("--resume: no complete checkpoint in ", plan.checkpoint_root,
              "; starting from step 0");
    } else {
      LogInfo("--resume: resuming from the checkpoint at step ", step, " in ",
              plan.checkpoint_root, " (or the newest intact older one: the coordinator "
              "skips a damaged checkpoint and its log says why)");
      restore = true;
    }
  }
  int exit_code = 0;
  for (int attempt = 0;; ++attempt) {
    std::string failure;
    {
      LocalAttempt run(plan, attempt, restore);
      exit_code = run.Run(&failure);
      *coordinator_restarts += run.coordinator_restarts_used();
    }
    if (exit_code != 1 || failure.empty()) break;  // done, stopped, or a start-up error
    if (attempt >= o.max_restarts) {
      if (o.max_restarts > 0) {
        LogError("giving up after ", o.max_restarts, " restart(s): ", failure);
      }
      break;
    }
    const int64_t step = NewestCompleteCheckpoint(plan.checkpoint_root, o.file_system);
    restore = step >= 0;
    LogWarning("restart ", attempt + 1, "/", o.max_restarts, " after ", failure, ": ",
               restore ? absl::StrCat("resuming from step ", step)
                       : std::string("no complete checkpoint, starting from step 0"));
  }
  return exit_code;
}

// The last lines of a run: its result, or where its logs are.
void Report(const LocalPlan& plan, int exit_code, int coordinator_restarts) {
  FileSystem* const fs = plan.options->file_system;
  if (exit_code == kExitFinalCheckpointFailed) {
    // Training is done and its results are written; only the last save
    // failed. Training again would end at the same full disk.
    const int64_t step = NewestCompleteCheckpoint(plan.checkpoint_root, fs);
    LogError("trained every step", FinalEvaluation(plan.result_dir + "/result0.json", fs),
             "; but the final checkpoint failed (the workers' error above says why and "
             "where), so ",
             step >= 0 ? absl::StrCat("the newest complete checkpoint stays step ", step,
                                      " in ", plan.checkpoint_root)
                       : absl::StrCat("there is no complete checkpoint in ",
                                      plan.checkpoint_root),
             "; not restarted");
  }
  if (exit_code != 0) {
    LogError("logs are in ", plan.work);
    return;
  }
  LogInfo("done", FinalEvaluation(plan.result_dir + "/result0.json", fs),
          coordinator_restarts > 0
              ? absl::StrCat("; the coordinator was restarted ", coordinator_restarts,
                             " time(s)")
              : "",
          "; logs in ", plan.work);
  // A work directory of our own: its coordinator states are of no more use.
  if (plan.options->work_dir.empty()) {
    absl::StatusOr<std::vector<FileSystem::DirEntry>> entries = fs->ListDir(plan.work);
    if (!entries.ok()) return;
    for (const FileSystem::DirEntry& entry : *entries) {
      if (entry.is_dir && absl::StartsWith(entry.name, "coordinator")) {
        fs->RemoveTree(absl::StrCat(plan.work, "/", entry.name)).IgnoreError();
      }
    }
  }
}

}  // namespace

int RunLocal(const LocalClusterOptions& options) {
  LocalPlan plan;
  plan.options = &options;
  if (const int code = CheckTopology(options, &plan); code != 0) return code;
  if (const int code = ReadJob(options, &plan); code != 0) return code;
  if (const int code = Prepare(options, &plan); code != 0) return code;
  int coordinator_restarts = 0;
  const int exit_code = RunAttempts(plan, &coordinator_restarts);
  Report(plan, exit_code, coordinator_restarts);
  return exit_code;
}

}  // namespace recps::client
