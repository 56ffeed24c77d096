// Fused row updates: each optimizer against two steps worked out by hand
// from the formulas in kernels/optimizer.h (dim 2, w = [1, -2], g1 = [0.5,
// -1], g2 = [0.25, 0.5], lr = 0.1), then random rows on every CPU path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
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

TEST(FusedOptimizer, VisitOptimizerReachesEveryRegisteredKind) {
  for (const OptimizerInfo& info : Optimizers()) {
    const OptimizerKind seen = VisitOptimizer(
        info.kind, [](auto kind) { return decltype(kind)::kKind; },
        [] { return static_cast<OptimizerKind>(-1); });
    EXPECT_EQ(seen, info.kind) << info.name;
  }
  bool unknown = false;
  VisitOptimizer(
      static_cast<OptimizerKind>(99), [](auto) {}, [&] { unknown = true; });
  EXPECT_TRUE(unknown);
}

// Every registered kind updates rows and keeps rows it does not touch.
TEST(FusedOptimizer, EveryRegisteredKindUpdatesItsRow) {
  for (const OptimizerInfo& info : Optimizers()) {
    SCOPED_TRACE(info.name);
    const int dim = 8;
    const int64_t stride = FusedRowStride(info.kind, dim);
    std::vector<float> rows(2 * stride, 0.5f);
    InitFusedRowState(info.kind, dim, rows.data() + stride);
    const std::vector<float> grads(dim, 1.0f);
    const int64_t index = 1;
    FusedUpdateArgs a;
    a.rows = rows.data();
    a.num_rows = 2;
    a.row_stride = stride;
    a.dim = dim;
    a.row_indices = &index;
    a.num_updates = 1;
    a.grads = grads.data();
    a.optimizer.kind = info.kind;
    ASSERT_TRUE(FusedOptimizerUpdateCpu(a, {}).ok());
    for (int j = 0; j < dim; ++j) {
      EXPECT_EQ(rows[j], 0.5f);
      EXPECT_LT(rows[stride + j], 0.5f);
    }
  }
}

// ---- 16-bit weights (fp16 / bf16), fp32 optimizer state ----

TEST(FusedOptimizer16, RowLayoutKeepsStateAndRowsSixteenByteAligned) {
  for (RowPrecision p : {RowPrecision::kFp16, RowPrecision::kBf16}) {
    for (OptimizerKind k :
         {OptimizerKind::kSgd, OptimizerKind::kAdagrad,
          OptimizerKind::kRowWiseAdagrad, OptimizerKind::kAdam}) {
      for (int dim : {1, 7, 8, 9, 16, 64, 100, 4096}) {
        SCOPED_TRACE(dim);
        if (dim % 8 == 0) {
          EXPECT_EQ(FusedRowStateOffset(dim, p) % 4, 0);
        }
        EXPECT_EQ(FusedRowStateOffset(dim, p), (dim + 1) / 2);
        EXPECT_EQ(FusedRowStride(k, dim, p) % 4, 0);
        EXPECT_GE(FusedRowStride(k, dim, p),
                  FusedRowStateOffset(dim, p) + FusedRowStateWidth(k, dim));
        EXPECT_LE(FusedRowStride(k, dim, p), FusedRowStride(k, dim));
      }
    }
  }
  // SGD rows halve; Adagrad dim 64: 32 words of weights + 64 of state.
  EXPECT_EQ(FusedRowStride(OptimizerKind::kSgd, 64, RowPrecision::kFp16), 32);
  EXPECT_EQ(FusedRowStride(OptimizerKind::kAdagrad, 64, RowPrecision::kBf16),
            96);
  EXPECT_EQ(FusedRowStride(OptimizerKind::kAdam, 64, RowPrecision::kFp32),
            FusedRowStride(OptimizerKind::kAdam, 64));
}

