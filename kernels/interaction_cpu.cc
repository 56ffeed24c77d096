// CPU DLRM dot interaction and its backward, split over the batch; the
// per-sample loops are built per ISA (dense_math_simd.cc).
//
// Each sample is independent and its work needs no scratch, so any split
// of the batch gives bit-identical results.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "kernels/dense_math_internal.h"
#include "kernels/interaction.h"

namespace recps::kernels {
namespace {

// Multiply-adds per pool task: enough to amortise the hand-off.
constexpr int64_t kTaskWork = 1 << 15;

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
  auto range = RECPS_ISA_SELECT(ctx.isa, DotInteractionForwardRange);
  ParallelFor(ctx.pool, a.batch, Grain(a.num_sparse, a.dim),
              [&](int64_t lo, int64_t hi) { range(a, lo, hi); });
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
  auto range = RECPS_ISA_SELECT(ctx.isa, DotInteractionBackwardRange);
  ParallelFor(ctx.pool, a.batch, Grain(a.num_sparse, a.dim),
              [&](int64_t lo, int64_t hi) { range(a, lo, hi); });
  return absl::OkStatus();
}

}  // namespace recps::kernels
