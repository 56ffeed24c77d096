// Sigmoid + binary cross-entropy on logits, computed stably:
//   loss_i = max(x, 0) - x * y + log(1 + exp(-|x|)),  loss = mean_i loss_i
//   d loss / d x_i = (sigmoid(x_i) - y_i) / n
#ifndef RECPS_KERNELS_LOSS_H_
#define RECPS_KERNELS_LOSS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/exec_context.h"

namespace recps::kernels {

struct SigmoidBceArgs {
  int64_t n = 0;
  const float* logits = nullptr;  // n
  const float* labels = nullptr;  // n, in [0, 1]
  // Outputs, each optional (nullptr: not computed). Same memory space as the
  // inputs (device memory for the CUDA twin).
  float* loss = nullptr;           // 1: the mean loss
  float* probabilities = nullptr;  // n: sigmoid(x)
  float* grad_logits = nullptr;    // n: (sigmoid(x) - y) / n
};

// INVALID_ARGUMENT for n < 1 or null inputs.
absl::Status SigmoidBceCpu(const SigmoidBceArgs& args, const ExecContext& ctx);
absl::Status SigmoidBceCuda(const SigmoidBceArgs& args, const ExecContext& ctx);

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_LOSS_H_
