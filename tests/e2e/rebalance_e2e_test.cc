// Live rebalancing end to end, through `recps local`, recpsctl and the real
// binaries (sync mode, 2 workers, deterministic synthetic data, small
// tables). Each run moves slots while the job trains and must end with the
// final tables, dense state and per-step losses bit-identical to a run
// without any move (compared through the final checkpoint, as
// checkpoint_e2e_test.cc does):
// - a third of the slots moved in the middle (ApplyRebalance with a plan
//   written by the test);
// - a third shard server started mid-run and `recpsctl rebalance --apply`;
// - `recpsctl drain` of one of three servers;
// - kill -9 of the target, of the coordinator and of the source during a
//   copy (slowed by a bandwidth limit): the move rolls back (or the job
//   restarts from its last checkpoint), and afterwards `recpsctl status
//   --json` shows every slot with exactly one owner that answers.
// Every process a test starts is stopped (the launcher stops its children).
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "client/launcher/process.h"
#include "common/rpc/channels.h"
#include "common/wire/shard_map.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "recps/v1/admin.pb.h"
#include "recps/v1/checkpoint.pb.h"
#include "tests/testing/local_run.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::recps::testing::Eventually;
using ::recps::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kSteps = 3000;
constexpr int kEvery = 500;

using ::recps::testing::CheckpointDir;
using ::recps::testing::ReadAll;
using Outcome = ::recps::testing::RunOutcome;

// The shared small job (tests/testing/local_run.h), rebalance_e2e's steps.
struct RebalanceRun : ::recps::testing::LocalRun {
  RebalanceRun() : LocalRun({"rebalance_e2e", kSteps, kEvery}) {}
};

std::string Dir(const std::string& root, int64_t step) { return CheckpointDir(root, step); }
Outcome Collect(const RebalanceRun& run) { return ::recps::testing::CollectOutcome(run); }
void ExpectSame(const Outcome& reference, const Outcome& got) {
  ::recps::testing::ExpectSameOutcome(reference, got, kSteps);
}

// recpsctl with `args`; its exit code and stdout (stderr to a side file).
struct CtlResult {
  int code = -1;
  std::string out;
};
CtlResult Recpsctl(const TempDir& dir, std::vector<std::string> args) {
  static int n = 0;
  // The admin certificate `recps local` made in <dir>/work/certs (none
  // when it runs --insecure).
  const std::string certs = dir.path() + "/work/certs/";
  if (std::filesystem::exists(certs)) {
    args.push_back("--tls_ca=" + certs + "ca.crt");
    args.push_back("--tls_cert=" + certs + "admin.crt");
    args.push_back("--tls_key=" + certs + "admin.key");
  } else {
    args.push_back("--insecure");
  }
  const std::string out_path = absl::StrCat(dir.path(), "/recpsctl", n++, ".out");
  // stdout only: a shell redirects stderr (the progress bar) elsewhere.
  std::string command = RECPSCTL_BINARY;
  for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
  absl::StrAppend(&command, " > '", out_path, "' 2> '", out_path, ".err'");
  absl::StatusOr<client::ChildProcess> p =
      client::ChildProcess::Spawn("/bin/sh", {"-c", command});
  CtlResult r;
  if (!p.ok()) return r;
  absl::StatusOr<int> code = p->Wait(absl::Minutes(5));
  r.code = code.ok() ? *code : -1;
  r.out = ReadAll(out_path);
  if (r.code != 0) absl::StrAppend(&r.out, "\nstderr: ", ReadAll(out_path + ".err"));
  return r;
}

template <typename M>
M FromJson(const std::string& text) {
  M m;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text, &m, options).ok()) << text;
  return m;
}

