// CUDA fused optimizer update of embedding rows (embedding_optimizer.h).
//
// A group of threads (a power of two, up to a warp) per updated row; each
// thread owns 16-byte chunks of the row's weights and their state, and
// applies the rules of optimizer.h element by element. The row's scalar
// state (row-wise Adagrad's sum, Adam's step count) is read by every lane of
// the group and written back by its first lane.
//
// Out-of-range row indices and negative gradient indices are skipped on the
// device (the CPU rejects the former; neither can check grad_indices' upper
// bound, which the arguments do not carry).
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda_util.cuh"
#include "kernels/embedding_optimizer.h"

namespace recps::kernels {
namespace {

struct FusedParams {
  float* rows;
  int64_t num_rows;
  int64_t row_stride;
  int dim;
  const int64_t* row_indices;
  int64_t num_updates;
  const float* grads;
  const int64_t* grad_indices;  // null: update i uses gradient row i
  OptimizerParams opt;
};

template <OptimizerKind kKind, int kVec>
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
    float* w = active ? p.rows + row * p.row_stride : nullptr;
    const float* g = active ? p.grads + grad_row * dim : nullptr;

    if constexpr (kKind == OptimizerKind::kSgd) {
      if (!active) continue;
      for (int c = lane * kVec; c < dim; c += group_threads * kVec) {
        float wv[kVec], gv[kVec];
        LoadFloats<kVec>(w + c, wv);
        LoadFloats<kVec>(g + c, gv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) SgdRule(wv[i], gv[i], p.opt);
        StoreFloats<kVec>(w + c, wv);
      }
    } else if constexpr (kKind == OptimizerKind::kAdagrad) {
      if (!active) continue;
      float* s = w + dim;
      for (int c = lane * kVec; c < dim; c += group_threads * kVec) {
        float wv[kVec], sv[kVec], gv[kVec];
        LoadFloats<kVec>(w + c, wv);
        LoadFloats<kVec>(s + c, sv);
        LoadFloats<kVec>(g + c, gv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) AdagradRule(wv[i], sv[i], gv[i], p.opt);
        StoreFloats<kVec>(w + c, wv);
        StoreFloats<kVec>(s + c, sv);
      }
    } else if constexpr (kKind == OptimizerKind::kRowWiseAdagrad) {
      // s += mean_j (g_j + wd * w_j)^2, reduced over the group.
      float sum_sq = 0.0f;
      float s_old = 0.0f;
      if (active) {
        s_old = w[dim];
        for (int c = lane * kVec; c < dim; c += group_threads * kVec) {
          float wv[kVec], gv[kVec];
          LoadFloats<kVec>(w + c, wv);
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
      if (lane == 0) w[dim] = s_new;
      const float multiplier = p.opt.learning_rate / (sqrtf(s_new) + p.opt.eps);
      for (int c = lane * kVec; c < dim; c += group_threads * kVec) {
        float wv[kVec], gv[kVec];
        LoadFloats<kVec>(w + c, wv);
        LoadFloats<kVec>(g + c, gv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          RowWiseAdagradRule(wv[i], gv[i], multiplier, p.opt);
        }
        StoreFloats<kVec>(w + c, wv);
      }
    } else {  // Adam, AdamW: m, v, then the step count's bits
      uint32_t t = 0;
      uint32_t* step =
          active ? reinterpret_cast<uint32_t*>(w + 3 * dim) : nullptr;
      if (active) t = *step + 1;  // incremented before use
      __syncwarp();  // every lane has read the count before lane 0 writes
      if (!active) continue;
      if (lane == 0) *step = t;
      const AdamScale scale = ComputeAdamScale(p.opt, t);
      constexpr bool kDecoupled = kKind == OptimizerKind::kAdamW;
      float* m = w + dim;
      float* v = w + 2 * dim;
      for (int c = lane * kVec; c < dim; c += group_threads * kVec) {
        float wv[kVec], mv[kVec], vv[kVec], gv[kVec];
        LoadFloats<kVec>(w + c, wv);
        LoadFloats<kVec>(m + c, mv);
        LoadFloats<kVec>(v + c, vv);
        LoadFloats<kVec>(g + c, gv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          AdamRule(wv[i], mv[i], vv[i], gv[i], p.opt, scale, kDecoupled);
        }
        StoreFloats<kVec>(w + c, wv);
        StoreFloats<kVec>(m + c, mv);
        StoreFloats<kVec>(v + c, vv);
      }
    }
  }
}

template <OptimizerKind kKind>
absl::Status Launch(const FusedParams& p, bool vec4, cudaStream_t stream) {
  const int vec = vec4 ? 4 : 1;
  const int group_threads = ThreadsPerRow(p.dim / vec);
  const unsigned blocks =
      GridBlocks(p.num_updates, kBlockThreads / group_threads);
  if (vec4) {
    FusedUpdateKernel<kKind, 4>
        <<<blocks, kBlockThreads, 0, stream>>>(p, group_threads);
  } else {
    FusedUpdateKernel<kKind, 1>
        <<<blocks, kBlockThreads, 0, stream>>>(p, group_threads);
  }
  RETURN_IF_LAUNCH_ERROR("FusedUpdateKernel");
  return absl::OkStatus();
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
  if (args.precision != RowPrecision::kFp32) {
    // The device store refuses 16-bit tables at start; this is the backstop.
    return absl::FailedPreconditionError(absl::StrCat(
        op, ": ", RowPrecisionName(args.precision),
        " rows are served by the host store only"));
  }
  const OptimizerKind kind = args.optimizer.kind;
  const int64_t min_stride = args.dim + FusedRowStateWidth(kind, args.dim);
  if (args.row_stride < min_stride) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": row_stride ", args.row_stride, " is less than dim + ",
        OptimizerName(kind), " state = ", min_stride));
  }
  if (args.num_updates == 0) return absl::OkStatus();
  if (args.rows == nullptr || args.row_indices == nullptr ||
      args.grads == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": rows, row_indices or grads is null"));
  }

  const FusedParams p{args.rows,  args.num_rows,     args.row_stride,
                      args.dim,   args.row_indices,  args.num_updates,
                      args.grads, args.grad_indices, args.optimizer};
  // float4 needs dim, the stride and both bases 16-byte aligned; the state
  // arrays then start aligned too (they sit at multiples of dim).
  const bool vec4 = args.dim % 4 == 0 && args.row_stride % 4 == 0 &&
                    Aligned16(args.rows) && Aligned16(args.grads);
  const cudaStream_t stream = StreamOf(ctx);
  switch (kind) {
    case OptimizerKind::kSgd:
      return Launch<OptimizerKind::kSgd>(p, vec4, stream);
    case OptimizerKind::kAdagrad:
      return Launch<OptimizerKind::kAdagrad>(p, vec4, stream);
    case OptimizerKind::kRowWiseAdagrad:
      return Launch<OptimizerKind::kRowWiseAdagrad>(p, vec4, stream);
    case OptimizerKind::kAdam:
      return Launch<OptimizerKind::kAdam>(p, vec4, stream);
    case OptimizerKind::kAdamW:
      return Launch<OptimizerKind::kAdamW>(p, vec4, stream);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": unknown optimizer kind ", static_cast<int>(kind)));
}

}  // namespace recps::kernels
