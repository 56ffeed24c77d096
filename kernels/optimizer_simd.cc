// Fused embedding-row and dense optimizer loops, built once per ISA (see
// cmake/RecpsIsa.cmake). The update rules come from optimizer.h; these loops
// are written so the compiler vectorises them over the row (restrict
// pointers, no FMA contraction, -fno-math-errno for sqrt).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/half.h"
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

// One row of kind K: fp32 weights `w`, its state `state` (laid out as the
// kind's registry entry says), gradient `g`.
template <OptimizerKind K>
void UpdateRow(float* __restrict w, float* __restrict state,
               const float* __restrict g, int dim, const OptimizerParams& p) {
  if constexpr (K == OptimizerKind::kSgd) {
    SgdRow(w, g, dim, p);
  } else if constexpr (K == OptimizerKind::kAdagrad) {
    AdagradRow(w, state, g, dim, p);
  } else if constexpr (K == OptimizerKind::kRowWiseAdagrad) {
    RowWiseAdagradRow(w, state, g, dim, p);
  } else if constexpr (IsAdam(K)) {  // m, v, then the step count's bits
    uint32_t step;
    std::memcpy(&step, state + 2 * dim, sizeof(step));
    ++step;
    std::memcpy(state + 2 * dim, &step, sizeof(step));
    AdamRow(w, state, state + dim, g, dim, p, ComputeAdamScale(p, step),
            K == OptimizerKind::kAdamW);
  } else {
    static_assert(kUnhandledOptimizer<K>, "UpdateRow: add the kind's rule");
  }
}

// 16-bit weights <-> fp32: exact widening, round-to-nearest-even narrowing.
// F16C where the build has it (every ISA but the portable one), bit-identical
// to common/half.h's scalar conversions for every value but NaN payloads.
void WidenFp16(const uint16_t* __restrict src, int n, float* __restrict out) {
  int j = 0;
#if defined(__F16C__)
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i*>(src + j))));
  }
#endif
  for (; j < n; ++j) out[j] = HalfToFloat(src[j]);
}

void NarrowFp16(const float* __restrict w, int n, uint16_t* __restrict out) {
  int j = 0;
#if defined(__F16C__)
  for (; j + 8 <= n; j += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(w + j),
                                     _MM_FROUND_TO_NEAREST_INT |
                                         _MM_FROUND_NO_EXC));
  }
#endif
  for (; j < n; ++j) out[j] = FloatToHalf(w[j]);
}

// bf16 is the top half of a float: plain integer loops that vectorise.
void WidenBf16(const uint16_t* __restrict src, int n, float* __restrict out) {
  for (int j = 0; j < n; ++j) out[j] = Bf16ToFloat(src[j]);
}

void NarrowBf16(const float* __restrict w, int n, uint16_t* __restrict out) {
  // FloatToBf16 without its branch, so that it vectorises.
  for (int j = 0; j < n; ++j) {
    uint32_t x;
    std::memcpy(&x, &w[j], sizeof(x));
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t nan = (x >> 16) | 0x40u;
    out[j] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan
                                                                    : rounded);
  }
}

// Stochastic rounding: common/half.h RoundStochastic.
void NarrowStochastic(bool fp16, const float* w, int n, uint16_t* out) {
  if (fp16) {
    for (int j = 0; j < n; ++j) out[j] = RoundStochastic<true>(w[j], j);
  } else {
    for (int j = 0; j < n; ++j) out[j] = RoundStochastic<false>(w[j], j);
  }
}

// The 16-bit twin of the fp32 loop below: each row's weights are widened
// into `w`, updated by the same row functions as fp32 weights, and rounded
// back once.
template <OptimizerKind K>
void FusedUpdateRange16(const FusedUpdateArgs& a, int64_t begin, int64_t end) {
  const OptimizerParams& p = a.optimizer;
  const int dim = a.dim;
  const bool fp16 = a.precision == RowPrecision::kFp16;
  const int64_t state_offset = FusedRowStateOffset(dim, a.precision);
  const int64_t touched_bytes =
      (state_offset + FusedRowStateWidth(p.kind, dim)) *
      static_cast<int64_t>(sizeof(float));
  std::vector<float> scratch(dim);  // once per range, not per row
  float* const w = scratch.data();
  for (int64_t i = begin; i < end; ++i) {
    if (i + kPrefetchDistance < end) {
      PrefetchRowForWrite(
          a.rows + a.row_indices[i + kPrefetchDistance] * a.row_stride,
          touched_bytes);
    }
    float* row = a.rows + a.row_indices[i] * a.row_stride;
    uint16_t* weights = reinterpret_cast<uint16_t*>(row);
    float* state = row + state_offset;
    const float* g = a.grads + (a.grad_indices ? a.grad_indices[i] : i) * dim;
    if (fp16) {
      WidenFp16(weights, dim, w);
    } else {
      WidenBf16(weights, dim, w);
    }
    UpdateRow<K>(w, state, g, dim, p);
    if (a.stochastic_rounding) {
      NarrowStochastic(fp16, w, dim, weights);
    } else if (fp16) {
      NarrowFp16(w, dim, weights);
    } else {
      NarrowBf16(w, dim, weights);
    }
  }
}

template <OptimizerKind K>
void FusedUpdateRange32(const FusedUpdateArgs& a, int64_t begin, int64_t end) {
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
    UpdateRow<K>(row, row + dim, g, dim, p);
  }
}

// Elements [begin, end) of a dense tensor of kind K (with a dense form).
template <OptimizerKind K>
void DenseRange(const DenseOptimizerArgs& a, AdamScale scale, int64_t begin,
                int64_t end) {
  const OptimizerParams& p = a.optimizer;
  const int64_t n = end - begin;
  float* w = a.weights + begin;
  const float* g = a.grads + begin;
  // Chunks of at most 2^30 elements keep the row loops' int counters valid.
  for (int64_t off = 0; off < n; off += (1 << 30)) {
    const int len = static_cast<int>(std::min<int64_t>(n - off, 1 << 30));
    if constexpr (K == OptimizerKind::kSgd) {
      SgdRow(w + off, g + off, len, p);
    } else if constexpr (K == OptimizerKind::kAdagrad) {
      AdagradRow(w + off, a.state + begin + off, g + off, len, p);
    } else if constexpr (IsAdam(K)) {
      AdamRow(w + off, a.state + begin + off, a.state + a.n + begin + off,
              g + off, len, p, scale, K == OptimizerKind::kAdamW);
    }
    // Others (row-wise Adagrad) have no dense form: refused by the caller.
  }
}

}  // namespace

void FusedUpdateRange(const FusedUpdateArgs& a, int64_t begin, int64_t end) {
  const bool fp32 = a.precision == RowPrecision::kFp32;
  VisitOptimizer(
      a.optimizer.kind,
      [&](auto kind) {
        constexpr OptimizerKind K = decltype(kind)::kKind;
        if (fp32) {
          FusedUpdateRange32<K>(a, begin, end);
        } else {
          FusedUpdateRange16<K>(a, begin, end);
        }
      },
      [] {});  // validated by the caller
}

void DenseOptimizerRange(const DenseOptimizerArgs& a, AdamScale scale,
                         int64_t begin, int64_t end) {
  VisitOptimizer(
      a.optimizer.kind,
      [&](auto kind) { DenseRange<decltype(kind)::kKind>(a, scale, begin, end); },
      [] {});  // validated by the caller
}

}  // namespace recps::kernels::RECPS_ISA_NS
