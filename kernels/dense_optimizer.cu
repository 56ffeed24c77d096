// CUDA dense optimizer step (dense_optimizer.h): one grid-stride pass over
// the parameters with the element rules of optimizer.h.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda_util.cuh"
#include "kernels/dense_optimizer.h"

namespace recps::kernels {
namespace {

struct DenseParams {
  float* weights;
  const float* grads;
  float* state;
  int64_t n;
  OptimizerParams opt;
  AdamScale adam_scale;  // Adam/AdamW only, computed once on the host
};

template <OptimizerKind kKind>
__global__ void __launch_bounds__(kBlockThreads)
    DenseStepKernel(DenseParams p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float w = p.weights[i];
    const float g = p.grads[i];
    if constexpr (kKind == OptimizerKind::kSgd) {
      SgdRule(w, g, p.opt);
    } else if constexpr (kKind == OptimizerKind::kAdagrad) {
      float s = p.state[i];
      AdagradRule(w, s, g, p.opt);
      p.state[i] = s;
    } else if constexpr (IsAdam(kKind)) {
      float m = p.state[i];
      float v = p.state[p.n + i];
      AdamRule(w, m, v, g, p.opt, p.adam_scale, kKind == OptimizerKind::kAdamW);
      p.state[i] = m;
      p.state[p.n + i] = v;
    }
    // Others (row-wise Adagrad) have no dense form: refused before launch.
    p.weights[i] = w;
  }
}

template <OptimizerKind kKind>
absl::Status Launch(const DenseParams& p, cudaStream_t stream) {
  DenseStepKernel<kKind><<<GridBlocks(p.n), kBlockThreads, 0, stream>>>(p);
  RETURN_IF_LAUNCH_ERROR("DenseStepKernel");
  return absl::OkStatus();
}

}  // namespace

absl::Status DenseOptimizerStepCuda(const DenseOptimizerArgs& args,
                                    const ExecContext& ctx) {
  const char* op = "DenseOptimizerStepCuda";
  RETURN_IF_ERROR(ValidateOptimizerParams(args.optimizer));
  const OptimizerKind kind = args.optimizer.kind;
  if (const OptimizerInfo& info = *FindOptimizer(kind); !info.has_dense_form()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", info.display_name, " is an embedding optimizer (no dense form)"));
  }
  if (args.n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": n must be >= 0, got ", args.n));
  }
  // The rules count steps in uint32.
  if (args.step < 1 || args.step > int64_t{UINT32_MAX}) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": step must be in [1, 2^32), got ", args.step));
  }
  if (args.n == 0) return absl::OkStatus();
  if (args.weights == nullptr || args.grads == nullptr ||
      (DenseOptimizerStateSize(kind, args.n) > 0 && args.state == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": weights, grads or state is null"));
  }

  DenseParams p{args.weights, args.grads, args.state, args.n, args.optimizer,
                // Read by Adam and AdamW only.
                ComputeAdamScale(args.optimizer, static_cast<uint32_t>(args.step))};
  const cudaStream_t stream = StreamOf(ctx);
  return VisitOptimizer(
      kind, [&](auto k) { return Launch<decltype(k)::kKind>(p, stream); },
      [&] {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": unknown optimizer kind ", static_cast<int>(kind)));
      });
}

}  // namespace recps::kernels
