// DLRM init and config checks, the dense optimizer, and a small end-to-end
// training run of the dense part.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dense_optimizer.h"
#include "tests/kernels/test_util.h"
#include "tests/worker/dlrm_reference.h"
#include "worker/model/dense_optimizer.h"
#include "worker/model/dlrm.h"

namespace recps::worker {
namespace {

using ::recps::kernels::ExecContext;
using ::recps::OptimizerKind;
using ::recps::OptimizerParams;
using ::recps::kernels::testing::RandomFloats;
using ::recps::worker::testing::Layout;
using ::recps::worker::testing::RefLayer;
using ::testing::HasSubstr;

DlrmConfig WideConfig(uint64_t seed) {
  DlrmConfig c;
  c.num_dense = 13;
  c.num_sparse = 4;
  c.embedding_dim = 16;
  c.bottom_mlp = {512, 256, 16};
  c.top_mlp = {512, 256, 1};
  c.seed = seed;
  return c;
}

std::vector<float> InitialParameters(const DlrmConfig& c) {
  auto model = DlrmModel::Create(c);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  return std::vector<float>((*model)->parameters().begin(),
                            (*model)->parameters().end());
}

// Sample mean and standard deviation of p[begin, begin + n).
void Moments(const std::vector<float>& p, int64_t begin, int64_t n,
             double* mean, double* stddev) {
  double s = 0.0, s2 = 0.0;
  for (int64_t i = begin; i < begin + n; ++i) {
    s += p[i];
    s2 += static_cast<double>(p[i]) * p[i];
  }
  *mean = s / n;
  *stddev = std::sqrt(s2 / n - *mean * *mean);
}

TEST(DlrmInitTest, DeterministicPerSeed) {
  const std::vector<float> a = InitialParameters(WideConfig(1));
  EXPECT_EQ(a, InitialParameters(WideConfig(1)));
  const std::vector<float> b = InitialParameters(WideConfig(2));
  ASSERT_EQ(a.size(), b.size());
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  EXPECT_LT(same, static_cast<int64_t>(a.size() / 1000));
}

// Each layer is seeded by its name, not its place in the buffer: changing
// the top MLP leaves the bottom MLP's init alone.
TEST(DlrmInitTest, BottomInitIndependentOfTopMlp) {
  DlrmConfig c = WideConfig(3);
  const std::vector<float> a = InitialParameters(c);
  c.top_mlp = {32, 1};
  const std::vector<float> b = InitialParameters(c);
  const RefLayer last_bottom = Layout(c)[c.bottom_mlp.size() - 1];
  const int64_t bottom_size = last_bottom.bias_offset + last_bottom.out;
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + bottom_size, b.begin()));
}

TEST(DlrmInitTest, ScaleFollowsDlrmReference) {
  const DlrmConfig c = WideConfig(4);
  const std::vector<float> p = InitialParameters(c);
  for (const RefLayer& l : Layout(c)) {
    SCOPED_TRACE(::testing::Message() << l.in << " -> " << l.out);
    double mean, stddev;
    const int64_t n = l.in * l.out;
    Moments(p, l.weight_offset, n, &mean, &stddev);
    const double want = std::sqrt(2.0 / (l.in + l.out));
    // Five standard errors of the sample mean and deviation.
    EXPECT_NEAR(mean, 0.0, 5 * want / std::sqrt(n));
    EXPECT_NEAR(stddev, want, 5 * want / std::sqrt(2.0 * n));
    if (l.out >= 256) {
      Moments(p, l.bias_offset, l.out, &mean, &stddev);
      const double want_b = std::sqrt(1.0 / l.out);
      EXPECT_NEAR(mean, 0.0, 5 * want_b / std::sqrt(l.out));
      EXPECT_NEAR(stddev, want_b, 5 * want_b / std::sqrt(2.0 * l.out));
    }
  }
}

void ExpectBadConfig(const DlrmConfig& c, const char* field) {
  auto model = DlrmModel::Create(c);
  ASSERT_FALSE(model.ok()) << field;
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr(field));
}

TEST(DlrmConfigTest, BadConfigsNameTheField) {
  const DlrmConfig good = WideConfig(0);
  ASSERT_TRUE(DlrmModel::Create(good).ok());
  DlrmConfig c = good;
  c.bottom_mlp = {64, 8};
  ExpectBadConfig(c, "bottom_mlp");
  c = good;
  c.top_mlp = {64, 2};
  ExpectBadConfig(c, "top_mlp");
  c = good;
  c.bottom_mlp.clear();
  ExpectBadConfig(c, "bottom_mlp");
  c = good;
  c.top_mlp.clear();
  ExpectBadConfig(c, "top_mlp");
  c = good;
  c.top_mlp = {0, 1};
  ExpectBadConfig(c, "top_mlp[0]");
  c = good;
  c.num_sparse = 0;
  ExpectBadConfig(c, "num_sparse");
  c = good;
  c.num_dense = 0;
  ExpectBadConfig(c, "num_dense");
  c = good;
  c.embedding_dim = 0;
  ExpectBadConfig(c, "embedding_dim");
}

