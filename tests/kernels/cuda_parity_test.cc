// Every CUDA kernel against its CPU twin on random data: copy in, run both,
// copy back, compare (1e-5 absolute + relative). Each case skips without a
// GPU. Outputs are prefilled with NaN bits to catch unwritten elements.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "gtest/gtest.h"
#include "kernels/cuda_util.h"
#include "kernels/dense_layer.h"
#include "kernels/dense_optimizer.h"
#include "kernels/embedding_bag.h"
#include "kernels/embedding_optimizer.h"
#include "kernels/gemm.h"
#include "kernels/interaction.h"
#include "kernels/loss.h"
#include "tests/kernels/test_util.h"
#include "tests/testing/gpu_test_util.h"

namespace recps::kernels {
namespace {

using testing::AllNear;
using testing::RandomFloats;

constexpr double kTol = 1e-5;

// Owns n elements of device memory; prefilled with 0xff bytes (NaN floats).
// Freeing waits for queued work, so a buffer may go out of scope right after
// the launch that reads it.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ == 0) return;
    EXPECT_EQ(cudaMalloc(&ptr_, n_ * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr_, 0xff, n_ * sizeof(T)), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host)
      : DeviceBuffer(host.size()) {
    Upload(host);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ == nullptr) return;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(ptr_);
  }
  T* get() const { return static_cast<T*>(ptr_); }
  void Upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    if (n_ == 0) return;
    ASSERT_EQ(
        cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice),
        cudaSuccess);
  }
  // Waits for all queued work first, so kernel faults fail the test here.
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (n_ > 0) {
      EXPECT_EQ(
          cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost),
          cudaSuccess);
    }
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t n_;
};

// A non-default stream (so launches honour ctx.cuda_stream) and its context.
class CudaContext {
 public:
  CudaContext() {
    EXPECT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    ctx_.cuda_stream = stream_;
  }
  ~CudaContext() {
    if (cublas_ != nullptr) DestroyCublasHandle(cublas_);
    cudaStreamDestroy(stream_);
  }
  const ExecContext& ctx() const { return ctx_; }
  const ExecContext& WithCublas() {
    if (cublas_ == nullptr) {
      // Through the kernels' own loader, as production code does.
      absl::StatusOr<void*> handle = CreateCublasHandle();
      EXPECT_TRUE(handle.ok()) << handle.status();
      cublas_ = handle.value_or(nullptr);
      ctx_.cublas_handle = cublas_;
    }
    return ctx_;
  }