// Every slot has exactly one owner, that owner answers, and no move is in
// flight (recpsctl status --json; the map is a list of owners, so "one
// owner" means: every server of the map reachable, routing by the map's
// epoch, and the slot counts adding up). Polled: a poll that finds no
// coordinator or a server still settling is not a failure. When
// `job_ended` turns true first (the launcher stops every server at the end
// of the run), there is nothing left to check: says so and returns.
void ExpectOneOwnerPerSlot(const TempDir& dir, const std::string& coordinator,
                           const std::function<bool()>& job_ended = [] { return false; }) {
  std::string last;
  bool ended = false;
  ASSERT_TRUE(Eventually(
      [&] {
        const CtlResult r = Recpsctl(
            dir, {"status", "--coordinator=" + coordinator, "--interval=0", "--json"});
        last = r.out;
        v1::ClusterStatus status;
        google::protobuf::util::JsonParseOptions options;
        options.ignore_unknown_fields = true;
        // recpsctl exits 1 when a server is unreachable; its stdout is the
        // JSON either way (r.out then ends with "stderr: ...").
        const std::string json = r.out.substr(0, r.out.find("\nstderr: "));
        if (!google::protobuf::util::JsonStringToMessage(json, &status, options).ok()) {
          ended = job_ended();
          return ended;
        }
        if (!status.moves_in_flight().empty() || status.shard_map_epoch() == 0) return false;
        int64_t slots = 0;
        for (const v1::ServerStatus& s : status.servers()) {
          if (s.slots() == 0) continue;
          if (!s.reachable() || s.shard_map_epoch() != status.shard_map_epoch()) {
            ended = job_ended();
            return ended;
          }
          slots += s.slots();
        }
        return slots == status.num_slots();
      },
      absl::Seconds(30)))
      << last;
  if (ended) std::cerr << "the run ended before every slot's owner could be checked\n";
}

// Rank 0's step times, from its result JSON (written at the end).
std::vector<double> StepTimes(const RebalanceRun& run) {
  std::vector<double> out;
  const std::string json = ReadAll(run.work + "/result0.json");
  const size_t begin = json.find("\"step_seconds\":[");
  if (begin == std::string::npos) return out;
  const size_t first = begin + std::string("\"step_seconds\":[").size();
  const size_t end = json.find(']', first);
  for (absl::string_view v : absl::StrSplit(json.substr(first, end - first), ',',
                                            absl::SkipEmpty())) {
    double d = 0;
    if (absl::SimpleAtod(v, &d)) out.push_back(d);
  }
  return out;
}

class RebalanceE2e : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reference_run_ = new RebalanceRun();
    // Run once per build of the binaries, by the suite's first process.
    absl::StatusOr<Outcome> reference =
        ::recps::testing::ReferenceOutcome(*reference_run_, 2, absl::Seconds(300));
    ASSERT_TRUE(reference.ok()) << reference.status();
    reference_ = new Outcome(*std::move(reference));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete reference_run_;
  }

  // Waits until rank 0 trained `steps` steps (and the run is not over).
  static void WaitForSteps(const RebalanceRun& run, int steps) {
    ASSERT_TRUE(Eventually([&] { return run.LossLines() >= steps; }, absl::Seconds(120)))
        << ReadAll(run.log);
    ASSERT_LT(run.LossLines(), kSteps) << "the run ended before the move";
  }

  // Starts one more recps-shard for `run`'s job; it registers and owns
  // nothing until a rebalance.
  static absl::StatusOr<client::ChildProcess> StartExtraShard(const RebalanceRun& run,
                                                              std::string* address) {
    const std::string ports = run.dir->path() + "/extra.ports";
    std::vector<std::string> args = {"--job=" + run.work + "/job.textproto", "--world_size=2",
                                     "--coordinator=" + run.Coordinator(),
                                     "--listen=127.0.0.1:0", "--port_file=" + ports};
    for (std::string& f : run.TlsFlags("shard")) args.push_back(std::move(f));
    absl::StatusOr<client::ChildProcess> p =
        client::ChildProcess::Spawn(RECPS_SHARD_BINARY, args, run.dir->path() + "/extra.log");
    if (!p.ok()) return p.status();
    if (!Eventually([&] { return !ReadAll(ports).empty(); }, absl::Seconds(30))) {
      return absl::DeadlineExceededError(ReadAll(run.dir->path() + "/extra.log"));
    }
    int port = 0;
    std::vector<std::string> f = absl::StrSplit(ReadAll(ports), ' ');
    (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(f[0]), &port);
    *address = absl::StrCat("127.0.0.1:", port);
    return p;
  }

  static v1::ListRebalanceMovesResponse Moves(const RebalanceRun& run) {
    return FromJson<v1::ListRebalanceMovesResponse>(
        Recpsctl(*run.dir, {"moves", "--coordinator=" + run.Coordinator(), "--json"}).out);
  }

  static RebalanceRun* reference_run_;
  static Outcome* reference_;
};

