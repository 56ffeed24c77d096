// CPU bias + ReLU for a fully connected layer, and its backward; the row
// loops are built per ISA (dense_math_simd.cc).
//
// The backward's bias gradient is a column sum over the batch. Rows are cut
// into blocks whose size depends only on (batch, n), never on the pool, and
// the per-block partial sums are added in block order, so grad_bias is
// bit-identical for any thread count.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "kernels/dense_layer.h"
#include "kernels/dense_math_internal.h"

namespace recps::kernels {
namespace {

// Elements per forward task: large enough to amortise the pool hand-off.
constexpr int64_t kForwardChunkElements = 1 << 14;
// Backward row blocks hold at least this many elements ...
constexpr int64_t kBackwardBlockElements = 1 << 15;
// ... and there are at most this many of them, which bounds the scratch
// for the partial sums to kMaxBackwardBlocks * n floats.
constexpr int64_t kMaxBackwardBlocks = 256;

absl::Status CheckShape(const char* op, int64_t batch, int64_t n) {
  if (batch < 0 || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": negative size batch=", batch, " n=", n));
  }
  return absl::OkStatus();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows per backward block: a function of the shape only (determinism).
int64_t BackwardBlockRows(int64_t batch, int64_t n) {
  const int64_t by_size =
      CeilDiv(kBackwardBlockElements, std::max<int64_t>(n, 1));
  const int64_t by_count = CeilDiv(batch, kMaxBackwardBlocks);
  return std::max<int64_t>(1, std::max(by_size, by_count));
}

}  // namespace

absl::Status BiasActivationForwardCpu(const BiasActivationForwardArgs& args,
                                      const ExecContext& ctx) {
  const BiasActivationForwardArgs& a = args;
  RETURN_IF_ERROR(CheckShape("BiasActivationForwardCpu", a.batch, a.n));
  if (a.batch == 0 || a.n == 0) return absl::OkStatus();
  if (a.y == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BiasActivationForwardCpu: y is null but batch=", a.batch, " n=", a.n));
  }
  if (a.bias == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("BiasActivationForwardCpu: bias is null but n=", a.n));
  }
  const int64_t n = a.n;
  const int64_t grain = std::max<int64_t>(1, kForwardChunkElements / n);
  auto range = RECPS_ISA_SELECT(ctx.isa, BiasActivationForwardRange);
  ParallelFor(ctx.pool, a.batch, grain, [&](int64_t lo, int64_t hi) { range(a, lo, hi); });
  return absl::OkStatus();
}

absl::Status BiasActivationBackwardCpu(const BiasActivationBackwardArgs& args,
                                       const ExecContext& ctx) {
  const BiasActivationBackwardArgs& a = args;
  RETURN_IF_ERROR(CheckShape("BiasActivationBackwardCpu", a.batch, a.n));
  if (a.n == 0) return absl::OkStatus();
  if (a.grad_bias == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BiasActivationBackwardCpu: grad_bias is null but n=", a.n));
  }
  if (a.batch > 0 && a.dy == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BiasActivationBackwardCpu: dy is null but batch=", a.batch,
        " n=", a.n));
  }
  // y is read only for the ReLU mask.
  if (a.batch > 0 && a.relu && a.y == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BiasActivationBackwardCpu: y is null but relu is on (batch=", a.batch,
        " n=", a.n, ")"));
  }
  const int64_t n = a.n;
  if (a.batch == 0) {
    std::fill(a.grad_bias, a.grad_bias + n, 0.0f);
    return absl::OkStatus();
  }
  const int64_t block_rows = BackwardBlockRows(a.batch, n);
  const int64_t num_blocks = CeilDiv(a.batch, block_rows);
  // Block 0 sums straight into grad_bias; the others into scratch.
  std::vector<float> partials((num_blocks - 1) * n);
  auto block = RECPS_ISA_SELECT(ctx.isa, BiasActivationBackwardBlock);
  ParallelFor(ctx.pool, num_blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      float* sum = b == 0 ? a.grad_bias : partials.data() + (b - 1) * n;
      block(a, b * block_rows, std::min(a.batch, (b + 1) * block_rows), sum);
    }
  });
  if (num_blocks > 1) {
    // Add the partials in block order; columns are independent, so the
    // column split does not change any sum.
    const int64_t col_grain =
        std::max<int64_t>(256, CeilDiv(kForwardChunkElements, num_blocks));
    ParallelFor(ctx.pool, n, col_grain, [&](int64_t lo, int64_t hi) {
      for (int64_t b = 1; b < num_blocks; ++b) {
        const float* p = partials.data() + (b - 1) * n;
        for (int64_t j = lo; j < hi; ++j) a.grad_bias[j] += p[j];
      }
    });
  }
  return absl::OkStatus();
}

}  // namespace recps::kernels