 private:
  cudaStream_t stream_ = nullptr;
  void* cublas_ = nullptr;
  ExecContext ctx_;
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ------------------------------------------------------------ embedding bag

struct Jagged {
  std::vector<int64_t> indices;
  std::vector<int64_t> offsets;
  std::vector<float> weights;
};

// Bag 0 empty, bag 1 of one, bag 2 one row three times, then random sizes in
// [0, max_bag]; rows drawn from [0, num_rows - 3), so the last three rows are
// never named.
Jagged MakeJagged(int64_t num_bags, int max_bag, int64_t num_rows,
                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> row(0, num_rows - 4);
  std::uniform_int_distribution<int> size(0, max_bag);
  Jagged j;
  j.offsets.push_back(0);
  for (int64_t b = 0; b < num_bags; ++b) {
    const int n = b == 0 ? 0 : b == 1 ? 1 : b == 2 ? 3 : size(rng);
    const int64_t dup = row(rng);
    for (int i = 0; i < n; ++i) j.indices.push_back(b == 2 ? dup : row(rng));
    j.offsets.push_back(static_cast<int64_t>(j.indices.size()));
  }
  j.weights = RandomFloats(j.indices.size(), seed + 1, -2.0f, 2.0f);
  return j;
}

std::vector<uint16_t> ToHalf(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = FloatToHalf(v[i]);
  return h;
}

std::string Name(PoolingMode m) {
  return m == PoolingMode::kSum    ? "sum"
         : m == PoolingMode::kMean ? "mean"
                                   : "none";
}

constexpr PoolingMode kPoolings[] = {PoolingMode::kSum, PoolingMode::kMean,
                                     PoolingMode::kNone};

TEST(CudaParityTest, EmbeddingBagForward) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  constexpr int64_t kRows = 41, kBags = 40;
  const Jagged j = MakeJagged(kBags, 9, kRows, 7);
  DeviceBuffer<int64_t> d_idx(j.indices), d_off(j.offsets);
  DeviceBuffer<float> d_w(j.weights);
  for (RowDType dtype : {RowDType::kFloat32, RowDType::kFloat16}) {
    for (int dim : {7, 33, 64, 128}) {
      for (int64_t stride :
           {int64_t{dim}, int64_t{dim} + 9, int64_t{(dim + 15) / 8 * 8}}) {
        const std::vector<float> f = RandomFloats(kRows * stride, dim);
        const std::vector<uint16_t> h = ToHalf(f);
        DeviceBuffer<float> d_f(f);
        DeviceBuffer<uint16_t> d_h(h);
        for (PoolingMode pooling : kPoolings) {
          for (bool weighted : {false, true}) {
            if (weighted && pooling == PoolingMode::kMean) continue;
            SCOPED_TRACE(absl::StrCat("fp16=", dtype == RowDType::kFloat16,
                                      " dim=", dim, " stride=", stride, " ",
                                      Name(pooling), " weighted=", weighted));
            const int64_t out_rows =
                pooling == PoolingMode::kNone ? j.indices.size() : kBags;
            EmbeddingBagForwardArgs a;
            a.dtype = dtype;
            a.rows = dtype == RowDType::kFloat32
                         ? static_cast<const void*>(f.data())
                         : h.data();
            a.num_rows = kRows;
            a.row_stride = stride;
            a.dim = dim;
            a.indices = j.indices.data();
            a.num_indices = j.indices.size();
            a.offsets = j.offsets.data();
            a.num_bags = kBags;
            a.per_sample_weights = weighted ? j.weights.data() : nullptr;
            a.pooling = pooling;
            std::vector<float> want(out_rows * dim);
            a.output = want.data();
            ASSERT_TRUE(EmbeddingBagForwardCpu(a, ExecContext()).ok());

            DeviceBuffer<float> d_out(want.size());
            a.rows = dtype == RowDType::kFloat32
                         ? static_cast<const void*>(d_f.get())
                         : d_h.get();
            a.indices = d_idx.get();
            a.offsets = d_off.get();
            a.per_sample_weights = weighted ? d_w.get() : nullptr;
            a.output = d_out.get();
            ASSERT_TRUE(EmbeddingBagForwardCuda(a, cuda.ctx()).ok());
            EXPECT_TRUE(AllNear(d_out.Download(), want, kTol, kTol));
          }
        }
      }
    }
  }
}

// Rows not 16-byte aligned must take the scalar path and still agree.
TEST(CudaParityTest, EmbeddingBagForwardUnalignedRows) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  constexpr int64_t kRows = 20, kBags = 12, kDim = 64;
  const Jagged j = MakeJagged(kBags, 6, kRows, 11);
  const std::vector<float> f = RandomFloats(kRows * kDim + 1, 12);
  EmbeddingBagForwardArgs a;
  a.rows = f.data() + 1;
  a.num_rows = kRows;
  a.row_stride = kDim;
  a.dim = kDim;
  a.indices = j.indices.data();
  a.num_indices = j.indices.size();
  a.offsets = j.offsets.data();
  a.num_bags = kBags;
  std::vector<float> want(kBags * kDim);
  a.output = want.data();
  ASSERT_TRUE(EmbeddingBagForwardCpu(a, ExecContext()).ok());
  DeviceBuffer<float> d_f(f), d_out(want.size());
  DeviceBuffer<int64_t> d_idx(j.indices), d_off(j.offsets);
  a.rows = d_f.get() + 1;
  a.indices = d_idx.get();
  a.offsets = d_off.get();
  a.output = d_out.get();
  ASSERT_TRUE(EmbeddingBagForwardCuda(a, cuda.ctx()).ok());
  EXPECT_TRUE(AllNear(d_out.Download(), want, kTol, kTol));
}

