// Embedding-bag forward/backward against naive loops, on every CPU path and
// with a thread pool. The kernels promise bit-identical results on every
// path, so the naive loops (same summation order) are compared exactly.
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "kernels/embedding_bag.h"
#include "tests/kernels/test_util.h"

namespace recps::kernels {
namespace {

using testing::AllNear;
using testing::EveryCpuIsa;
using testing::RandomFloats;

struct Jagged {
  std::vector<int64_t> indices;
  std::vector<int64_t> offsets;
  std::vector<float> weights;
};

// Bags of sizes 0..max_bag (empty bags and bags of one included), random
// rows with duplicates; the last row is always used once.
Jagged MakeJagged(int64_t num_bags, int max_bag, int64_t num_rows,
                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  Jagged j;
  j.offsets.push_back(0);
  for (int64_t b = 0; b < num_bags; ++b) {
    const int len = b == 0 ? 0 : b == 1 ? 1 : static_cast<int>(rng() % (max_bag + 1));
    for (int i = 0; i < len; ++i) {
      j.indices.push_back(static_cast<int64_t>(rng() % num_rows));
    }
    j.offsets.push_back(static_cast<int64_t>(j.indices.size()));
  }
  if (!j.indices.empty()) j.indices.back() = num_rows - 1;
  j.weights = RandomFloats(j.indices.size(), seed + 1, 0.0f, 2.0f);
  return j;
}

float RowValue(const std::vector<float>& f32, const std::vector<uint16_t>& f16,
               RowDType dtype, int64_t i) {
  return dtype == RowDType::kFloat16 ? HalfToFloat(f16[i]) : f32[i];
}

// The reference: one output row at a time, positions in order, in float
// with the kernel's rounding (sum from the first term, mean divides).
std::vector<float> NaiveForward(const EmbeddingBagForwardArgs& a,
                                const std::vector<float>& f32,
                                const std::vector<uint16_t>& f16) {
  const bool none = a.pooling == PoolingMode::kNone;
  const int64_t n = none ? a.num_indices : a.num_bags;
  std::vector<float> out(n * a.dim, 0.0f);
  for (int64_t o = 0; o < n; ++o) {
    const int64_t lo = none ? o : a.offsets[o];
    const int64_t hi = none ? o + 1 : a.offsets[o + 1];
    for (int d = 0; d < a.dim; ++d) {
      float acc = 0.0f;
      for (int64_t p = lo; p < hi; ++p) {
        const float w = a.per_sample_weights ? a.per_sample_weights[p] : 1.0f;
        const float term = w * RowValue(f32, f16, a.dtype, a.indices[p] * a.row_stride + d);
        acc = p == lo ? term : acc + term;
      }
      if (a.pooling == PoolingMode::kMean && hi > lo) acc /= static_cast<float>(hi - lo);
      out[o * a.dim + d] = acc;
    }
  }
  return out;
}

struct Case {
  int dim;
  RowDType dtype;
  PoolingMode pooling;
  bool weighted;
};

class EmbeddingBagCase : public ::testing::TestWithParam<Case> {};

TEST_P(EmbeddingBagCase, ForwardAndBackwardMatchNaiveLoopsOnEveryPath) {
  const Case c = GetParam();
  const int64_t num_rows = 97, num_bags = 41;
  const int64_t stride = c.dim + 5;  // rows carry "state" after the weights
  const Jagged j = MakeJagged(num_bags, 6, num_rows, 7 + c.dim);
  std::vector<float> f32 = RandomFloats(num_rows * stride, 3);
  std::vector<uint16_t> f16(f32.size());
  for (size_t i = 0; i < f32.size(); ++i) f16[i] = FloatToHalf(f32[i]);

  EmbeddingBagForwardArgs fwd;
  fwd.rows = c.dtype == RowDType::kFloat16 ? static_cast<const void*>(f16.data())
                                            : f32.data();
  fwd.dtype = c.dtype;
  fwd.num_rows = num_rows;
  fwd.row_stride = stride;
  fwd.dim = c.dim;
  fwd.indices = j.indices.data();
  fwd.num_indices = j.indices.size();
  fwd.offsets = j.offsets.data();
  fwd.num_bags = num_bags;
  fwd.per_sample_weights = c.weighted ? j.weights.data() : nullptr;
  fwd.pooling = c.pooling;
  const std::vector<float> want = NaiveForward(fwd, f32, f16);

  const int64_t out_rows = c.pooling == PoolingMode::kNone ? fwd.num_indices : num_bags;
  std::vector<float> grad_out = RandomFloats(out_rows * c.dim, 11);

  // Backward reference: per row, contributions in position order.
  std::vector<float> want_grad(num_rows * c.dim, 0.0f);
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int d = 0; d < c.dim; ++d) {
      float acc = 0.0f;
      bool first = true;
      for (int64_t p = 0; p < fwd.num_indices; ++p) {
        if (j.indices[p] != r) continue;
        int64_t src = p;
        float scale = c.weighted ? j.weights[p] : 1.0f;
        if (c.pooling != PoolingMode::kNone) {
          src = std::upper_bound(j.offsets.begin(), j.offsets.end(), p) -
                j.offsets.begin() - 1;
          if (c.pooling == PoolingMode::kMean) {
            scale = 1.0f / static_cast<float>(j.offsets[src + 1] - j.offsets[src]);
          }
        }
        acc = first ? scale * grad_out[src * c.dim + d]
                    : acc + scale * grad_out[src * c.dim + d];
        first = false;
      }
      want_grad[r * c.dim + d] = acc;
    }
  }

