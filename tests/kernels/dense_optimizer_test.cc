// Dense optimizer step: the hand-worked two steps of embedding_optimizer_test
// (same formulas, w = [1, -2], g1 = [0.5, -1], g2 = [0.25, 0.5], lr = 0.1),
// every path bit-identical, and its argument checks.
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dense_optimizer.h"
#include "tests/kernels/test_util.h"

namespace recps::kernels {
namespace {

using testing::AllNear;
using testing::EveryCpuIsa;
using testing::RandomFloats;

struct DenseHandCase {
  const char* name;
  OptimizerKind kind;
  float weight_decay;
  float eps;
  std::vector<float> want;
};

class DenseOptimizerHand : public ::testing::TestWithParam<DenseHandCase> {};

TEST_P(DenseOptimizerHand, TwoStepsMatchHandValues) {
  const DenseHandCase& c = GetParam();
  for (const ExecContext& ctx : EveryCpuIsa()) {
    SCOPED_TRACE(CpuIsaName(ctx.isa));
    std::vector<float> w = {1.0f, -2.0f};
    std::vector<float> state(DenseOptimizerStateSize(c.kind, 2), 0.0f);
    DenseOptimizerArgs a;
    a.weights = w.data();
    a.state = state.data();
    a.n = 2;
    a.optimizer.kind = c.kind;
    a.optimizer.learning_rate = 0.1f;
    a.optimizer.weight_decay = c.weight_decay;
    a.optimizer.eps = c.eps;
    const std::vector<std::vector<float>> grads = {{0.5f, -1.0f}, {0.25f, 0.5f}};
    for (int t = 0; t < 2; ++t) {
      a.grads = grads[t].data();
      a.step = t + 1;
      ASSERT_TRUE(DenseOptimizerStepCpu(a, ctx).ok());
    }
    EXPECT_TRUE(AllNear(w, c.want, 2e-6, 2e-6));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, DenseOptimizerHand,
    ::testing::Values(
        DenseHandCase{"sgd_wd", OptimizerKind::kSgd, 0.1f, 1e-8f, {0.9056f, -1.9112f}},
        DenseHandCase{"adagrad", OptimizerKind::kAdagrad, 0.0f, 1e-10f,
                      {0.85527864f, -1.94472136f}},
        DenseHandCase{"adam", OptimizerKind::kAdam, 0.0f, 1e-8f,
                      {0.80678204f, -1.87336630f}},
        DenseHandCase{"adamw", OptimizerKind::kAdamW, 0.1f, 1e-8f,
                      {0.78788204f, -1.83456630f}}),
    [](const ::testing::TestParamInfo<DenseHandCase>& info) {
      return info.param.name;
    });

TEST(DenseOptimizer, EveryPathAndThreadCountGivesTheSameBits) {
  ThreadPool pool(3);
  const int64_t n = 100003;  // several pool chunks and an odd tail
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad,
                             OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    SCOPED_TRACE(OptimizerName(kind));
    const std::vector<float> w0 = RandomFloats(n, 1);
    const std::vector<float> g = RandomFloats(n, 2);
    std::vector<float> want_w, want_s;
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      for (const ExecContext& ctx : EveryCpuIsa(p)) {
        std::vector<float> w = w0;
        std::vector<float> s(DenseOptimizerStateSize(kind, n), 0.0f);
        DenseOptimizerArgs a;
        a.weights = w.data();
        a.grads = g.data();
        a.state = s.data();
        a.n = n;
        a.step = 3;
        a.optimizer.kind = kind;
        a.optimizer.weight_decay = 0.01f;
        ASSERT_TRUE(DenseOptimizerStepCpu(a, ctx).ok());
        if (want_w.empty()) {
          want_w = w;
          want_s = s;
        }
        EXPECT_TRUE(AllNear(w, want_w, 0.0)) << CpuIsaName(ctx.isa);
        EXPECT_TRUE(AllNear(s, want_s, 0.0)) << CpuIsaName(ctx.isa);
      }
    }
  }
}

TEST(DenseOptimizer, RefusesRowWiseAdagradAndBadSteps) {
  std::vector<float> w(4), g(4), s(8);
  DenseOptimizerArgs a;
  a.weights = w.data();
  a.grads = g.data();
  a.state = s.data();
  a.n = 4;
  a.optimizer.kind = OptimizerKind::kRowWiseAdagrad;
  EXPECT_EQ(DenseOptimizerStepCpu(a, {}).code(), absl::StatusCode::kInvalidArgument);
  a.optimizer.kind = OptimizerKind::kAdam;
  a.step = 0;
  const absl::Status st = DenseOptimizerStepCpu(a, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("step"), absl::string_view::npos);
  a.step = 1;
  a.state = nullptr;
  EXPECT_EQ(DenseOptimizerStepCpu(a, {}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recps::kernels
