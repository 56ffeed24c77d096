#include "worker/model/dense_optimizer.h"

#include "absl/strings/str_cat.h"
#include "common/optimizer_registry.h"
#include "common/status_macros.h"
#include "kernels/dispatch.h"
#include "kernels/dense_optimizer.h"

namespace recps::worker {

absl::StatusOr<std::unique_ptr<DenseOptimizer>> DenseOptimizer::Create(
    const OptimizerParams& params, int64_t n,
    const kernels::ExecContext& ctx) {
  RETURN_IF_ERROR(ValidateOptimizerParams(params));
  if (const OptimizerInfo& info = *FindOptimizer(params.kind);
      !info.has_dense_form()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DenseOptimizer: ", info.name, " is an embedding optimizer; use ",
        OptimizerName(info.instead), " for dense parameters"));
  }
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DenseOptimizer: negative parameter count ", n));
  }
  RETURN_IF_ERROR(kernels::CheckDeviceUsable(ctx.device, ctx.cuda_device));
  std::unique_ptr<DenseOptimizer> opt(new DenseOptimizer(params, n, ctx));
  // Resize zeroes the new elements on every device.
  RETURN_IF_ERROR(opt->state_.Resize(static_cast<size_t>(
      kernels::DenseOptimizerStateSize(params.kind, n))));
  return opt;
}

DenseOptimizer::DenseOptimizer(const OptimizerParams& params,
                               int64_t n, const kernels::ExecContext& ctx)
    : params_(params), n_(n), state_(ctx.device, ctx.cuda_device) {}

namespace {

kernels::ExecContext CopyContext(const kernels::DeviceBuffer& b) {
  kernels::ExecContext ctx;
  ctx.device = b.device();
  ctx.cuda_device = b.cuda_device();
  return ctx;
}

}  // namespace

absl::Status DenseOptimizer::ReadState(std::vector<float>* out) const {
  const kernels::ExecContext ctx = CopyContext(state_);
  RETURN_IF_ERROR(kernels::Synchronize(ctx));  // queued steps first
  out->resize(state_.size());
  RETURN_IF_ERROR(
      kernels::CopyToHost(out->data(), state_.data(), state_.size(), ctx));
  return kernels::Synchronize(ctx);
}

absl::Status DenseOptimizer::WriteState(absl::Span<const float> values) {
  if (values.size() != state_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DenseOptimizer::WriteState: ", values.size(), " values for a state of ",
        state_.size(), " floats"));
  }
  const kernels::ExecContext ctx = CopyContext(state_);
  RETURN_IF_ERROR(kernels::Synchronize(ctx));  // queued steps first
  RETURN_IF_ERROR(
      kernels::CopyToDevice(state_.data(), values.data(), values.size(), ctx));
  return kernels::Synchronize(ctx);
}

absl::Status DenseOptimizer::Step(absl::Span<float> weights,
                                  absl::Span<const float> grads,
                                  const kernels::ExecContext& ctx) {
  if (static_cast<int64_t>(weights.size()) != n_ ||
      static_cast<int64_t>(grads.size()) != n_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DenseOptimizer::Step: ", weights.size(), " weights and ",
        grads.size(), " gradients for an optimizer of ", n_, " parameters"));
  }
  if (ctx.device != state_.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DenseOptimizer::Step: the state lives on ",
        kernels::DeviceName(state_.device(), state_.cuda_device()),
        " but the context is ", kernels::DeviceName(ctx.device, ctx.cuda_device)));
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
  OptimizerParams p = params_;
  p.learning_rate = learning_rate;
  RETURN_IF_ERROR(ValidateOptimizerParams(p));
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
