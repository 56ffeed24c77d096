// Checkpoints end to end, through `recps local` and the real binaries (sync
// mode, 2 workers, deterministic synthetic data, small tables):
// - kill -9 a shard server, a worker or the coordinator mid-run with
//   --max_restarts=1: the job restarts from its newest checkpoint and ends
//   with the final tables, dense state and per-step losses bit-identical to
//   an uninterrupted run; with replication a killed shard server fails
//   over instead (no restart), bit-identical too;
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
#include "tests/testing/local_run.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::recps::testing::Eventually;
using ::recps::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kSteps = 300;
constexpr int kEvery = 20;

using ::recps::testing::CheckpointDir;
using ::recps::testing::ReadAll;
using Outcome = ::recps::testing::RunOutcome;

// The shared small job (tests/testing/local_run.h), ckpt_e2e's steps.
struct CheckpointRun : ::recps::testing::LocalRun {
  CheckpointRun() : LocalRun({"ckpt_e2e", kSteps, kEvery}) {}
};

std::string Dir(const std::string& root, int64_t step) { return CheckpointDir(root, step); }
Outcome Collect(const CheckpointRun& run) { return ::recps::testing::CollectOutcome(run); }
void ExpectSame(const Outcome& reference, const Outcome& got,
                const std::string& read_only_rows_of = "") {
  ::recps::testing::ExpectSameOutcome(reference, got, kSteps, read_only_rows_of);
}

class CheckpointE2e : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reference_run_ = new CheckpointRun();
    // Run once per build of the binaries, by the suite's first process.
    absl::StatusOr<Outcome> reference =
        ::recps::testing::ReferenceOutcome(*reference_run_, 2, absl::Seconds(180));
    ASSERT_TRUE(reference.ok()) << reference.status();
    reference_ = new Outcome(*std::move(reference));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete reference_run_;
  }

  // What the job does about a kill: restarts from its checkpoint, fails the
  // lost shard server over (replication), or carries on (a coordinator
  // restarted in place).
  enum class Then { kRestarts, kFailsOver, kCarriesOn };
  // Kills `victims` (their names in WORK/pids) once a checkpoint exists and
  // rank 0 trained past it; the job ends as `then` says, bit-identical.

  void KillAndCompare(const std::vector<std::string>& victims, std::vector<std::string> extra,
                      Then then = Then::kRestarts) {
    const bool fails_over = then == Then::kFailsOver;
    ASSERT_NE(reference_, nullptr);
    CheckpointRun run;
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
    std::vector<pid_t> pids;
    for (const std::string& victim : victims) {
      pids.push_back(run.PidOf(victim));
      ASSERT_GT(pids.back(), 0) << ReadAll(run.work + "/pids");
    }
    ASSERT_LT(run.LossLines(), kSteps) << "the run ended before the kill";
    for (const pid_t pid : pids) ASSERT_EQ(kill(pid, SIGKILL), 0);
    absl::StatusOr<int> code = p->Wait(absl::Seconds(180));
    ASSERT_TRUE(code.ok()) << code.status();
    const std::string log = ReadAll(run.log);
    EXPECT_EQ(*code, 0) << log;
    if (then != Then::kRestarts) {
      EXPECT_THAT(log, Not(HasSubstr("restart 1/1 after")));
      EXPECT_THAT(log, Not(HasSubstr("resuming from step")));
    }
    if (fails_over) {
      EXPECT_THAT(log, HasSubstr("its backups take over its rows"));
      EXPECT_THAT(ReadAll(run.work + "/coordinator.log"),
                  HasSubstr("its backups own its rows in shard map epoch"));
    } else if (then == Then::kCarriesOn) {
      EXPECT_THAT(log, HasSubstr("restarted (pid"));
      EXPECT_THAT(ReadAll(run.work + "/coordinator.log"), Not(HasSubstr("failover")));
    } else {
      EXPECT_THAT(log, HasSubstr("restart 1/1 after"));
      EXPECT_THAT(log, HasSubstr("resuming from step"));
    }
    // After a failover the rows the lost primary had only read (step 0's
    // evaluation) are not on the promoted server: they must hold their
    // initial value.
    ExpectSame(*reference_, Collect(run), fails_over ? run.job : "");
  }

  // SIGTERM to the launcher once rank 0 trained past a checkpoint: the
  // workers agree on a step, checkpoint it and exit; then --resume on
  // `resume_shards` shard servers finishes the job.
  void PreemptAndResume(int resume_shards) {
    ASSERT_NE(reference_, nullptr);
    CheckpointRun run;
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

  static CheckpointRun* reference_run_;
  static Outcome* reference_;
};

CheckpointRun* CheckpointE2e::reference_run_ = nullptr;
Outcome* CheckpointE2e::reference_ = nullptr;

TEST_F(CheckpointE2e, KilledShardServerRestartsBitIdentical) {
  KillAndCompare({"shard server 1"}, {});
}

// Replication 2 on the two servers (each backs the other up): a lost shard
// server costs a failover, not a restart. Its lease runs out, the
// coordinator promotes its backup in a new map epoch, the workers retry
// there, and the job ends as without the failure: every loss, row and
// the dense state bit for bit, and no step redone from a checkpoint.
TEST_F(CheckpointE2e, ReplicatedShardServerKilledFailsOverBitIdentical) {
  KillAndCompare({"shard server 1"}, {"--replication=2"}, Then::kFailsOver);
}

// The coordinator of a replicated job dies and is restarted in place: the
// shard servers' leases may lapse meanwhile (they fence themselves, and the
// workers' pushes wait), the restarted coordinator gives every member a
// fresh lease, and the job carries on: no failover, no restart.
TEST_F(CheckpointE2e, ReplicatedJobsCoordinatorRestartedInPlaceCarriesOn) {
  KillAndCompare({"coordinator"}, {"--replication=2"}, Then::kCarriesOn);
}

// The restart that remains with replication (here the coordinator is lost
// too, and not restarted in place): a checkpoint holds each row once (the
// owners'), and the restart restores the backups' copies too and resumes
// their replica clocks at the cut, so the forwards of the steps after it
// are taken and the job ends as without replication.
TEST_F(CheckpointE2e, ReplicatedShardsRestartBitIdentical) {
  KillAndCompare({"coordinator", "shard server 1"},
                 {"--replication=2", "--coordinator_restarts=0"});
}

TEST_F(CheckpointE2e, KilledWorkerRestartsBitIdentical) { KillAndCompare({"worker 1"}, {}); }

TEST_F(CheckpointE2e, KilledCoordinatorRestartsBitIdentical) {
  // No in-place coordinator restart: the whole job restarts from the
  // checkpoint (with in-place restarts the job would simply carry on).
  KillAndCompare({"coordinator"}, {"--coordinator_restarts=0"});
}

TEST_F(CheckpointE2e, PreemptedThenResumedBitIdentical) { PreemptAndResume(2); }

TEST_F(CheckpointE2e, SavedOnTwoShardsResumedOnOne) { PreemptAndResume(1); }

TEST_F(CheckpointE2e, SavedOnTwoShardsResumedOnThree) { PreemptAndResume(3); }

}  // namespace
}  // namespace recps
