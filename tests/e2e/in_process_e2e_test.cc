// `recps local --in_process` end to end, through the real binaries: each
// worker embeds its shard server (recps-worker --embedded_shard) and reaches
// it without gRPC. Sync mode on deterministic synthetic data with 1 and 2
// workers must end with the same final tables (every row of the final
// checkpoint, by key), dense state and per-step losses, bit for bit, as the
// same job with separate shard servers (as many as workers). A worker killed
// mid-run takes its shard's rows with it: with --max_restarts the job
// restarts from its newest checkpoint and still ends bit-identical.
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
#include "recps/v1/checkpoint.pb.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_reader.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::recps::testing::Eventually;
using ::recps::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kSteps = 300;
constexpr int kEvery = 20;

std::string ReadAll(const std::string& path) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

// 4 tables of 16 floats (one dynamic), batch 64, checkpoints every kEvery
// steps into `checkpoint_dir`.
std::string WriteJob(const TempDir& dir, const std::string& checkpoint_dir) {
  std::string tables, features;
  for (int t = 0; t < 4; ++t) {
    absl::StrAppend(&tables, "tables { name: \"t", t,
                    "\" dim: 16 optimizer { kind: ADAGRAD learning_rate: 0.05 } }\n");
    absl::StrAppend(&features, "features { name: \"f", t, "\" table: \"t", t,
                    "\" pooling: SUM }\n");
  }
  return dir.WriteFile(
      "job.textproto",
      absl::StrCat(
          "name: \"in_process_e2e\"\n", tables, features,
          "model { bottom_mlp: [16, 16] top_mlp: [16, 1] }\n"
          "training {\n  batch_size: 64\n  steps: ", kSteps, "\n",
          "  dense_optimizer { kind: ADAM learning_rate: 0.001 }\n"
          "  consistency { mode: SYNC }\n  eval_interval: 0\n  eval_batches: 2\n"
          "  seed: 7\n  checkpoint { dir: \"", checkpoint_dir, "\" every_steps: ", kEvery,
          " keep_last: 2 }\n}\n"
          "data { synthetic { seed: 11 num_dense: 13\n"
          "  features { id_space: 5000 zipf_exponent: 1.05 min_ids_per_bag: 1 max_ids_per_bag: 2 }\n"
          "  features { id_space: 500 zipf_exponent: 1.05 min_ids_per_bag: 1 max_ids_per_bag: 1 }\n"
          "  features { id_space: 20000 zipf_exponent: 1.1 min_ids_per_bag: 1 max_ids_per_bag: 3 }\n"
          "  features { id_space: 50 zipf_exponent: 0.8 min_ids_per_bag: 1 max_ids_per_bag: 1 }\n"
          "} }\n"));
}

struct LocalRun {
  std::unique_ptr<TempDir> dir = std::make_unique<TempDir>();
  std::string checkpoints = dir->path() + "/ckpt";
  std::string job = WriteJob(*dir, checkpoints);
  std::string work = dir->path() + "/work";
  std::string log = dir->path() + "/recps.log";

  absl::StatusOr<client::ChildProcess> Start(int workers, bool in_process,
                                             std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {"local", "--job=" + job, "--work_dir=" + work,
                                     absl::StrCat("--workers=", workers), "--insecure"};
    if (in_process) {
      args.push_back("--in_process");
    } else {
      args.push_back(absl::StrCat("--shards=", workers));
    }
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--");
    args.push_back("--threads=1");
    args.push_back("--progress_every=1000h");
    args.push_back("--loss_log=" + dir->path() + "/loss{rank}.log");
    return client::ChildProcess::Spawn(RECPS_LAUNCHER_BINARY, args, log);
  }
  int LossLines() const {
    const std::string text = ReadAll(dir->path() + "/loss0.log");
    return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  }
  pid_t PidOf(const std::string& name) const {
    for (absl::string_view line : absl::StrSplit(ReadAll(work + "/pids"), '\n')) {
      if (!absl::StartsWith(line, name + " ")) continue;
      pid_t pid = 0;
      if (absl::SimpleAtoi(line.substr(line.rfind(' ') + 1), &pid)) return pid;
    }
    return 0;
  }
};

struct Outcome {
  std::map<std::string, std::string> rows;  // key -> fused row bytes
  std::string dense;
  std::vector<std::map<int64_t, std::string>> losses;  // per rank
  std::string error;
};

std::string Dir(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%012lld", static_cast<long long>(step));
  return root + "/" + name;
}

