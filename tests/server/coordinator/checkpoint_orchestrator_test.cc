// The coordinator's checkpoint orchestration with fake shard servers (a
// ShardCheckpointRpc that records calls), a fake clock for the cut barrier,
// and a real checkpoint root in a temp dir: cuts, manifests, the incremental
// policy, pruning, failures, --restore and the refusals. No gRPC, no sleeps.
#include "server/coordinator/checkpoint_orchestrator.h"

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "server/checkpoint/crc32c.h"
#include "server/checkpoint/manifest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_store.h"
#include "tests/testing/local_shard.h"

namespace recps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace ckpt = checkpoint;

// Shard servers that answer at once: SaveRows takes a "snapshot" of 5 rows,
// SaveRowsStatus says DONE (or what `status_state` says), RestoreRows
// records the chain.
class FakeShards : public ShardCheckpointRpc {
 public:
  absl::StatusOr<v1::SaveRowsResponse> SaveRows(const std::string& address,
                                                const v1::SaveRowsRequest& request,
                                                absl::Duration) override {
    absl::MutexLock lock(&mu);
    saves.push_back({address, request});
    if (auto it = save_errors.find(address); it != save_errors.end()) return it->second;
    if (request.incremental() && refuse_incremental) {
      return absl::FailedPreconditionError("no snapshot for the base step");
    }
    v1::SaveRowsResponse r;
    r.set_rows(5);
    return r;
  }
  absl::StatusOr<v1::SaveRowsStatusResponse> SaveRowsStatus(
      const std::string& address, const v1::SaveRowsStatusRequest& request,
      absl::Duration) override {
    absl::MutexLock lock(&mu);
    if (auto it = status_errors.find(address); it != status_errors.end()) {
      return it->second;
    }
    v1::SaveRowsStatusResponse r;
    for (const auto& [a, save] : saves) {
      if (a != address || save.step() != request.step()) continue;
      r.set_state(failed_writes.count(address) ? v1::SaveRowsStatusResponse::FAILED
                                               : v1::SaveRowsStatusResponse::DONE);
      r.set_error("cannot write " + save.path() + ": No space left on device");
      if (failed_writes.count(address)) {
        r.set_error_code(static_cast<int32_t>(absl::StatusCode::kResourceExhausted));
      }
      r.mutable_file()->set_name(std::filesystem::path(save.path()).filename());
      r.mutable_file()->set_size_bytes(100);
      r.mutable_file()->set_rows(5);
    }
    return r;
  }
  absl::StatusOr<v1::RestoreRowsResponse> RestoreRows(const std::string& address,
                                                      const v1::RestoreRowsRequest& request,
                                                      absl::Duration) override {
    absl::MutexLock lock(&mu);
    restores.push_back({address, request});
    if (refuse_restore) return absl::FailedPreconditionError("the store holds rows");
    if (damaged_steps.count(request.step())) {
      return absl::DataLossError("row file shard-00000.sst: CRC-32C mismatch");
    }
    v1::RestoreRowsResponse r;
    r.set_rows(7);
    return r;
  }
  absl::StatusOr<uint64_t> ShardMapEpoch(const std::string&, absl::Duration) override {
    return 1;
  }

  absl::Mutex mu;
  std::vector<std::pair<std::string, v1::SaveRowsRequest>> saves;
  std::vector<std::pair<std::string, v1::RestoreRowsRequest>> restores;
  std::map<std::string, absl::Status> save_errors;
  std::map<std::string, absl::Status> status_errors;
  std::map<std::string, bool> failed_writes;
  bool refuse_incremental = false;
  bool refuse_restore = false;
  std::set<uint64_t> damaged_steps;  // RestoreRows of these: DATA_LOSS
};

v1::JobConfig Job(const std::string& checkpoint_dir) {
  v1::JobConfig job;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(R"(
    name: "j"
    tables { name: "t0" dim: 8 num_rows: 1000 optimizer { kind: ADAGRAD learning_rate: 0.1 } }
    features { name: "f0" table: "t0" }
    model { bottom_mlp: 8 top_mlp: 1 }
    training { batch_size: 32 steps: 10 seed: 7 eval_batches: 1 eval_interval: 5
               dense_optimizer { kind: SGD learning_rate: 0.1 } }
    data { synthetic { seed: 1 num_dense: 4
                       features { id_space: 1000 min_ids_per_bag: 1 max_ids_per_bag: 1 } } })",
                                                          &job));
  job.mutable_training()->mutable_checkpoint()->set_dir(checkpoint_dir);
  return job;
}

