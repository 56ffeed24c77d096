// CUDA fused optimizer update of embedding rows (embedding_optimizer.h).
//
// A group of threads (a power of two, up to a warp) per updated row; each
// thread owns 16-byte chunks of the row's weights and their state, and
// applies the rules of optimizer.h element by element. The row's scalar
// state (row-wise Adagrad's sum, Adam's step count) is read by every lane of
// the group and written back by its first lane. 16-bit rows: each thread
// widens its weights, applies the fp32 rules and rounds them back once
// (common/half.h, the same functions as the CPU), so SGD stays bit-identical
// to the CPU.
//
// Out-of-range row indices and negative gradient indices are skipped on the
// device (the CPU rejects the former; neither can check grad_indices' upper
// bound, which the arguments do not carry).
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/status_macros.h"
#include "kernels/cuda_util.cuh"
#include "kernels/embedding_optimizer.h"

namespace recps::kernels {
namespace {

struct FusedParams {
  float* rows;
  int64_t num_rows;
  int64_t row_stride;
  int64_t state_offset;  // words from a row's start to its fp32 state
  bool stochastic;       // 16-bit weights: stochastic rounding
  int dim;
  const int64_t* row_indices;
  int64_t num_updates;
  const float* grads;
  const int64_t* grad_indices;  // null: update i uses gradient row i
  OptimizerParams opt;
};

// Weights kVec at a time: fp32 as they are, 16-bit widened on load and
// rounded on store (to nearest even, or stochastically by column).
template <RowPrecision kPrecision, int kVec>
__device__ __forceinline__ void LoadWeights(const float* row, int c,
                                            float (&v)[kVec]) {
  if constexpr (kPrecision == RowPrecision::kFp32) {
    LoadFloats<kVec>(row + c, v);
  } else {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(row) + c;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      v[i] = kPrecision == RowPrecision::kFp16 ? HalfToFloat(h[i])
                                               : Bf16ToFloat(h[i]);
    }
  }
}

template <RowPrecision kPrecision, int kVec>
__device__ __forceinline__ void StoreWeights(float* row, int c,
                                             const float (&v)[kVec],
                                             bool stochastic) {
  if constexpr (kPrecision == RowPrecision::kFp32) {
    StoreFloats<kVec>(row + c, v);
  } else {
    constexpr bool kFp16 = kPrecision == RowPrecision::kFp16;
    uint16_t* h = reinterpret_cast<uint16_t*>(row) + c;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      h[i] = stochastic ? RoundStochastic<kFp16>(v[i], c + i)
                        : (kFp16 ? FloatToHalf(v[i]) : FloatToBf16(v[i]));
    }
  }
}

