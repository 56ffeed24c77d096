// `recps local --in_process` end to end, through the real binaries: each
// worker embeds its shard server (recps-worker --embedded_shard) and reaches
// it without gRPC. Sync mode on deterministic synthetic data with 1 and 2
// workers must end with the same final tables (every row of the final
// checkpoint, by key), dense state and per-step losses, bit for bit, as the
// same job with separate shard servers (as many as workers). A worker killed
// mid-run takes its shard's rows with it: with --max_restarts the job
// restarts from its newest checkpoint and still ends bit-identical. With
// --one_process the two workers are threads of one recps-worker around one
// embedded shard server, and end as the two processes do.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/launcher/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/local_run.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/metrics_scrape.h"

namespace recps {
namespace {

using ::recps::testing::Eventually;
using ::recps::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kSteps = 300;
constexpr int kEvery = 20;

using ::recps::testing::ReadAll;
using Outcome = ::recps::testing::RunOutcome;

std::string Dir(const std::string& root, int64_t step) {
  return ::recps::testing::CheckpointDir(root, step);
}

// The shared small job (tests/testing/local_run.h) with Adagrad tables,
// plaintext; Start picks the worker count and the transport.
struct LocalRun : ::recps::testing::LocalRun {
  LocalRun() : ::recps::testing::LocalRun({"in_process_e2e", kSteps, kEvery, "ADAGRAD"}) {
    insecure = true;
  }
  absl::StatusOr<client::ChildProcess> Start(int num_workers, bool in_process,
                                             std::vector<std::string> extra = {}) {
    workers = num_workers;
    if (in_process) extra.insert(extra.begin(), "--in_process");
    return ::recps::testing::LocalRun::Start(num_workers, std::move(extra));
  }
  // recps local --in_process --one_process: every worker a thread of one
  // process, one shard server inside it.
  absl::StatusOr<client::ChildProcess> StartOneProcess(int num_workers,
                                                       std::vector<std::string> extra = {}) {
    workers = num_workers;
    extra.insert(extra.begin(), {"--in_process", "--one_process"});
    return ::recps::testing::LocalRun::Start(1, std::move(extra));
  }
};

Outcome Collect(const LocalRun& run, int workers) {
  EXPECT_EQ(run.workers, workers);
  return ::recps::testing::CollectOutcome(run);
}
void ExpectSame(const Outcome& reference, const Outcome& got) {
  ::recps::testing::ExpectSameOutcome(reference, got, kSteps);
}

Outcome RunToEnd(LocalRun& run, int workers, bool in_process) {
  absl::StatusOr<client::ChildProcess> p = run.Start(workers, in_process);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {};
  absl::StatusOr<int> code = p->Wait(absl::Seconds(240));
  EXPECT_TRUE(code.ok() && *code == 0) << ReadAll(run.log);
  return Collect(run, workers);
}

class InProcessE2e : public ::testing::TestWithParam<int> {};

TEST_P(InProcessE2e, SameAsSeparateShardServersBitIdentical) {
  const int workers = GetParam();
  LocalRun separate, embedded;
  const Outcome reference = RunToEnd(separate, workers, /*in_process=*/false);
  const Outcome got = RunToEnd(embedded, workers, /*in_process=*/true);
  ExpectSame(reference, got);
  const std::string log = ReadAll(embedded.log);
  EXPECT_THAT(log, HasSubstr("one inside each worker, --in_process"));
  EXPECT_THAT(log, HasSubstr("this worker reaches it in process"));
  // Embedded shards: the lookups are CPU work on the worker's own cores.
  EXPECT_THAT(log, HasSubstr("sync prefetch off (--sync_prefetch=auto)"));
}

INSTANTIATE_TEST_SUITE_P(Workers, InProcessE2e, ::testing::Values(1, 2),
                         [](const auto& info) { return absl::StrCat("W", info.param); });

// Two workers as threads of one process around one embedded shard server:
// the same ranks, batches, allreduce and synchronous steps as two
// processes with a shard server each, so the same result bit for bit.
TEST(OneProcessE2e, SameAsTwoProcessesBitIdentical) {
  LocalRun processes, threads;
  const Outcome reference = RunToEnd(processes, 2, /*in_process=*/true);
  absl::StatusOr<client::ChildProcess> p = threads.StartOneProcess(2);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<int> code = p->Wait(absl::Seconds(240));
  ASSERT_TRUE(code.ok()) << code.status();
  const std::string log = ReadAll(threads.log);
  EXPECT_EQ(*code, 0) << log;
  ExpectSame(reference, Collect(threads, 2));
  EXPECT_THAT(log, HasSubstr("1 shard server(s) (inside the workers' process, "
                             "--one_process), 2 worker(s) as threads of one process"));
  EXPECT_GT(threads.PidOf("workers 0-1"), 0) << ReadAll(threads.work + "/pids");
  EXPECT_THAT(log, HasSubstr("recps-worker 1] done: 300 steps"));
}

// The ranks of one process share its /metrics endpoint and tell their
// series apart by a rank label.
TEST(OneProcessE2e, MetricsCarryTheRank) {
  LocalRun run;
  const std::string ports = run.dir->path() + "/worker.ports";
  const std::string log = run.dir->path() + "/worker.log";
  absl::StatusOr<client::ChildProcess> p = client::ChildProcess::Spawn(
      RECPS_WORKER_BINARY,
      {"--config=" + run.job, "--embedded_shard", "--insecure", "--world_size=2",
       "--local_ranks=2", "--rendezvous_dir=" + run.dir->path() + "/rendezvous",
       "--steps=1000000", "--threads=1", "--progress_every=1000h",
       "--metrics_listen=127.0.0.1:0", "--port_file=" + ports},
      log);
  ASSERT_TRUE(p.ok()) << p.status();
  std::string text;
  EXPECT_TRUE(Eventually(
      [&] {
        int grpc = 0, metrics = 0;
        std::ifstream(ports) >> grpc >> metrics;
        text = metrics > 0 ? ::recps::testing::ScrapeMetrics(metrics) : "";
        return ::recps::testing::MetricValue(text, "recps_worker_steps_total{rank=\"0\"}") > 0 &&
               ::recps::testing::MetricValue(text, "recps_worker_steps_total{rank=\"1\"}") > 0;
      },
      absl::Seconds(60)))
      << text << ReadAll(log);
  EXPECT_THAT(text, HasSubstr("phase=\"lookup\",rank=\"1\""));
  p->Signal(SIGKILL);
  ASSERT_TRUE(p->Wait(absl::Seconds(30)).ok());
}

// How the two workers of a restart test run: one process each, or as
// threads of one process (--one_process).
enum class Form { kProcesses, kOneProcess };

absl::StatusOr<client::ChildProcess> StartForm(LocalRun& run, Form form,
                                               std::vector<std::string> extra = {}) {
  return form == Form::kOneProcess ? run.StartOneProcess(2, std::move(extra))
                                   : run.Start(2, /*in_process=*/true, std::move(extra));
}

class InProcessE2eRestart : public ::testing::TestWithParam<Form> {};

// A worker dies (with --one_process: the process of both): its embedded
// shard's rows are gone, so the launcher restarts the whole job from the
// newest checkpoint, which ends as an uninterrupted run.
TEST_P(InProcessE2eRestart, KilledWorkerRestartsFromCheckpointBitIdentical) {
  LocalRun reference_run, run;
  const Outcome reference = RunToEnd(reference_run, 2, /*in_process=*/true);
  absl::StatusOr<client::ChildProcess> p = StartForm(run, GetParam(), {"--max_restarts=1"});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(Eventually(
      [&] {
        return std::filesystem::exists(Dir(run.checkpoints, 2 * kEvery) + "/MANIFEST") &&
               run.LossLines() >= 2 * kEvery + kEvery / 2;
      },
      absl::Seconds(120)))
      << ReadAll(run.log);
  const pid_t pid = run.PidOf(GetParam() == Form::kOneProcess ? "workers 0-1" : "worker 1");
  ASSERT_GT(pid, 0) << ReadAll(run.work + "/pids");
  ASSERT_LT(run.LossLines(), kSteps) << "the run ended before the kill";
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  absl::StatusOr<int> code = p->Wait(absl::Seconds(240));
  ASSERT_TRUE(code.ok()) << code.status();
  const std::string log = ReadAll(run.log);
  EXPECT_EQ(*code, 0) << log;
  EXPECT_THAT(log, HasSubstr("restart 1/1 after"));
  EXPECT_THAT(log, HasSubstr("resuming from step"));
  ExpectSame(reference, Collect(run, 2));
}

// SIGTERM to the launcher (pre-emption): the workers checkpoint (their
// embedded servers save their rows) and exit; `recps local --in_process
// --resume` finishes the job as an uninterrupted run.
TEST_P(InProcessE2eRestart, PreemptedThenResumedBitIdentical) {
  LocalRun reference_run, run;
  const Outcome reference = RunToEnd(reference_run, 2, /*in_process=*/true);
  {
    absl::StatusOr<client::ChildProcess> p = StartForm(run, GetParam());
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(Eventually([&] { return run.LossLines() >= kEvery + kEvery / 2; },
                           absl::Seconds(120)))
        << ReadAll(run.log);
    ASSERT_LT(run.LossLines(), kSteps) << "the run ended before the signal";
    p->Signal(SIGTERM);
    absl::StatusOr<int> code = p->Wait(absl::Seconds(120));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 128 + SIGTERM) << ReadAll(run.log);
  }
  EXPECT_THAT(ReadAll(run.log), HasSubstr("pre-empted: checkpoint at step"));
  ASSERT_FALSE(std::filesystem::exists(Dir(run.checkpoints, kSteps)));
  absl::StatusOr<client::ChildProcess> p = StartForm(run, GetParam(), {"--resume"});
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<int> code = p->Wait(absl::Seconds(240));
  ASSERT_TRUE(code.ok()) << code.status();
  const std::string log = ReadAll(run.log);
  EXPECT_EQ(*code, 0) << log;
  EXPECT_THAT(log, HasSubstr("--resume: resuming from the checkpoint at step"));
  ExpectSame(reference, Collect(run, 2));
}

INSTANTIATE_TEST_SUITE_P(Forms, InProcessE2eRestart,
                         ::testing::Values(Form::kProcesses, Form::kOneProcess),
                         [](const auto& info) {
                           return info.param == Form::kOneProcess ? "OneProcess" : "Processes";
                         });

// The embedded servers register like recps-shard: `recpsctl status` lists
// them as alive shard servers with their rows while the job trains.
TEST(InProcessE2eStatus, RecpsctlStatusListsTheEmbeddedServers) {
  LocalRun run;
  absl::StatusOr<client::ChildProcess> p = run.Start(2, true, {"--steps=100000"});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(Eventually([&] { return run.LossLines() >= 5; }, absl::Seconds(120)))
      << ReadAll(run.log);
  int port = 0;
  {
    std::ifstream ports(run.work + "/coordinator.ports");
    ports >> port;
  }
  ASSERT_GT(port, 0);
  const std::string out = run.dir->path() + "/status.txt";
  std::string status;
  // Poll: the servers' first Stats may not have rows yet.
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<int> code = testing::RunProcess(
            "/bin/sh",
            {"-c", absl::StrCat(RECPSCTL_BINARY, " --insecure --coordinator=127.0.0.1:", port,
                                " status > ", out, " 2>&1")},
            absl::Seconds(30));
        status = ReadAll(out);
        return code.ok() && *code == 0 && absl::StrContains(status, "shard-0") &&
               absl::StrContains(status, "shard-1") &&
               absl::StrContains(status, "4 alive");
      },
      absl::Seconds(60)))
      << status;
  p->Signal(SIGTERM);
  absl::StatusOr<int> code = p->Wait(absl::Seconds(120));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 128 + SIGTERM) << ReadAll(run.log);
}