// What a cut's callback got.
struct Answer {
  absl::Mutex mu;
  std::optional<absl::StatusOr<v1::CheckpointCutResponse>> result;
  bool done() {
    absl::MutexLock lock(&mu);
    return result.has_value();
  }
  absl::StatusOr<v1::CheckpointCutResponse> get() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](Answer* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->result.has_value(); },
        this));
    return *result;
  }
};

class CheckpointOrchestratorTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = dir_.path() + "/ckpt"; }

  std::unique_ptr<Coordinator> Open(const v1::JobConfig& job, std::string restore = "",
                                    bool start = true) {
    auto store = CoordinatorStore::Open(dir_.path() + "/state");
    EXPECT_TRUE(store.ok()) << store.status();
    CoordinatorOptions options;
    options.num_shards = 2;
    options.num_slots = 64;
    options.world_size = 2;
    options.clock = [this] {
      absl::MutexLock lock(&clock_mu_);
      return now_;
    };
    options.checkpoint.rpc = shards_;
    options.checkpoint.restore = std::move(restore);
    options.checkpoint.poll_interval = absl::Milliseconds(1);
    options.checkpoint.cut_timeout = absl::Seconds(30);
    auto c = Coordinator::Create(*std::move(store), options, nullptr);
    EXPECT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE((*c)->SetJob(job).ok());
    for (const char* address : {"10.0.0.1:1", "10.0.0.2:1"}) {
      v1::RegisterRequest r;
      r.set_role(v1::SHARD_SERVER);
      r.set_address(address);
      EXPECT_TRUE((*c)->Register(r).ok());
    }
    if (start) {
      EXPECT_TRUE((*c)->checkpoints().Start().ok());
    }
    return *std::move(c);
  }

  static v1::CheckpointCutRequest CutAt(int rank, uint64_t step, bool wait = false) {
    v1::CheckpointCutRequest r;
    r.set_rank(rank);
    r.set_step(step);
    r.set_wait_complete(wait);
    r.set_reason("periodic");
    r.mutable_position()->set_batches_read(static_cast<int64_t>(step) + rank);
    if (rank == 0) r.set_dense_state("dense-" + std::to_string(step));
    return r;
  }

  // Both workers cut at `step`; returns rank 0's answer once complete.
  absl::StatusOr<v1::CheckpointCutResponse> CutAll(Coordinator& c, uint64_t step) {
    Answer a0, a1;
    c.checkpoints().Cut(CutAt(0, step, true), [&](auto r) {
      absl::MutexLock lock(&a0.mu);
      a0.result = std::move(r);
    });
    c.checkpoints().Cut(CutAt(1, step, true), [&](auto r) {
      absl::MutexLock lock(&a1.mu);
      a1.result = std::move(r);
    });
    EXPECT_EQ(a1.get().status().code(), a0.get().status().code());
    return a0.get();
  }

  void Advance(absl::Duration d) {
    absl::MutexLock lock(&clock_mu_);
    now_ += d;
  }

  testing::TempDir dir_;
  std::string root_;
  std::shared_ptr<FakeShards> shards_ = std::make_shared<FakeShards>();
  absl::Mutex clock_mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