template <OptimizerKind kKind, RowPrecision kPrecision, int kVec>
__global__ void __launch_bounds__(kBlockThreads)
    FusedUpdateKernel(FusedParams p, int group_threads) {
  const int warp_lane = threadIdx.x % kWarpSize;
  const int lane = warp_lane % group_threads;
  const int64_t groups_per_warp = kWarpSize / group_threads;
  const int64_t warp =
      (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / kWarpSize;
  const int64_t num_warps = int64_t{gridDim.x} * blockDim.x / kWarpSize;
  const int dim = p.dim;
  // The loop is uniform across the warp so that every lane reaches the
  // shuffles and __syncwarp below, active or not.
  for (int64_t base = warp * groups_per_warp; base < p.num_updates;
       base += num_warps * groups_per_warp) {
    const int64_t u = base + warp_lane / group_threads;
    int64_t row = -1;
    int64_t grad_row = u;
    if (u < p.num_updates) {
      row = p.row_indices[u];
      if (p.grad_indices != nullptr) grad_row = p.grad_indices[u];
      if (row >= p.num_rows || grad_row < 0) row = -1;
    }
    const bool active = row >= 0;
    float* w = active ? p.rows + row * p.row_stride : nullptr;  // the row
    float* state = active ? w + p.state_offset : nullptr;
    const float* g = active ? p.grads + grad_row * dim : nullptr;

    if constexpr (kKind == OptimizerKind::kSgd) {
      if (!active) continue;
      for (int c = lane * kVec; c < dim; c += group_threads * kVec) {
        float wv[kVec], gv[kVec];
        LoadWeights<kPrecision, kVec>(w, c, wv);
        LoadFloats<kVec>(g + c, gv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) SgdRule(wv[i], gv[i], p.opt);
        StoreWeights<kPrecision, kVec>(w, c, wv, p.stochastic);
      }
    } else if constexpr (kKind == OptimizerKind::kAdagrad) {
      if (!active) continue;
      float* s = state;
      for (int c = lane * kVec; c < dim; c += group_threads * kVec) {
        float wv[kVec], sv[kVec], gv[kVec];
        LoadWeights<kPrecision, kVec>(w, c, wv);
        LoadFloats<kVec>(s + c, sv);
        LoadFloats<kVec>(g + c, gv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) AdagradRule(wv[i], sv[i], gv[i], p.opt);
        StoreWeights<kPrecision, kVec>(w, c, wv, p.stochastic);
        StoreFloats<kVec>(s + c, sv);
      }
    } else if constexpr (kKind == OptimizerKind::kRowWiseAdagrad) {
      // s += mean_j (g_j + wd * w_j)^2, reduced over the group.
      float sum_sq = 0.0f;
      float s_old = 0.0f;
      if (active) {
        s_old = state[0];
        for (int c = lane * kVec; c < dim; c += group_threads * kVec) {
          float wv[kVec], gv[kVec];
          LoadWeights<kPrecision, kVec>(w, c, wv);
          LoadFloats<kVec>(g + c, gv);
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            const float gi = gv[i] + p.opt.weight_decay * wv[i];
            sum_sq += gi * gi;
          }
        }
      }
      sum_sq = GroupSum(sum_sq, group_threads);
      __syncwarp();  // every lane has read s_old before lane 0 replaces it
      if (!active) continue;
      const float s_new = s_old + sum_sq / static_cast<float>(dim);
      if (lane == 0) state[0] = s_new;
      const float multiplier = p.opt.learning_rate / (sqrtf(s_new) + p.opt.eps);
      for (int c = lane * kVec; c < dim; c += group_threads * kVec) {
        float wv[kVec], gv[kVec];
        LoadWeights<kPrecision, kVec>(w, c, wv);
        LoadFloats<kVec>(g + c, gv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          RowWiseAdagradRule(wv[i], gv[i], multiplier, p.opt);
        }
        StoreWeights<kPrecision, kVec>(w, c, wv, p.stochastic);
      }
    } else if constexpr (IsAdam(kKind)) {  // m, v, then the step count's bits
      uint32_t t = 0;
      uint32_t* step =
          active ? reinterpret_cast<uint32_t*>(state + 2 * dim) : nullptr;
      if (active) t = *step + 1;  // incremented before use
      __syncwarp();  // every lane has read the count before lane 0 writes
      if (!active) continue;
      if (lane == 0) *step = t;
      const AdamScale scale = ComputeAdamScale(p.opt, t);
      constexpr bool kDecoupled = kKind == OptimizerKind::kAdamW;
      float* m = state;
      float* v = state + dim;
      for (int c = lane * kVec; c < dim; c += group_threads * kVec) {
        float wv[kVec], mv[kVec], vv[kVec], gv[kVec];
        LoadWeights<kPrecision, kVec>(w, c, wv);
        LoadFloats<kVec>(m + c, mv);
        LoadFloats<kVec>(v + c, vv);
        LoadFloats<kVec>(g + c, gv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          AdamRule(wv[i], mv[i], vv[i], gv[i], p.opt, scale, kDecoupled);
        }
        StoreWeights<kPrecision, kVec>(w, c, wv, p.stochastic);
        StoreFloats<kVec>(m + c, mv);
        StoreFloats<kVec>(v + c, vv);
      }
    } else {
      static_assert(kUnhandledOptimizer<kKind>, "FusedUpdateKernel: add the kind's rule");
    }
  }
}

