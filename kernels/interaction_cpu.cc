// CPU DLRM dot interaction and its backward, split over the batch.
//
// Each sample is independent and its work needs no scratch, so any split
// of the batch gives bit-identical results.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "kernels/interaction.h"

namespace recps::kernels {
namespace {

// Multiply-adds per pool task: enough to amortise the hand-off.
constexpr int64_t kTaskWork = 1 << 15;

// Dot product with 8 independent partial sums combined in a fixed order:
// the compiler may not reorder a float sum itself (no -ffast-math), and this
// shape vectorises while staying the same on every machine.
float Dot(const float* __restrict a, const float* __restrict b, int dim) {
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int k = 0;
  for (; k + 8 <= dim; k += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[k + l] * b[k + l];
  }
  float tail = 0.0f;
  for (; k < dim; ++k) tail += a[k] * b[k];
  return (((acc[0] + acc[4]) + (acc[1] + acc[5])) +
          ((acc[2] + acc[6]) + (acc[3] + acc[7]))) +
         tail;
}

// Position of pair (i, j), j < i, among the dot products of one row.
inline int64_t PairIndex(int i, int j) {
  return static_cast<int64_t>(i) * (i - 1) / 2 + j;
}

absl::Status CheckShape(const char* op, int64_t batch, int num_sparse,
                        int dim) {
  if (batch < 0 || num_sparse < 0 || dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": need batch >= 0, num_sparse >= 0 and dim >= 1; got batch=",
        batch, " num_sparse=", num_sparse, " dim=", dim));
  }
  return absl::OkStatus();
}

absl::Status CheckPointer(const char* op, const void* p, const char* name,
                          bool needed, int64_t batch, int num_sparse, int dim) {
  if (p == nullptr && needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " is null (batch=", batch,
                     " num_sparse=", num_sparse, " dim=", dim, ")"));
  }
  return absl::OkStatus();
}

int64_t Grain(int num_sparse, int dim) {
  const int64_t rows = static_cast<int64_t>(num_sparse) + 1;
  const int64_t work_per_sample = std::max<int64_t>(1, rows * rows / 2 * dim);
  return std::max<int64_t>(1, kTaskWork / work_per_sample);
}

}  // namespace

int64_t DotInteractionOutputWidth(int num_sparse, int dim) {
  return static_cast<int64_t>(dim) +
         (static_cast<int64_t>(num_sparse) + 1) * num_sparse / 2;
}

absl::Status DotInteractionForwardCpu(const DotInteractionForwardArgs& args,
                                      const ExecContext& ctx) {
  const DotInteractionForwardArgs& a = args;
  constexpr char kOp[] = "DotInteractionForwardCpu";
  RETURN_IF_ERROR(CheckShape(kOp, a.batch, a.num_sparse, a.dim));
  if (a.batch == 0) return absl::OkStatus();
  const bool has_sparse = a.num_sparse > 0;
  RETURN_IF_ERROR(
      CheckPointer(kOp, a.dense, "dense", true, a.batch, a.num_sparse, a.dim));
  RETURN_IF_ERROR(CheckPointer(kOp, a.sparse, "sparse", has_sparse, a.batch,
                               a.num_sparse, a.dim));
  RETURN_IF_ERROR(CheckPointer(kOp, a.output, "output", true, a.batch,
                               a.num_sparse, a.dim));
  const int f = a.num_sparse;
  const int dim = a.dim;
  const int64_t width = DotInteractionOutputWidth(f, dim);
  ParallelFor(ctx.pool, a.batch, Grain(f, dim), [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s) {
      const float* dense = a.dense + s * dim;
      const float* sparse = a.sparse + s * f * dim;  // unused when f == 0
      // Row r of T: the dense vector, then the pooled embeddings.
      auto t_row = [&](int r) {
        return r == 0 ? dense : sparse + static_cast<int64_t>(r - 1) * dim;
      };
      float* out = a.output + s * width;
      std::copy(dense, dense + dim, out);
      float* dots = out + dim;
      for (int i = 1; i <= f; ++i) {
        const float* ti = t_row(i);
        for (int j = 0; j < i; ++j) *dots++ = Dot(ti, t_row(j), dim);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status DotInteractionBackwardCpu(const DotInteractionBackwardArgs& args,
                                       const ExecContext& ctx) {
  const DotInteractionBackwardArgs& a = args;
  constexpr char kOp[] = "DotInteractionBackwardCpu";
  RETURN_IF_ERROR(CheckShape(kOp, a.batch, a.num_sparse, a.dim));
  if (a.batch == 0) return absl::OkStatus();
  const bool has_sparse = a.num_sparse > 0;
  RETURN_IF_ERROR(
      CheckPointer(kOp, a.dense, "dense", true, a.batch, a.num_sparse, a.dim));
  RETURN_IF_ERROR(CheckPointer(kOp, a.sparse, "sparse", has_sparse, a.batch,
                               a.num_sparse, a.dim));
  RETURN_IF_ERROR(CheckPointer(kOp, a.grad_output, "grad_output", true, a.batch,
                               a.num_sparse, a.dim));
  RETURN_IF_ERROR(CheckPointer(kOp, a.grad_dense, "grad_dense", true, a.batch,
                               a.num_sparse, a.dim));
  RETURN_IF_ERROR(CheckPointer(kOp, a.grad_sparse, "grad_sparse", has_sparse,
                               a.batch, a.num_sparse, a.dim));
  const int f = a.num_sparse;
  const int dim = a.dim;
  const int64_t width = DotInteractionOutputWidth(f, dim);
  ParallelFor(ctx.pool, a.batch, Grain(f, dim), [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s) {
      const float* dense = a.dense + s * dim;
      const float* sparse = a.sparse + s * f * dim;
      float* grad_dense = a.grad_dense + s * dim;
      float* grad_sparse = a.grad_sparse + s * f * dim;
      auto t_row = [&](int r) {
        return r == 0 ? dense : sparse + static_cast<int64_t>(r - 1) * dim;
      };
      const float* g = a.grad_output + s * width;
      const float* g_dots = g + dim;
      // dL/dT_i = sum_{j != i} g_{ij} T_j, g symmetric; T_0 also gets the
      // gradient of its copy. Each gradient row is written once, j in
      // increasing order.
      for (int i = 0; i <= f; ++i) {
        float* __restrict gi =
            i == 0 ? grad_dense
                   : grad_sparse + static_cast<int64_t>(i - 1) * dim;
        if (i == 0) {
          std::copy(g, g + dim, gi);
        } else {
          std::fill(gi, gi + dim, 0.0f);
        }
        for (int j = 0; j <= f; ++j) {
          if (j == i) continue;
          const float w = g_dots[i > j ? PairIndex(i, j) : PairIndex(j, i)];
          const float* __restrict tj = t_row(j);
          for (int k = 0; k < dim; ++k) gi[k] += w * tj[k];
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace recps::kernels