TEST_F(CheckpointOrchestratorTest, CutWaitsForEveryWorkerThenWritesManifestLast) {
  auto c = Open(Job(root_));
  Answer a0, a1;
  c->checkpoints().Cut(CutAt(0, 10), [&](auto r) {
    absl::MutexLock lock(&a0.mu);
    a0.result = std::move(r);
  });
  EXPECT_FALSE(a0.done());  // rank 1 has not arrived
  {
    absl::MutexLock lock(&shards_->mu);
    EXPECT_TRUE(shards_->saves.empty());
  }
  c->checkpoints().Cut(CutAt(1, 10), [&](auto r) {
    absl::MutexLock lock(&a1.mu);
    a1.result = std::move(r);
  });
  absl::StatusOr<v1::CheckpointCutResponse> r0 = a0.get();
  ASSERT_TRUE(r0.ok()) << r0.status();
  EXPECT_EQ(r0->step(), 10u);
  EXPECT_EQ(r0->dir(), root_ + "/step-000000000010");
  ASSERT_TRUE(a1.get().ok());
  ASSERT_TRUE(c->checkpoints().WaitIdle(absl::Seconds(30)));

  absl::StatusOr<v1::CheckpointManifest> m = ckpt::ReadManifest(r0->dir());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kind(), v1::CHECKPOINT_KIND_FULL);
  EXPECT_EQ(m->step(), 10u);
  EXPECT_EQ(m->job_config_digest(), ckpt::JobConfigDigest(Job(root_)));
  EXPECT_EQ(m->shard_map().servers_size(), 2);
  EXPECT_EQ(m->num_slots(), 64u);
  ASSERT_EQ(m->tables_size(), 1);
  EXPECT_EQ(m->tables(0).name(), "t0");
  EXPECT_EQ(m->tables(0).row_stride(), 16);  // Adagrad: weights + sums
  ASSERT_EQ(m->files_size(), 2);
  EXPECT_EQ(m->files(0).name(), "shard-00000.sst");
  EXPECT_EQ(m->files(1).shard(), 1u);
  EXPECT_EQ(m->reason(), "periodic");
  ASSERT_EQ(m->workers_size(), 2);
  EXPECT_EQ(m->workers(0).rank(), 0);
  EXPECT_EQ(m->workers(1).batches_read(), 11);
  EXPECT_EQ(m->dense().name(), "dense.pb");
  EXPECT_EQ(m->dense().size_bytes(), 8u);
  const std::string dense = "dense-10";
  EXPECT_EQ(m->dense().crc32c(), ckpt::Crc32cExtend(0, dense.data(), dense.size()));
  {
    absl::MutexLock lock(&shards_->mu);
    ASSERT_EQ(shards_->saves.size(), 2u);
    for (const auto& [address, save] : shards_->saves) {
      EXPECT_EQ(save.step(), 10u);
      EXPECT_FALSE(save.incremental());
      EXPECT_EQ(save.path(), absl::StrCat(r0->dir(), "/shard-0000", save.shard(), ".sst"));
    }
  }
  absl::StatusOr<v1::ListCheckpointsResponse> list = c->checkpoints().List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->checkpoints_size(), 1);
  EXPECT_EQ(list->checkpoints(0).rows(), 10);
  EXPECT_GT(list->checkpoints(0).size_bytes(), 200 + 8);  // files, dense, manifest
  EXPECT_TRUE(list->last_error().empty());
}

TEST_F(CheckpointOrchestratorTest, ColumnGroupsOfASplitTableAreManifestTables) {
  auto c = Open(Job(root_));
  absl::StatusOr<v1::ShardMap> map = c->GetShardMap();
  ASSERT_TRUE(map.ok());
  map->set_epoch(2);
  v1::TableRouting* routing = map->add_tables();
  routing->set_table("t0");
  for (int g = 0; g < 2; ++g) {
    v1::ColumnGroupRouting* group = routing->add_column_groups();
    group->set_column_begin(4 * g);
    group->set_column_end(4 * g + 4);
    group->set_owner(g);
  }
  ASSERT_TRUE(c->SetShardMap(*map).ok());
  ASSERT_TRUE(CutAll(*c, 10).ok());
  auto m = ckpt::ReadManifest(root_ + "/" + ckpt::CheckpointDirName(10));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->tables_size(), 3);
  EXPECT_EQ(m->tables(0).dim(), 8);
  EXPECT_EQ(m->tables(1).dim(), 4);
  EXPECT_EQ(m->tables(1).row_stride(), 8);  // Adagrad over 4 columns
  EXPECT_NE(m->tables(1).name(), m->tables(2).name());
}

