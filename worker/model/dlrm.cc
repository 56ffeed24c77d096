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
    const DlrmConfig& config) {
  RETURN_IF_ERROR(ValidateDlrmConfig(config));
  std::unique_ptr<DlrmModel> model(new DlrmModel(config));
  model->InitParameters();
  return model;
}

DlrmModel::DlrmModel(const DlrmConfig& config) : config_(config) {
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
  params_.assign(static_cast<size_t>(offset), 0.0f);
  grads_.assign(static_cast<size_t>(offset), 0.0f);
  act_.resize(layers_.size());
  grad_act_.resize(layers_.size());
}

void DlrmModel::InitParameters() {
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
    float* w = params_.data() + layer.weight_offset;
    for (int64_t row = 0; row < layer.out; ++row) {
      InitRow(weight_init, config_.seed, weight_key, row,
              static_cast<int>(layer.in), w + row * layer.in);
    }
    RowInit bias_init = weight_init;
    bias_init.b = static_cast<float>(std::sqrt(1.0 / layer.out));
    InitRow(bias_init, config_.seed, StableNameKey(absl::StrCat(name, ".bias")),
            /*id=*/0, static_cast<int>(layer.out),
            params_.data() + layer.bias_offset);
  }
}

void DlrmModel::Reserve(int64_t batch) {
  if (batch <= capacity_) return;
  dense_in_.resize(Floats(batch, config_.num_dense));
  pooled_in_.resize(
      Floats(batch, static_cast<int64_t>(config_.num_sparse) *
                        config_.embedding_dim));
  interaction_.resize(Floats(batch, interaction_width_));
  grad_interaction_.resize(Floats(batch, interaction_width_));
  for (size_t l = 0; l < layers_.size(); ++l) {
    act_[l].resize(Floats(batch, layers_[l].out));
    grad_act_[l].resize(Floats(batch, layers_[l].out));
  }
  capacity_ = batch;
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

absl::Status DlrmModel::Forward(int64_t batch, const float* dense,
                                const float* pooled, float* logits,
                                const kernels::ExecContext& ctx) {
  batch_ = -1;  // a failed Forward leaves nothing for Backward
  if (batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DlrmModel::Forward: negative batch ", batch));
  }
  if (batch > 0 &&
      (dense == nullptr || pooled == nullptr || logits == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmModel::Forward: ",
        dense == nullptr ? "dense" : pooled == nullptr ? "pooled" : "logits",
        " is null (batch=", batch, ")"));
  }
  Reserve(batch);
  // Copies, so Backward does not depend on the caller's buffers (which may
  // be refilled, or be grad_pooled itself, before Backward runs).
  std::copy(dense, dense + Floats(batch, config_.num_dense),
            dense_in_.begin());
  std::copy(pooled,
            pooled + Floats(batch, static_cast<int64_t>(config_.num_sparse) *
                                       config_.embedding_dim),
            pooled_in_.begin());
  batch_ = batch;
  const absl::Status status = ForwardLayers(ctx);
  if (!status.ok()) {
    batch_ = -1;
    return status;
  }
  // The last layer has width 1: its output is the logits vector.
  std::copy(act_.back().begin(), act_.back().begin() + batch, logits);
  return absl::OkStatus();
}

absl::Status DlrmModel::Backward(const float* grad_logits, float* grad_pooled,
                                 const kernels::ExecContext& ctx) {
  if (batch_ < 0) {
    return absl::FailedPreconditionError(
        "DlrmModel::Backward: no successful Forward to differentiate");
  }
  if (batch_ > 0 && (grad_logits == nullptr || grad_pooled == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DlrmModel::Backward: ",
        grad_logits == nullptr ? "grad_logits" : "grad_pooled",
        " is null (batch=", batch_, ")"));
  }
  std::copy(grad_logits, grad_logits + batch_, grad_act_.back().begin());
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
  // Grow-only scratch, like the activations.
  if (model.logits_.size() < static_cast<size_t>(batch)) {
    model.logits_.resize(static_cast<size_t>(batch));
    model.grad_logits_.resize(static_cast<size_t>(batch));
  }
  RETURN_IF_ERROR(
      model.Forward(batch, dense, pooled, model.logits_.data(), ctx));
  float loss = 0.0f;
  kernels::SigmoidBceArgs la;
  la.n = batch;
  la.logits = model.logits_.data();
  la.labels = labels;
  la.loss = &loss;
  la.grad_logits = model.grad_logits_.data();
  RETURN_IF_ERROR(kernels::SigmoidBce(la, ctx));
  RETURN_IF_ERROR(model.Backward(model.grad_logits_.data(), grad_pooled, ctx));
  if (logits_out != nullptr) {
    std::copy(model.logits_.begin(), model.logits_.begin() + batch, logits_out);
  }
  return loss;
}

}  // namespace recps::worker
