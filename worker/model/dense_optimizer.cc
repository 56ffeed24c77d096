#include "worker/model/dense_optimizer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/dispatch.h"
#include "kernels/dense_optimizer.h"

namespace recps::worker {

absl::StatusOr<std::unique_ptr<DenseOptimizer>> DenseOptimizer::Create(
    const kernels::OptimizerParams& params, int64_t n) {
  RETURN_IF_ERROR(kernels::ValidateOptimizerParams(params));
  if (params.kind == kernels::OptimizerKind::kRowWiseAdagrad) {
    return absl::InvalidArgumentError(
        "DenseOptimizer: rowwise_adagrad is an embedding optimizer; use "
        "adagrad for dense parameters");
  }
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DenseOptimizer: negative parameter count ", n));
  }
  return std::unique_ptr<DenseOptimizer>(new DenseOptimizer(params, n));
}

DenseOptimizer::DenseOptimizer(const kernels::OptimizerParams& params,
                               int64_t n)
    : params_(params),
      n_(n),
      state_(static_cast<size_t>(
                 kernels::DenseOptimizerStateSize(params.kind, n)),
             0.0f) {}

absl::Status DenseOptimizer::Step(absl::Span<float> weights,
                                  absl::Span<const float> grads,
                                  const kernels::ExecContext& ctx) {
  if (static_cast<int64_t>(weights.size()) != n_ ||
      static_cast<int64_t>(grads.size()) != n_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DenseOptimizer::Step: ", weights.size(), " weights and ",
        grads.size(), " gradients for an optimizer of ", n_, " parameters"));
  }
  kernels::DenseOptimizerArgs a;
  a.weights = weights.data();
  a.grads = grads.data();
  a.state = state_.data();
  a.n = n_;
  a.step = step_ + 1;
  a.optimizer = params_;
  RETURN_IF_ERROR(kernels::DenseOptimizerStep(a, ctx));
  ++step_;
  return absl::OkStatus();
}

absl::Status DenseOptimizer::SetLearningRate(float learning_rate) {
  kernels::OptimizerParams p = params_;
  p.learning_rate = learning_rate;
  RETURN_IF_ERROR(kernels::ValidateOptimizerParams(p));
  params_ = p;
  return absl::OkStatus();
}

absl::Status DenseOptimizer::set_step(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DenseOptimizer: negative step count ", step));
  }
  step_ = step;
  return absl::OkStatus();
}

}  // namespace recps::worker