TEST_F(CheckpointOrchestratorTest, IncrementalChainsToThePreviousAndFullEveryN) {
  v1::JobConfig job = Job(root_);
  job.mutable_training()->mutable_checkpoint()->set_incremental(true);
  job.mutable_training()->mutable_checkpoint()->set_full_every(2);
  job.mutable_training()->mutable_checkpoint()->set_keep_last(10);
  auto c = Open(job);
  for (uint64_t step : {10, 20, 30, 40}) ASSERT_TRUE(CutAll(*c, step).ok());
  std::vector<std::pair<int, uint64_t>> kinds;
  for (uint64_t step : {10, 20, 30, 40}) {
    auto m = ckpt::ReadManifest(root_ + "/" + ckpt::CheckpointDirName(step));
    ASSERT_TRUE(m.ok()) << m.status();
    kinds.emplace_back(m->kind(), m->base_step());
    if (step == 30) {
      EXPECT_EQ(m->full_step(), 10u);
    }
  }
  EXPECT_THAT(kinds, ElementsAre(std::pair<int, uint64_t>{v1::CHECKPOINT_KIND_FULL, 0},
                                 std::pair<int, uint64_t>{v1::CHECKPOINT_KIND_INCREMENTAL, 10},
                                 std::pair<int, uint64_t>{v1::CHECKPOINT_KIND_INCREMENTAL, 20},
                                 std::pair<int, uint64_t>{v1::CHECKPOINT_KIND_FULL, 0}));
}

// Rebalancing: after a slot move the next checkpoint is full (a server's
// own snapshot no longer covers its slots), and a server that owns nothing
// (drained, or listed for a move that failed) is not asked for rows.
TEST_F(CheckpointOrchestratorTest, AfterASlotMoveFullAndServersOwningNothingSkipped) {
  v1::JobConfig job = Job(root_);
  job.mutable_training()->mutable_checkpoint()->set_incremental(true);
  job.mutable_training()->mutable_checkpoint()->set_keep_last(10);
  auto c = Open(job);
  ASSERT_TRUE(CutAll(*c, 10).ok());
  ASSERT_TRUE(CutAll(*c, 20).ok());  // incremental
  // Slot 0 moves to the other server (same servers).
  v1::ShardMap map = *c->GetShardMap();
  map.set_epoch(2);
  map.set_slot_owner(0, map.slot_owner(0) == 0 ? 1 : 0);
  ASSERT_TRUE(c->SetShardMap(map).ok());
  ASSERT_TRUE(CutAll(*c, 30).ok());
  ASSERT_TRUE(CutAll(*c, 40).ok());
  // A third server listed, owning nothing.
  map.set_epoch(3);
  map.add_servers("10.0.0.3:1");
  ASSERT_TRUE(c->SetShardMap(map).ok());
  ASSERT_TRUE(CutAll(*c, 50).ok());
  std::vector<int> kinds;
  for (uint64_t step : {10, 20, 30, 40, 50}) {
    auto m = ckpt::ReadManifest(root_ + "/" + ckpt::CheckpointDirName(step));
    ASSERT_TRUE(m.ok()) << m.status();
    kinds.push_back(m->kind());
    EXPECT_EQ(m->files_size(), 2) << step;
  }
  EXPECT_THAT(kinds, ElementsAre(v1::CHECKPOINT_KIND_FULL, v1::CHECKPOINT_KIND_INCREMENTAL,
                                 v1::CHECKPOINT_KIND_FULL, v1::CHECKPOINT_KIND_INCREMENTAL,
                                 v1::CHECKPOINT_KIND_FULL));
  absl::MutexLock lock(&shards_->mu);
  for (const auto& [address, save] : shards_->saves) EXPECT_NE(address, "10.0.0.3:1");
}

TEST_F(CheckpointOrchestratorTest, RefusedIncrementalFailsAndTheNextOneIsFull) {
  v1::JobConfig job = Job(root_);
  job.mutable_training()->mutable_checkpoint()->set_incremental(true);
  auto c = Open(job);
  ASSERT_TRUE(CutAll(*c, 10).ok());
  shards_->refuse_incremental = true;
  absl::StatusOr<v1::CheckpointCutResponse> r = CutAll(*c, 20);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("the next one is full"));
  EXPECT_FALSE(ckpt::ReadManifest(root_ + "/" + ckpt::CheckpointDirName(20)).ok());
  ASSERT_TRUE(CutAll(*c, 30).ok());
  auto m = ckpt::ReadManifest(root_ + "/" + ckpt::CheckpointDirName(30));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kind(), v1::CHECKPOINT_KIND_FULL);
}