TEST(DenseOptimizerTest, CountsStepsForAdam) {
  OptimizerParams p;
  p.kind = OptimizerKind::kAdam;
  p.learning_rate = 0.1f;
  const int64_t n = 37;
  auto opt = DenseOptimizer::Create(p, n);
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ((*opt)->state().size(), static_cast<size_t>(2 * n));
  std::vector<float> w = RandomFloats(n, 1), want = w;
  std::vector<float> state(2 * n, 0.0f);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> g = RandomFloats(n, 10 + step);
    ASSERT_TRUE((*opt)->Step(absl::MakeSpan(w), g, {}).ok());
    kernels::DenseOptimizerArgs a;
    a.weights = want.data();
    a.grads = g.data();
    a.state = state.data();
    a.n = n;
    a.step = step;
    a.optimizer = p;
    ASSERT_TRUE(kernels::DenseOptimizerStepCpu(a, {}).ok());
    EXPECT_EQ(w, want) << "step " << step;
    EXPECT_EQ((*opt)->step(), step);
  }
}

TEST(DenseOptimizerTest, Errors) {
  OptimizerParams p;
  p.kind = OptimizerKind::kRowWiseAdagrad;
  EXPECT_EQ(DenseOptimizer::Create(p, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  p.kind = OptimizerKind::kSgd;
  EXPECT_FALSE(DenseOptimizer::Create(p, -1).ok());
  p.learning_rate = -1.0f;
  EXPECT_FALSE(DenseOptimizer::Create(p, 4).ok());
  p.learning_rate = 0.5f;
  auto opt = DenseOptimizer::Create(p, 4);
  ASSERT_TRUE(opt.ok());
  std::vector<float> w(4, 1.0f), g(3, 1.0f);
  EXPECT_EQ((*opt)->Step(absl::MakeSpan(w), g, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->step(), 0);
  EXPECT_FALSE((*opt)->SetLearningRate(std::nanf("")).ok());
  ASSERT_TRUE((*opt)->SetLearningRate(0.25f).ok());
  g.assign(4, 2.0f);
  ASSERT_TRUE((*opt)->Step(absl::MakeSpan(w), g, {}).ok());
  EXPECT_EQ(w, std::vector<float>(4, 0.5f));  // 1 - 0.25 * 2
}

// A separable toy problem: fixed pooled embeddings, labels from a linear
// rule on the dense features. The dense part alone must learn it.
float TrainToy(OptimizerParams p, int steps, float* initial_loss) {
  DlrmConfig c;
  c.num_dense = 4;
  c.num_sparse = 2;
  c.embedding_dim = 4;
  c.bottom_mlp = {16, 4};
  c.top_mlp = {16, 1};
  c.seed = 9;
  auto model = DlrmModel::Create(c);
  EXPECT_TRUE(model.ok());
  auto opt = DenseOptimizer::Create(p, (*model)->num_parameters());
  EXPECT_TRUE(opt.ok());
  const int64_t batch = 128;
  const std::vector<float> dense = RandomFloats(batch * c.num_dense, 21);
  const std::vector<float> pooled =
      RandomFloats(batch * c.num_sparse * c.embedding_dim, 22, -0.5f, 0.5f);
  std::vector<float> labels(batch);
  for (int64_t s = 0; s < batch; ++s) {
    const float* x = dense.data() + s * c.num_dense;
    labels[s] = x[0] + 0.5f * x[1] - x[2] > 0.0f ? 1.0f : 0.0f;
  }
  std::vector<float> grad_pooled(pooled.size());
  float loss = 0.0f;
  for (int step = 0; step < steps; ++step) {
    auto l = DlrmTrainStep(**model, batch, dense.data(), pooled.data(),
                           labels.data(), grad_pooled.data(), nullptr, {});
    EXPECT_TRUE(l.ok()) << l.status();
    loss = *l;
    if (step == 0) *initial_loss = loss;
    EXPECT_TRUE((*opt)->Step((*model)->parameters(), (*model)->gradients(), {})
                    .ok());
  }
  return loss;
}

TEST(DlrmTrainingTest, SgdDrivesLossDown) {
  OptimizerParams p;
  p.kind = OptimizerKind::kSgd;
  p.learning_rate = 0.5f;
  float initial = 0.0f;
  const float final_loss = TrainToy(p, 300, &initial);
  EXPECT_GT(initial, 0.6f);
  EXPECT_LT(final_loss, 0.1f) << "initial " << initial;
}

TEST(DlrmTrainingTest, AdamDrivesLossDown) {
  OptimizerParams p;
  p.kind = OptimizerKind::kAdam;
  p.learning_rate = 0.01f;
  float initial = 0.0f;
  const float final_loss = TrainToy(p, 200, &initial);
  EXPECT_LT(final_loss, 0.1f) << "initial " << initial;
}

}  // namespace
}  // namespace recps::worker
