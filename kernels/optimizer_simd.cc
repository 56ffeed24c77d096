// Fused embedding-row and dense optimizer loops, built once per ISA (see
// cmake/RecpsIsa.cmake). The update rules come from optimizer.h; these loops
// are written so the compiler vectorises them over the row (restrict
// pointers, no FMA contraction, -fno-math-errno for sqrt).
#include <algorithm>
#include <cstring>

#include "kernels/optimizer_internal.h"
#include "kernels/row_math_simd.h"

namespace recps::kernels::RECPS_ISA_NS {
namespace {

constexpr int64_t kPrefetchDistance = 8;

void SgdRow(float* __restrict w, const float* __restrict g, int dim,
            const OptimizerParams& p) {
  for (int j = 0; j < dim; ++j) SgdRule(w[j], g[j], p);
}

void AdagradRow(float* __restrict w, float* __restrict s,
                const float* __restrict g, int dim, const OptimizerParams& p) {
  for (int j = 0; j < dim; ++j) AdagradRule(w[j], s[j], g[j], p);
}

void RowWiseAdagradRow(float* __restrict w, float* __restrict s,
                       const float* __restrict g, int dim,
                       const OptimizerParams& p) {
  float lanes[kRowSumLanes] = {};
  int j = 0;
  for (; j + kRowSumLanes <= dim; j += kRowSumLanes) {
    for (int k = 0; k < kRowSumLanes; ++k) {
      const float gj = g[j + k] + p.weight_decay * w[j + k];
      lanes[k] += gj * gj;
    }
  }
  for (int k = 0; j + k < dim; ++k) {
    const float gj = g[j + k] + p.weight_decay * w[j + k];
    lanes[k] += gj * gj;
  }
  float sum = 0.0f;
  for (int k = 0; k < kRowSumLanes; ++k) sum += lanes[k];
  *s += sum / static_cast<float>(dim);
  const float multiplier = p.learning_rate / (sqrtf(*s) + p.eps);
  for (int k = 0; k < dim; ++k) RowWiseAdagradRule(w[k], g[k], multiplier, p);
}

void AdamRow(float* __restrict w, float* __restrict m, float* __restrict v,
             const float* __restrict g, int dim, const OptimizerParams& p,
             AdamScale scale, bool decoupled) {
  for (int j = 0; j < dim; ++j) AdamRule(w[j], m[j], v[j], g[j], p, scale, decoupled);
}

}  // namespace

void FusedUpdateRange(const FusedUpdateArgs& a, int64_t begin, int64_t end) {
  const OptimizerParams& p = a.optimizer;
  const int dim = a.dim;
  const int64_t touched_bytes =
      (dim + FusedRowStateWidth(p.kind, dim)) * static_cast<int64_t>(sizeof(float));
  for (int64_t i = begin; i < end; ++i) {
    if (i + kPrefetchDistance < end) {
      PrefetchRowForWrite(a.rows + a.row_indices[i + kPrefetchDistance] * a.row_stride,
                          touched_bytes);
    }
    float* row = a.rows + a.row_indices[i] * a.row_stride;
    const float* g = a.grads + (a.grad_indices ? a.grad_indices[i] : i) * dim;
    switch (p.kind) {
      case OptimizerKind::kSgd:
        SgdRow(row, g, dim, p);
        break;
      case OptimizerKind::kAdagrad:
        AdagradRow(row, row + dim, g, dim, p);
        break;
      case OptimizerKind::kRowWiseAdagrad:
        RowWiseAdagradRow(row, row + dim, g, dim, p);
        break;
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW: {
        uint32_t step;
        std::memcpy(&step, row + 3 * dim, sizeof(step));
        ++step;
        std::memcpy(row + 3 * dim, &step, sizeof(step));
        AdamRow(row, row + dim, row + 2 * dim, g, dim, p,
                ComputeAdamScale(p, step), p.kind == OptimizerKind::kAdamW);
        break;
      }
    }
  }
}

void DenseOptimizerRange(const DenseOptimizerArgs& a, AdamScale scale,
                         int64_t begin, int64_t end) {
  const OptimizerParams& p = a.optimizer;
  const int64_t n = end - begin;
  float* w = a.weights + begin;
  const float* g = a.grads + begin;
  // Chunks of at most 2^30 elements keep the row loops' int counters valid.
  for (int64_t off = 0; off < n; off += (1 << 30)) {
    const int len = static_cast<int>(std::min<int64_t>(n - off, 1 << 30));
    switch (p.kind) {
      case OptimizerKind::kSgd:
        SgdRow(w + off, g + off, len, p);
        break;
      case OptimizerKind::kAdagrad:
        AdagradRow(w + off, a.state + begin + off, g + off, len, p);
        break;
      case OptimizerKind::kRowWiseAdagrad:
        break;  // refused by the caller
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW:
        AdamRow(w + off, a.state + begin + off, a.state + a.n + begin + off,
                g + off, len, p, scale, p.kind == OptimizerKind::kAdamW);
        break;
    }
  }
}

}  // namespace recps::kernels::RECPS_ISA_NS