TEST_F(CheckpointOrchestratorTest, LateRepeatedArrivalIsAnsweredAtOnce) {
  auto c = Open(Job(root_));
  ASSERT_TRUE(CutAll(*c, 10).ok());
  Answer late;
  c->checkpoints().Cut(CutAt(1, 10), [&](auto r) {
    absl::MutexLock lock(&late.mu);
    late.result = std::move(r);
  });
  ASSERT_TRUE(late.done());  // no new barrier that would time out
  ASSERT_TRUE(late.get().ok());
  EXPECT_TRUE(late.get()->complete());
}

TEST_F(CheckpointOrchestratorTest, KeepsTheLastKeepLast) {
  v1::JobConfig job = Job(root_);
  job.mutable_training()->mutable_checkpoint()->set_keep_last(2);
  auto c = Open(job);
  for (uint64_t step : {10, 20, 30}) ASSERT_TRUE(CutAll(*c, step).ok());
  auto list = c->checkpoints().List();
  ASSERT_TRUE(list.ok());
  std::vector<uint64_t> steps;
  for (const auto& s : list->checkpoints()) steps.push_back(s.step());
  EXPECT_THAT(steps, ElementsAre(20, 30));
}

TEST_F(CheckpointOrchestratorTest, FailedWriteLeavesNoManifestAndKeepsThePrevious) {
  auto c = Open(Job(root_));
  ASSERT_TRUE(CutAll(*c, 10).ok());
  shards_->failed_writes["10.0.0.2:1"] = true;
  absl::StatusOr<v1::CheckpointCutResponse> r = CutAll(*c, 20);
  // The server's code, not DATA_LOSS: nothing was damaged, the disk is full.
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("10.0.0.2:1"));
  EXPECT_THAT(r.status().message(), HasSubstr("No space left"));
  EXPECT_THAT(r.status().message(), HasSubstr("partial files were removed"));
  EXPECT_THAT(r.status().message(),
              HasSubstr("the newest complete checkpoint stays: step 10"));
  EXPECT_FALSE(ckpt::ReadManifest(root_ + "/" + ckpt::CheckpointDirName(20)).ok());
  // Its partial files would keep a full disk full.
  EXPECT_FALSE(std::filesystem::exists(root_ + "/" + ckpt::CheckpointDirName(20)));
  auto list = c->checkpoints().List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->checkpoints_size(), 1);
  EXPECT_EQ(list->checkpoints(0).step(), 10u);
  EXPECT_THAT(list->last_error(), HasSubstr("step 20"));
}

TEST_F(CheckpointOrchestratorTest, UnreachableServerFailsTheCheckpoint) {
  auto c = Open(Job(root_));
  shards_->status_errors["10.0.0.1:1"] = absl::InvalidArgumentError("gone");
  absl::StatusOr<v1::CheckpointCutResponse> r = CutAll(*c, 10);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("10.0.0.1:1"));
}

TEST_F(CheckpointOrchestratorTest, DifferentStepRefusedAndMissingRankTimesOut) {
  auto c = Open(Job(root_));
  Answer a0, other;
  c->checkpoints().Cut(CutAt(0, 10), [&](auto r) {
    absl::MutexLock lock(&a0.mu);
    a0.result = std::move(r);
  });
  c->checkpoints().Cut(CutAt(1, 11), [&](auto r) {
    absl::MutexLock lock(&other.mu);
    other.result = std::move(r);
  });
  EXPECT_TRUE(absl::IsFailedPrecondition(other.get().status()));
  EXPECT_THAT(other.get().status().message(), HasSubstr("step 10 is open"));
  c->Tick();
  EXPECT_FALSE(a0.done());
  Advance(absl::Seconds(31));
  c->Tick();
  absl::StatusOr<v1::CheckpointCutResponse> r = a0.get();
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("ranks 1 did not arrive"));
  auto list = c->checkpoints().List();
  EXPECT_THAT(list->last_error(), HasSubstr("ranks 1"));
}