uint16_t Narrow(RowPrecision p, float v) {
  return p == RowPrecision::kFp16 ? FloatToHalf(v) : FloatToBf16(v);
}
float Widen(RowPrecision p, uint16_t h) {
  return p == RowPrecision::kFp16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

struct Case16 {
  RowPrecision precision;
  OptimizerKind kind;
  float weight_decay;
  float scale;  // of the initial weights (small: fp16 subnormals)
};

// The 16-bit update against the fp32 kernel run on the widened row and
// rounded once per step (scalar round-to-nearest-even of common/half.h):
// bit-identical weights and state, three steps, every ISA (the portable
// build uses the scalar conversions, the others F16C).
TEST(FusedOptimizer16, MatchesTheFp32UpdateRoundedOncePerStep) {
  std::vector<Case16> cases;
  for (RowPrecision p : {RowPrecision::kFp16, RowPrecision::kBf16}) {
    for (OptimizerKind k :
         {OptimizerKind::kSgd, OptimizerKind::kAdagrad,
          OptimizerKind::kRowWiseAdagrad, OptimizerKind::kAdam,
          OptimizerKind::kAdamW}) {
      cases.push_back({p, k, 0.0f, 1.0f});
      cases.push_back({p, k, 0.05f, 1e-5f});
    }
  }
  for (const Case16& c : cases) {
    for (int dim : {1, 7, 8, 16, 33, 100}) {
      SCOPED_TRACE(::testing::Message()
                   << RowPrecisionName(c.precision) << " "
                   << OptimizerName(c.kind) << " wd " << c.weight_decay
                   << " scale " << c.scale << " dim " << dim);
      const int num_rows = 5;
      const int64_t s16 = FusedRowStride(c.kind, dim, c.precision);
      const int64_t off = FusedRowStateOffset(dim, c.precision);
      const int64_t s32 = FusedRowStride(c.kind, dim);
      const int64_t state = FusedRowStateWidth(c.kind, dim);
      // Initial rows: 16-bit weights, state >= 0 (Adam: step count 2).
      std::vector<float> rows16(num_rows * s16, 0.0f);
      const std::vector<float> w0 = RandomFloats(num_rows * dim, dim, -c.scale,
                                                 c.scale);
      const std::vector<float> st0 =
          RandomFloats(num_rows * state, 7 * dim, 0.0f, 0.01f);
      for (int r = 0; r < num_rows; ++r) {
        auto* w = reinterpret_cast<uint16_t*>(rows16.data() + r * s16);
        for (int j = 0; j < dim; ++j) w[j] = Narrow(c.precision, w0[r * dim + j]);
        std::copy(st0.begin() + r * state, st0.begin() + (r + 1) * state,
                  rows16.begin() + r * s16 + off);
        if (c.kind == OptimizerKind::kAdam || c.kind == OptimizerKind::kAdamW) {
          const uint32_t step = 2;
          std::memcpy(rows16.data() + r * s16 + off + 2 * dim, &step, 4);
        }
      }
      const std::vector<int64_t> idx = {3, 0, 4};  // row 1 and 2 untouched
      OptimizerParams params;
      params.kind = c.kind;
      params.learning_rate = 0.01f;
      params.weight_decay = c.weight_decay;
      // Reference: per step, widen, fp32 update (portable), round.
      std::vector<float> want = rows16;
      for (int step = 0; step < 3; ++step) {
        const std::vector<float> grads =
            RandomFloats(idx.size() * dim, 100 + step, -c.scale, c.scale);
        std::vector<float> rows32(num_rows * s32, 0.0f);
        for (int r = 0; r < num_rows; ++r) {
          const auto* w = reinterpret_cast<const uint16_t*>(want.data() + r * s16);
          for (int j = 0; j < dim; ++j) rows32[r * s32 + j] = Widen(c.precision, w[j]);
          std::copy(want.begin() + r * s16 + off,
                    want.begin() + r * s16 + off + state,
                    rows32.begin() + r * s32 + dim);
        }
        FusedUpdateArgs a;
        a.rows = rows32.data();
        a.num_rows = num_rows;
        a.row_stride = s32;
        a.dim = dim;
        a.row_indices = idx.data();
        a.num_updates = static_cast<int64_t>(idx.size());
        a.grads = grads.data();
        a.optimizer = params;
        ExecContext portable;
        portable.isa = CpuIsa::kPortable;
        ASSERT_TRUE(FusedOptimizerUpdateCpu(a, portable).ok());
        for (int r = 0; r < num_rows; ++r) {
          auto* w = reinterpret_cast<uint16_t*>(want.data() + r * s16);
          for (int j = 0; j < dim; ++j) w[j] = Narrow(c.precision, rows32[r * s32 + j]);
          std::copy(rows32.begin() + r * s32 + dim,
                    rows32.begin() + r * s32 + dim + state,
                    want.begin() + r * s16 + off);
        }
      }
      for (const ExecContext& ctx : EveryCpuIsa()) {
        SCOPED_TRACE(CpuIsaName(ctx.isa));
        std::vector<float> got = rows16;
        for (int step = 0; step < 3; ++step) {
          const std::vector<float> grads =
              RandomFloats(idx.size() * dim, 100 + step, -c.scale, c.scale);
          FusedUpdateArgs a;
          a.rows = got.data();
          a.precision = c.precision;
          a.num_rows = num_rows;
          a.row_stride = s16;
          a.dim = dim;
          a.row_indices = idx.data();
          a.num_updates = static_cast<int64_t>(idx.size());
          a.grads = grads.data();
          a.optimizer = params;
          ASSERT_TRUE(FusedOptimizerUpdateCpu(a, ctx).ok());
        }
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(),
                                 sizeof(float) * got.size()));
        // Something moved (the test is not vacuous).
        EXPECT_NE(0, std::memcmp(got.data(), rows16.data(),
                                 sizeof(float) * got.size()));
      }
    }
  }
}