template <OptimizerKind kKind, RowPrecision kPrecision>
absl::Status Launch(const FusedParams& p, bool vec4, cudaStream_t stream) {
  const int vec = vec4 ? 4 : 1;
  const int group_threads = ThreadsPerRow(p.dim / vec);
  const unsigned blocks =
      GridBlocks(p.num_updates, kBlockThreads / group_threads);
  if (vec4) {
    FusedUpdateKernel<kKind, kPrecision, 4>
        <<<blocks, kBlockThreads, 0, stream>>>(p, group_threads);
  } else {
    FusedUpdateKernel<kKind, kPrecision, 1>
        <<<blocks, kBlockThreads, 0, stream>>>(p, group_threads);
  }
  RETURN_IF_LAUNCH_ERROR("FusedUpdateKernel");
  return absl::OkStatus();
}

template <RowPrecision kPrecision>
absl::Status LaunchKind(const FusedParams& p, bool vec4, cudaStream_t stream) {
  return VisitOptimizer(
      p.opt.kind,
      [&](auto kind) {
        return Launch<decltype(kind)::kKind, kPrecision>(p, vec4, stream);
      },
      [&] {
        return absl::InvalidArgumentError(absl::StrCat(
            "FusedOptimizerUpdateCuda: unknown optimizer kind ",
            static_cast<int>(p.opt.kind)));
      });
}

}  // namespace

absl::Status FusedOptimizerUpdateCuda(const FusedUpdateArgs& args,
                                      const ExecContext& ctx) {
  const char* op = "FusedOptimizerUpdateCuda";
  RETURN_IF_ERROR(ValidateOptimizerParams(args.optimizer));
  if (args.dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dim must be >= 1, got ", args.dim));
  }
  if (args.num_rows < 0 || args.num_updates < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": negative size (num_rows ", args.num_rows,
                     ", num_updates ", args.num_updates, ")"));
  }
  if (args.precision != RowPrecision::kFp32 &&
      args.precision != RowPrecision::kFp16 &&
      args.precision != RowPrecision::kBf16) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": unknown row precision ", static_cast<int>(args.precision)));
  }
  const OptimizerKind kind = args.optimizer.kind;
  const int64_t state_offset = FusedRowStateOffset(args.dim, args.precision);
  const int64_t min_stride = state_offset + FusedRowStateWidth(kind, args.dim);
  if (args.row_stride < min_stride) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": row_stride ", args.row_stride, " cannot hold dim ", args.dim,
        " ", RowPrecisionName(args.precision), " weights plus ",
        OptimizerName(kind), " state (", min_stride, " words)"));
  }
  if (args.num_updates == 0) return absl::OkStatus();
  if (args.rows == nullptr || args.row_indices == nullptr ||
      args.grads == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": rows, row_indices or grads is null"));
  }

  FusedParams p;
  p.rows = args.rows;
  p.num_rows = args.num_rows;
  p.row_stride = args.row_stride;
  p.state_offset = state_offset;
  p.stochastic = args.stochastic_rounding;
  p.dim = args.dim;
  p.row_indices = args.row_indices;
  p.num_updates = args.num_updates;
  p.grads = args.grads;
  p.grad_indices = args.grad_indices;
  p.opt = args.optimizer;
  // float4 needs dim, the stride, the state's offset and both bases 16-byte
  // aligned; the state arrays then start aligned too (at multiples of dim
  // past the state's offset).
  const bool vec4 = args.dim % 4 == 0 && args.row_stride % 4 == 0 &&
                    state_offset % 4 == 0 && Aligned16(args.rows) &&
                    Aligned16(args.grads);
  const cudaStream_t stream = StreamOf(ctx);
  switch (args.precision) {
    case RowPrecision::kFp32:
      return LaunchKind<RowPrecision::kFp32>(p, vec4, stream);
    case RowPrecision::kFp16:
      return LaunchKind<RowPrecision::kFp16>(p, vec4, stream);
    case RowPrecision::kBf16:
      return LaunchKind<RowPrecision::kBf16>(p, vec4, stream);
  }
  return absl::OkStatus();  // unreachable: checked above
}

}  // namespace recps::kernels