TEST_F(CheckpointOrchestratorTest, RequestIdInHeartbeatsAndKeptAcrossRestart) {
  {
    auto c = Open(Job(root_));
    v1::RegisterRequest w;
    w.set_role(v1::WORKER);
    w.set_rank(0);
    auto reg = c->Register(w);
    ASSERT_TRUE(reg.ok());
    v1::HeartbeatRequest hb;
    hb.set_member_id(reg->member_id());
    EXPECT_EQ(c->Heartbeat(hb)->checkpoint_request_id(), 0u);
    ASSERT_TRUE(c->checkpoints().Request("").ok());
    auto r = c->checkpoints().Request("operator");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->request_id(), 2u);
    EXPECT_EQ(c->Heartbeat(hb)->checkpoint_request_id(), 2u);
  }
  auto c = Open(Job(root_));
  EXPECT_EQ(c->checkpoints().request_id(), 2u);
}

TEST_F(CheckpointOrchestratorTest, CheckpointsOffAreRefused) {
  auto c = Open(Job(""));
  Answer a;
  c->checkpoints().Cut(CutAt(0, 10), [&](auto r) {
    absl::MutexLock lock(&a.mu);
    a.result = std::move(r);
  });
  EXPECT_TRUE(absl::IsFailedPrecondition(a.get().status()));
  EXPECT_THAT(a.get().status().message(), HasSubstr("training.checkpoint.dir"));
  EXPECT_TRUE(absl::IsFailedPrecondition(c->checkpoints().Request("").status()));
}

TEST_F(CheckpointOrchestratorTest, FreshRunRefusesExistingCheckpoints) {
  {
    auto c = Open(Job(root_));
    ASSERT_TRUE(CutAll(*c, 10).ok());
  }
  std::filesystem::remove_all(dir_.path() + "/state");  // a new run
  auto c = Open(Job(root_), "", /*start=*/false);
  absl::Status s = c->checkpoints().Start();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("--restore"));
  EXPECT_THAT(s.message(), HasSubstr("of this job"));
}

TEST_F(CheckpointOrchestratorTest, RestoreResolvesTheChainAndServesResumeState) {
  v1::JobConfig job = Job(root_);
  job.mutable_training()->mutable_checkpoint()->set_incremental(true);
  {
    auto c = Open(job);
    for (uint64_t step : {10, 20, 30}) ASSERT_TRUE(CutAll(*c, step).ok());
  }
  std::filesystem::remove_all(dir_.path() + "/state");
  // A longer run of the same job: training.steps is not in the digest.
  job.mutable_training()->set_steps(1000);
  shards_ = std::make_shared<FakeShards>();
  auto c = Open(job, "latest");
  ASSERT_TRUE(c->checkpoints().WaitIdle(absl::Seconds(30)));
  absl::StatusOr<v1::GetResumeStateResponse> r = c->checkpoints().ResumeState(1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->resume());
  EXPECT_EQ(r->step(), 30u);
  EXPECT_EQ(r->dense_state(), "dense-30");
  EXPECT_EQ(r->position().batches_read(), 31);
  {
    absl::MutexLock lock(&shards_->mu);
    ASSERT_EQ(shards_->restores.size(), 2u);
    const v1::RestoreRowsRequest& req = shards_->restores[0].second;
    EXPECT_THAT(std::vector<std::string>(req.checkpoint_dirs().begin(),
                                         req.checkpoint_dirs().end()),
                ElementsAre(root_ + "/step-000000000010", root_ + "/step-000000000020",
                            root_ + "/step-000000000030"));
    EXPECT_EQ(req.step(), 30u);
  }
  auto list = c->checkpoints().List();
  EXPECT_EQ(list->restored_step(), 30u);
  // The next checkpoint extends the restored chain.
  ASSERT_TRUE(CutAll(*c, 40).ok());
  auto m = ckpt::ReadManifest(root_ + "/" + ckpt::CheckpointDirName(40));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kind(), v1::CHECKPOINT_KIND_INCREMENTAL);
  EXPECT_EQ(m->base_step(), 30u);
  EXPECT_EQ(m->full_step(), 10u);
}