  ThreadPool pool(3);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    for (const ExecContext& ctx : EveryCpuIsa(p)) {
      SCOPED_TRACE(std::string(CpuIsaName(ctx.isa)) + (p ? " pool" : " inline"));
      std::vector<float> out(out_rows * c.dim, -7.0f);
      fwd.output = out.data();
      ASSERT_TRUE(EmbeddingBagForwardCpu(fwd, ctx).ok());
      EXPECT_TRUE(AllNear(out, want, 0.0));

      EmbeddingBagBackwardArgs bwd;
      bwd.grad_output = grad_out.data();
      bwd.dim = c.dim;
      bwd.indices = fwd.indices;
      bwd.num_indices = fwd.num_indices;
      bwd.offsets = fwd.offsets;
      bwd.num_bags = num_bags;
      bwd.per_sample_weights = fwd.per_sample_weights;
      bwd.pooling = c.pooling;
      bwd.num_rows = num_rows;
      std::vector<float> grad(num_rows * c.dim, -7.0f);
      bwd.grad_rows = grad.data();
      ASSERT_TRUE(EmbeddingBagBackwardCpu(bwd, ctx).ok());
      EXPECT_TRUE(AllNear(grad, want_grad, 0.0));
    }
  }
}

// The trainer's layout: F features pool into one sample-major B x F x D
// tensor through output_stride, and their gradients (read in place through
// grad_output_stride) sum into the rows of the table they share with
// accumulate. Against the scalar reference of the old trainer (per-feature
// contiguous buffers, each feature's backward into scratch, then added in
// feature order), exactly, on every ISA path and with 1..7 threads (the
// result must not depend on the thread count).
TEST(EmbeddingBag, StridedSharedTableMatchesPerFeatureBuffersExactly) {
  constexpr int kFeatures = 3;
  for (int dim : {1, 7, 16, 64}) {
    for (PoolingMode pooling : {PoolingMode::kSum, PoolingMode::kMean}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + " pooling " +
                   std::to_string(static_cast<int>(pooling)));
      const int64_t num_rows = 53, num_bags = 29;
      std::vector<Jagged> j;
      for (int f = 0; f < kFeatures; ++f) {
        j.push_back(MakeJagged(num_bags, 5, num_rows, 100 + f));
      }
      const std::vector<float> rows = RandomFloats(num_rows * dim, 8);
      const std::vector<float> grad_pooled =
          RandomFloats(num_bags * kFeatures * dim, 9);
      // Reference: contiguous per-feature forward then interleave; backward
      // per feature into scratch, then table += scratch in feature order.
      std::vector<float> want_pooled(num_bags * kFeatures * dim);
      std::vector<float> want_grad(num_rows * dim, 0.0f);
      for (int f = 0; f < kFeatures; ++f) {
        EmbeddingBagForwardArgs a;
        a.rows = rows.data();
        a.num_rows = num_rows;
        a.row_stride = dim;
        a.dim = dim;
        a.indices = j[f].indices.data();
        a.num_indices = j[f].indices.size();
        a.offsets = j[f].offsets.data();
        a.num_bags = num_bags;
        a.pooling = pooling;
        const std::vector<float> out = NaiveForward(a, rows, {});
        for (int64_t b = 0; b < num_bags; ++b) {
          std::memcpy(&want_pooled[(b * kFeatures + f) * dim], &out[b * dim],
                      sizeof(float) * dim);
        }
        std::vector<float> scratch(num_rows * dim, 0.0f);
        std::vector<bool> touched(num_rows, false);
        for (int64_t b = 0; b < num_bags; ++b) {
          const int64_t lo = j[f].offsets[b], hi = j[f].offsets[b + 1];
          const float scale = pooling == PoolingMode::kMean
                                  ? 1.0f / static_cast<float>(std::max<int64_t>(1, hi - lo))
                                  : 1.0f;
          for (int64_t p = lo; p < hi; ++p) {
            const int64_t r = j[f].indices[p];
            for (int d = 0; d < dim; ++d) {
              const float term = scale * grad_pooled[(b * kFeatures + f) * dim + d];
              scratch[r * dim + d] = touched[r] ? scratch[r * dim + d] + term : term;
            }
            touched[r] = true;
          }
        }
        for (int64_t k = 0; k < num_rows * dim; ++k) {
          want_grad[k] = f == 0 ? scratch[k] : want_grad[k] + scratch[k];
        }
      }
      for (int threads : {1, 2, 3, 7}) {
        ThreadPool pool(threads);
        for (const ExecContext& ctx : EveryCpuIsa(threads > 1 ? &pool : nullptr)) {
          SCOPED_TRACE(std::string(CpuIsaName(ctx.isa)) + " threads " +
                       std::to_string(threads));
          std::vector<float> pooled(num_bags * kFeatures * dim, -7.0f);
          std::vector<float> grad(num_rows * dim, -7.0f);
          for (int f = 0; f < kFeatures; ++f) {
            EmbeddingBagForwardArgs a;
            a.rows = rows.data();
            a.num_rows = num_rows;
            a.row_stride = dim;
            a.dim = dim;
            a.indices = j[f].indices.data();
            a.num_indices = j[f].indices.size();
            a.offsets = j[f].offsets.data();
            a.num_bags = num_bags;
            a.pooling = pooling;
            a.output = pooled.data() + f * dim;
            a.output_stride = kFeatures * dim;
            ASSERT_TRUE(EmbeddingBagForwardCpu(a, ctx).ok());
            EmbeddingBagBackwardArgs g;
            g.grad_output = grad_pooled.data() + f * dim;
            g.grad_output_stride = kFeatures * dim;
            g.dim = dim;
            g.indices = a.indices;
            g.num_indices = a.num_indices;
            g.offsets = a.offsets;
            g.num_bags = num_bags;
            g.pooling = pooling;
            g.num_rows = num_rows;
            g.grad_rows = grad.data();
            g.accumulate = f > 0;
            ASSERT_TRUE(EmbeddingBagBackwardCpu(g, ctx).ok());
          }
          EXPECT_EQ(0, std::memcmp(pooled.data(), want_pooled.data(),
                                   pooled.size() * sizeof(float)));
          EXPECT_EQ(0, std::memcmp(grad.data(), want_grad.data(),
                                   grad.size() * sizeof(float)));
        }
      }
    }
  }
}