// recps-worker --embedded_shard without a coordinator: one worker serving
// every slot alone, trained to the end; with --world_size=2 it is refused
// (its peers could not find the shard server), as is an unknown
// --sync_prefetch value.
TEST(InProcessE2eFlags, WorkerAloneWithItsShardServer) {
  LocalRun run;
  const std::string log = run.dir->path() + "/worker.log";
  absl::StatusOr<client::ChildProcess> p = client::ChildProcess::Spawn(
      RECPS_WORKER_BINARY,
      {"--config=" + run.job, "--embedded_shard", "--insecure", "--steps=20",
       "--threads=1", "--progress_every=1000h"},
      log);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<int> code = p->Wait(absl::Seconds(120));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << ReadAll(log);
  EXPECT_THAT(ReadAll(log), HasSubstr("this worker reaches it in process"));
  EXPECT_THAT(ReadAll(log), HasSubstr("done: 20 steps"));
  // Its lookups are CPU work on its own cores: no overlapped read by default.
  EXPECT_THAT(ReadAll(log), HasSubstr("sync prefetch off (--sync_prefetch=auto)"));

  // Refused at start with exit code 2 and the reason.
  auto expect_refused = [&](const std::string& name, std::vector<std::string> args,
                            const std::string& reason) {
    const std::string refused_log = run.dir->path() + "/" + name + ".log";
    args.insert(args.begin(), {"--config=" + run.job, "--embedded_shard", "--insecure"});
    absl::StatusOr<client::ChildProcess> refused =
        client::ChildProcess::Spawn(RECPS_WORKER_BINARY, args, refused_log);
    ASSERT_TRUE(refused.ok()) << refused.status();
    absl::StatusOr<int> exit_code = refused->Wait(absl::Seconds(60));
    ASSERT_TRUE(exit_code.ok()) << exit_code.status();
    EXPECT_EQ(*exit_code, 2) << name;
    EXPECT_THAT(ReadAll(refused_log), HasSubstr(reason)) << name;
  };
  expect_refused("world_size",
                 {"--world_size=2", "--rank=0", "--rendezvous_dir=" + run.dir->path()},
                 "it needs --world_size=1 (or all ranks in this process, --local_ranks) "
                 "and no --shards");
  expect_refused("sync_prefetch", {"--sync_prefetch=maybe"},
                 "--sync_prefetch=maybe: expected true, false or auto");
  // --local_ranks: a count of ranks inside the world, each writing its own
  // files.
  const std::string rendezvous = "--rendezvous_dir=" + run.dir->path() + "/rendezvous";
  expect_refused("local_ranks", {"--local_ranks=0"}, "--local_ranks=0: must be >= 1");
  expect_refused("ranks_outside", {"--world_size=2", "--rank=1", "--local_ranks=2", rendezvous},
                 "ranks 1..2 (--local_ranks=2) are outside [0, 2)");
  expect_refused("rank_paths",
                 {"--world_size=2", "--local_ranks=2", rendezvous,
                  "--result_json=" + run.dir->path() + "/result.json"},
                 "with --local_ranks=2 the path needs {rank}");
}

// --in_process needs one shard server per worker; --one_process one in
// all, and --in_process.
TEST(InProcessE2eFlags, OtherShardCountsAreRefused) {
  auto expect_refused = [](std::vector<std::string> flags, const std::string& reason) {
    TempDir dir;
    flags.insert(flags.begin(), {"local", "--workers=2", "--insecure",
                                 "--work_dir=" + dir.path() + "/work"});
    absl::StatusOr<client::ChildProcess> p =
        client::ChildProcess::Spawn(RECPS_LAUNCHER_BINARY, flags, dir.path() + "/log");
    ASSERT_TRUE(p.ok()) << p.status();
    absl::StatusOr<int> code = p->Wait(absl::Seconds(30));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 2) << reason;
    EXPECT_THAT(ReadAll(dir.path() + "/log"), HasSubstr(reason));
  };
  expect_refused({"--in_process", "--shards=3"}, "--shards=3 must equal --workers=2");
  expect_refused({"--in_process", "--one_process", "--shards=2"}, "--shards=2 must be 1");
  expect_refused({"--one_process"}, "--one_process runs the workers around an embedded "
                                    "shard server: it needs --in_process");
}

}  // namespace
}  // namespace recps