// The device skips out-of-range indices: same as the CPU with those
// positions weighted zero.
TEST(CudaParityTest, EmbeddingBagForwardSkipsBadIndices) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  constexpr int64_t kRows = 10, kDim = 8;
  const std::vector<float> f = RandomFloats(kRows * kDim, 3);
  std::vector<int64_t> bad = {1, -1, 2, kRows, 3, 1000};
  std::vector<int64_t> good = {1, 0, 2, 0, 3, 0};
  std::vector<float> w_bad(6, 1.0f), w_good = {1, 0, 1, 0, 1, 0};
  const std::vector<int64_t> offsets = {0, 2, 4, 6};
  EmbeddingBagForwardArgs a;
  a.rows = f.data();
  a.num_rows = kRows;
  a.row_stride = kDim;
  a.dim = kDim;
  a.indices = good.data();
  a.num_indices = 6;
  a.offsets = offsets.data();
  a.num_bags = 3;
  a.per_sample_weights = w_good.data();
  std::vector<float> want(3 * kDim);
  a.output = want.data();
  ASSERT_TRUE(EmbeddingBagForwardCpu(a, ExecContext()).ok());
  DeviceBuffer<float> d_f(f), d_w(w_bad), d_out(want.size());
  DeviceBuffer<int64_t> d_idx(bad), d_off(offsets);
  a.rows = d_f.get();
  a.indices = d_idx.get();
  a.offsets = d_off.get();
  a.per_sample_weights = d_w.get();
  a.output = d_out.get();
  ASSERT_TRUE(EmbeddingBagForwardCuda(a, cuda.ctx()).ok());
  EXPECT_TRUE(AllNear(d_out.Download(), want, kTol, kTol));
}

TEST(CudaParityTest, EmbeddingBagRejectsBadArguments) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  DeviceBuffer<float> rows(64), weights(4), out(64);
  DeviceBuffer<int64_t> idx(std::vector<int64_t>{0, 1, 2, 3}),
      off(std::vector<int64_t>{0, 2, 4});
  EmbeddingBagForwardArgs good;
  good.rows = rows.get();
  good.num_rows = 8;
  good.row_stride = 8;
  good.dim = 8;
  good.indices = idx.get();
  good.num_indices = 4;
  good.offsets = off.get();
  good.num_bags = 2;
  good.output = out.get();
  ASSERT_TRUE(EmbeddingBagForwardCuda(good, ExecContext()).ok());
  // Each case is `good` with one field broken.
  auto expect_invalid = [&good](auto&& breaks) {
    EmbeddingBagForwardArgs a = good;
    breaks(a);
    EXPECT_EQ(EmbeddingBagForwardCuda(a, ExecContext()).code(),
              absl::StatusCode::kInvalidArgument);
  };
  expect_invalid([&](EmbeddingBagForwardArgs& a) {
    a.pooling = PoolingMode::kMean;
    a.per_sample_weights = weights.get();
  });
  expect_invalid([](EmbeddingBagForwardArgs& a) { a.dim = 0; });
  expect_invalid([](EmbeddingBagForwardArgs& a) { a.row_stride = 7; });
  expect_invalid([](EmbeddingBagForwardArgs& a) { a.rows = nullptr; });
  expect_invalid([](EmbeddingBagForwardArgs& a) { a.num_indices = -1; });
  expect_invalid([](EmbeddingBagForwardArgs& a) { a.offsets = nullptr; });
  expect_invalid([](EmbeddingBagForwardArgs& a) { a.output = nullptr; });
  EmbeddingBagBackwardArgs b;
  b.grad_output = out.get();
  b.dim = 8;
  b.indices = idx.get();
  b.num_indices = 4;
  b.offsets = off.get();
  b.num_bags = 2;
  b.num_rows = 8;
  b.grad_rows = rows.get();
  ASSERT_TRUE(EmbeddingBagBackwardCuda(b, ExecContext()).ok());
  b.pooling = PoolingMode::kMean;
  b.per_sample_weights = weights.get();
  EXPECT_EQ(EmbeddingBagBackwardCuda(b, ExecContext()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

void CheckBackward(const Jagged& j, int64_t num_bags, int64_t num_rows, int dim,
                   PoolingMode pooling, bool weighted, const ExecContext& ctx) {
  const int64_t out_rows =
      pooling == PoolingMode::kNone ? j.indices.size() : num_bags;
  const std::vector<float> grad_out = RandomFloats(out_rows * dim, dim + 5);
  EmbeddingBagBackwardArgs a;
  a.grad_output = grad_out.data();
  a.dim = dim;
  a.indices = j.indices.data();
  a.num_indices = j.indices.size();
  a.offsets = j.offsets.data();
  a.num_bags = num_bags;
  a.per_sample_weights = weighted ? j.weights.data() : nullptr;
  a.pooling = pooling;
  a.num_rows = num_rows;
  std::vector<float> want(num_rows * dim);
  a.grad_rows = want.data();
  ASSERT_TRUE(EmbeddingBagBackwardCpu(a, ExecContext()).ok());

  DeviceBuffer<float> d_grad_out(grad_out), d_w(j.weights);
  DeviceBuffer<int64_t> d_idx(j.indices), d_off(j.offsets);
  a.grad_output = d_grad_out.get();
  a.indices = d_idx.get();
  a.offsets = d_off.get();
  a.per_sample_weights = weighted ? d_w.get() : nullptr;
  std::vector<float> runs[2];
  for (std::vector<float>& run : runs) {
    DeviceBuffer<float> d_rows(want.size());
    a.grad_rows = d_rows.get();
    ASSERT_TRUE(EmbeddingBagBackwardCuda(a, ctx).ok());
    run = d_rows.Download();
  }
  EXPECT_TRUE(AllNear(runs[0], want, kTol, kTol));
  EXPECT_TRUE(SameBits(runs[0], runs[1])) << "backward is not deterministic";
}

TEST(CudaParityTest, EmbeddingBagBackward) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  constexpr int64_t kRows = 37, kBags = 50;
  const Jagged j = MakeJagged(kBags, 12, kRows, 21);
  for (int dim : {7, 33, 64, 128}) {
    for (PoolingMode pooling : kPoolings) {
      for (bool weighted : {false, true}) {
        if (weighted && pooling == PoolingMode::kMean) continue;
        SCOPED_TRACE(absl::StrCat("dim=", dim, " ", Name(pooling),
                                  " weighted=", weighted));
        CheckBackward(j, kBags, kRows, dim, pooling, weighted, cuda.ctx());
      }
    }
  }
}

// Thousands of contributions to a few rows: summation order matters, and
// must be the same on every run.
TEST(CudaParityTest, EmbeddingBagBackwardManyDuplicatesIsDeterministic) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  const Jagged j = MakeJagged(2000, 40, 12, 5);
  CheckBackward(j, 2000, 12, 64, PoolingMode::kSum, true, cuda.ctx());
  CheckBackward(j, 2000, 12, 33, PoolingMode::kMean, false, cuda.ctx());
}