TEST(EmbeddingBag, StridesSmallerThanDimAreRefused) {
  const std::vector<int64_t> indices = {0};
  const std::vector<int64_t> offsets = {0, 1};
  std::vector<float> rows(8), out(8);
  EmbeddingBagForwardArgs a;
  a.rows = rows.data();
  a.num_rows = 1;
  a.row_stride = 8;
  a.dim = 8;
  a.indices = indices.data();
  a.num_indices = 1;
  a.offsets = offsets.data();
  a.num_bags = 1;
  a.output = out.data();
  a.output_stride = 4;
  const absl::Status s = EmbeddingBagForwardCpu(a, {});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("output_stride 4"), std::string::npos) << s;
  EmbeddingBagBackwardArgs g;
  g.grad_output = out.data();
  g.grad_output_stride = 3;
  g.dim = 8;
  g.indices = indices.data();
  g.num_indices = 1;
  g.offsets = offsets.data();
  g.num_bags = 1;
  g.num_rows = 1;
  g.grad_rows = rows.data();
  const absl::Status t = EmbeddingBagBackwardCpu(g, {});
  EXPECT_TRUE(absl::IsInvalidArgument(t)) << t;
  EXPECT_NE(t.message().find("grad_output_stride 3"), std::string::npos) << t;
}