Outcome Collect(const LocalRun& run, int workers) {
  Outcome out;
  const std::string final_dir = Dir(run.checkpoints, kSteps);
  EXPECT_TRUE(std::filesystem::exists(final_dir + "/MANIFEST")) << final_dir;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(final_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "dense.pb") {
      v1::DenseState dense;
      EXPECT_TRUE(dense.ParseFromString(ReadAll(entry.path().string())));
      out.dense = dense.parameters() + "|" + dense.optimizer_state() + "|" +
                  std::to_string(dense.optimizer_steps());
      continue;
    }
    if (entry.path().extension() != ".sst") continue;
    rocksdb::Options options;
    rocksdb::SstFileReader reader(options);
    EXPECT_TRUE(reader.Open(entry.path().string()).ok()) << name;
    std::unique_ptr<rocksdb::Iterator> it(reader.NewIterator(rocksdb::ReadOptions()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const std::string key = it->key().ToString();
      if (!key.empty() && key[0] == '\0') continue;  // the file's header
      out.rows[key] = it->value().ToString();
    }
  }
  out.losses.resize(workers);
  for (int rank = 0; rank < workers; ++rank) {
    for (absl::string_view line :
         absl::StrSplit(ReadAll(absl::StrCat(run.dir->path(), "/loss", rank, ".log")), '\n',
                        absl::SkipEmpty())) {
      const std::vector<std::string> f = absl::StrSplit(line, ' ');
      int64_t step = 0;
      if (f.size() != 2 || !absl::SimpleAtoi(f[0], &step)) continue;
      auto [it, fresh] = out.losses[rank].emplace(step, f[1]);
      if (!fresh && it->second != f[1] && out.error.empty()) {
        out.error = absl::StrCat("rank ", rank, " step ", step, ": loss ", it->second,
                                 " before the restart, ", f[1], " after");
      }
    }
  }
  return out;
}

void ExpectSame(const Outcome& reference, const Outcome& got) {
  EXPECT_EQ(got.error, "");
  EXPECT_FALSE(reference.rows.empty());
  EXPECT_EQ(reference.rows.size(), got.rows.size());
  EXPECT_TRUE(reference.rows == got.rows) << "the final tables differ";
  EXPECT_FALSE(reference.dense.empty());
  EXPECT_TRUE(reference.dense == got.dense) << "the final dense state differs";
  ASSERT_EQ(reference.losses.size(), got.losses.size());
  for (size_t rank = 0; rank < reference.losses.size(); ++rank) {
    EXPECT_EQ(reference.losses[rank].size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(reference.losses[rank], got.losses[rank]) << "rank " << rank << "'s losses";
  }
}

Outcome RunToEnd(const LocalRun& run, int workers, bool in_process) {
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
}

INSTANTIATE_TEST_SUITE_P(Workers, InProcessE2e, ::testing::Values(1, 2),
                         [](const auto& info) { return absl::StrCat("W", info.param); });

// A worker dies: its embedded shard's rows are gone, so the launcher
// restarts the whole job from the newest checkpoint, which ends as an
// uninterrupted run.
TEST(InProcessE2eRestart, KilledWorkerRestartsFromCheckpointBitIdentical) {
  LocalRun reference_run, run;
  const Outcome reference = RunToEnd(reference_run, 2, /*in_process=*/true);
  absl::StatusOr<client::ChildProcess> p = run.Start(2, true, {"--max_restarts=1"});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(Eventually(
      [&] {
        return std::filesystem::exists(Dir(run.checkpoints, 2 * kEvery) + "/MANIFEST") &&
               run.LossLines() >= 2 * kEvery + kEvery / 2;
      },
      absl::Seconds(120)))
      << ReadAll(run.log);
  const pid_t pid = run.PidOf("worker 1");
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
TEST(InProcessE2eRestart, PreemptedThenResumedBitIdentical) {
  LocalRun reference_run, run;
  const Outcome reference = RunToEnd(reference_run, 2, /*in_process=*/true);
  {
    absl::StatusOr<client::ChildProcess> p = run.Start(2, true);
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
  absl::StatusOr<client::ChildProcess> p = run.Start(2, true, {"--resume"});
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<int> code = p->Wait(absl::Seconds(240));
  ASSERT_TRUE(code.ok()) << code.status();
  const std::string log = ReadAll(run.log);
  EXPECT_EQ(*code, 0) << log;
  EXPECT_THAT(log, HasSubstr("--resume: resuming from the checkpoint at step"));
  ExpectSame(reference, Collect(run, 2));
}

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
// (its peers could not find the shard server).
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

  const std::string refused_log = run.dir->path() + "/refused.log";
  absl::StatusOr<client::ChildProcess> refused = client::ChildProcess::Spawn(
      RECPS_WORKER_BINARY,
      {"--config=" + run.job, "--embedded_shard", "--insecure", "--world_size=2",
       "--rank=0", "--rendezvous_dir=" + run.dir->path()},
      refused_log);
  ASSERT_TRUE(refused.ok()) << refused.status();
  code = refused->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(ReadAll(refused_log), HasSubstr("it needs --world_size=1 and no --shards"));
}

// --in_process needs one shard server per worker.
TEST(InProcessE2eFlags, OtherShardCountsAreRefused) {
  TempDir dir;
  absl::StatusOr<client::ChildProcess> p = client::ChildProcess::Spawn(
      RECPS_LAUNCHER_BINARY,
      {"local", "--in_process", "--workers=2", "--shards=3", "--insecure",
       "--work_dir=" + dir.path() + "/work"},
      dir.path() + "/log");
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<int> code = p->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(ReadAll(dir.path() + "/log"),
              HasSubstr("--shards=3 must equal --workers=2"));
}

}  // namespace
}  // namespace recps
