#include "kernels/dense_optimizer.h"

namespace recps::kernels {

int64_t DenseOptimizerStateSize(OptimizerKind kind, int64_t n) {
  const OptimizerInfo* info = FindOptimizer(kind);
  if (info == nullptr || !info->has_dense_form()) return 0;
  return info->dense_state_per_param * n;
}

}  // namespace recps::kernels