// ------------------------------------------------------------- optimizers

constexpr OptimizerKind kAllKinds[] = {
    OptimizerKind::kSgd, OptimizerKind::kAdagrad,
    OptimizerKind::kRowWiseAdagrad, OptimizerKind::kAdam,
    OptimizerKind::kAdamW};

OptimizerParams TestParams(OptimizerKind kind) {
  OptimizerParams p;
  p.kind = kind;
  p.learning_rate = 0.05f;
  p.weight_decay = 0.01f;
  return p;
}

// Two steps of 12 distinct rows each of `rows` (6 rows are in both), on
// the CPU into `rows` and on the GPU into `d_rows`; `a` gives the row layout
// and optimizer. The second step picks its gradient rows through
// grad_indices (reversed).
void UpdateTwoStepsOnBoth(FusedUpdateArgs a, std::vector<float>& rows,
                          DeviceBuffer<float>& d_rows, const ExecContext& cuda) {
  std::vector<int64_t> perm(a.num_rows);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(a.dim));
  for (int step = 0; step < 2; ++step) {
    const std::vector<int64_t> ids(perm.begin() + 6 * step,
                                   perm.begin() + 6 * step + 12);
    const std::vector<float> grads = RandomFloats(ids.size() * a.dim, 100 + step);
    std::vector<int64_t> grad_ids(ids.size());
    std::iota(grad_ids.rbegin(), grad_ids.rend(), 0);
    a.rows = rows.data();
    a.row_indices = ids.data();
    a.num_updates = ids.size();
    a.grads = grads.data();
    a.grad_indices = step == 1 ? grad_ids.data() : nullptr;
    ASSERT_TRUE(FusedOptimizerUpdateCpu(a, ExecContext()).ok());
    DeviceBuffer<int64_t> d_ids(ids), d_grad_ids(grad_ids);
    DeviceBuffer<float> d_grads(grads);
    a.rows = d_rows.get();
    a.row_indices = d_ids.get();
    a.grads = d_grads.get();
    a.grad_indices = step == 1 ? d_grad_ids.get() : nullptr;
    ASSERT_TRUE(FusedOptimizerUpdateCuda(a, cuda).ok());
  }
}