// Adjoint check in double: <grad_out, F(rows)> == <B(grad_out), rows>, so the
// backward really is the forward's transpose.
void ExpectAdjoint(const Case& c) {
  SCOPED_TRACE("dim " + std::to_string(c.dim) + " pooling " +
               std::to_string(static_cast<int>(c.pooling)));
  const int64_t num_rows = 31, num_bags = 17;
  const Jagged j = MakeJagged(num_bags, 5, num_rows, 99);
  std::vector<float> rows = RandomFloats(num_rows * c.dim, 5);
  EmbeddingBagForwardArgs fwd;
  fwd.rows = rows.data();
  fwd.num_rows = num_rows;
  fwd.row_stride = c.dim;
  fwd.dim = c.dim;
  fwd.indices = j.indices.data();
  fwd.num_indices = j.indices.size();
  fwd.offsets = j.offsets.data();
  fwd.num_bags = num_bags;
  fwd.per_sample_weights = c.weighted ? j.weights.data() : nullptr;
  fwd.pooling = c.pooling;
  const int64_t out_rows = c.pooling == PoolingMode::kNone ? fwd.num_indices : num_bags;
  std::vector<float> out(out_rows * c.dim);
  fwd.output = out.data();
  EXPECT_TRUE(EmbeddingBagForwardCpu(fwd, {}).ok());
  std::vector<float> grad_out = RandomFloats(out.size(), 6);
  EmbeddingBagBackwardArgs bwd{grad_out.data(), c.dim, fwd.indices, fwd.num_indices,
                               fwd.offsets, num_bags, fwd.per_sample_weights,
                               c.pooling, num_rows, nullptr};
  std::vector<float> grad(rows.size());
  bwd.grad_rows = grad.data();
  EXPECT_TRUE(EmbeddingBagBackwardCpu(bwd, {}).ok());
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < out.size(); ++i) lhs += double(grad_out[i]) * out[i];
  for (size_t i = 0; i < rows.size(); ++i) rhs += double(grad[i]) * rows[i];
  EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::abs(lhs)));
}

