// Optimizer state for the model's flat dense parameter buffer, stepped with
// kernels::DenseOptimizerStep on the model's device (the state lives there
// too). Every worker holds the same allreduced
// gradients and so takes the same step on its own replica.
#ifndef RECPS_WORKER_MODEL_DENSE_OPTIMIZER_H_
#define RECPS_WORKER_MODEL_DENSE_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/device_memory.h"
#include "kernels/exec_context.h"
#include "kernels/optimizer.h"

namespace recps::worker {

class DenseOptimizer {
 public:
  // For `n` parameters. INVALID_ARGUMENT for bad hyper-parameters, the
  // row-wise Adagrad kind (embedding-only) or n < 0. The state lives on
  // ctx's device (zeroed); FAILED_PRECONDITION when it cannot be used.
  static absl::StatusOr<std::unique_ptr<DenseOptimizer>> Create(
      const OptimizerParams& params, int64_t n,
      const kernels::ExecContext& ctx = {});

  DenseOptimizer(const DenseOptimizer&) = delete;
  DenseOptimizer& operator=(const DenseOptimizer&) = delete;

  // One update of `weights` from `grads`, both of size n() and in the
  // memory of the optimizer's device (ctx must be of that device). The step
  // counter (Adam's bias correction) advances only when the launch succeeds;
  // on a GPU the update is queued on ctx's stream.
  absl::Status Step(absl::Span<float> weights, absl::Span<const float> grads,
                    const kernels::ExecContext& ctx);

  // For learning-rate schedules (warm-up, decay). INVALID_ARGUMENT if the
  // rate is negative or not finite.
  absl::Status SetLearningRate(float learning_rate);

  const OptimizerParams& params() const { return params_; }
  int64_t n() const { return n_; }
  // Steps taken so far.
  int64_t step() const { return step_; }

  // State and step counter, for checkpoints: state layout as
  // kernels::DenseOptimizerStateSize (Adagrad: s; Adam: m then v). state()
  // is device memory; ReadState/WriteState copy through the host (waiting
  // for queued work). WriteState: INVALID_ARGUMENT for a size mismatch.
  absl::Span<float> state() { return absl::MakeSpan(state_.data(), state_.size()); }
  absl::Span<const float> state() const {
    return absl::MakeConstSpan(state_.data(), state_.size());
  }
  int64_t state_size() const { return static_cast<int64_t>(state_.size()); }
  absl::Status ReadState(std::vector<float>* out) const;
  absl::Status WriteState(absl::Span<const float> values);
  kernels::Device device() const { return state_.device(); }
  // INVALID_ARGUMENT for a negative count.
  absl::Status set_step(int64_t step);

 private:
  DenseOptimizer(const OptimizerParams& params, int64_t n,
                 const kernels::ExecContext& ctx);

  OptimizerParams params_;
  int64_t n_ = 0;
  int64_t step_ = 0;
  kernels::DeviceBuffer state_;
};

}  // namespace recps::worker

#endif  // RECPS_WORKER_MODEL_DENSE_OPTIMIZER_H_
