// CPU embedding-bag: argument checks, the thread split, and (backward) the
// stable counting sort that fixes the summation order. The per-row vector
// loops live in embedding_bag_simd.cc, one build per ISA.
#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/embedding_bag.h"
#include "kernels/embedding_bag_internal.h"

namespace recps::kernels {
namespace {

// Lowers `target` to `value` if smaller (lock-free min).
void AtomicMin(std::atomic<int64_t>& target, int64_t value) {
  int64_t cur = target.load(std::memory_order_relaxed);
  while (value < cur &&
         !target.compare_exchange_weak(cur, value, std::memory_order_relaxed)) {
  }
}

// Checks the jagged input shared by forward and backward: offsets and every
// index. The index scan is split over the pool; it reads 8 bytes per
// position against the row bytes the kernel then gathers.
absl::Status ValidateJagged(const int64_t* indices, int64_t num_indices,
                            const int64_t* offsets, int64_t num_bags,
                            const float* per_sample_weights,
                            PoolingMode pooling, int64_t num_rows, int dim,
                            const ExecContext& ctx) {
  if (dim < 1) return absl::InvalidArgumentError(absl::StrCat("dim must be >= 1, got ", dim));
  if (num_indices < 0 || num_bags < 0 || num_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "negative size: num_indices=", num_indices, " num_bags=", num_bags,
        " num_rows=", num_rows));
  }
  if (num_indices > 0 && indices == nullptr) {
    return absl::InvalidArgumentError("indices is null");
  }
  if (pooling == PoolingMode::kMean && per_sample_weights != nullptr) {
    return absl::InvalidArgumentError(
        "per_sample_weights need pooling sum or none, not mean");
  }
  if (pooling != PoolingMode::kNone) {
    if (offsets == nullptr) return absl::InvalidArgumentError("offsets is null");
    if (offsets[0] != 0 || offsets[num_bags] != num_indices) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offsets must run from 0 to num_indices=", num_indices, ", got ",
          offsets[0], "..", offsets[num_bags]));
    }
    for (int64_t b = 0; b < num_bags; ++b) {
      if (offsets[b + 1] < offsets[b]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "offsets decrease at bag ", b, ": ", offsets[b], " then ",
            offsets[b + 1]));
      }
    }
  }
  std::atomic<int64_t> first_bad{std::numeric_limits<int64_t>::max()};
  ParallelFor(ctx.pool, num_indices, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      if (static_cast<uint64_t>(indices[p]) >=
          static_cast<uint64_t>(num_rows)) {
        AtomicMin(first_bad, p);
        return;
      }
    }
  });
  const int64_t bad = first_bad.load();
  if (bad != std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index ", indices[bad], " at position ", bad, " is outside [0, ",
        num_rows, ")"));
  }
  return absl::OkStatus();
}

// Chunk size that gives each thread several chunks (load balance) while
// keeping the per-chunk overhead small.
int64_t GrainFor(int64_t n, const ExecContext& ctx) {
  const int threads = ctx.pool ? ctx.pool->num_threads() : 1;
  return std::max<int64_t>(1, n / (threads * 8));
}

int64_t GradStride(const EmbeddingBagBackwardArgs& a) {
  return a.grad_output_stride > 0 ? a.grad_output_stride : a.dim;
}

}  // namespace

absl::Status EmbeddingBagForwardCpu(const EmbeddingBagForwardArgs& a,
                                    const ExecContext& ctx) {
  if (a.rows == nullptr && a.num_rows > 0) {
    return absl::InvalidArgumentError("rows is null");
  }
  if (a.row_stride < a.dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row_stride ", a.row_stride, " is smaller than dim ", a.dim));
  }
  RETURN_IF_ERROR(ValidateJagged(a.indices, a.num_indices, a.offsets,
                                 a.num_bags, a.per_sample_weights, a.pooling,
                                 a.num_rows, a.dim, ctx));
  const int64_t n = a.pooling == PoolingMode::kNone ? a.num_indices : a.num_bags;
  if (n > 0 && a.output == nullptr) {
    return absl::InvalidArgumentError("output is null");
  }
  if (a.output_stride != 0 && a.output_stride < a.dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output_stride ", a.output_stride, " is smaller than dim ", a.dim));
  }
  auto range = RECPS_ISA_SELECT(ctx.isa, EmbeddingBagForwardRange);
  ParallelFor(ctx.pool, n, GrainFor(n, ctx),
              [&](int64_t lo, int64_t hi) { range(a, lo, hi); });
  return absl::OkStatus();
}

absl::Status EmbeddingBagBackwardCpu(const EmbeddingBagBackwardArgs& a,
                                     const ExecContext& ctx) {
  RETURN_IF_ERROR(ValidateJagged(a.indices, a.num_indices, a.offsets,
                                 a.num_bags, a.per_sample_weights, a.pooling,
                                 a.num_rows, a.dim, ctx));
  if (a.num_indices > 0 && a.grad_output == nullptr) {
    return absl::InvalidArgumentError("grad_output is null");
  }
  if (a.num_rows > 0 && a.grad_rows == nullptr) {
    return absl::InvalidArgumentError("grad_rows is null");
  }
  if (a.grad_output_stride != 0 && a.grad_output_stride < a.dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grad_output_stride ", a.grad_output_stride, " is smaller than dim ",
        a.dim));
  }

  // Stable counting sort of positions by row: entries of row r keep
  // increasing position order, which fixes the summation order.
  std::vector<int64_t> row_begin(a.num_rows + 1, 0);
  for (int64_t p = 0; p < a.num_indices; ++p) ++row_begin[a.indices[p] + 1];
  for (int64_t r = 0; r < a.num_rows; ++r) row_begin[r + 1] += row_begin[r];
  std::vector<int64_t> source_row(a.num_indices);
  std::vector<float> scale(a.num_indices);
  std::vector<int64_t> cursor(row_begin.begin(), row_begin.end() - 1);
  auto place = [&](int64_t p, int64_t src, float s) {
    const int64_t e = cursor[a.indices[p]]++;
    source_row[e] = src;
    scale[e] = s;
  };
  const float* psw = a.per_sample_weights;
  if (a.pooling == PoolingMode::kNone) {
    for (int64_t p = 0; p < a.num_indices; ++p) place(p, p, psw ? psw[p] : 1.0f);
  } else {
    for (int64_t b = 0; b < a.num_bags; ++b) {
      const int64_t lo = a.offsets[b], hi = a.offsets[b + 1];
      const float mean_scale = 1.0f / static_cast<float>(std::max<int64_t>(1, hi - lo));
      for (int64_t p = lo; p < hi; ++p) {
        place(p, b,
              a.pooling == PoolingMode::kMean ? mean_scale
                                               : (psw ? psw[p] : 1.0f));
      }
    }
  }

  const EmbeddingBagBackwardPlan plan{
      a.grad_output,     a.dim,        GradStride(a),   a.accumulate, row_begin.data(),
      source_row.data(), scale.data(), a.grad_rows};
  auto range = RECPS_ISA_SELECT(ctx.isa, EmbeddingBagBackwardRange);
  ParallelFor(ctx.pool, a.num_rows, GrainFor(a.num_rows, ctx),
              [&](int64_t lo, int64_t hi) { range(plan, lo, hi); });
  return absl::OkStatus();
}

}  // namespace recps::kernels
