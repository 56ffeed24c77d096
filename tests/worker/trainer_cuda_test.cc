// The trainer with its dense model on a device, against a real recps-shard
// (standalone, sync): the allreduce hook's device-side buffer on the CPU,
// and (TrainerCudaTest.*, skipped without a GPU, failing when a GPU is
// present but CUDA or NCCL does not initialise) 50 steps of the GPU trainer
// against the CPU trainer on the same data, plain and with a one-rank NCCL
// allreduce in the path.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/embedding_client.h"
#include "common/config/job_config.h"
#include "common/thread_pool.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "kernels/cuda_util.h"
#include "kernels/device_memory.h"
#include "tests/testing/local_shard.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/kv_store.h"
#include "worker/collectives/nccl_collectives.h"
#include "worker/data/synthetic.h"
#include "worker/trainer.h"
#include "tests/testing/gpu_test_util.h"

namespace recps::worker {
namespace {

using ::recps::testing::LocalShard;
using ::recps::testing::TempDir;

constexpr int kSteps = 50;

v1::JobConfig Job() {
  v1::JobConfig job;
  job.set_name("trainer_cuda");
  for (int t = 0; t < 2; ++t) {
    v1::TableConfig* table = job.add_tables();
    table->set_name(absl::StrCat("t", t));
    table->set_dim(16);
    table->mutable_optimizer()->set_kind(v1::OptimizerConfig::ROWWISE_ADAGRAD);
    table->mutable_optimizer()->set_learning_rate(0.05f);
    v1::FeatureConfig* f = job.add_features();
    f->set_name(absl::StrCat("f", t));
    f->set_table(absl::StrCat("t", t));
  }
  job.mutable_model()->add_bottom_mlp(32);
  job.mutable_model()->add_bottom_mlp(16);
  job.mutable_model()->add_top_mlp(32);
  job.mutable_model()->add_top_mlp(1);
  v1::TrainingConfig* tr = job.mutable_training();
  tr->set_batch_size(128);
  tr->set_steps(kSteps);
  // SGD: Adam would turn a near-zero gradient whose sign differs between
  // the devices (summation order) into a +-lr step (see dlrm_cuda_test.cc).
  tr->mutable_dense_optimizer()->set_kind(v1::OptimizerConfig::SGD);
  tr->mutable_dense_optimizer()->set_learning_rate(0.1f);
  tr->mutable_consistency()->set_mode(v1::ConsistencyConfig::SYNC);
  tr->set_eval_batches(1);
  v1::SyntheticDataConfig* s = job.mutable_data()->mutable_synthetic();
  s->set_seed(5);
  s->set_num_dense(6);
  // The data these tests were tuned on: noisy labels from every feature.
  s->set_label_noise(0.1);
  s->set_informative_features(2);
  for (int64_t space : {500, 3000}) {
    v1::SyntheticFeatureConfig* f = s->add_features();
    f->set_id_space(space);
    f->set_zipf_exponent(1.05);
    f->set_min_ids_per_bag(1);
    f->set_max_ids_per_bag(3);
  }
  return job;
}

// What recps-worker reads for this job.
SyntheticConfig Data(const v1::JobConfig& job) {
  return ToSyntheticConfig(job.data().synthetic());
}

class TrainerDevice : public ::testing::Test {
 protected:
  void SetUp() override { SetJob(Job()); }

  void SetJob(const v1::JobConfig& job) {
    job_ = job;
    ASSERT_TRUE(config::ValidateJobConfig(job_).ok()) << config::ValidateJobConfig(job_);
    std::string text;
    google::protobuf::TextFormat::PrintToString(job_, &text);
    job_path_ = dir_.WriteFile("job.textproto", text);
  }

  // Trains kSteps on a fresh standalone shard server; the per-step losses.
  std::vector<float> Train(TrainerOptions options) {
    absl::StatusOr<std::vector<float>> losses = TrainOr(std::move(options));
    EXPECT_TRUE(losses.ok()) << losses.status();
    return losses.ok() ? *std::move(losses) : std::vector<float>();
  }

  absl::StatusOr<std::vector<float>> TrainOr(TrainerOptions options) {
    auto shard = LocalShard::Start(RECPS_SHARD_BINARY, {"--job=" + job_path_, "--threads=1",
                                                        "--num_slots=64", "--standalone"});
    if (!shard.ok()) return shard.status();
    std::vector<client::TableSchema> tables;
    for (const auto& t : job_.tables()) tables.push_back({t.name(), t.dim()});
    auto client = client::EmbeddingClient::Create(
        tables, client::MakeServerShardMapSource({(*shard)->address()}), {});
    if (!client.ok()) return client.status();
    SyntheticConfig eval = Data(job_);
    eval.first_sample = int64_t{1} << 40;
    auto trainer = Trainer::Create(
        job_, *std::move(client),
        MakeSyntheticSource(Data(job_), 0, 1, job_.training().batch_size(), kSteps),
        [eval]() -> absl::StatusOr<std::unique_ptr<BatchSource>> {
          return MakeSyntheticSource(eval, 0, 1, 128, 1);
        },
        std::move(options));
    if (!trainer.ok()) return trainer.status();
    absl::StatusOr<TrainResult> result = (*trainer)->Run();
    if (!result.ok()) return result.status();
    EXPECT_EQ(result->losses.size(), static_cast<size_t>(kSteps));
    return result->losses;
  }

