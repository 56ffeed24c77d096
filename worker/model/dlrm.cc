#include "worker/model/dlrm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/row_init.h"
#include "common/status_macros.h"
#include "kernels/dispatch.h"
#include "kernels/dense_layer.h"
#include "kernels/gemm.h"
#include "kernels/interaction.h"
#include "kernels/loss.h"

namespace recps::worker {
namespace {

absl::Status CheckMlp(const char* field, const std::vector<int>& widths,
                      int required_last, const char* last_name) {
  if (widths.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DlrmConfig.", field, " is empty; it needs at least one "
                     "layer, the last of width ", last_name, " = ",
                     required_last));
  }
  for (size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("DlrmConfig.", field, "[", i, "] = ", widths[i],
                       "; layer widths must be >= 1"));
    }
  }
  if (widths.back() != required_last) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmConfig.", field, ": the last layer has width ", widths.back(),
        " but must equal ", last_name, " = ", required_last));
  }
  return absl::OkStatus();
}

// Number of floats in a batch x width matrix, for buffer sizes.
size_t Floats(int64_t batch, int64_t width) {
  return static_cast<size_t>(batch) * static_cast<size_t>(width);
}

}  // namespace

absl::Status ValidateDlrmConfig(const DlrmConfig& c) {
  if (c.num_dense < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmConfig.num_dense must be >= 1, got ", c.num_dense));
  }
  if (c.num_sparse < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmConfig.num_sparse must be >= 1, got ", c.num_sparse));
  }
  if (c.embedding_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmConfig.embedding_dim must be >= 1, got ", c.embedding_dim));
  }
  // The first top layer's input width is a GEMM and init dimension (int).
  const int64_t width =
      kernels::DotInteractionOutputWidth(c.num_sparse, c.embedding_dim);
  if (width > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmConfig.num_sparse = ", c.num_sparse, " with embedding_dim = ",
        c.embedding_dim, " gives an interaction width ", width,
        " beyond the int range"));
  }
  RETURN_IF_ERROR(
      CheckMlp("bottom_mlp", c.bottom_mlp, c.embedding_dim, "embedding_dim"));
  RETURN_IF_ERROR(CheckMlp("top_mlp", c.top_mlp, 1, "the single logit"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DlrmModel>> DlrmModel::Create(
    const DlrmConfig& config, const kernels::ExecContext& ctx) {
  RETURN_IF_ERROR(ValidateDlrmConfig(config));
  RETURN_IF_ERROR(kernels::CheckDeviceUsable(ctx.device, ctx.cuda_device));
  std::unique_ptr<DlrmModel> model(new DlrmModel(config, ctx));
  RETURN_IF_ERROR(model->Allocate());
  RETURN_IF_ERROR(model->InitParameters());
  return model;
}

DlrmModel::DlrmModel(const DlrmConfig& config, const kernels::ExecContext& ctx)
    : config_(config), device_(ctx.device), cuda_device_(ctx.cuda_device) {
  interaction_width_ = kernels::DotInteractionOutputWidth(
      config.num_sparse, config.embedding_dim);
  int64_t offset = 0;
  auto add = [&](int64_t in, int out, bool relu) {
    Layer layer;
    layer.in = in;
    layer.out = out;
    layer.relu = relu;
    layer.weight_offset = offset;
    offset += in * out;
    layer.bias_offset = offset;
    offset += out;
    layers_.push_back(layer);
  };
  int64_t in = config.num_dense;
  // Every bottom layer has ReLU, the last too (DLRM's reference).
  for (int width : config.bottom_mlp) {
    add(in, width, /*relu=*/true);
    in = width;
  }
  num_bottom_ = layers_.size();
  in = interaction_width_;
  for (size_t i = 0; i < config.top_mlp.size(); ++i) {
    add(in, config.top_mlp[i], /*relu=*/i + 1 < config.top_mlp.size());
    in = config.top_mlp[i];
  }
  for (kernels::DeviceBuffer* b :
       {&params_, &grads_, &dense_in_, &pooled_in_, &interaction_,
        &grad_interaction_, &grad_pooled_, &labels_, &loss_}) {
    *b = NewBuffer();
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    act_.push_back(NewBuffer());
    grad_act_.push_back(NewBuffer());
  }
}

absl::Status DlrmModel::Allocate() {
  const size_t n = layers_.empty()
                       ? 0
                       : static_cast<size_t>(layers_.back().bias_offset +
                                             layers_.back().out);
  RETURN_IF_ERROR(params_.Resize(n));
  RETURN_IF_ERROR(grads_.Resize(n));
  return loss_.Resize(1);
}

absl::Status DlrmModel::InitParameters() {
  // Computed on the host (the same bits for every device), then copied.
  std::vector<float> host(params_.size(), 0.0f);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    const bool bottom = l < num_bottom_;
    // Named by position within its MLP: the bottom MLP's init does not
    // change when the top MLP does, and vice versa.
    const std::string name =
        absl::StrCat(bottom ? "bottom_mlp." : "top_mlp.",
                     bottom ? l : l - num_bottom_);
    RowInit weight_init;
    weight_init.distribution = RowInit::Distribution::kNormal;
    weight_init.a = 0.0f;
    weight_init.b = static_cast<float>(
        std::sqrt(2.0 / (static_cast<double>(layer.in) + layer.out)));
    const uint64_t weight_key = StableNameKey(absl::StrCat(name, ".weight"));
    float* w = host.data() + layer.weight_offset;
    for (int64_t row = 0; row < layer.out; ++row) {
      InitRow(weight_init, config_.seed, weight_key, row,
              static_cast<int>(layer.in), w + row * layer.in);
    }
    RowInit bias_init = weight_init;
    bias_init.b = static_cast<float>(std::sqrt(1.0 / layer.out));
    InitRow(bias_init, config_.seed, StableNameKey(absl::StrCat(name, ".bias")),
            /*id=*/0, static_cast<int>(layer.out),
            host.data() + layer.bias_offset);
  }
  return WriteParameters(host);
}

namespace {

// A context for the model's own copies outside a step (init, checkpoints):
// the whole device (its streams are non-blocking): see Synchronize.
kernels::ExecContext CopyContext(kernels::Device device, int cuda_device) {
  kernels::ExecContext ctx;
  ctx.device = device;
  ctx.cuda_device = cuda_device;
  return ctx;
}

}  // namespace

absl::Status DlrmModel::ReadParameters(std::vector<float>* out) const {
  const kernels::ExecContext ctx = CopyContext(device_, cuda_device_);
  RETURN_IF_ERROR(kernels::Synchronize(ctx));  // queued steps first
  out->resize(params_.size());
  RETURN_IF_ERROR(kernels::CopyToHost(out->data(), params_.data(),
                                      params_.size(), ctx));
  return kernels::Synchronize(ctx);
}

absl::Status DlrmModel::ReadGradients(std::vector<float>* out) const {
  const kernels::ExecContext ctx = CopyContext(device_, cuda_device_);
  RETURN_IF_ERROR(kernels::Synchronize(ctx));  // queued steps first
  out->resize(grads_.size());
  RETURN_IF_ERROR(
      kernels::CopyToHost(out->data(), grads_.data(), grads_.size(), ctx));
  return kernels::Synchronize(ctx);
}

absl::Status DlrmModel::WriteParameters(absl::Span<const float> values) {
  if (values.size() != params_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmModel::WriteParameters: ", values.size(),
        " values for a model of ", params_.size(), " parameters"));
  }
  const kernels::ExecContext ctx = CopyContext(device_, cuda_device_);
  RETURN_IF_ERROR(kernels::Synchronize(ctx));  // queued readers first
  RETURN_IF_ERROR(kernels::CopyToDevice(params_.data(), values.data(),
                                        values.size(), ctx));
  return kernels::Synchronize(ctx);
}

