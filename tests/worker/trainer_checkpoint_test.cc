// The trainer's checkpoint cuts and resume against a real recps-shard
// (standalone, sync mode, one worker): where it cuts and why, that cutting
// does not change a number, pre-emption, and that a trainer resumed from a
// cut's dense state and data position at that step continues bit-identical
// to one that never stopped.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/embedding_client.h"
#include "common/config/job_config.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "tests/testing/local_shard.h"
#include "worker/data/synthetic.h"
#include "worker/model/dense_state.h"
#include "worker/trainer.h"

namespace recps::worker {
namespace {

using ::recps::testing::LocalShard;
using ::recps::testing::TempDir;

constexpr int kSteps = 10;

v1::JobConfig Job() {
  v1::JobConfig job;
  job.set_name("trainer_ckpt");
  for (int t = 0; t < 2; ++t) {
    v1::TableConfig* table = job.add_tables();
    table->set_name(absl::StrCat("t", t));
    table->set_dim(8);
    table->mutable_optimizer()->set_kind(v1::OptimizerConfig::ROWWISE_ADAGRAD);
    table->mutable_optimizer()->set_learning_rate(0.05f);
    v1::FeatureConfig* f = job.add_features();
    f->set_name(absl::StrCat("f", t));
    f->set_table(absl::StrCat("t", t));
  }
  job.mutable_model()->add_bottom_mlp(8);
  job.mutable_model()->add_top_mlp(8);
  job.mutable_model()->add_top_mlp(1);
  v1::TrainingConfig* tr = job.mutable_training();
  tr->set_batch_size(32);
  tr->set_steps(kSteps);
  tr->mutable_dense_optimizer()->set_kind(v1::OptimizerConfig::ADAM);
  tr->mutable_dense_optimizer()->set_learning_rate(0.01f);
  tr->mutable_consistency()->set_mode(v1::ConsistencyConfig::SYNC);
  tr->set_eval_batches(1);
  v1::SyntheticDataConfig* s = job.mutable_data()->mutable_synthetic();
  s->set_seed(3);
  s->set_num_dense(4);
  for (int64_t space : {300, 2000}) {
    v1::SyntheticFeatureConfig* f = s->add_features();
    f->set_id_space(space);
    f->set_zipf_exponent(1.05);
    f->set_min_ids_per_bag(1);
    f->set_max_ids_per_bag(2);
  }
  return job;
}

// What recps-worker reads for this job.
SyntheticConfig Data(const v1::JobConfig& job) {
  return ToSyntheticConfig(job.data().synthetic());
}

class TrainerCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string text;
    job_ = Job();
    ASSERT_TRUE(config::ValidateJobConfig(job_).ok()) << config::ValidateJobConfig(job_);
    google::protobuf::TextFormat::PrintToString(job_, &text);
    job_path_ = dir_.WriteFile("job.textproto", text);
  }

  // A fresh standalone shard server.
  std::unique_ptr<LocalShard> StartShard() {
    auto shard = LocalShard::Start(RECPS_SHARD_BINARY, {"--job=" + job_path_, "--threads=1",
                                                        "--num_slots=64", "--standalone"});
    EXPECT_TRUE(shard.ok()) << shard.status();
    return shard.ok() ? *std::move(shard) : nullptr;
  }

  // A trainer against `shard`, its data skipped to `start_step`.
  std::unique_ptr<Trainer> MakeTrainer(const LocalShard& shard, TrainerOptions options) {
    std::vector<client::TableSchema> tables;
    for (const auto& t : job_.tables()) tables.push_back({t.name(), t.dim()});
    auto client = client::EmbeddingClient::Create(
        tables, client::MakeServerShardMapSource({shard.address()}), {});
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    auto data = MakeSyntheticSource(Data(job_), 0, 1, job_.training().batch_size(), kSteps);
    EXPECT_EQ(*data->Skip(options.start_step), options.start_step);
    SyntheticConfig eval = Data(job_);
    eval.first_sample = int64_t{1} << 40;
    auto trainer = Trainer::Create(
        job_, *std::move(client), std::move(data),
        [eval]() -> absl::StatusOr<std::unique_ptr<BatchSource>> {
          return MakeSyntheticSource(eval, 0, 1, 32, 1);
        },
        std::move(options));
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    return trainer.ok() ? *std::move(trainer) : nullptr;
  }

  TempDir dir_;
  v1::JobConfig job_;
  std::string job_path_;
};

bool SameFloats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

