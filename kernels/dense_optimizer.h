// Optimizer step for dense (MLP) parameters: a flat parameter tensor, its
// gradient and its state, updated element-wise with the rules of optimizer.h.
#ifndef RECPS_KERNELS_DENSE_OPTIMIZER_H_
#define RECPS_KERNELS_DENSE_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/exec_context.h"
#include "kernels/optimizer.h"

namespace recps::kernels {

// Floats of state for n parameters: the kind's dense_state_per_param
// (common/optimizer_registry.h) times n: SGD 0, Adagrad n, Adam/AdamW 2n (m
// then v). Row-wise Adagrad is an embedding optimizer and has no dense
// form (0).
int64_t DenseOptimizerStateSize(OptimizerKind kind, int64_t n);

struct DenseOptimizerArgs {
  float* weights = nullptr;      // n
  const float* grads = nullptr;  // n
  float* state = nullptr;        // DenseOptimizerStateSize(kind, n), zeroed at start
  int64_t n = 0;
  // 1-based count of steps taken including this one (Adam bias correction).
  int64_t step = 1;
  OptimizerParams optimizer;
};

// INVALID_ARGUMENT for row-wise Adagrad, null pointers, or step < 1.
absl::Status DenseOptimizerStepCpu(const DenseOptimizerArgs& args,
                                   const ExecContext& ctx);
absl::Status DenseOptimizerStepCuda(const DenseOptimizerArgs& args,
                                    const ExecContext& ctx);

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_DENSE_OPTIMIZER_H_
