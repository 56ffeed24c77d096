// The element-wise part of a fully connected layer: bias add and optional
// ReLU after the GEMM, and its backward.
#ifndef RECPS_KERNELS_DENSE_LAYER_H_
#define RECPS_KERNELS_DENSE_LAYER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/exec_context.h"

namespace recps::kernels {

struct BiasActivationForwardArgs {
  // In place on a row-major batch x n matrix (the GEMM output):
  // y[i][j] = act(y[i][j] + bias[j]), act = ReLU when relu, else identity.
  float* y = nullptr;
  const float* bias = nullptr;  // n
  int64_t batch = 0;
  int64_t n = 0;
  bool relu = true;
};

struct BiasActivationBackwardArgs {
  const float* y = nullptr;  // the forward output, batch x n
  // In: gradient w.r.t. y. Out (in place): gradient w.r.t. the pre-bias GEMM
  // output (dy masked by y > 0 when relu).
  float* dy = nullptr;
  float* grad_bias = nullptr;  // n, overwritten with sum over the batch
  int64_t batch = 0;
  int64_t n = 0;
  bool relu = true;
};

absl::Status BiasActivationForwardCpu(const BiasActivationForwardArgs& args,
                                      const ExecContext& ctx);
absl::Status BiasActivationForwardCuda(const BiasActivationForwardArgs& args,
                                       const ExecContext& ctx);
absl::Status BiasActivationBackwardCpu(const BiasActivationBackwardArgs& args,
                                       const ExecContext& ctx);
absl::Status BiasActivationBackwardCuda(const BiasActivationBackwardArgs& args,
                                        const ExecContext& ctx);

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_DENSE_LAYER_H_