absl::Status DlrmModel::CheckContext(const kernels::ExecContext& ctx,
                                     const char* op) const {
  if (ctx.device == device_ &&
      (device_ == kernels::Device::kCpu || ctx.cuda_device == cuda_device_)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "DlrmModel::", op, ": the model lives on ",
      kernels::DeviceName(device_, cuda_device_), " but the context is ",
      kernels::DeviceName(ctx.device, ctx.cuda_device)));
}

absl::Status DlrmModel::Reserve(int64_t batch) {
  if (batch <= capacity_) return absl::OkStatus();
  RETURN_IF_ERROR(dense_in_.Resize(Floats(batch, config_.num_dense)));
  const size_t pooled = Floats(
      batch, static_cast<int64_t>(config_.num_sparse) * config_.embedding_dim);
  RETURN_IF_ERROR(pooled_in_.Resize(pooled));
  RETURN_IF_ERROR(interaction_.Resize(Floats(batch, interaction_width_)));
  RETURN_IF_ERROR(grad_interaction_.Resize(Floats(batch, interaction_width_)));
  for (size_t l = 0; l < layers_.size(); ++l) {
    RETURN_IF_ERROR(act_[l].Resize(Floats(batch, layers_[l].out)));
    RETURN_IF_ERROR(grad_act_[l].Resize(Floats(batch, layers_[l].out)));
  }
  if (device_ != kernels::Device::kCpu) {
    // The CPU path writes d loss / d pooled straight to the caller's buffer.
    RETURN_IF_ERROR(grad_pooled_.Resize(pooled));
  }
  capacity_ = batch;
  return absl::OkStatus();
}