TEST(CudaParityTest, FusedOptimizerUpdateTwoSteps) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  constexpr int64_t kRows = 30;
  for (OptimizerKind kind : kAllKinds) {
    for (int dim : {7, 33, 64, 128}) {
      SCOPED_TRACE(absl::StrCat(OptimizerName(kind), " dim=", dim));
      const int64_t stride = FusedRowStride(kind, dim);
      std::vector<float> rows = RandomFloats(kRows * stride, dim);
      for (int64_t r = 0; r < kRows; ++r) {
        InitFusedRowState(kind, dim, rows.data() + r * stride);
      }
      DeviceBuffer<float> d_rows(rows);
      FusedUpdateArgs a;
      a.num_rows = kRows;
      a.row_stride = stride;
      a.dim = dim;
      a.optimizer = TestParams(kind);
      ASSERT_NO_FATAL_FAILURE(UpdateTwoStepsOnBoth(a, rows, d_rows, cuda.ctx()));
      const std::vector<float> got = d_rows.Download();
      EXPECT_TRUE(AllNear(got, rows, kTol, kTol));
      if (kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW) {
        for (int64_t r = 0; r < kRows; ++r) {  // step counts, exactly
          EXPECT_EQ(FloatBits(got[r * stride + 3 * dim]),
                    FloatBits(rows[r * stride + 3 * dim]))
              << "row " << r;
        }
      }
    }
  }
}

// 16-bit rows (fp16, bf16; nearest-even and stochastic rounding): the CUDA
// update widens, applies the fp32 rules and rounds with the CPU's functions.
// SGD's rows are bit-identical; the others' weights within one 16-bit step
// (a last-bit difference in fp32 can round the other way), state within kTol.
TEST(CudaParityTest, FusedOptimizerUpdate16BitRowsTwoSteps) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  constexpr int64_t kRows = 30;
  for (RowPrecision precision : {RowPrecision::kFp16, RowPrecision::kBf16}) {
    for (bool stochastic : {false, true}) {
      for (OptimizerKind kind : kAllKinds) {
        for (int dim : {7, 16, 33, 64}) {
          SCOPED_TRACE(absl::StrCat(RowPrecisionName(precision),
                                    stochastic ? " stochastic " : " nearest ",
                                    OptimizerName(kind), " dim=", dim));
          const int64_t stride = FusedRowStride(kind, dim, precision);
          const int64_t state_at = FusedRowStateOffset(dim, precision);
          const bool fp16 = precision == RowPrecision::kFp16;
          std::vector<float> rows(kRows * stride, 0.0f);
          const std::vector<float> init = RandomFloats(kRows * dim, dim);
          for (int64_t r = 0; r < kRows; ++r) {
            auto* w = reinterpret_cast<uint16_t*>(rows.data() + r * stride);
            for (int c = 0; c < dim; ++c) {
              const float v = init[r * dim + c];
              w[c] = fp16 ? FloatToHalf(v) : FloatToBf16(v);
            }
          }
          DeviceBuffer<float> d_rows(rows);
          FusedUpdateArgs a;
          a.precision = precision;
          a.stochastic_rounding = stochastic;
          a.num_rows = kRows;
          a.row_stride = stride;
          a.dim = dim;
          a.optimizer = TestParams(kind);
          ASSERT_NO_FATAL_FAILURE(UpdateTwoStepsOnBoth(a, rows, d_rows, cuda.ctx()));
          const std::vector<float> got = d_rows.Download();
          const double step = fp16 ? 1.0 / 1024 : 1.0 / 128;
          for (int64_t r = 0; r < kRows; ++r) {
            const auto* gw = reinterpret_cast<const uint16_t*>(got.data() + r * stride);
            const auto* ww = reinterpret_cast<const uint16_t*>(rows.data() + r * stride);
            for (int c = 0; c < dim; ++c) {
              const float x = fp16 ? HalfToFloat(gw[c]) : Bf16ToFloat(gw[c]);
              const float y = fp16 ? HalfToFloat(ww[c]) : Bf16ToFloat(ww[c]);
              if (kind == OptimizerKind::kSgd) {
                ASSERT_EQ(gw[c], ww[c]) << "row " << r << " column " << c;
              } else {
                ASSERT_NEAR(x, y, step * std::max(1.0f, std::fabs(y)))
                    << "row " << r << " column " << c;
              }
            }
            const std::vector<float> got_state(
                got.begin() + r * stride + state_at,
                got.begin() + r * stride + state_at + FusedRowStateWidth(kind, dim));
            const std::vector<float> want_state(
                rows.begin() + r * stride + state_at,
                rows.begin() + r * stride + state_at + FusedRowStateWidth(kind, dim));
            EXPECT_TRUE(AllNear(got_state, want_state, kTol, kTol)) << "row " << r;
          }
        }
      }
    }
  }
}