RebalanceRun* RebalanceE2e::reference_run_ = nullptr;
Outcome* RebalanceE2e::reference_ = nullptr;

TEST_F(RebalanceE2e, AThirdOfTheSlotsMovedMidRunBitIdentical) {
  ASSERT_NE(reference_, nullptr);
  RebalanceRun run;
  // Slots of row-wise tables: the planner would keep these small tables
  // whole (table-wise), so the map spreads them evenly.
  absl::StatusOr<client::ChildProcess> p = run.Start(2, {"--sharding=even"});
  ASSERT_TRUE(p.ok()) << p.status();
  WaitForSteps(run, kSteps / 4);
  run.UseAdminCertificate();
  client::CoordinatorClient coordinator(run.Coordinator());
  absl::StatusOr<v1::ShardMap> map = coordinator.GetShardMap();
  ASSERT_TRUE(map.ok()) << map.status();
  // Every third slot changes owner: server 0's to 1 and 1's to 0.
  v1::ApplyRebalanceRequest apply;
  v1::RebalancePlan* plan = apply.mutable_plan();
  plan->set_base_epoch(map->epoch());
  v1::SlotMove* to1 = plan->add_moves();
  to1->set_source(map->servers(0));
  to1->set_target(map->servers(1));
  v1::SlotMove* to0 = plan->add_moves();
  to0->set_source(map->servers(1));
  to0->set_target(map->servers(0));
  for (uint32_t s = 0; s < map->num_slots(); s += 3) {
    (map->slot_owner(static_cast<int>(s)) == 0 ? to1 : to0)->add_slots(s);
  }
  absl::StatusOr<v1::ApplyRebalanceResponse> started = coordinator.ApplyRebalance(apply);
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_TRUE(Eventually([&] { return Moves(run).running().empty(); }, absl::Seconds(120)));
  const v1::ListRebalanceMovesResponse moves = Moves(run);
  ASSERT_EQ(moves.moves_size(), 2);
  for (const v1::MoveRecord& r : moves.moves()) {
    EXPECT_EQ(r.state(), v1::MoveRecord::DONE) << r.error();
  }
  EXPECT_LT(run.LossLines(), kSteps) << "the moves ended after the run";
  ExpectOneOwnerPerSlot(*run.dir, run.Coordinator());
  absl::StatusOr<int> code = p->Wait(absl::Seconds(300));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << ReadAll(run.log);
  ExpectSame(*reference_, Collect(run));
}

// A shard server started mid-run (its step clock at -1) is listed owning
// nothing, takes no part in steps (the workers do not push to it) and joins
// at the source's step when the first move hands slots to it.
TEST_F(RebalanceE2e, ThirdServerAddedAndRebalancedOntoBitIdentical) {
  ASSERT_NE(reference_, nullptr);
  RebalanceRun run;
  // Row-wise tables, whose slots the new server takes a share of.
  absl::StatusOr<client::ChildProcess> p = run.Start(2, {"--sharding=even"});
  ASSERT_TRUE(p.ok()) << p.status();
  WaitForSteps(run, kSteps / 4);
  std::string extra_address;
  absl::StatusOr<client::ChildProcess> extra = StartExtraShard(run, &extra_address);
  ASSERT_TRUE(extra.ok()) << extra.status();
  // The plan gives the new server its third.
  ASSERT_TRUE(Eventually(
      [&] {
        const CtlResult plan =
            Recpsctl(*run.dir, {"rebalance", "--coordinator=" + run.Coordinator(), "--json"});
        return plan.code == 0 && absl::StrContains(plan.out, extra_address);
      },
      absl::Seconds(30)));
  const CtlResult applied =
      Recpsctl(*run.dir, {"rebalance", "--coordinator=" + run.Coordinator(), "--apply"});
  EXPECT_EQ(applied.code, 0) << applied.out;
  EXPECT_THAT(applied.out, HasSubstr(extra_address));
  EXPECT_LT(run.LossLines(), kSteps) << "the moves ended after the run";
  ExpectOneOwnerPerSlot(*run.dir, run.Coordinator());
  run.UseAdminCertificate();
  client::CoordinatorClient coordinator(run.Coordinator());
  absl::StatusOr<v1::ShardMap> map = coordinator.GetShardMap();
  ASSERT_TRUE(map.ok());
  const ShardMap parsed = *ShardMap::FromProto(*map);
  const int index = parsed.IndexOf(extra_address);
  ASSERT_GE(index, 0);
  // Its share is a third of the bytes and load, not of the slot count.
  EXPECT_GT(parsed.SlotsOf(index).size(), 0u);
  absl::StatusOr<int> code = p->Wait(absl::Seconds(300));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << ReadAll(run.log);
  ExpectSame(*reference_, Collect(run));
}