TEST(EmbeddingBag, BackwardIsTheForwardsTranspose) {
  for (int dim : {1, 7, 64}) {
    ExpectAdjoint({dim, RowDType::kFloat32, PoolingMode::kSum, false});
    ExpectAdjoint({dim, RowDType::kFloat32, PoolingMode::kSum, true});
    ExpectAdjoint({dim, RowDType::kFloat32, PoolingMode::kMean, false});
    ExpectAdjoint({dim, RowDType::kFloat32, PoolingMode::kNone, true});
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (int dim : {1, 7, 16, 33, 64, 128}) {
    for (RowDType dtype : {RowDType::kFloat32, RowDType::kFloat16}) {
      for (PoolingMode pooling : {PoolingMode::kSum, PoolingMode::kMean, PoolingMode::kNone}) {
        for (bool weighted : {false, true}) {
          if (weighted && pooling == PoolingMode::kMean) continue;
          cases.push_back({dim, dtype, pooling, weighted});
        }
      }
    }
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  static const char* const kPooling[] = {"sum", "mean", "none"};
  const Case& c = info.param;
  return "dim" + std::to_string(c.dim) +
         (c.dtype == RowDType::kFloat16 ? "_f16_" : "_f32_") +
         kPooling[static_cast<int>(c.pooling)] + (c.weighted ? "_weighted" : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmbeddingBagCase,
                         ::testing::ValuesIn(AllCases()), CaseName);

class EmbeddingBagErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    rows_ = RandomFloats(10 * 4, 1);
    args_.rows = rows_.data();
    args_.num_rows = 10;
    args_.row_stride = 4;
    args_.dim = 4;
    args_.indices = indices_.data();
    args_.num_indices = indices_.size();
    args_.offsets = offsets_.data();
    args_.num_bags = 2;
    args_.output = out_.data();
  }
  // Checks the call fails with INVALID_ARGUMENT and leaves output untouched.
  void ExpectRefused(const char* what) {
    std::fill(out_.begin(), out_.end(), 42.0f);
    const absl::Status s = EmbeddingBagForwardCpu(args_, {});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << ": " << s;
    EXPECT_NE(s.message().find(what), absl::string_view::npos) << s;
    for (float v : out_) EXPECT_EQ(v, 42.0f);
  }
  std::vector<float> rows_;
  std::vector<int64_t> indices_ = {0, 3, 9};
  std::vector<int64_t> offsets_ = {0, 1, 3};
  std::vector<float> out_ = std::vector<float>(3 * 4);
  EmbeddingBagForwardArgs args_;
};

TEST_F(EmbeddingBagErrors, HugeIndexIsRefusedNamingThePosition) {
  indices_[2] = std::numeric_limits<int64_t>::max();
  ExpectRefused("at position 2");
}

TEST_F(EmbeddingBagErrors, NegativeIndexIsRefused) {
  indices_[1] = -1;
  ExpectRefused("index -1 at position 1");
}

TEST_F(EmbeddingBagErrors, DecreasingOffsetsAreRefused) {
  offsets_ = {0, 2, 1};
  args_.offsets = offsets_.data();
  ExpectRefused("offsets");
}

TEST_F(EmbeddingBagErrors, OffsetsNotEndingAtNumIndicesAreRefused) {
  offsets_ = {0, 1, 2};
  args_.offsets = offsets_.data();
  ExpectRefused("num_indices=3");
}

TEST_F(EmbeddingBagErrors, StrideSmallerThanDimIsRefused) {
  args_.row_stride = 3;
  ExpectRefused("row_stride");
}

TEST_F(EmbeddingBagErrors, WeightsWithMeanAreRefused) {
  std::vector<float> w(3, 1.0f);
  args_.per_sample_weights = w.data();
  args_.pooling = PoolingMode::kMean;
  ExpectRefused("per_sample_weights");
}

TEST(EmbeddingBag, NoBagsIsFine) {
  std::vector<int64_t> offsets = {0};
  EmbeddingBagForwardArgs a;
  a.dim = 8;
  a.row_stride = 8;
  a.offsets = offsets.data();
  EXPECT_TRUE(EmbeddingBagForwardCpu(a, {}).ok());
}

}  // namespace
}  // namespace recps::kernels