TEST(FusedOptimizer16, AStrideTooSmallForTheStateIsRefused) {
  const int dim = 16;
  std::vector<float> rows(64, 0.0f);
  std::vector<float> grads(dim, 0.1f);
  const int64_t idx = 0;
  FusedUpdateArgs a;
  a.rows = rows.data();
  a.precision = RowPrecision::kFp16;
  a.num_rows = 1;
  a.row_stride = 8 + dim - 1;  // 8 words of halves, one state float short
  a.dim = dim;
  a.row_indices = &idx;
  a.num_updates = 1;
  a.grads = grads.data();
  a.optimizer.kind = OptimizerKind::kAdagrad;
  a.optimizer.learning_rate = 0.1f;
  const absl::Status s = FusedOptimizerUpdateCpu(a, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fp16"), absl::string_view::npos) << s;
  a.row_stride = 8 + dim;
  EXPECT_TRUE(FusedOptimizerUpdateCpu(a, {}).ok());
}

// Stochastic rounding: each weight lands on one of the two 16-bit
// neighbours of the fp32 update, the same on every ISA and every call, and
// unbiased: updates far below half an ulp still move the mean.
TEST(FusedOptimizer16, StochasticRoundingIsUnbiasedAndDeterministic) {
  for (RowPrecision p : {RowPrecision::kFp16, RowPrecision::kBf16}) {
    SCOPED_TRACE(RowPrecisionName(p));
    const int dim = 8;
    const int num_rows = 4096;
    const int64_t stride = FusedRowStride(OptimizerKind::kSgd, dim, p);
    // SGD with lr 1 and a gradient of about -0.1 ulp of the weights.
    const float ulp = p == RowPrecision::kFp16 ? 1.0f / 1024 : 1.0f / 128;
    // Row r starts at base(r) = 1 + (r % 64) ulp: distinct values to hash
    // (the random bits are a hash of the value and the column).
    std::vector<float> rows(num_rows * stride, 0.0f);
    auto base = [&](int r) { return 1.0f + static_cast<float>(r % 64) * ulp; };
    for (int r = 0; r < num_rows; ++r) {
      auto* w = reinterpret_cast<uint16_t*>(rows.data() + r * stride);
      for (int j = 0; j < dim; ++j) w[j] = Narrow(p, base(r));
    }
    std::vector<int64_t> idx(num_rows);
    std::vector<float> grads(num_rows * dim);
    for (int r = 0; r < num_rows; ++r) {
      idx[r] = r;
      for (int j = 0; j < dim; ++j) {
        grads[r * dim + j] = -0.1f * ulp * (1.0f + 0.01f * static_cast<float>(r / 64));
      }
    }
    FusedUpdateArgs a;
    a.precision = p;
    a.stochastic_rounding = true;
    a.num_rows = num_rows;
    a.row_stride = stride;
    a.dim = dim;
    a.row_indices = idx.data();
    a.num_updates = num_rows;
    a.grads = grads.data();
    a.optimizer.kind = OptimizerKind::kSgd;
    a.optimizer.learning_rate = 1.0f;
    std::vector<float> first;
    for (const ExecContext& ctx : EveryCpuIsa()) {
      SCOPED_TRACE(CpuIsaName(ctx.isa));
      std::vector<float> got = rows;
      a.rows = got.data();
      ASSERT_TRUE(FusedOptimizerUpdateCpu(a, ctx).ok());
      double sum = 0;
      int up = 0;
      for (int r = 0; r < num_rows; ++r) {
        const auto* w = reinterpret_cast<const uint16_t*>(got.data() + r * stride);
        for (int j = 0; j < dim; ++j) {
          const float v = Widen(p, w[j]);
          ASSERT_TRUE(v == base(r) || v == base(r) + ulp) << v;
          up += v != base(r);
          sum += (v - base(r)) / (1.0 + 0.01 * (r / 64));  // in units of 0.1 ulp
        }
      }
      // About 10% go up: the mean update is 0.1 ulp (nearest even: 0).
      const double mean = sum / (num_rows * dim) / ulp;
      EXPECT_NEAR(mean, 0.1, 0.015);
      EXPECT_GT(up, 0);
      if (first.empty()) {
        first = got;
      } else {
        EXPECT_EQ(0, std::memcmp(first.data(), got.data(), sizeof(float) * got.size()));
      }
    }
    // Nearest even keeps every weight at 1.0.
    std::vector<float> rne = rows;
    a.rows = rne.data();
    a.stochastic_rounding = false;
    ASSERT_TRUE(FusedOptimizerUpdateCpu(a, {}).ok());
    EXPECT_EQ(rne, rows);
  }
}

}  // namespace
}  // namespace recps::kernels