// The device skips out-of-range rows and updates the others.
TEST(CudaParityTest, FusedOptimizerUpdateSkipsBadRows) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  constexpr int64_t kRows = 8;
  constexpr int kDim = 16;
  const OptimizerKind kind = OptimizerKind::kRowWiseAdagrad;
  const int64_t stride = FusedRowStride(kind, kDim);
  std::vector<float> rows = RandomFloats(kRows * stride, 1);
  for (int64_t r = 0; r < kRows; ++r) {
    InitFusedRowState(kind, kDim, rows.data() + r * stride);
  }
  DeviceBuffer<float> d_rows(rows);
  const std::vector<float> grads = RandomFloats(4 * kDim, 2);
  const std::vector<int64_t> bad = {3, -1, 5, kRows};
  const std::vector<int64_t> good = {3, 5};
  std::vector<float> good_grads(grads.begin(), grads.begin() + kDim);
  good_grads.insert(good_grads.end(), grads.begin() + 2 * kDim,
                    grads.begin() + 3 * kDim);
  FusedUpdateArgs a;
  a.rows = rows.data();
  a.num_rows = kRows;
  a.row_stride = stride;
  a.dim = kDim;
  a.row_indices = good.data();
  a.num_updates = 2;
  a.grads = good_grads.data();
  a.optimizer = TestParams(kind);
  ASSERT_TRUE(FusedOptimizerUpdateCpu(a, ExecContext()).ok());
  DeviceBuffer<int64_t> d_ids(bad);
  DeviceBuffer<float> d_grads(grads);
  a.rows = d_rows.get();
  a.row_indices = d_ids.get();
  a.num_updates = 4;
  a.grads = d_grads.get();
  ASSERT_TRUE(FusedOptimizerUpdateCuda(a, cuda.ctx()).ok());
  EXPECT_TRUE(AllNear(d_rows.Download(), rows, kTol, kTol));
}

TEST(CudaParityTest, DenseOptimizerStepTwoSteps) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  constexpr int64_t kN = 100003;
  for (OptimizerKind kind : kAllKinds) {
    SCOPED_TRACE(OptimizerName(kind));
    std::vector<float> weights = RandomFloats(kN, 1);
    std::vector<float> state(DenseOptimizerStateSize(kind, kN), 0.0f);
    DeviceBuffer<float> d_weights(weights), d_state(state);
    for (int64_t step = 1; step <= 2; ++step) {
      const std::vector<float> grads = RandomFloats(kN, 10 + step);
      DenseOptimizerArgs a;
      a.weights = weights.data();
      a.grads = grads.data();
      a.state = state.data();
      a.n = kN;
      a.step = step;
      a.optimizer = TestParams(kind);
      DeviceBuffer<float> d_grads(grads);
      DenseOptimizerArgs d = a;
      d.weights = d_weights.get();
      d.grads = d_grads.get();
      d.state = d_state.get();
      if (kind == OptimizerKind::kRowWiseAdagrad) {
        EXPECT_EQ(DenseOptimizerStepCuda(d, cuda.ctx()).code(),
                  absl::StatusCode::kInvalidArgument);
        break;
      }
      ASSERT_TRUE(DenseOptimizerStepCpu(a, ExecContext()).ok());
      ASSERT_TRUE(DenseOptimizerStepCuda(d, cuda.ctx()).ok());
    }
    EXPECT_TRUE(AllNear(d_weights.Download(), weights, kTol, kTol));
    EXPECT_TRUE(AllNear(d_state.Download(), state, kTol, kTol));
  }
}

// ------------------------------------------------------- gemm, dense layer