TEST_F(RebalanceE2e, OneOfThreeServersDrainedBitIdentical) {
  ASSERT_NE(reference_, nullptr);
  RebalanceRun run;
  absl::StatusOr<client::ChildProcess> p = run.Start(3, {});
  ASSERT_TRUE(p.ok()) << p.status();
  WaitForSteps(run, kSteps / 4);
  const std::string drained = run.Shard(1);
  const CtlResult applied = Recpsctl(
      *run.dir, {"drain", drained, "--coordinator=" + run.Coordinator(), "--apply"});
  EXPECT_EQ(applied.code, 0) << applied.out;
  ExpectOneOwnerPerSlot(*run.dir, run.Coordinator());
  run.UseAdminCertificate();
  client::CoordinatorClient coordinator(run.Coordinator());
  absl::StatusOr<v1::ShardMap> map = coordinator.GetShardMap();
  ASSERT_TRUE(map.ok());
  const ShardMap parsed = *ShardMap::FromProto(*map);
  EXPECT_TRUE(parsed.SlotsOf(parsed.IndexOf(drained)).empty());
  // Draining every server is refused.
  v1::PlanRebalanceRequest all;
  for (const std::string& s : map->servers()) all.add_drain(s);
  EXPECT_EQ(coordinator.PlanRebalance(all).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<int> code = p->Wait(absl::Seconds(300));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << ReadAll(run.log);
  ExpectSame(*reference_, Collect(run));
}

// Replication 2 on three servers, two of them lost one after the other:
// the first loss is failed over, and re-replication copies the units that
// lost their backup with it to the server left (a move that adds a backup,
// listed by recpsctl moves); so the second loss is failed over too, from
// that copy, instead of a restart. The job ends bit-identical, but for the
// rows only read (step 0's evaluation), which only the lost owners held.
TEST_F(RebalanceE2e, ReplicatedServersLostOneAfterTheOtherAreReReplicatedBitIdentical) {
  ASSERT_NE(reference_, nullptr);
  RebalanceRun run;
  absl::StatusOr<client::ChildProcess> p = run.Start(3, {"--replication=2"});
  ASSERT_TRUE(p.ok()) << p.status();
  WaitForSteps(run, kSteps / 5);
  run.UseAdminCertificate();
  const pid_t first = run.PidOf("shard server 1");
  ASSERT_GT(first, 0) << ReadAll(run.work + "/pids");
  ASSERT_EQ(kill(first, SIGKILL), 0);
  v1::MoveRecord copy;
  ASSERT_TRUE(Eventually(
      [&] {
        const v1::ListRebalanceMovesResponse moves = Moves(run);
        for (const v1::MoveRecord& r : moves.moves()) {
          if (r.add_backup() && r.state() == v1::MoveRecord::DONE) copy = r;
        }
        return copy.add_backup();
      },
      absl::Seconds(60)))
      << ReadAll(run.work + "/coordinator.log");
  // The owner whose backup was lost, and the server left as the new one.
  EXPECT_NE(copy.source(), run.Shard(1));
  EXPECT_NE(copy.target(), run.Shard(1));
  ASSERT_LT(run.LossLines(), kSteps) << "the run ended before the second loss";
  const pid_t second =
      run.PidOf(copy.source() == run.Shard(0) ? "shard server 0" : "shard server 2");
  ASSERT_GT(second, 0);
  ASSERT_EQ(kill(second, SIGKILL), 0);
  absl::StatusOr<int> code = p->Wait(absl::Seconds(300));
  ASSERT_TRUE(code.ok()) << code.status();
  const std::string log = ReadAll(run.log);
  EXPECT_EQ(*code, 0) << log;
  EXPECT_THAT(log, Not(HasSubstr("resuming from step")));
  EXPECT_THAT(ReadAll(run.work + "/coordinator.log"), Not(HasSubstr("has no copy left")));
  ::recps::testing::ExpectSameOutcome(*reference_, Collect(run), kSteps, run.job);
}

// Bad requests through recpsctl: clear errors, nothing moved.
TEST_F(RebalanceE2e, RefusalsMoveNothing) {
  RebalanceRun run;
  absl::StatusOr<client::ChildProcess> p = run.Start(2, {});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(Eventually([&] { return !run.Coordinator().empty() && run.LossLines() > 0; },
                         absl::Seconds(60)));
  const std::string coord = "--coordinator=" + run.Coordinator();
  CtlResult r = Recpsctl(*run.dir, {"drain", "127.0.0.1:1", coord});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("is not a server of shard map"));
  r = Recpsctl(*run.dir, {"drain", run.Shard(0), coord});
  EXPECT_EQ(r.code, 0) << r.out;  // a plan; draining one of two is fine
  run.UseAdminCertificate();
  client::CoordinatorClient coordinator(run.Coordinator());
  absl::StatusOr<v1::ShardMap> map = coordinator.GetShardMap();
  ASSERT_TRUE(map.ok());
  v1::ApplyRebalanceRequest bad;
  bad.mutable_plan()->set_base_epoch(map->epoch());
  v1::SlotMove* m = bad.mutable_plan()->add_moves();
  m->set_source(map->servers(0));
  m->set_target(map->servers(0));
  m->add_slots(0);
  EXPECT_THAT(coordinator.ApplyRebalance(bad).status().message(), HasSubstr("both"));
  m->set_target(map->servers(1));
  m->set_slots(0, map->num_slots());
  EXPECT_THAT(coordinator.ApplyRebalance(bad).status().message(), HasSubstr("out of range"));
  m->set_slots(0, 0);
  m->set_target("127.0.0.1:1");
  EXPECT_THAT(coordinator.ApplyRebalance(bad).status().message(), HasSubstr("127.0.0.1:1"));
  absl::StatusOr<v1::ShardMap> after = coordinator.GetShardMap();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->epoch(), map->epoch());
  EXPECT_TRUE(Moves(run).moves().empty());
}

