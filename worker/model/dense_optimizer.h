// Optimizer state for the model's flat dense parameter buffer, stepped with
// kernels::DenseOptimizerStepCpu. Every worker holds the same allreduced
// gradients and so takes the same step on its own replica.
#ifndef RECPS_WORKER_MODEL_DENSE_OPTIMIZER_H_
#define RECPS_WORKER_MODEL_DENSE_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/exec_context.h"
#include "kernels/optimizer.h"

namespace recps::worker {

class DenseOptimizer {
 public:
  // For `n` parameters. INVALID_ARGUMENT for bad hyper-parameters, the
  // row-wise Adagrad kind (embedding-only) or n < 0.
  static absl::StatusOr<std::unique_ptr<DenseOptimizer>> Create(
      const kernels::OptimizerParams& params, int64_t n);

  DenseOptimizer(const DenseOptimizer&) = delete;
  DenseOptimizer& operator=(const DenseOptimizer&) = delete;

  // One update of `weights` from `grads`, both of size n(). The step
  // counter (Adam's bias correction) advances only when the step succeeds.
  absl::Status Step(absl::Span<float> weights, absl::Span<const float> grads,
                    const kernels::ExecContext& ctx);

  // For learning-rate schedules (warm-up, decay). INVALID_ARGUMENT if the
  // rate is negative or not finite.
  absl::Status SetLearningRate(float learning_rate);

  const kernels::OptimizerParams& params() const { return params_; }
  int64_t n() const { return n_; }
  // Steps taken so far.
  int64_t step() const { return step_; }

  // State and step counter, for checkpoints: state layout as
  // kernels::DenseOptimizerStateSize (Adagrad: s; Adam: m then v).
  absl::Span<float> state() { return absl::MakeSpan(state_); }
  absl::Span<const float> state() const { return state_; }
  // INVALID_ARGUMENT for a negative count.
  absl::Status set_step(int64_t step);

 private:
  DenseOptimizer(const kernels::OptimizerParams& params, int64_t n);

  kernels::OptimizerParams params_;
  int64_t n_ = 0;
  int64_t step_ = 0;
  std::vector<float> state_;
};

}  // namespace recps::worker

#endif  // RECPS_WORKER_MODEL_DENSE_OPTIMIZER_H_
