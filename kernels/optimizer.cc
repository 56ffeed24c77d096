#include "kernels/optimizer.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

#include "kernels/dense_optimizer.h"
#include "kernels/embedding_optimizer.h"

namespace recps::kernels {

const char* OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdagrad:
      return "adagrad";
    case OptimizerKind::kRowWiseAdagrad:
      return "rowwise_adagrad";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
  }
  return "unknown";
}

absl::Status ValidateOptimizerParams(const OptimizerParams& p) {
  auto bad = [&](const char* field, float value, const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat(
        OptimizerName(p.kind), " ", field, " is ", value, "; ", rule));
  };
  switch (p.kind) {
    case OptimizerKind::kSgd:
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kRowWiseAdagrad:
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown optimizer kind ", static_cast<int>(p.kind)));
  }
  if (!std::isfinite(p.learning_rate) || p.learning_rate < 0) {
    return bad("learning_rate", p.learning_rate, "it must be finite and >= 0");
  }
  if (!std::isfinite(p.weight_decay) || p.weight_decay < 0) {
    return bad("weight_decay", p.weight_decay, "it must be finite and >= 0");
  }
  if (!std::isfinite(p.eps) || p.eps <= 0) {
    return bad("eps", p.eps, "it must be finite and > 0");
  }
  if (!(p.beta1 >= 0 && p.beta1 < 1)) return bad("beta1", p.beta1, "it must be in [0, 1)");
  if (!(p.beta2 >= 0 && p.beta2 < 1)) return bad("beta2", p.beta2, "it must be in [0, 1)");
  return absl::OkStatus();
}

int64_t FusedRowStateWidth(OptimizerKind kind, int dim) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kAdagrad:
      return dim;
    case OptimizerKind::kRowWiseAdagrad:
      return 1;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return 2 * static_cast<int64_t>(dim) + 1;
  }
  return 0;
}

int64_t FusedRowStride(OptimizerKind kind, int dim) {
  const int64_t used = dim + FusedRowStateWidth(kind, dim);
  return (used + 3) / 4 * 4;
}

void InitFusedRowState(OptimizerKind kind, int dim, float* row) {
  // Zero floats and a zero uint32 step count have the same bits.
  std::memset(row + dim, 0, sizeof(float) * FusedRowStateWidth(kind, dim));
}

int64_t DenseOptimizerStateSize(OptimizerKind kind, int64_t n) {
  switch (kind) {
    case OptimizerKind::kSgd:
    case OptimizerKind::kRowWiseAdagrad:
      return 0;
    case OptimizerKind::kAdagrad:
      return n;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return 2 * n;
  }
  return 0;
}

}  // namespace recps::kernels