const float* DlrmModel::LayerInput(size_t l) const {
  if (l == 0) return dense_in_.data();
  if (l == num_bottom_) return interaction_.data();
  return act_[l - 1].data();
}

absl::Status DlrmModel::LinearForward(size_t l,
                                      const kernels::ExecContext& ctx) {
  const Layer& layer = layers_[l];
  // y = x W^T, then y += b and ReLU in place.
  kernels::GemmArgs g;
  g.trans_b = true;
  g.m = batch_;
  g.n = layer.out;
  g.k = layer.in;
  g.a = LayerInput(l);
  g.lda = layer.in;
  g.b = params_.data() + layer.weight_offset;
  g.ldb = layer.in;
  g.c = act_[l].data();
  g.ldc = layer.out;
  RETURN_IF_ERROR(kernels::Gemm(g, ctx));
  kernels::BiasActivationForwardArgs b;
  b.y = act_[l].data();
  b.bias = params_.data() + layer.bias_offset;
  b.batch = batch_;
  b.n = layer.out;
  b.relu = layer.relu;
  return kernels::BiasActivationForward(b, ctx);
}

absl::Status DlrmModel::LinearBackward(size_t l, float* grad_x,
                                       const kernels::ExecContext& ctx) {
  const Layer& layer = layers_[l];
  float* dy = grad_act_[l].data();
  kernels::BiasActivationBackwardArgs b;
  b.y = act_[l].data();
  b.dy = dy;
  b.grad_bias = grads_.data() + layer.bias_offset;
  b.batch = batch_;
  b.n = layer.out;
  b.relu = layer.relu;
  RETURN_IF_ERROR(kernels::BiasActivationBackward(b, ctx));
  // grad_W [out x in] = dy^T x; beta = 0 overwrites (k = batch = 0 too).
  kernels::GemmArgs gw;
  gw.trans_a = true;
  gw.m = layer.out;
  gw.n = layer.in;
  gw.k = batch_;
  gw.a = dy;
  gw.lda = layer.out;
  gw.b = LayerInput(l);
  gw.ldb = layer.in;
  gw.c = grads_.data() + layer.weight_offset;
  gw.ldc = layer.in;
  RETURN_IF_ERROR(kernels::Gemm(gw, ctx));
  if (grad_x == nullptr) return absl::OkStatus();
  // grad_x [batch x in] = dy W.
  kernels::GemmArgs gx;
  gx.m = batch_;
  gx.n = layer.in;
  gx.k = layer.out;
  gx.a = dy;
  gx.lda = layer.out;
  gx.b = params_.data() + layer.weight_offset;
  gx.ldb = layer.in;
  gx.c = grad_x;
  gx.ldc = layer.in;
  return kernels::Gemm(gx, ctx);
}

absl::Status DlrmModel::ForwardLayers(const kernels::ExecContext& ctx) {
  for (size_t l = 0; l < num_bottom_; ++l) {
    RETURN_IF_ERROR(LinearForward(l, ctx));
  }
  kernels::DotInteractionForwardArgs ia;
  ia.batch = batch_;
  ia.num_sparse = config_.num_sparse;
  ia.dim = config_.embedding_dim;
  ia.dense = act_[num_bottom_ - 1].data();
  ia.sparse = pooled_in_.data();
  ia.output = interaction_.data();
  RETURN_IF_ERROR(kernels::DotInteractionForward(ia, ctx));
  for (size_t l = num_bottom_; l < layers_.size(); ++l) {
    RETURN_IF_ERROR(LinearForward(l, ctx));
  }
  return absl::OkStatus();
}