// kill -9 during a copy: one of three servers is drained with a bandwidth
// limit (seconds per move), and a process is killed while a move copies.
class RebalanceKillE2e : public RebalanceE2e {
 protected:
  // Returns once a move is copying; `copying` is that move.
  void StartSlowDrain(RebalanceRun& run, std::vector<std::string> extra_flags,
                      std::optional<client::ChildProcess>* job, v1::MoveRecord* copying) {
    absl::StatusOr<client::ChildProcess> p = run.Start(3, extra_flags);
    ASSERT_TRUE(p.ok()) << p.status();
    job->emplace(*std::move(p));
    WaitForSteps(run, kEvery + kEvery / 2);
    // The restart tests resume from this checkpoint: its rows are written in
    // the background at low priority, and on a loaded machine a run can be
    // well past step kEvery before its MANIFEST lands (CI once restarted from
    // step 0 because of that, and "resuming from step" never appeared).
    ASSERT_TRUE(Eventually(
        [&] { return std::filesystem::exists(Dir(run.checkpoints, kEvery) + "/MANIFEST"); },
        absl::Seconds(60)))
        << "no complete checkpoint at step " << kEvery << "\n" << ReadAll(run.log);
    ASSERT_LT(run.LossLines(), kSteps) << "the run ended before the checkpoint was complete";
    // The workers wait (SIGSTOP) until the test has killed its process, so
    // that the run cannot end first on a slow machine; the copy goes on
    // without them.
    for (int r = 0; r < 2; ++r) {
      const pid_t pid = run.PidOf(absl::StrCat("worker ", r));
      ASSERT_GT(pid, 0) << ReadAll(run.work + "/pids");
      ASSERT_EQ(kill(pid, SIGSTOP), 0);
      paused_.push_back(pid);
    }
    run.UseAdminCertificate();
    client::CoordinatorClient coordinator(run.Coordinator());
    v1::PlanRebalanceRequest request;
    request.add_drain(run.Shard(1));
    absl::StatusOr<v1::PlanRebalanceResponse> plan = coordinator.PlanRebalance(request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_GT(plan->plan().moves_size(), 0);
    v1::ApplyRebalanceRequest apply;
    *apply.mutable_plan() = plan->plan();
    apply.set_max_bytes_per_second(20000);
    ASSERT_TRUE(coordinator.ApplyRebalance(apply).ok());
    ASSERT_TRUE(Eventually(
        [&] {
          const v1::ListRebalanceMovesResponse listed = Moves(run);
          for (const v1::MoveRecord& r : listed.moves()) {
            if (r.state() == v1::MoveRecord::COPYING) {
              *copying = r;
              return true;
            }
          }
          return false;
        },
        absl::Seconds(30)));
    ASSERT_LT(run.LossLines(), kSteps) << "the run ended before the kill";
  }
  std::vector<pid_t> paused_;
  void ResumeWorkers() {
    for (pid_t pid : paused_) kill(pid, SIGCONT);
    paused_.clear();
  }
  void TearDown() override { ResumeWorkers(); }
  int ShardIndex(const RebalanceRun& run, const std::string& address) {
    for (int i = 0; i < 3; ++i) {
      if (run.Shard(i) == address) return i;
    }
    return -1;
  }
};

TEST_F(RebalanceKillE2e, KilledTargetRestartsFromTheCheckpoint) {
  ASSERT_NE(reference_, nullptr);
  RebalanceRun run;
  std::optional<client::ChildProcess> job;
  v1::MoveRecord copying;
  StartSlowDrain(run, {"--max_restarts=1"}, &job, &copying);
  ASSERT_TRUE(job.has_value());
  const pid_t pid = run.PidOf(absl::StrCat("shard server ", ShardIndex(run, copying.target())));
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ResumeWorkers();
  absl::StatusOr<int> code = job->Wait(absl::Seconds(300));
  ASSERT_TRUE(code.ok()) << code.status();
  const std::string log = ReadAll(run.log);
  EXPECT_EQ(*code, 0) << log;
  EXPECT_THAT(log, HasSubstr("resuming from step"));
  ExpectSame(*reference_, Collect(run));
}

TEST_F(RebalanceKillE2e, KilledCoordinatorResolvesTheMoveOnRestart) {
  ASSERT_NE(reference_, nullptr);
  RebalanceRun run;
  // Under mutual TLS, as `recps local` runs by default: the test's recpsctl
  // calls start while the coordinator is down and must get through once it
  // is back, before the job ends (RecpsctlRestartTest).
  std::optional<client::ChildProcess> job;
  v1::MoveRecord copying;
  StartSlowDrain(run, {}, &job, &copying);
  ASSERT_TRUE(job.has_value());
  const pid_t coordinator = run.PidOf("coordinator " + run.Coordinator());
  ASSERT_GT(coordinator, 0) << ReadAll(run.work + "/pids");
  ASSERT_EQ(kill(coordinator, SIGKILL), 0);
  ResumeWorkers();
  // The launcher restarts it in place (same state, same port): it finds the
  // moves in flight and resolves them (a copy is rolled back).
  v1::ListRebalanceMovesResponse moves;
  ASSERT_TRUE(Eventually(
      [&] {
        moves = Moves(run);
        if (moves.moves().empty() || !moves.running().empty()) return false;
        for (const v1::MoveRecord& r : moves.moves()) {
          if (r.state() != v1::MoveRecord::DONE && r.state() != v1::MoveRecord::ABORTED &&
              r.state() != v1::MoveRecord::FAILED) {
            return false;
          }
        }
        return true;
      },
      absl::Seconds(60)))
      << ReadAll(run.log) << "\ncoordinator log:\n" << ReadAll(run.work + "/coordinator.log");
  bool resolved = false;
  for (const v1::MoveRecord& r : moves.moves()) {
    if (r.move_id() == copying.move_id()) {
      EXPECT_EQ(r.state(), v1::MoveRecord::ABORTED);
      EXPECT_THAT(r.error(), HasSubstr("restarted"));
      resolved = true;
    }
  }
  EXPECT_TRUE(resolved);
  // The workers ran on while the coordinator restarted and resolved the
  // move, and on a loaded machine the run may be over by now (CI once).
  ExpectOneOwnerPerSlot(*run.dir, run.Coordinator(),
                        [&] { return run.LossLines() >= kSteps; });
  absl::StatusOr<int> code = job->Wait(absl::Seconds(300));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << ReadAll(run.log);
  ExpectSame(*reference_, Collect(run));
}

TEST_F(RebalanceKillE2e, KilledSourceRestartsFromTheCheckpoint) {
  ASSERT_NE(reference_, nullptr);
  RebalanceRun run;
  std::optional<client::ChildProcess> job;
  v1::MoveRecord copying;
  StartSlowDrain(run, {"--max_restarts=1"}, &job, &copying);
  ASSERT_TRUE(job.has_value());
  const pid_t pid = run.PidOf(absl::StrCat("shard server ", ShardIndex(run, copying.source())));
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ResumeWorkers();
  absl::StatusOr<int> code = job->Wait(absl::Seconds(300));
  ASSERT_TRUE(code.ok()) << code.status();
  const std::string log = ReadAll(run.log);
  EXPECT_EQ(*code, 0) << log;
  EXPECT_THAT(log, HasSubstr("resuming from step"));
  ExpectSame(*reference_, Collect(run));
}

// Step times before and during a drain of one of three servers, and the
// move rate; printed for docs/operations.md. A measurement, not a check
// (speed is the benchmarks' business, and the drain itself is checked by
// OneOfThreeServersDrainedBitIdentical), so it does not run with the
// tests: --gtest_also_run_disabled_tests --gtest_filter='*Measure*'.
TEST_F(RebalanceE2e, DISABLED_MeasureStepTimesDuringAMove) {
  RebalanceRun run;
  absl::StatusOr<client::ChildProcess> p = run.Start(3, {});
  ASSERT_TRUE(p.ok()) << p.status();
  WaitForSteps(run, kSteps / 4);
  const int before = run.LossLines();
  const CtlResult applied = Recpsctl(
      *run.dir, {"drain", run.Shard(1), "--coordinator=" + run.Coordinator(), "--apply"});
  const int after = run.LossLines();
  EXPECT_EQ(applied.code, 0) << applied.out;
  const v1::ListRebalanceMovesResponse moves = Moves(run);
  absl::StatusOr<int> code = p->Wait(absl::Seconds(300));
  ASSERT_TRUE(code.ok());
  std::vector<double> times = StepTimes(run);
  auto stats = [](std::vector<double> v) {
    if (v.empty()) return std::string("n/a");
    std::sort(v.begin(), v.end());
    return absl::StrFormat("p50 %.2f ms, p99 %.2f ms, max %.2f ms (%d steps)",
                           1e3 * v[v.size() / 2], 1e3 * v[v.size() * 99 / 100],
                           1e3 * v.back(), v.size());
  };
  if (static_cast<int>(times.size()) > after) {
    std::printf("step time before the move: %s\n",
                stats({times.begin() + 10, times.begin() + before}).c_str());
    std::printf("step time during the move: %s\n",
                stats({times.begin() + before, times.begin() + std::max(after, before + 1)})
                    .c_str());
  } else {
    std::printf("no step times (rank 0's result JSON)\n");
  }
  std::printf("move rate: %.1f MB/s over %d moves\n", moves.move_bytes_per_second() / 1e6,
              moves.moves_size());
}

}  // namespace
}  // namespace recps