TEST_F(CheckpointOrchestratorTest, RestoreAtStepAndRefusals) {
  {
    auto c = Open(Job(root_));
    for (uint64_t step : {10, 20}) ASSERT_TRUE(CutAll(*c, step).ok());
  }
  std::filesystem::remove_all(dir_.path() + "/state");
  {
    auto c = Open(Job(root_), root_ + "@10");
    ASSERT_TRUE(c->checkpoints().WaitIdle(absl::Seconds(30)));
    EXPECT_EQ(c->checkpoints().ResumeState(0)->step(), 10u);
  }
  std::filesystem::remove_all(dir_.path() + "/state");
  {
    auto c = Open(Job(root_), root_ + "@15", false);
    absl::Status s = c->checkpoints().Start();
    EXPECT_TRUE(absl::IsNotFound(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("10, 20"));
  }
  std::filesystem::remove_all(dir_.path() + "/state");
  {
    v1::JobConfig other = Job(root_);
    other.mutable_tables(0)->set_dim(16);
    other.mutable_model()->set_bottom_mlp(0, 16);
    auto c = Open(other, "latest", false);
    absl::Status s = c->checkpoints().Start();
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("step-000000000020/MANIFEST"));
    EXPECT_THAT(s.message(), HasSubstr("another job"));
  }
  std::filesystem::remove_all(dir_.path() + "/state");
  {
    // A damaged dense state is named.
    std::FILE* f = std::fopen((root_ + "/step-000000000020/dense.pb").c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fputc('X', f);
    std::fclose(f);
    auto c = Open(Job(root_), root_ + "@20", false);
    absl::Status s = c->checkpoints().Start();
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("step-000000000020/dense.pb"));
  }
  std::filesystem::remove_all(dir_.path() + "/state");
  {
    // Without a step, the newest intact one is restored instead.
    auto c = Open(Job(root_), "latest");
    ASSERT_TRUE(c->checkpoints().WaitIdle(absl::Seconds(30)));
    auto r = c->checkpoints().ResumeState(0);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step(), 10u);
  }
}

TEST_F(CheckpointOrchestratorTest, RowFilesRefusedAsDamagedFallBackToAnOlderCheckpoint) {
  {
    auto c = Open(Job(root_));
    for (uint64_t step : {10, 20}) ASSERT_TRUE(CutAll(*c, step).ok());
  }
  std::filesystem::remove_all(dir_.path() + "/state");
  shards_->damaged_steps = {20};
  {
    auto c = Open(Job(root_), "latest");
    ASSERT_TRUE(c->checkpoints().WaitIdle(absl::Seconds(30)));
    auto r = c->checkpoints().ResumeState(0);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step(), 10u);
    EXPECT_EQ(r->dense_state(), "dense-10");
    EXPECT_EQ(c->checkpoints().List()->restored_step(), 10u);
    // Training on from step 10 writes step 20 anew (not "complete already").
    const size_t saves = [&] {
      absl::MutexLock lock(&shards_->mu);
      return shards_->saves.size();
    }();
    ASSERT_TRUE(CutAll(*c, 20).ok());
    absl::MutexLock lock(&shards_->mu);
    EXPECT_EQ(shards_->saves.size(), saves + 2);
  }
  std::filesystem::remove_all(dir_.path() + "/state");
  {
    // A step asked for is that step or nothing.
    auto c = Open(Job(root_), root_ + "@20");
    ASSERT_TRUE(c->checkpoints().WaitIdle(absl::Seconds(30)));
    auto r = c->checkpoints().ResumeState(0);
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  }
  std::filesystem::remove_all(dir_.path() + "/state");
  shards_->damaged_steps = {10, 20};
  {
    auto c = Open(Job(root_), "latest");
    ASSERT_TRUE(c->checkpoints().WaitIdle(absl::Seconds(30)));
    auto r = c->checkpoints().ResumeState(0);
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("no intact checkpoint"));
  }
}