TEST_F(TrainerCheckpoint, CutsPeriodicallyAndAtTheEndWithoutChangingANumber) {
  std::vector<CheckpointCutInfo> cuts;
  std::vector<int64_t> reported_before_cut;
  int64_t last_reported = -1;
  TrainerOptions options;
  options.checkpoint = [&](const CheckpointCutInfo& info) {
    cuts.push_back(info);
    reported_before_cut.push_back(last_reported);
    return absl::OkStatus();
  };
  options.on_step = [&](int64_t step, float, const TrainResult&) { last_reported = step; };
  options.checkpoint_every = 3;
  auto shard = StartShard();
  ASSERT_NE(shard, nullptr);
  auto trainer = MakeTrainer(*shard, options);
  ASSERT_NE(trainer, nullptr);
  absl::StatusOr<TrainResult> with = trainer->Run();
  ASSERT_TRUE(with.ok()) << with.status();
  ASSERT_EQ(cuts.size(), 4u);
  const int64_t steps[] = {3, 6, 9, 10};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(cuts[i].step, steps[i]);
    EXPECT_EQ(cuts[i].batches_read, steps[i]);
    EXPECT_EQ(cuts[i].reason, i < 3 ? "periodic" : "final");
    EXPECT_EQ(cuts[i].wait_complete, i == 3);
    EXPECT_EQ(cuts[i].dense.optimizer_steps(), steps[i]);  // rank 0 sends it
  }
  EXPECT_EQ(with->checkpoint_steps, std::vector<int64_t>({3, 6, 9, 10}));
  // Every step before a cut has reported its loss (recps-worker's --loss_log):
  // a worker killed right after the cut resumes past those steps.
  EXPECT_EQ(reported_before_cut, std::vector<int64_t>({2, 5, 8, 9}));
  EXPECT_EQ(with->step_seconds.size(), static_cast<size_t>(kSteps));

  auto fresh = StartShard();
  ASSERT_NE(fresh, nullptr);
  auto plain = MakeTrainer(*fresh, TrainerOptions());
  ASSERT_NE(plain, nullptr);
  absl::StatusOr<TrainResult> without = plain->Run();
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_TRUE(SameFloats(with->losses, without->losses));
  const auto p = trainer->model().parameters();
  const auto q = plain->model().parameters();
  EXPECT_TRUE(SameFloats({p.begin(), p.end()}, {q.begin(), q.end()}));
}

TEST_F(TrainerCheckpoint, RequestedOnceAndPreemptedThenResumedBitIdentical) {
  // The uninterrupted run.
  auto shard_a = StartShard();
  ASSERT_NE(shard_a, nullptr);
  auto straight = MakeTrainer(*shard_a, TrainerOptions());
  ASSERT_NE(straight, nullptr);
  absl::StatusOr<TrainResult> want = straight->Run();
  ASSERT_TRUE(want.ok()) << want.status();

  // A request seen after step 1, a stop after step 4: cuts at 2
  // ("requested", once) and 5 ("preempted", then Run returns).
  auto shard_b = StartShard();
  ASSERT_NE(shard_b, nullptr);
  std::vector<CheckpointCutInfo> cuts;
  uint64_t request_id = 7;  // a request from before the run: not answered
  bool stop = false;
  TrainerOptions options;
  options.checkpoint = [&](const CheckpointCutInfo& info) {
    cuts.push_back(info);
    return absl::OkStatus();
  };
  options.checkpoint_request_id = [&] { return request_id; };
  options.stop_requested = [&] { return stop; };
  options.on_step = [&](int64_t step, float, const TrainResult&) {
    if (step == 0) request_id = 8;
    if (step == 3) stop = true;
  };
  auto first = MakeTrainer(*shard_b, options);
  ASSERT_NE(first, nullptr);
  absl::StatusOr<TrainResult> part = first->Run();
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_TRUE(part->preempted);
  EXPECT_EQ(part->steps, 5);
  ASSERT_EQ(cuts.size(), 2u);
  EXPECT_EQ(cuts[0].step, 2);
  EXPECT_EQ(cuts[0].reason, "requested");
  EXPECT_EQ(cuts[1].step, 5);
  EXPECT_EQ(cuts[1].reason, "preempted");
  EXPECT_TRUE(cuts[1].wait_complete);

  // Resume on the same server (its rows are the state after 5 steps): the
  // dense state and data position of the cut.
  TrainerOptions resume;
  resume.start_step = 5;
  auto second = MakeTrainer(*shard_b, resume);
  ASSERT_NE(second, nullptr);
  v1::DenseState dense;
  ASSERT_TRUE(dense.ParseFromString(cuts[1].dense.SerializeAsString()));
  ASSERT_TRUE(LoadDenseState(dense, &second->model(), &second->optimizer()).ok());
  absl::StatusOr<TrainResult> rest = second->Run();
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(rest->steps, kSteps);
  std::vector<float> losses = part->losses;
  losses.insert(losses.end(), rest->losses.begin(), rest->losses.end());
  EXPECT_TRUE(SameFloats(losses, want->losses));
  const auto p = straight->model().parameters();
  const auto q = second->model().parameters();
  EXPECT_TRUE(SameFloats({p.begin(), p.end()}, {q.begin(), q.end()}));
}

}  // namespace
}  // namespace recps::worker
