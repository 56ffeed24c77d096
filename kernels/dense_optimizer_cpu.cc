// CPU dense optimizer step: checks, then element ranges split over the pool;
// the loops are in optimizer_simd.cc, one build per ISA.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/dense_optimizer.h"
#include "kernels/optimizer_internal.h"

namespace recps::kernels {

absl::Status DenseOptimizerStepCpu(const DenseOptimizerArgs& a,
                                   const ExecContext& ctx) {
  RETURN_IF_ERROR(ValidateOptimizerParams(a.optimizer));
  if (const OptimizerInfo& info = *FindOptimizer(a.optimizer.kind);
      !info.has_dense_form()) {
    return absl::InvalidArgumentError(absl::StrCat(
        info.name, " is an embedding optimizer; use ", OptimizerName(info.instead),
        " for dense parameters"));
  }
  if (a.n < 0) return absl::InvalidArgumentError(absl::StrCat("negative n ", a.n));
  if (a.step < 1 || a.step > 0xffffffffLL) {
    return absl::InvalidArgumentError(absl::StrCat("step must be in [1, 2^32), got ", a.step));
  }
  if (a.n == 0) return absl::OkStatus();
  if (a.weights == nullptr || a.grads == nullptr ||
      (DenseOptimizerStateSize(a.optimizer.kind, a.n) > 0 && a.state == nullptr)) {
    return absl::InvalidArgumentError("weights, grads or state is null");
  }
  const AdamScale scale =
      ComputeAdamScale(a.optimizer, static_cast<uint32_t>(a.step));
  auto range = RECPS_ISA_SELECT(ctx.isa, DenseOptimizerRange);
  ParallelFor(ctx.pool, a.n, std::max<int64_t>(4096, a.n / 64),
              [&](int64_t lo, int64_t hi) { range(a, scale, lo, hi); });
  return absl::OkStatus();
}

}  // namespace recps::kernels
