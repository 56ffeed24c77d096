// The update rules of the registered optimizers (kinds, names and
// hyper-parameters: common/optimizer_registry.h), written once and used by
// the fused embedding-row update and the dense optimizer, on CPU and CUDA,
// through one dispatch (VisitOptimizer). Each rule is one element (or one
// row's scalar part) of the update.
//
// Formulas (g: gradient, w: weight, t: 1-based step count of this row or
// tensor, lr/eps/b1/b2/wd: OptimizerParams):
//   SGD (torch.optim.SGD, no momentum):
//     g += wd * w;  w -= lr * g
//   Adagrad (torch.optim.Adagrad, lr_decay 0, initial accumulator 0):
//     g += wd * w;  s += g * g;  w -= lr * g / (sqrt(s) + eps)
//   Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD, L2 weight decay):
//     g_j += wd * w_j;  s += mean_j(g_j * g_j);
//     w_j -= (lr / (sqrt(s) + eps)) * g_j          -- one s per row
//   Adam (torch.optim.Adam, L2 weight decay):
//     g += wd * w;  m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g;
//     w -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//   AdamW (torch.optim.AdamW, decoupled weight decay):
//     w *= 1 - lr * wd;  then Adam's update with wd = 0.
#ifndef RECPS_KERNELS_OPTIMIZER_H_
#define RECPS_KERNELS_OPTIMIZER_H_

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "common/host_device.h"
#include "common/optimizer_registry.h"

namespace recps::kernels {

// A kind as a type: what VisitOptimizer hands its function.
template <OptimizerKind K>
struct OptimizerConstant {
  static constexpr OptimizerKind kKind = K;
};

// The one switch over the kinds in the kernels: returns
// f(OptimizerConstant<kind>()), so that each loop or CUDA kernel is
// compiled per kind (its rule chosen with `if constexpr`), or unknown()
// for a value no kind has (callers validate first:
// ValidateOptimizerParams). A new kind needs its case here.
template <typename F, typename Unknown>
auto VisitOptimizer(OptimizerKind kind, F&& f, Unknown&& unknown)
    -> decltype(f(OptimizerConstant<OptimizerKind::kSgd>())) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return f(OptimizerConstant<OptimizerKind::kSgd>());
    case OptimizerKind::kAdagrad:
      return f(OptimizerConstant<OptimizerKind::kAdagrad>());
    case OptimizerKind::kRowWiseAdagrad:
      return f(OptimizerConstant<OptimizerKind::kRowWiseAdagrad>());
    case OptimizerKind::kAdam:
      return f(OptimizerConstant<OptimizerKind::kAdam>());
    case OptimizerKind::kAdamW:
      return f(OptimizerConstant<OptimizerKind::kAdamW>());
  }
  return unknown();
}

// Adam and AdamW share a rule (decoupled weight decay for AdamW).
RECPS_HOST_DEVICE constexpr bool IsAdam(OptimizerKind kind) {
  return kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW;
}

// For a static_assert in the last branch of an `if constexpr` chain over
// the kinds: false, but only once instantiated with a kind.
template <OptimizerKind K>
inline constexpr bool kUnhandledOptimizer = false;

// Bias-correction factors for Adam at 1-based step t, computed once per row.
struct AdamScale {
  float step_size;   // lr / (1 - b1^t)
  float sqrt_bc2;    // sqrt(1 - b2^t)
};

RECPS_HOST_DEVICE inline AdamScale ComputeAdamScale(const OptimizerParams& p,
                                                    uint32_t t) {
  const double bc1 = 1.0 - pow(static_cast<double>(p.beta1), t);
  const double bc2 = 1.0 - pow(static_cast<double>(p.beta2), t);
  return {static_cast<float>(p.learning_rate / bc1),
          static_cast<float>(sqrt(bc2))};
}

RECPS_HOST_DEVICE inline void SgdRule(float& w, float g,
                                      const OptimizerParams& p) {
  g += p.weight_decay * w;
  w -= p.learning_rate * g;
}

RECPS_HOST_DEVICE inline void AdagradRule(float& w, float& s, float g,
                                          const OptimizerParams& p) {
  g += p.weight_decay * w;
  s += g * g;
  w -= p.learning_rate * g / (sqrtf(s) + p.eps);
}

// Row-wise Adagrad: `multiplier` = lr / (sqrt(s_new) + eps) for the row.
RECPS_HOST_DEVICE inline void RowWiseAdagradRule(float& w, float g,
                                                 float multiplier,
                                                 const OptimizerParams& p) {
  g += p.weight_decay * w;
  w -= multiplier * g;
}

// Adam and AdamW (decoupled = true). `scale` from ComputeAdamScale.
RECPS_HOST_DEVICE inline void AdamRule(float& w, float& m, float& v, float g,
                                       const OptimizerParams& p,
                                       AdamScale scale, bool decoupled) {
  if (decoupled) {
    w *= 1.0f - p.learning_rate * p.weight_decay;
  } else {
    g += p.weight_decay * w;
  }
  m = p.beta1 * m + (1.0f - p.beta1) * g;
  v = p.beta2 * v + (1.0f - p.beta2) * g * g;
  w -= scale.step_size * (m / (sqrtf(v) / scale.sqrt_bc2 + p.eps));
}

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_OPTIMIZER_H_