TEST(CudaParityTest, GemmEveryTranspose) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  const ExecContext& ctx = cuda.WithCublas();
  for (int64_t k : {31, 0}) {
    for (float beta : {0.5f, 0.0f}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          SCOPED_TRACE(absl::StrCat("k=", k, " beta=", beta, " trans_a=", ta,
                                    " trans_b=", tb));
          GemmArgs g;
          g.trans_a = ta;
          g.trans_b = tb;
          g.m = 17;
          g.n = 23;
          g.k = k;
          g.alpha = 1.5f;
          g.beta = beta;
          g.lda = (ta ? g.m : k) + 3;  // padded rows
          g.ldb = (tb ? k : g.n) + 2;
          g.ldc = g.n + 5;
          const std::vector<float> a = RandomFloats((ta ? k : g.m) * g.lda, 1);
          const std::vector<float> b = RandomFloats((tb ? g.n : k) * g.ldb, 2);
          std::vector<float> c = RandomFloats(g.m * g.ldc, 3);
          DeviceBuffer<float> d_a(a), d_b(b), d_c(c);
          g.a = a.data();
          g.b = b.data();
          g.c = c.data();
          ASSERT_TRUE(GemmCpu(g, ExecContext()).ok());
          g.a = d_a.get();
          g.b = d_b.get();
          g.c = d_c.get();
          ASSERT_TRUE(GemmCuda(g, ctx).ok());
          EXPECT_TRUE(AllNear(d_c.Download(), c, kTol, kTol));
        }
      }
    }
  }
}

TEST(CudaParityTest, GemmNeedsCublasHandle) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  DeviceBuffer<float> a(4), b(4), c(4);
  GemmArgs g;
  g.m = g.n = g.k = 2;
  g.lda = g.ldb = g.ldc = 2;
  g.a = a.get();
  g.b = b.get();
  g.c = c.get();
  EXPECT_EQ(GemmCuda(g, ExecContext()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CudaParityTest, BiasActivationForwardBackward) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  struct Shape {
    int64_t batch, n;
  };
  // The tall shapes split the bias sum into several row blocks.
  for (Shape s : {Shape{37, 45}, Shape{3, 300}, Shape{70000, 1},
                  Shape{20000, 64}, Shape{0, 5}}) {
    for (bool relu : {true, false}) {
      SCOPED_TRACE(absl::StrCat("batch=", s.batch, " n=", s.n, " relu=", relu));
      std::vector<float> y = RandomFloats(s.batch * s.n, 1);
      const std::vector<float> bias = RandomFloats(s.n, 2);
      DeviceBuffer<float> d_y(y), d_bias(bias);
      BiasActivationForwardArgs f{y.data(), bias.data(), s.batch, s.n, relu};
      ASSERT_TRUE(BiasActivationForwardCpu(f, ExecContext()).ok());
      f.y = d_y.get();
      f.bias = d_bias.get();
      ASSERT_TRUE(BiasActivationForwardCuda(f, cuda.ctx()).ok());
      EXPECT_TRUE(AllNear(d_y.Download(), y, kTol, kTol));

      d_y.Upload(y);  // both backward passes see the CPU's forward output
      std::vector<float> dy = RandomFloats(s.batch * s.n, 3);
      std::vector<float> grad_bias(s.n);
      DeviceBuffer<float> d_dy(dy), d_grad_bias(s.n);
      BiasActivationBackwardArgs b{y.data(), dy.data(), grad_bias.data(),
                                   s.batch,  s.n,       relu};
      ASSERT_TRUE(BiasActivationBackwardCpu(b, ExecContext()).ok());
      b.y = d_y.get();
      b.dy = d_dy.get();
      b.grad_bias = d_grad_bias.get();
      ASSERT_TRUE(BiasActivationBackwardCuda(b, cuda.ctx()).ok());
      EXPECT_TRUE(AllNear(d_dy.Download(), dy, kTol, kTol));
      EXPECT_TRUE(AllNear(d_grad_bias.Download(), grad_bias, kTol, kTol));
    }
  }
}

// ------------------------------------------------------ interaction, loss

