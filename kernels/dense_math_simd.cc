// The per-sample loops of the dot interaction and of bias + ReLU, built once
// per ISA (cmake/RecpsIsa.cmake): plain C++ that the compiler vectorises at
// the ISA's width. The build forbids FMA contraction (-ffp-contract=off) and
// every loop keeps its operation order, so every ISA gives the same bits.
// Arguments arrive validated by interaction_cpu.cc and dense_layer_cpu.cc.
#include <algorithm>
#include <cstdint>

#include "kernels/dense_math_internal.h"

namespace recps::kernels::RECPS_ISA_NS {
namespace {

// Dot product with 8 independent partial sums combined in a fixed order:
// vectorises while staying the same on every machine.
float Dot(const float* __restrict a, const float* __restrict b, int dim) {
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int k = 0;
  for (; k + 8 <= dim; k += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[k + l] * b[k + l];
  }
  float tail = 0.0f;
  for (; k < dim; ++k) tail += a[k] * b[k];
  return (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) +
         tail;
}

// Position of pair (i, j), j < i, among the dot products of one row.
inline int64_t PairIndex(int i, int j) { return static_cast<int64_t>(i) * (i - 1) / 2 + j; }

}  // namespace

void DotInteractionForwardRange(const DotInteractionForwardArgs& a, int64_t lo, int64_t hi) {
  const int f = a.num_sparse;
  const int dim = a.dim;
  const int64_t width = DotInteractionOutputWidth(f, dim);
  for (int64_t s = lo; s < hi; ++s) {
    const float* dense = a.dense + s * dim;
    const float* sparse = a.sparse + s * f * dim;  // unused when f == 0
    // Row r of T: the dense vector, then the pooled embeddings.
    auto t_row = [&](int r) { return r == 0 ? dense : sparse + static_cast<int64_t>(r - 1) * dim; };
    float* out = a.output + s * width;
    std::copy(dense, dense + dim, out);
    float* dots = out + dim;
    for (int i = 1; i <= f; ++i) {
      const float* ti = t_row(i);
      for (int j = 0; j < i; ++j) *dots++ = Dot(ti, t_row(j), dim);
    }
  }
}

namespace {

// One sample's dL/dT: dL/dT_i = sum_{j != i} g_ij T_j (g symmetric), T_0
// also getting the gradient of its copy, j in increasing order. kDim > 0:
// the row's width known at compile time, so its sum stays in registers
// across the j loop (the generic loop loads and stores it for every j, 3x
// the memory operations of the multiply-adds); kDim == 0: any width. The
// same operations in the same order either way, so the same bits.
template <int kDim>
void DotBackwardSample(const DotInteractionBackwardArgs& a, int64_t s, int64_t width) {
  const int f = a.num_sparse;
  const int dim = kDim > 0 ? kDim : a.dim;
  const float* dense = a.dense + s * dim;
  const float* sparse = a.sparse + s * f * dim;
  float* grad_dense = a.grad_dense + s * dim;
  float* grad_sparse = a.grad_sparse + s * f * dim;
  auto t_row = [&](int r) { return r == 0 ? dense : sparse + static_cast<int64_t>(r - 1) * dim; };
  const float* g = a.grad_output + s * width;
  const float* g_dots = g + dim;
  for (int i = 0; i <= f; ++i) {
    float* __restrict gi = i == 0 ? grad_dense : grad_sparse + static_cast<int64_t>(i - 1) * dim;
    if constexpr (kDim > 0) {
      float acc[kDim];
      for (int k = 0; k < kDim; ++k) acc[k] = i == 0 ? g[k] : 0.0f;
      for (int j = 0; j <= f; ++j) {
        if (j == i) continue;
        const float w = g_dots[i > j ? PairIndex(i, j) : PairIndex(j, i)];
        const float* __restrict tj = t_row(j);
        for (int k = 0; k < kDim; ++k) acc[k] += w * tj[k];
      }
      std::copy(acc, acc + kDim, gi);
    } else {
      if (i == 0) {
        std::copy(g, g + dim, gi);
      } else {
        std::fill(gi, gi + dim, 0.0f);
      }
      for (int j = 0; j <= f; ++j) {
        if (j == i) continue;
        const float w = g_dots[i > j ? PairIndex(i, j) : PairIndex(j, i)];
        const float* __restrict tj = t_row(j);
        for (int k = 0; k < dim; ++k) gi[k] += w * tj[k];
      }
    }
  }
}

}  // namespace

void DotInteractionBackwardRange(const DotInteractionBackwardArgs& a, int64_t lo, int64_t hi) {
  const int64_t width = DotInteractionOutputWidth(a.num_sparse, a.dim);
  // The widths embeddings usually have.
  auto run = [&](auto sample) {
    for (int64_t s = lo; s < hi; ++s) sample(a, s, width);
  };
  switch (a.dim) {
    case 16:
      return run(DotBackwardSample<16>);
    case 32:
      return run(DotBackwardSample<32>);
    case 64:
      return run(DotBackwardSample<64>);
    case 128:
      return run(DotBackwardSample<128>);
    default:
      return run(DotBackwardSample<0>);
  }
}

void BiasActivationForwardRange(const BiasActivationForwardArgs& a, int64_t lo, int64_t hi) {
  const int64_t n = a.n;
  for (int64_t i = lo; i < hi; ++i) {
    float* __restrict y = a.y + i * n;
    const float* __restrict bias = a.bias;
    if (a.relu) {
      // `v < 0 ? 0 : v` keeps NaN (as PyTorch's relu does) and maps to a
      // vector max.
      for (int64_t j = 0; j < n; ++j) {
        const float v = y[j] + bias[j];
        y[j] = v < 0.0f ? 0.0f : v;
      }
    } else {
      for (int64_t j = 0; j < n; ++j) y[j] += bias[j];
    }
  }
}

void BiasActivationBackwardBlock(const BiasActivationBackwardArgs& a, int64_t lo, int64_t hi,
                                 float* __restrict sum) {
  const int64_t n = a.n;
  std::fill(sum, sum + n, 0.0f);
  for (int64_t i = lo; i < hi; ++i) {
    float* __restrict dy = a.dy + i * n;
    if (a.relu) {
      const float* __restrict y = a.y + i * n;
      for (int64_t j = 0; j < n; ++j) {
        const float d = y[j] > 0.0f ? dy[j] : 0.0f;
        dy[j] = d;
        sum[j] += d;
      }
    } else {
      for (int64_t j = 0; j < n; ++j) sum[j] += dy[j];
    }
  }
}

}  // namespace recps::kernels::RECPS_ISA_NS