TEST_F(CheckpointOrchestratorTest, ResumeStateWithoutRestoreAndRestoreFailure) {
  auto c = Open(Job(root_));
  auto fresh = c->checkpoints().ResumeState(0);
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(fresh->resume());
  ASSERT_TRUE(CutAll(*c, 10).ok());
  c.reset();
  std::filesystem::remove_all(dir_.path() + "/state");
  shards_->refuse_restore = true;
  c = Open(Job(root_), "latest");
  ASSERT_TRUE(c->checkpoints().WaitIdle(absl::Seconds(30)));
  auto r = c->checkpoints().ResumeState(0);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("the store holds rows"));
}

}  // namespace
}  // namespace recps::server

namespace recps::server {
namespace {

void RegisterWorker(Coordinator& c, int rank) {
  v1::RegisterRequest r;
  r.set_role(v1::WORKER);
  r.set_rank(rank);
  ASSERT_TRUE(c.Register(r).ok());
}

// `recps launch --max_restarts` (or a recreated worker pod): new processes
// for every rank while the servers hold the rows of later steps.
TEST_F(CheckpointOrchestratorTest, RestartedRanksRollEveryServerBackToTheNewestCheckpoint) {
  auto c = Open(Job(root_));
  RegisterWorker(*c, 0);
  RegisterWorker(*c, 1);
  for (uint64_t step : {10, 20}) ASSERT_TRUE(CutAll(*c, step).ok());
  // A cut the failed run opened: answered, never written.
  Answer late;
  c->checkpoints().Cut(CutAt(0, 30, true), [&](auto r) {
    absl::MutexLock lock(&late.mu);
    late.result = std::move(r);
  });
  RegisterWorker(*c, 1);
  EXPECT_TRUE(absl::IsAborted(late.get().status())) << late.get().status();
  absl::StatusOr<v1::GetResumeStateResponse> waiting = c->checkpoints().ResumeState(1);
  EXPECT_TRUE(absl::IsUnavailable(waiting.status())) << waiting.status();
  EXPECT_THAT(waiting.status().message(), HasSubstr("waiting for worker rank(s) 0"));
  RegisterWorker(*c, 0);
  ASSERT_TRUE(c->checkpoints().WaitIdle(absl::Seconds(30)));
  absl::StatusOr<v1::GetResumeStateResponse> r = c->checkpoints().ResumeState(0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->resume());
  EXPECT_EQ(r->step(), 20u);
  EXPECT_EQ(r->dense_state(), "dense-20");
  {
    absl::MutexLock lock(&shards_->mu);
    ASSERT_EQ(shards_->restores.size(), 2u);
    for (const auto& [address, req] : shards_->restores) {
      EXPECT_TRUE(req.replace()) << address;
      EXPECT_EQ(req.step(), 20u);
      EXPECT_THAT(std::vector<std::string>(req.checkpoint_dirs().begin(),
                                           req.checkpoint_dirs().end()),
                  ElementsAre(root_ + "/step-000000000020"));
    }
  }
  // The run goes on from there, and a second restart rolls back again.
  ASSERT_TRUE(CutAll(*c, 30).ok());
  RegisterWorker(*c, 0);
  RegisterWorker(*c, 1);
  ASSERT_TRUE(c->checkpoints().WaitIdle(absl::Seconds(30)));
  r = c->checkpoints().ResumeState(1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 30u);
}

TEST_F(CheckpointOrchestratorTest, RestartedRanksWithoutACheckpointStartAgainAtStepZero) {
  auto c = Open(Job(root_));
  for (int round = 0; round < 2; ++round) {
    RegisterWorker(*c, 0);
    RegisterWorker(*c, 1);
  }
  ASSERT_TRUE(c->checkpoints().WaitIdle(absl::Seconds(30)));
  absl::StatusOr<v1::GetResumeStateResponse> r = c->checkpoints().ResumeState(0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->resume());
  absl::MutexLock lock(&shards_->mu);
  ASSERT_EQ(shards_->restores.size(), 2u);
  for (const auto& [address, req] : shards_->restores) {
    EXPECT_TRUE(req.replace()) << address;
    EXPECT_EQ(req.step(), 0u);
    EXPECT_EQ(req.checkpoint_dirs_size(), 0);
  }
}

}  // namespace
}  // namespace recps::server
