// recps: the launcher.
//
//   recps local [--job=FILE] [--shards=2] [--workers=2] [--consistency=sync]
//
// starts a coordinator, S shard servers and W workers as processes on
// 127.0.0.1 (ports picked by the OS), trains the job, shows one progress view
// (rank 0's progress and every worker's evaluations; the servers log to files
// in the work directory), and stops everything at the end or on Ctrl-C.
// With no flags it trains examples/small.textproto with 2 shards and 2
// workers in sync mode.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/process.h"
#include "common/log.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "worker/job_config.h"

ABSL_FLAG(std::string, job, "",
          "job config (text-format recps.v1.JobConfig); default: "
          "examples/small.textproto");
ABSL_FLAG(int, shards, 2, "shard servers to start");
ABSL_FLAG(int, workers, 2, "workers to start (data parallel, Gloo allreduce)");
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
ABSL_FLAG(absl::Duration, start_timeout, absl::Seconds(60),
          "how long servers may take to start");

namespace recps::client {
namespace {

std::string FindBinary(const std::string& name) {
  std::vector<std::string> dirs;
  if (const std::string d = absl::GetFlag(FLAGS_bin_dir); !d.empty()) dirs.push_back(d);
  const std::string self = SelfDirectory();
  dirs.push_back(self);
  dirs.push_back(self + "/../server");
  dirs.push_back(self + "/../worker");
  for (const std::string& d : dirs) {
    const std::string path = d + "/" + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

std::string DefaultJob() {
  for (const std::string& p :
       {std::string("examples/small.textproto"),
        SelfDirectory() + "/../../examples/small.textproto"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "examples/small.textproto";
}

std::string Tail(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  const size_t from = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + from, all.end(), "\n");
}

// Waits for a child's port file; fails if the child exits first.
absl::StatusOr<int> WaitForPort(ChildProcess& child, const std::string& port_file,
                                const std::string& log) {
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_start_timeout);
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) return port;
    if (child.Poll().ok()) {
      return absl::InternalError(absl::StrCat(child.name(), " exited during start-up:\n",
                                              Tail(log, 20)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(child.name(), " did not start; see ", log));
}

// Waits until `server` has a shard map (the coordinator pushes it once every
// shard has registered).
absl::Status WaitForShardMap(const std::string& server) {
  auto stub = v1::ShardAdmin::NewStub(
      grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_start_timeout);
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
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

int RunLocal() {
  const int num_shards = absl::GetFlag(FLAGS_shards);
  const int num_workers = absl::GetFlag(FLAGS_workers);
  if (num_shards < 1 || num_workers < 1) {
    LogError("--shards and --workers must be >= 1");
    return 2;
  }
  std::string job_path = absl::GetFlag(FLAGS_job);
  if (job_path.empty()) job_path = DefaultJob();
  absl::StatusOr<v1::JobConfig> job = worker::ReadJobConfig(job_path);
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

  const std::string coordinator_bin = FindBinary("recps-coordinator");
  const std::string shard_bin = FindBinary("recps-shard");
  const std::string worker_bin = FindBinary("recps-worker");
  if (coordinator_bin.empty() || shard_bin.empty() || worker_bin.empty()) {
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
  LogInfo("local cluster: 1 coordinator, ", num_shards, " shard server(s), ",
          num_workers, " worker(s); logs in ", work);

  // Children stop in reverse order of start when this vector is destroyed;
  // workers are stopped explicitly first.
  std::vector<ChildProcess> servers;
  auto fail = [&](const absl::Status& s) {
    LogError(s.message());
    LogError("logs are in ", work);
    return 1;
  };
  const std::string coord_log = work + "/coordinator.log";
  absl::StatusOr<ChildProcess> coordinator = ChildProcess::Spawn(
      coordinator_bin,
      {"--state_dir=" + work + "/coordinator", "--job=" + job_copy,
       absl::StrCat("--num_shards=", num_shards), "--listen=127.0.0.1:0",
       "--port_file=" + work + "/coordinator.ports"},
      coord_log);
  if (!coordinator.ok()) return fail(coordinator.status());
  servers.push_back(*std::move(coordinator));
  absl::StatusOr<int> coord_port =
      WaitForPort(servers.back(), work + "/coordinator.ports", coord_log);
  if (!coord_port.ok()) return fail(coord_port.status());

  std::vector<std::string> shard_addresses;
  for (int i = 0; i < num_shards; ++i) {
    const std::string log = absl::StrCat(work, "/shard", i, ".log");
    const std::string ports = absl::StrCat(work, "/shard", i, ".ports");
    absl::StatusOr<ChildProcess> shard = ChildProcess::Spawn(
        shard_bin,
        {"--job=" + job_copy, absl::StrCat("--world_size=", num_workers),
         absl::StrCat("--coordinator=127.0.0.1:", *coord_port),
         "--listen=127.0.0.1:0", "--port_file=" + ports},
        log);
    if (!shard.ok()) return fail(shard.status());
    servers.push_back(*std::move(shard));
    absl::StatusOr<int> port = WaitForPort(servers.back(), ports, log);
    if (!port.ok()) return fail(port.status());
    shard_addresses.push_back(absl::StrCat("127.0.0.1:", *port));
  }
  for (const std::string& s : shard_addresses) {
    if (absl::Status st = WaitForShardMap(s); !st.ok()) return fail(st);
  }

  // Share the cores: each worker gets its part for its own pool and for
  // OpenBLAS (whose threads would otherwise oversubscribe the machine).
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                      num_workers);
  setenv("OPENBLAS_NUM_THREADS", absl::StrCat(threads).c_str(), /*overwrite=*/0);
  std::vector<ChildProcess> workers;
  for (int r = 0; r < num_workers; ++r) {
    absl::StatusOr<ChildProcess> w = ChildProcess::Spawn(
        worker_bin,
        {"--config=" + job_copy, "--shards=" + absl::StrJoin(shard_addresses, ","),
         absl::StrCat("--rank=", r), absl::StrCat("--world_size=", num_workers),
         "--rendezvous_dir=" + work + "/rendezvous", absl::StrCat("--threads=", threads),
         r == 0 ? "--progress_every=2s" : "--progress_every=1000h"});
    if (!w.ok()) return fail(w.status());
    workers.push_back(*std::move(w));
  }

  // Wait for the workers, a failure, or Ctrl-C / SIGTERM.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  int exit_code = 0;
  int remaining = num_workers;
  while (remaining > 0) {
    timespec tick{0, 100 * 1000 * 1000};
    if (sigtimedwait(&stop, nullptr, &tick) > 0) {
      LogWarning("interrupted: stopping the cluster");
      exit_code = 130;
      break;
    }
    for (int r = 0; r < num_workers; ++r) {
      if (!workers[r].running()) continue;
      absl::StatusOr<int> code = workers[r].Poll();
      if (!code.ok()) continue;
      --remaining;
      if (*code != 0) {
        LogError("worker ", r, " failed with exit code ", *code, "; stopping the cluster");
        exit_code = 1;
      }
    }
    if (exit_code != 0) break;
    for (ChildProcess& s : servers) {
      if (s.running() && s.Poll().ok()) {
        LogError(s.name(), " exited unexpectedly; logs in ", work);
        exit_code = 1;
      }
    }
    if (exit_code != 0) break;
  }
  for (ChildProcess& w : workers) {
    if (w.running()) (void)w.Stop(absl::Seconds(5));
  }
  for (auto it = servers.rbegin(); it != servers.rend(); ++it) {
    if (it->running()) (void)it->Stop(absl::Seconds(10));
  }
  if (exit_code == 0) {
    LogInfo("done; logs in ", work);
    if (absl::GetFlag(FLAGS_work_dir).empty()) {
      std::error_code ec;
      std::filesystem::remove_all(work + "/coordinator", ec);
      std::filesystem::remove_all(work + "/rendezvous", ec);
    }
  }
  return exit_code;
}

}  // namespace
}  // namespace recps::client

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "recps launcher.\n"
      "  recps local [--job=FILE] [--shards=N] [--workers=N] "
      "[--consistency=sync|bounded|async] [--steps=N]\n"
      "    start a coordinator, shard servers and workers on 127.0.0.1 and "
      "train the job (default: examples/small.textproto, 2 shards, 2 workers, "
      "sync)");
  // Signals are taken with sigtimedwait; block them before any thread starts.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  recps::SetLogTag("recps");
  if (args.size() < 2 || std::string(args[1]) != "local") {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  return recps::client::RunLocal();
}
