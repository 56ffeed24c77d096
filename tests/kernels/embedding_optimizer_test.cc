// Fused row updates: each optimizer against two steps worked out by hand
// from the formulas in kernels/optimizer.h (dim 2, w = [1, -2], g1 = [0.5,
// -1], g2 = [0.25, 0.5], lr = 0.1), then random rows on every CPU path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/embedding_optimizer.h"
#include "tests/kernels/test_util.h"

namespace recps::kernels {
namespace {

using testing::AllNear;
using testing::EveryCpuIsa;
using testing::RandomFloats;

struct HandCase {
  const char* name;
  OptimizerKind kind;
  float weight_decay;
  float eps;
  std::vector<float> want_weights;  // after two steps
  std::vector<float> want_state;    // state floats after two steps
};

std::vector<HandCase> HandCases() {
  return {
      // g' = g + 0.1 w: [0.6, -1.2] then [0.344, 0.312].
      {"sgd_wd", OptimizerKind::kSgd, 0.1f, 1e-8f, {0.9056f, -1.9112f}, {}},
      // s = [0.25, 1] then [0.3125, 1.25]; w -= 0.1 g / sqrt(s).
      {"adagrad", OptimizerKind::kAdagrad, 0.0f, 1e-10f,
       {0.85527864f, -1.94472136f}, {0.3125f, 1.25f}},
      {"adagrad_wd", OptimizerKind::kAdagrad, 0.1f, 1e-10f,
       {0.85069874f, -1.92501220f}, {0.4756f, 1.5361f}},
      // s = mean(g^2): 0.625 then 0.78125.
      {"rowwise_adagrad", OptimizerKind::kRowWiseAdagrad, 0.0f, 1e-10f,
       {0.90847018f, -1.93007744f}, {0.78125f}},
      {"rowwise_adagrad_wd", OptimizerKind::kRowWiseAdagrad, 0.1f, 1e-10f,
       {0.90252238f, -1.90465055f}, {1.00793114f}},
      // Step 1 moves each weight by lr * sign(g); m = [0.07, -0.04],
      // v = [3.1225e-4, 1.249e-3] after step 2.
      {"adam", OptimizerKind::kAdam, 0.0f, 1e-8f, {0.80678204f, -1.87336630f},
       {0.07f, -0.04f, 3.1225e-4f, 1.249e-3f}},
      {"adam_wd", OptimizerKind::kAdam, 0.1f, 1e-8f,
       {0.80500977f, -1.85374726f}, {0.088f, -0.077f, 4.7524e-4f, 1.53466e-3f}},
      // AdamW: w *= 0.99 before each Adam step; moments as plain Adam.
      {"adamw", OptimizerKind::kAdamW, 0.1f, 1e-8f, {0.78788204f, -1.83456630f},
       {0.07f, -0.04f, 3.1225e-4f, 1.249e-3f}},
  };
}

class FusedOptimizerHand : public ::testing::TestWithParam<HandCase> {};

TEST_P(FusedOptimizerHand, TwoStepsMatchHandValues) {
  const HandCase& c = GetParam();
  const int dim = 2;
  const int64_t stride = FusedRowStride(c.kind, dim);
  ASSERT_EQ(stride % 4, 0);
  for (const ExecContext& ctx : EveryCpuIsa()) {
    SCOPED_TRACE(CpuIsaName(ctx.isa));
    // Row 0 must stay untouched; row 1 is updated.
    std::vector<float> rows(2 * stride, 0.0f);
    rows[0] = 5.0f;
    rows[1] = 6.0f;
    rows[stride] = 1.0f;
    rows[stride + 1] = -2.0f;
    InitFusedRowState(c.kind, dim, rows.data() + stride);
    FusedUpdateArgs a;
    a.rows = rows.data();
    a.num_rows = 2;
    a.row_stride = stride;
    a.dim = dim;
    const int64_t index = 1;
    a.row_indices = &index;
    a.num_updates = 1;
    a.optimizer.kind = c.kind;
    a.optimizer.learning_rate = 0.1f;
    a.optimizer.weight_decay = c.weight_decay;
    a.optimizer.eps = c.eps;
    for (const std::vector<float>& g : {std::vector<float>{0.5f, -1.0f},
                                        std::vector<float>{0.25f, 0.5f}}) {
      a.grads = g.data();
      ASSERT_TRUE(FusedOptimizerUpdateCpu(a, ctx).ok());
    }
    EXPECT_TRUE(AllNear(rows.data() + stride, c.want_weights.data(), dim, 2e-6, 2e-6));
    EXPECT_TRUE(AllNear(rows.data() + stride + dim, c.want_state.data(),
                        c.want_state.size(), 1e-7, 1e-5));
    if (c.kind == OptimizerKind::kAdam || c.kind == OptimizerKind::kAdamW) {
      uint32_t step;
      std::memcpy(&step, rows.data() + stride + 3 * dim, sizeof(step));
      EXPECT_EQ(step, 2u);
    }
    EXPECT_EQ(rows[0], 5.0f);
    EXPECT_EQ(rows[1], 6.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, FusedOptimizerHand, ::testing::ValuesIn(HandCases()),
    [](const ::testing::TestParamInfo<HandCase>& info) { return info.param.name; });

// Many random rows, several widths: every path and the threaded split give
// the same bits, and each updated row equals a single-row update.
TEST(FusedOptimizer, EveryPathAndThreadCountGivesTheSameBits) {
  ThreadPool pool(3);
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad,
                             OptimizerKind::kRowWiseAdagrad, OptimizerKind::kAdam,
                             OptimizerKind::kAdamW}) {
    for (int dim : {1, 7, 16, 33, 64, 128}) {
      SCOPED_TRACE(std::string(OptimizerName(kind)) + " dim " + std::to_string(dim));
      const int64_t num_rows = 300, num_updates = 200;
      const int64_t stride = FusedRowStride(kind, dim);
      std::vector<float> initial = RandomFloats(num_rows * stride, dim, 0.0f, 1.0f);
      std::vector<int64_t> perm(num_rows);
      for (int64_t i = 0; i < num_rows; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), std::mt19937_64(dim));
      perm.resize(num_updates);
      const std::vector<float> grads = RandomFloats(num_updates * dim, 2 * dim);

      FusedUpdateArgs a;
      a.num_rows = num_rows;
      a.row_stride = stride;
      a.dim = dim;
      a.row_indices = perm.data();
      a.num_updates = num_updates;
      a.grads = grads.data();
      a.optimizer.kind = kind;
      a.optimizer.weight_decay = 0.01f;

      // Reference: the portable path, one row per call.
      std::vector<float> want = initial;
      for (int64_t i = 0; i < num_updates; ++i) {
        FusedUpdateArgs one = a;
        one.rows = want.data();
        one.row_indices = &perm[i];
        one.num_updates = 1;
        one.grads = grads.data() + i * dim;
        ASSERT_TRUE(FusedOptimizerUpdateCpu(one, {nullptr, CpuIsa::kPortable}).ok());
      }
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        for (const ExecContext& ctx : EveryCpuIsa(p)) {
          SCOPED_TRACE(CpuIsaName(ctx.isa));
          std::vector<float> rows = initial;
          a.rows = rows.data();
          ASSERT_TRUE(FusedOptimizerUpdateCpu(a, ctx).ok());
          EXPECT_TRUE(AllNear(rows, want, 0.0));
        }
      }
    }
  }
}