TEST(CudaParityTest, DotInteractionForwardBackward) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  struct Shape {
    int64_t batch;
    int num_sparse, dim;
  };
  // The last two need more than 48 KiB of shared memory per sample (opt-in),
  // and more than any GPU has (the global-memory path).
  for (Shape s : {Shape{5, 3, 16}, Shape{3, 26, 128}, Shape{4, 7, 33},
                  Shape{2, 0, 8}, Shape{2, 100, 128}, Shape{2, 250, 256}}) {
    SCOPED_TRACE(
        absl::StrCat("batch=", s.batch, " F=", s.num_sparse, " dim=", s.dim));
    const int64_t width = DotInteractionOutputWidth(s.num_sparse, s.dim);
    const std::vector<float> dense = RandomFloats(s.batch * s.dim, 1);
    const std::vector<float> sparse =
        RandomFloats(s.batch * s.num_sparse * s.dim, 2);
    const std::vector<float> grad_out = RandomFloats(s.batch * width, 3);
    DeviceBuffer<float> d_dense(dense), d_sparse(sparse),
        d_out(s.batch * width), d_grad_out(grad_out),
        d_grad_dense(dense.size()), d_grad_sparse(sparse.size());

    std::vector<float> out(s.batch * width);
    DotInteractionForwardArgs f{s.batch,      s.num_sparse,  s.dim,
                                dense.data(), sparse.data(), out.data()};
    ASSERT_TRUE(DotInteractionForwardCpu(f, ExecContext()).ok());
    f.dense = d_dense.get();
    f.sparse = d_sparse.get();
    f.output = d_out.get();
    ASSERT_TRUE(DotInteractionForwardCuda(f, cuda.ctx()).ok());
    EXPECT_TRUE(AllNear(d_out.Download(), out, kTol, kTol));

    std::vector<float> grad_dense(dense.size()), grad_sparse(sparse.size());
    DotInteractionBackwardArgs b{
        s.batch,           s.num_sparse,      s.dim,
        dense.data(),      sparse.data(),     grad_out.data(),
        grad_dense.data(), grad_sparse.data()};
    ASSERT_TRUE(DotInteractionBackwardCpu(b, ExecContext()).ok());
    b.dense = d_dense.get();
    b.sparse = d_sparse.get();
    b.grad_output = d_grad_out.get();
    b.grad_dense = d_grad_dense.get();
    b.grad_sparse = d_grad_sparse.get();
    ASSERT_TRUE(DotInteractionBackwardCuda(b, cuda.ctx()).ok());
    EXPECT_TRUE(AllNear(d_grad_dense.Download(), grad_dense, kTol, kTol));
    EXPECT_TRUE(AllNear(d_grad_sparse.Download(), grad_sparse, kTol, kTol));
  }
}

TEST(CudaParityTest, SigmoidBce) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  CudaContext cuda;
  for (int64_t n : {1, 1000, 100003, 3000000}) {
    SCOPED_TRACE(absl::StrCat("n=", n));
    const std::vector<float> logits = RandomFloats(n, 1, -8.0f, 8.0f);
    const std::vector<float> labels = RandomFloats(n, 2, 0.0f, 1.0f);
    std::vector<float> loss(1), prob(n), grad(n);
    SigmoidBceArgs a{n,           logits.data(), labels.data(),
                     loss.data(), prob.data(),   grad.data()};
    ASSERT_TRUE(SigmoidBceCpu(a, ExecContext()).ok());
    DeviceBuffer<float> d_logits(logits), d_labels(labels), d_loss(1),
        d_prob(n), d_grad(n), d_loss_only(1);
    a.logits = d_logits.get();
    a.labels = d_labels.get();
    a.loss = d_loss.get();
    a.probabilities = d_prob.get();
    a.grad_logits = d_grad.get();
    ASSERT_TRUE(SigmoidBceCuda(a, cuda.ctx()).ok());
    const std::vector<float> got_loss = d_loss.Download();
    EXPECT_TRUE(AllNear(got_loss, loss, kTol, kTol));
    EXPECT_TRUE(AllNear(d_prob.Download(), prob, kTol, kTol));
    EXPECT_TRUE(AllNear(d_grad.Download(), grad, kTol, kTol));
    // The loss alone: same reduction, same bits.
    a.loss = d_loss_only.get();
    a.probabilities = nullptr;
    a.grad_logits = nullptr;
    ASSERT_TRUE(SigmoidBceCuda(a, cuda.ctx()).ok());
    EXPECT_TRUE(SameBits(d_loss_only.Download(), got_loss));
  }
}

}  // namespace
}  // namespace recps::kernels