absl::Status DlrmModel::LoadInputs(int64_t batch, const float* dense,
                                   const float* pooled,
                                   const kernels::ExecContext& ctx,
                                   bool pooled_in_place) {
  batch_ = -1;  // a failed Forward leaves nothing for Backward
  RETURN_IF_ERROR(CheckContext(ctx, "Forward"));
  if (batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DlrmModel::Forward: negative batch ", batch));
  }
  if (batch > 0 && (dense == nullptr || (pooled == nullptr && !pooled_in_place))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmModel::Forward: ", dense == nullptr ? "dense" : "pooled",
        " is null (batch=", batch, ")"));
  }
  RETURN_IF_ERROR(Reserve(batch));
  // Copies, so Backward does not depend on the caller's buffers (which may
  // be refilled, or be grad_pooled itself, before Backward runs).
  RETURN_IF_ERROR(kernels::CopyToDevice(
      dense_in_.data(), dense, Floats(batch, config_.num_dense), ctx));
  if (!pooled_in_place) {
    RETURN_IF_ERROR(kernels::CopyToDevice(
        pooled_in_.data(), pooled,
        Floats(batch,
               static_cast<int64_t>(config_.num_sparse) * config_.embedding_dim),
        ctx));
  }
  batch_ = batch;
  return absl::OkStatus();
}

absl::Status DlrmModel::ForwardToHost(int64_t batch, float* logits,
                                      const kernels::ExecContext& ctx) {
  absl::Status status = ForwardLayers(ctx);
  // The last layer has width 1: its output is the logits vector.
  if (status.ok()) {
    status = kernels::CopyToHost(logits, act_.back().data(),
                                 static_cast<size_t>(batch), ctx);
  }
  if (status.ok()) status = kernels::Synchronize(ctx);
  if (!status.ok()) batch_ = -1;
  return status;
}

absl::Status DlrmModel::Forward(int64_t batch, const float* dense,
                                const float* pooled, float* logits,
                                const kernels::ExecContext& ctx) {
  if (batch > 0 && logits == nullptr) {
    batch_ = -1;
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmModel::Forward: logits is null (batch=", batch, ")"));
  }
  RETURN_IF_ERROR(LoadInputs(batch, dense, pooled, ctx));
  return ForwardToHost(batch, logits, ctx);
}

absl::StatusOr<float*> DlrmModel::PooledInput(int64_t batch) {
  batch_ = -1;
  if (batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DlrmModel::PooledInput: negative batch ", batch));
  }
  RETURN_IF_ERROR(Reserve(batch));
  return pooled_in_.data();
}

absl::Status DlrmModel::ForwardPooledInPlace(int64_t batch, const float* dense,
                                             float* logits,
                                             const kernels::ExecContext& ctx) {
  if (batch > capacity_) {
    batch_ = -1;
    return absl::FailedPreconditionError(absl::StrCat(
        "DlrmModel::ForwardPooledInPlace: batch ", batch, " is larger than "
        "the PooledInput reserved (", capacity_, ")"));
  }
  if (batch > 0 && logits == nullptr) {
    batch_ = -1;
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmModel::ForwardPooledInPlace: logits is null (batch=", batch, ")"));
  }
  RETURN_IF_ERROR(LoadInputs(batch, dense, nullptr, ctx, /*pooled_in_place=*/true));
  return ForwardToHost(batch, logits, ctx);
}

absl::StatusOr<const float*> DlrmModel::BackwardToDevice(
    const float* grad_logits, const kernels::ExecContext& ctx) {
  if (batch_ < 0) {
    return absl::FailedPreconditionError(
        "DlrmModel::BackwardToDevice: no successful Forward to differentiate");
  }
  RETURN_IF_ERROR(CheckContext(ctx, "BackwardToDevice"));
  if (batch_ > 0 && grad_logits == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmModel::BackwardToDevice: grad_logits is null (batch=", batch_, ")"));
  }
  RETURN_IF_ERROR(grad_pooled_.Resize(
      Floats(capacity_,
             static_cast<int64_t>(config_.num_sparse) * config_.embedding_dim)));
  RETURN_IF_ERROR(kernels::CopyToDevice(grad_act_.back().data(), grad_logits,
                                        static_cast<size_t>(batch_), ctx));
  RETURN_IF_ERROR(BackwardLayers(grad_pooled_.data(), ctx));
  return static_cast<const float*>(grad_pooled_.data());
}

absl::Status DlrmModel::BackwardLayers(float* grad_pooled,
                                       const kernels::ExecContext& ctx) {
  for (size_t l = layers_.size(); l-- > num_bottom_;) {
    float* grad_x =
        l == num_bottom_ ? grad_interaction_.data() : grad_act_[l - 1].data();
    RETURN_IF_ERROR(LinearBackward(l, grad_x, ctx));
  }
  kernels::DotInteractionBackwardArgs ia;
  ia.batch = batch_;
  ia.num_sparse = config_.num_sparse;
  ia.dim = config_.embedding_dim;
  ia.dense = act_[num_bottom_ - 1].data();
  ia.sparse = pooled_in_.data();
  ia.grad_output = grad_interaction_.data();
  ia.grad_dense = grad_act_[num_bottom_ - 1].data();
  ia.grad_sparse = grad_pooled;
  RETURN_IF_ERROR(kernels::DotInteractionBackward(ia, ctx));
  for (size_t l = num_bottom_; l-- > 0;) {
    // The dense features are data: no gradient for them.
    RETURN_IF_ERROR(
        LinearBackward(l, l == 0 ? nullptr : grad_act_[l - 1].data(), ctx));
  }
  return absl::OkStatus();
}