TEST(FusedOptimizer, BadArgumentsAreRefusedBeforeAnyRowChanges) {
  const int dim = 4;
  const int64_t stride = FusedRowStride(OptimizerKind::kAdagrad, dim);
  std::vector<float> rows(3 * stride, 1.0f);
  const std::vector<float> before = rows;
  std::vector<int64_t> idx = {0, 3};  // 3 is out of range
  std::vector<float> grads(2 * dim, 0.5f);
  FusedUpdateArgs a;
  a.rows = rows.data();
  a.num_rows = 3;
  a.row_stride = stride;
  a.dim = dim;
  a.row_indices = idx.data();
  a.num_updates = 2;
  a.grads = grads.data();
  a.optimizer.kind = OptimizerKind::kAdagrad;
  absl::Status s = FusedOptimizerUpdateCpu(a, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row index 3 of update 1"), absl::string_view::npos) << s;

  idx[1] = 2;
  a.row_stride = dim + 1;  // no room for Adagrad's state
  s = FusedOptimizerUpdateCpu(a, {});
  EXPECT_NE(s.message().find("row_stride"), absl::string_view::npos) << s;

  a.row_stride = stride;
  a.optimizer.learning_rate = std::nanf("");
  s = FusedOptimizerUpdateCpu(a, {});
  EXPECT_NE(s.message().find("learning_rate"), absl::string_view::npos) << s;

  a.optimizer.learning_rate = 0.1f;
  a.optimizer.kind = OptimizerKind::kAdam;
  a.optimizer.beta2 = 1.0f;
  s = FusedOptimizerUpdateCpu(a, {});
  EXPECT_NE(s.message().find("beta2"), absl::string_view::npos) << s;
  EXPECT_EQ(rows, before);
}

TEST(FusedOptimizer, RowStridesAreSixteenByteAligned) {
  EXPECT_EQ(FusedRowStride(OptimizerKind::kSgd, 64), 64);
  EXPECT_EQ(FusedRowStride(OptimizerKind::kAdagrad, 64), 128);
  EXPECT_EQ(FusedRowStride(OptimizerKind::kRowWiseAdagrad, 64), 68);
  EXPECT_EQ(FusedRowStride(OptimizerKind::kAdam, 64), 196);
  EXPECT_EQ(FusedRowStride(OptimizerKind::kAdamW, 7), 24);
}

}  // namespace
}  // namespace recps::kernels
