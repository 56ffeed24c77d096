// CPU fused optimizer update: argument checks and the thread split; the row
// loops are in optimizer_simd.cc, one build per ISA.
#include <algorithm>
#include <atomic>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/embedding_optimizer.h"
#include "kernels/optimizer_internal.h"

namespace recps::kernels {

absl::Status FusedOptimizerUpdateCpu(const FusedUpdateArgs& a,
                                     const ExecContext& ctx) {
  RETURN_IF_ERROR(ValidateOptimizerParams(a.optimizer));
  if (a.dim < 1) return absl::InvalidArgumentError(absl::StrCat("dim must be >= 1, got ", a.dim));
  if (a.precision != RowPrecision::kFp32 &&
      a.precision != RowPrecision::kFp16 &&
      a.precision != RowPrecision::kBf16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown row precision ", static_cast<int>(a.precision)));
  }
  const int64_t needed = FusedRowStateOffset(a.dim, a.precision) +
                         FusedRowStateWidth(a.optimizer.kind, a.dim);
  if (a.row_stride < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row_stride ", a.row_stride, " cannot hold dim ", a.dim, " ",
        RowPrecisionName(a.precision), " weights plus ",
        OptimizerName(a.optimizer.kind), " state (", needed, " words)"));
  }
  if (a.num_updates < 0 || a.num_rows < 0) {
    return absl::InvalidArgumentError("negative num_updates or num_rows");
  }
  if (a.num_updates == 0) return absl::OkStatus();
  if (a.rows == nullptr || a.row_indices == nullptr || a.grads == nullptr) {
    return absl::InvalidArgumentError("rows, row_indices or grads is null");
  }
  std::atomic<int64_t> first_bad{std::numeric_limits<int64_t>::max()};
  ParallelFor(ctx.pool, a.num_updates, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (static_cast<uint64_t>(a.row_indices[i]) >=
          static_cast<uint64_t>(a.num_rows)) {
        int64_t cur = first_bad.load();
        while (i < cur && !first_bad.compare_exchange_weak(cur, i)) {
        }
        return;
      }
    }
  });
  if (const int64_t bad = first_bad.load(); bad != std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row index ", a.row_indices[bad], " of update ", bad,
        " is outside [0, ", a.num_rows, ")"));
  }
  const int threads = ctx.pool ? ctx.pool->num_threads() : 1;
  const int64_t grain = std::max<int64_t>(64, a.num_updates / (threads * 8));
  auto range = RECPS_ISA_SELECT(ctx.isa, FusedUpdateRange);
  ParallelFor(ctx.pool, a.num_updates, grain,
              [&](int64_t lo, int64_t hi) { range(a, lo, hi); });
  return absl::OkStatus();
}

}  // namespace recps::kernels