absl::Status DlrmModel::Backward(const float* grad_logits, float* grad_pooled,
                                 const kernels::ExecContext& ctx) {
  if (batch_ < 0) {
    return absl::FailedPreconditionError(
        "DlrmModel::Backward: no successful Forward to differentiate");
  }
  RETURN_IF_ERROR(CheckContext(ctx, "Backward"));
  if (batch_ > 0 && (grad_logits == nullptr || grad_pooled == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmModel::Backward: ",
        grad_logits == nullptr ? "grad_logits" : "grad_pooled",
        " is null (batch=", batch_, ")"));
  }
  RETURN_IF_ERROR(kernels::CopyToDevice(grad_act_.back().data(), grad_logits,
                                        static_cast<size_t>(batch_), ctx));
  if (device_ == kernels::Device::kCpu) return BackwardLayers(grad_pooled, ctx);
  RETURN_IF_ERROR(BackwardLayers(grad_pooled_.data(), ctx));
  RETURN_IF_ERROR(kernels::CopyToHost(
      grad_pooled, grad_pooled_.data(),
      Floats(batch_,
             static_cast<int64_t>(config_.num_sparse) * config_.embedding_dim),
      ctx));
  return kernels::Synchronize(ctx);
}

absl::StatusOr<float> DlrmTrainStep(DlrmModel& model, int64_t batch,
                                    const float* dense, const float* pooled,
                                    const float* labels, float* grad_pooled,
                                    float* logits_out,
                                    const kernels::ExecContext& ctx) {
  if (batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("DlrmTrainStep: batch must be >= 1, got ", batch));
  }
  if (labels == nullptr) {
    return absl::InvalidArgumentError("DlrmTrainStep: labels is null");
  }
  if (grad_pooled == nullptr) {
    return absl::InvalidArgumentError("DlrmTrainStep: grad_pooled is null");
  }
  const size_t n = static_cast<size_t>(batch);
  RETURN_IF_ERROR(model.LoadInputs(batch, dense, pooled, ctx));
  absl::Status status = model.ForwardLayers(ctx);
  // Everything from here to the copies back runs on the device: the loss
  // reads the logits in place (the last layer's output).
  const float* device_labels = labels;
  if (status.ok() && model.device_ != kernels::Device::kCpu) {
    status = model.labels_.Resize(n);
    if (status.ok()) {
      status = kernels::CopyToDevice(model.labels_.data(), labels, n, ctx);
    }
    device_labels = model.labels_.data();
  }
  float loss = 0.0f;
  if (status.ok()) {
    kernels::SigmoidBceArgs la;
    la.n = batch;
    la.logits = model.act_.back().data();
    la.labels = device_labels;
    la.loss = model.device_ == kernels::Device::kCpu ? &loss
                                                      : model.loss_.data();
    la.grad_logits = model.grad_act_.back().data();
    status = kernels::SigmoidBce(la, ctx);
  }
  if (status.ok()) {
    status = model.BackwardLayers(model.device_ == kernels::Device::kCpu
                                      ? grad_pooled
                                      : model.grad_pooled_.data(),
                                  ctx);
  }
  if (!status.ok()) {
    model.batch_ = -1;
    return status;
  }
  if (model.device_ != kernels::Device::kCpu) {
    RETURN_IF_ERROR(kernels::CopyToHost(
        grad_pooled, model.grad_pooled_.data(),
        Floats(batch, static_cast<int64_t>(model.config_.num_sparse) *
                          model.config_.embedding_dim),
        ctx));
    RETURN_IF_ERROR(kernels::CopyToHost(&loss, model.loss_.data(), 1, ctx));
  }
  if (logits_out != nullptr) {
    RETURN_IF_ERROR(
        kernels::CopyToHost(logits_out, model.act_.back().data(), n, ctx));
  }
  RETURN_IF_ERROR(kernels::Synchronize(ctx));
  return loss;
}

}  // namespace recps::worker