  TempDir dir_;
  v1::JobConfig job_;
  std::string job_path_;
};

// The allreduce hook now reduces a buffer on the model's device: on the
// CPU an identity hook must leave every loss bit-identical.
TEST_F(TrainerDevice, CpuAllreduceThroughTheDeviceBufferChangesNothing) {
  ThreadPool pool(2);
  TrainerOptions plain;
  plain.ctx.pool = &pool;
  const std::vector<float> without = Train(plain);
  LocalCollectives local;
  TrainerOptions hooked = plain;
  int calls = 0;
  hooked.allreduce = [&](absl::Span<float> data) {
    ++calls;
    return AllReduceInBuckets(local, data, 1000);
  };
  const std::vector<float> with = Train(hooked);
  EXPECT_EQ(calls, kSteps);
  EXPECT_EQ(with, without);
  ASSERT_FALSE(with.empty());
  EXPECT_LT(with.back(), with.front());  // it learns
}

// pool_on_device through the CPU twins of the GPU path (one kernel call per
// table, strided copies in and out of the pooled tensor): the same losses
// as host pooling, bit for bit, where every feature has its own table.
TEST_F(TrainerDevice, CpuPoolOnDeviceMatchesHostPooling) {
  ThreadPool pool(2);
  TrainerOptions host;
  host.ctx.pool = &pool;
  const std::vector<float> want = Train(host);
  TrainerOptions device = host;
  device.pool_on_device = true;
  const std::vector<float> got = Train(device);
  EXPECT_EQ(got, want);
  ASSERT_FALSE(got.empty());
}

// Two features on one table: one pooling call over both, one backward
// whose sums run over both features' positions (the host path adds the
// second feature's sums to the first's: a different rounding, not more).
TEST_F(TrainerDevice, CpuPoolOnDeviceWithASharedTable) {
  v1::JobConfig job = Job();
  job.mutable_features(1)->set_table("t0");
  SetJob(job);
  ThreadPool pool(2);
  TrainerOptions host;
  host.ctx.pool = &pool;
  const std::vector<float> want = Train(host);
  TrainerOptions device = host;
  device.pool_on_device = true;
  const std::vector<float> got = Train(device);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << "step " << i;
  }
  // A shared table needs one pooling mode.
  job.mutable_features(1)->set_pooling(v1::FeatureConfig::MEAN);
  SetJob(job);
  absl::StatusOr<std::vector<float>> mixed = TrainOr(device);
  EXPECT_TRUE(absl::IsInvalidArgument(mixed.status())) << mixed.status();
  EXPECT_NE(mixed.status().message().find("share table 't0' with different pooling"),
            std::string::npos)
      << mixed.status();
}

// Relative difference of two loss curves, step by step.
void ExpectCurvesClose(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "step " << i;
  }
}

TEST_F(TrainerDevice, CudaTrainerMatchesTheCpuOver50Steps) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  ThreadPool pool(2);
  TrainerOptions cpu;
  cpu.ctx.pool = &pool;
  const std::vector<float> cpu_losses = Train(cpu);
  auto exec = kernels::ExecResources::Create(kernels::Device::kCuda, 0, &pool);
  ASSERT_TRUE(exec.ok()) << exec.status();  // a GPU is present: must work
  TrainerOptions gpu;
  gpu.ctx = (*exec)->ctx();
  ExpectCurvesClose(Train(gpu), cpu_losses);
}

TEST_F(TrainerDevice, CudaTrainerPoolingOnTheGpuMatchesTheCpu) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  ThreadPool pool(2);
  TrainerOptions cpu;
  cpu.ctx.pool = &pool;
  const std::vector<float> cpu_losses = Train(cpu);
  auto exec = kernels::ExecResources::Create(kernels::Device::kCuda, 0, &pool);
  ASSERT_TRUE(exec.ok()) << exec.status();
  TrainerOptions gpu;
  gpu.ctx = (*exec)->ctx();
  gpu.pool_on_device = true;
  ExpectCurvesClose(Train(gpu), cpu_losses);
}

TEST_F(TrainerDevice, CudaTrainerWithOneRankNcclAllreduce) {
  RECPS_REQUIRE_GPU_OR_SKIP();
#if !defined(RECPS_HAVE_NCCL)
  FAIL() << "a GPU is present but this build has no NCCL";
#else
  ThreadPool pool(2);
  TrainerOptions cpu;
  cpu.ctx.pool = &pool;
  const std::vector<float> cpu_losses = Train(cpu);
  auto exec = kernels::ExecResources::Create(kernels::Device::kCuda, 0, &pool);
  ASSERT_TRUE(exec.ok()) << exec.status();
  InMemoryKeyValueStore store;
  auto nccl = CreateNcclCollectives(store, "trainer-cuda", 0, 1, 0, absl::Seconds(60));
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  TrainerOptions gpu;
  gpu.ctx = (*exec)->ctx();
  int calls = 0;
  gpu.allreduce = [&](absl::Span<float> data) {
    ++calls;
    return AllReduceInBuckets(**nccl, data, 1000);  // several buckets
  };
  ExpectCurvesClose(Train(gpu), cpu_losses);
  EXPECT_EQ(calls, kSteps);
#endif
}

}  // namespace
}  // namespace recps::worker
