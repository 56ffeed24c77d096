// Checkpoints end to end, through `recps local` and the real binaries (sync
// mode, 2 workers, deterministic synthetic data, small tables):
// - kill -9 a shard server, a worker or the coordinator mid-run with
//   --max_restarts=1: the job restarts from its newest checkpoint and ends
//   with the final tables, dense state and per-step losses bit-identical to
//   an uninterrupted run;
// - SIGTERM to the launcher (pre-emption): the workers checkpoint and exit;
//   `recps local --resume` on 2, 1 or 3 shard servers continues
//   bit-identically.
// The final checkpoint (reason "final") is compared: every row of every row
// file by key (table, slot, id), so the shard count does not matter, and the
// dense state. Every process a test starts is stopped (the launcher stops its
// children; they die with it).
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

// The small example, smaller: 4 tables of 16 floats, batch 64, checkpoints
// every kEvery steps into `checkpoint_dir`.
std::string WriteJob(const TempDir& dir, const std::string& checkpoint_dir) {
  std::string tables, features;
  for (int t = 0; t < 4; ++t) {
    absl::StrAppend(&tables, "tables { name: \"t", t,
                    "\" dim: 16 optimizer { kind: ROWWISE_ADAGRAD learning_rate: 0.05 } }\n");
    absl::StrAppend(&features, "features { name: \"f", t, "\" table: \"t", t,
                    "\" pooling: SUM }\n");
  }
  return dir.WriteFile(
      "job.textproto",
      absl::StrCat(
          "name: \"ckpt_e2e\"\n", tables, features,
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

// One `recps local` run of the job.
struct LocalRun {
  std::unique_ptr<TempDir> dir = std::make_unique<TempDir>();
  std::string checkpoints = dir->path() + "/ckpt";
  std::string job = WriteJob(*dir, checkpoints);
  std::string work = dir->path() + "/work";
  std::string log = dir->path() + "/recps.log";

  absl::StatusOr<client::ChildProcess> Start(int shards, std::vector<std::string> extra) const {
    std::vector<std::string> args = {"local", "--job=" + job, "--work_dir=" + work,
                                     absl::StrCat("--shards=", shards), "--workers=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--");
    args.push_back("--threads=1");
    args.push_back("--progress_every=1000h");
    args.push_back("--loss_log=" + dir->path() + "/loss{rank}.log");
    return client::ChildProcess::Spawn(RECPS_LAUNCHER_BINARY, args, log);
  }
  // Lines of rank 0's loss log so far.
  int LossLines() const {
    const std::string text = ReadAll(dir->path() + "/loss0.log");
    return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  }
  // The pid of the child whose line in WORK/pids starts with `name`.
  pid_t PidOf(const std::string& name) const {
    for (absl::string_view line : absl::StrSplit(ReadAll(work + "/pids"), '\n')) {
      if (!absl::StartsWith(line, name + " ")) continue;
      pid_t pid = 0;
      if (absl::SimpleAtoi(line.substr(line.rfind(' ') + 1), &pid)) return pid;
    }
    return 0;
  }
};

// Everything compared between runs.
struct Outcome {
  std::map<std::string, std::string> rows;  // key -> fused row bytes
  std::string dense;                        // DenseState, serialized
  std::map<int64_t, std::string> losses[2];  // per rank: step -> loss text
  std::string error;                         // a replayed step that differed
};

std::string Dir(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%012lld", static_cast<long long>(step));
  return root + "/" + name;
}

Outcome Collect(const LocalRun& run) {
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
  for (int rank = 0; rank < 2; ++rank) {
    for (absl::string_view line :
         absl::StrSplit(ReadAll(absl::StrCat(run.dir->path(), "/loss", rank, ".log")), '\n',
                        absl::SkipEmpty())) {
      const std::vector<std::string> f = absl::StrSplit(line, ' ');
      int64_t step = 0;
      if (f.size() != 2 || !absl::SimpleAtoi(f[0], &step)) continue;
      auto [it, fresh] = out.losses[rank].emplace(step, f[1]);
      // A step trained again after a restart must give the same loss.
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
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(reference.losses[rank].size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(reference.losses[rank], got.losses[rank]) << "rank " << rank << "'s losses";
  }
}

class CheckpointE2e : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reference_run_ = new LocalRun();
    absl::StatusOr<client::ChildProcess> p = reference_run_->Start(2, {});
    ASSERT_TRUE(p.ok()) << p.status();
    absl::StatusOr<int> code = p->Wait(absl::Seconds(180));
    ASSERT_TRUE(code.ok() && *code == 0) << ReadAll(reference_run_->log);
    reference_ = new Outcome(Collect(*reference_run_));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete reference_run_;
  }

  // Kills `victim` (its name in WORK/pids) once a checkpoint exists and rank
  // 0 trained past it; the launcher restarts the job from that checkpoint.
  void KillAndCompare(const std::string& victim, std::vector<std::string> extra) {
    ASSERT_NE(reference_, nullptr);
    LocalRun run;
    extra.push_back("--max_restarts=1");
    absl::StatusOr<client::ChildProcess> p = run.Start(2, extra);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(Eventually(
        [&] {
          return std::filesystem::exists(Dir(run.checkpoints, 2 * kEvery) + "/MANIFEST") &&
                 run.LossLines() >= 2 * kEvery + kEvery / 2;
        },
        absl::Seconds(120)))
        << ReadAll(run.log);
    const pid_t pid = run.PidOf(victim);
    ASSERT_GT(pid, 0) << ReadAll(run.work + "/pids");
    ASSERT_LT(run.LossLines(), kSteps) << "the run ended before the kill";
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    absl::StatusOr<int> code = p->Wait(absl::Seconds(180));
    ASSERT_TRUE(code.ok()) << code.status();
    const std::string log = ReadAll(run.log);
    EXPECT_EQ(*code, 0) << log;
    EXPECT_THAT(log, HasSubstr("restart 1/1 after"));
    EXPECT_THAT(log, HasSubstr("resuming from step"));
    ExpectSame(*reference_, Collect(run));
  }

  // SIGTERM to the launcher once rank 0 trained past a checkpoint: the
  // workers agree on a step, checkpoint it and exit; then --resume on
  // `resume_shards` shard servers finishes the job.
  void PreemptAndResume(int resume_shards) {
    ASSERT_NE(reference_, nullptr);
    LocalRun run;
    {
      absl::StatusOr<client::ChildProcess> p = run.Start(2, {});
      ASSERT_TRUE(p.ok()) << p.status();
      ASSERT_TRUE(Eventually([&] { return run.LossLines() >= kEvery + kEvery / 2; },
                             absl::Seconds(120)))
          << ReadAll(run.log);
      ASSERT_LT(run.LossLines(), kSteps) << "the run ended before the signal";
      p->Signal(SIGTERM);
      absl::StatusOr<int> code = p->Wait(absl::Seconds(120));
      ASSERT_TRUE(code.ok()) << code.status();
      EXPECT_EQ(*code, 128 + SIGTERM);
    }
    const std::string work_logs = ReadAll(run.log);
    EXPECT_THAT(work_logs, HasSubstr("pre-empted: checkpoint at step"));
    ASSERT_FALSE(std::filesystem::exists(Dir(run.checkpoints, kSteps)));
    absl::StatusOr<client::ChildProcess> p = run.Start(resume_shards, {"--resume"});
    ASSERT_TRUE(p.ok()) << p.status();
    absl::StatusOr<int> code = p->Wait(absl::Seconds(180));
    ASSERT_TRUE(code.ok()) << code.status();
    const std::string log = ReadAll(run.log);
    EXPECT_EQ(*code, 0) << log;
    EXPECT_THAT(log, HasSubstr("--resume: resuming from the checkpoint at step"));
    ExpectSame(*reference_, Collect(run));
  }

  static LocalRun* reference_run_;
  static Outcome* reference_;
};

LocalRun* CheckpointE2e::reference_run_ = nullptr;
Outcome* CheckpointE2e::reference_ = nullptr;

TEST_F(CheckpointE2e, KilledShardServerRestartsBitIdentical) {
  KillAndCompare("shard server 1", {});
}

TEST_F(CheckpointE2e, KilledWorkerRestartsBitIdentical) { KillAndCompare("worker 1", {}); }

TEST_F(CheckpointE2e, KilledCoordinatorRestartsBitIdentical) {
  // No in-place coordinator restart: the whole job restarts from the
  // checkpoint (with in-place restarts the job would simply carry on).
  KillAndCompare("coordinator", {"--coordinator_restarts=0"});
}

TEST_F(CheckpointE2e, PreemptedThenResumedBitIdentical) { PreemptAndResume(2); }

TEST_F(CheckpointE2e, SavedOnTwoShardsResumedOnOne) { PreemptAndResume(1); }

TEST_F(CheckpointE2e, SavedOnTwoShardsResumedOnThree) { PreemptAndResume(3); }

}  // namespace
}  // namespace recps
