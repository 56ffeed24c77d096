// CUDA embedding-bag forward and backward (contracts in embedding_bag.h).
//
// Forward: a group of threads (a power of two, up to a warp) per output row
// (a bag, or a position for kNone); each thread owns 16-byte chunks of the
// row and accumulates its bag's rows in position order, as the CPU does.
//
// Backward: positions are grouped by row with a stable radix sort of
// (row, position), so every stored row then sums its contributions in
// increasing position order: deterministic, no float atomics.
//
// The device never reports errors: out-of-range indices are skipped (they
// still count towards a mean's bag size), and malformed offsets are clamped
// so that they cannot read or write out of bounds.
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda_util.cuh"
#include "kernels/embedding_bag.h"

namespace recps::kernels {
namespace {

struct ForwardParams {
  const void* rows;
  int64_t num_rows;
  int64_t row_stride;
  int dim;
  const int64_t* indices;
  int64_t num_indices;
  const int64_t* offsets;  // null for kNone: output row g is position g
  int64_t num_groups;      // output rows
  const float* per_sample_weights;
  bool mean;
  float* output;
};

// Positions [lo, hi) of output row g, clamped to [0, num_indices).
__device__ __forceinline__ void GroupRange(const int64_t* offsets,
                                           int64_t num_indices, int64_t g,
                                           int64_t* lo, int64_t* hi) {
  if (offsets == nullptr) {
    *lo = g;
    *hi = g + 1;
    return;
  }
  *lo = min(max(offsets[g], int64_t{0}), num_indices);
  *hi = min(max(offsets[g + 1], *lo), num_indices);
}

template <typename Row, int kVec>
__global__ void __launch_bounds__(kBlockThreads)
    ForwardKernel(ForwardParams p, int group_threads) {
  const Row* rows = static_cast<const Row*>(p.rows);
  const int lane = threadIdx.x % group_threads;
  const int64_t groups_per_block = blockDim.x / group_threads;
  const int chunks = p.dim / kVec;  // kVec > 1 only when it divides dim
  for (int64_t g = blockIdx.x * groups_per_block + threadIdx.x / group_threads;
       g < p.num_groups; g += gridDim.x * groups_per_block) {
    int64_t lo, hi;
    GroupRange(p.offsets, p.num_indices, g, &lo, &hi);
    float* out = p.output + g * p.dim;
    for (int c = lane; c < chunks; c += group_threads) {
      float acc[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
      bool first = true;
      for (int64_t pos = lo; pos < hi; ++pos) {
        const int64_t row = p.indices[pos];
        if (row < 0 || row >= p.num_rows) continue;
        const float w =
            p.per_sample_weights != nullptr ? p.per_sample_weights[pos] : 1.0f;
        float v[kVec];
        LoadFloats<kVec>(rows + row * p.row_stride + c * kVec, v);
        // The CPU's arithmetic: the first term stored, later ones added as
        // acc + w * v rounded twice (--fmad=false).
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          acc[i] = first ? w * v[i] : acc[i] + w * v[i];
        }
        first = false;
      }
      if (p.mean && hi > lo) {
        const float n = static_cast<float>(hi - lo);
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] /= n;
      }
      StoreFloats<kVec>(out + c * kVec, acc);
    }
  }
}

template <typename Row, int kVec>
absl::Status LaunchForward(const ForwardParams& p, cudaStream_t stream) {
  const int group_threads = ThreadsPerRow(p.dim / kVec);
  const int64_t groups_per_block = kBlockThreads / group_threads;
  ForwardKernel<Row, kVec>
      <<<GridBlocks(p.num_groups, static_cast<int>(groups_per_block)),
         kBlockThreads, 0, stream>>>(p, group_threads);
  RETURN_IF_LAUNCH_ERROR("EmbeddingBagForward kernel");
  return absl::OkStatus();
}

// Checks shared by forward and backward. `out_rows` receives the number of
// rows of the (forward) output.
absl::Status CheckJagged(const char* op, int dim, const int64_t* indices,
                         int64_t num_indices, const int64_t* offsets,
                         int64_t num_bags, const float* per_sample_weights,
                         PoolingMode pooling, int64_t* out_rows) {
  if (dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dim must be >= 1, got ", dim));
  }
  if (num_indices < 0 || num_bags < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": negative size (num_indices ", num_indices,
                     ", num_bags ", num_bags, ")"));
  }
  if (pooling != PoolingMode::kSum && pooling != PoolingMode::kMean &&
      pooling != PoolingMode::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": unknown pooling mode ", static_cast<int>(pooling)));
  }
  if (pooling == PoolingMode::kMean && per_sample_weights != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op,
                     ": per_sample_weights are not supported with mean "
                     "pooling"));
  }
  if (num_indices > 0 && indices == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": indices is null"));
  }
  if (pooling == PoolingMode::kNone) {
    *out_rows = num_indices;
    return absl::OkStatus();
  }
  // Offsets live on the device; only what the sizes alone imply is checked.
  if (offsets == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": offsets is null (required for sum/mean pooling)"));
  }
  if (num_bags == 0 && num_indices > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", num_indices,
                     " indices but no bags (offsets[num_bags] must equal "
                     "num_indices)"));
  }
  *out_rows = num_bags;
  return absl::OkStatus();
}

// ---------------------------------------------------------------- backward

// Sort input for each position: key = its row (num_rows, which sorts last
// and is never read, for a skipped position), value = the position; and the
// gradient row and scale of its contribution.
template <typename IndexT>
__global__ void __launch_bounds__(kBlockThreads)
    PrepareSortKernel(const int64_t* indices, int64_t num_indices,
                      const int64_t* offsets, int64_t num_bags,
                      const float* per_sample_weights, bool mean,
                      int64_t num_rows, IndexT* keys, IndexT* positions,
                      int64_t* source_row, float* scale) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
       p < num_indices; p += int64_t{gridDim.x} * blockDim.x) {
    int64_t bag = p;
    float s = per_sample_weights != nullptr ? per_sample_weights[p] : 1.0f;
    if (offsets != nullptr) {
      // The last bag b with offsets[b] <= p (empty bags are passed over).
      int64_t lo = 0, hi = num_bags;  // answer in [lo - 1, hi)
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (offsets[mid] <= p) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      bag = lo - 1;
      if (bag >= 0 && p >= offsets[bag + 1]) bag = -1;  // malformed offsets
      if (bag >= 0 && mean) {
        s = 1.0f / static_cast<float>(offsets[bag + 1] - offsets[bag]);
      }
      source_row[p] = bag;
    }
    const int64_t row = indices[p];
    const bool valid = bag >= 0 && row >= 0 && row < num_rows;
    keys[p] = static_cast<IndexT>(valid ? row : num_rows);
    positions[p] = static_cast<IndexT>(p);
    scale[p] = s;
  }
}

// First i in [0, n) with keys[i] >= key, or n.
template <typename IndexT>
__device__ __forceinline__ int64_t LowerBound(const IndexT* keys, int64_t n,
                                              int64_t key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(keys[mid]) < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <typename IndexT, int kVec>
__global__ void __launch_bounds__(kBlockThreads)
    AccumulateKernel(const float* grad_output, int dim,
                     const IndexT* sorted_rows, const IndexT* sorted_positions,
                     int64_t num_indices, const int64_t* source_row,
                     const float* scale, int64_t num_rows, float* grad_rows,
                     int group_threads) {
  const int lane = threadIdx.x % group_threads;
  const int64_t groups_per_block = blockDim.x / group_threads;
  const int chunks = dim / kVec;
  for (int64_t r = blockIdx.x * groups_per_block + threadIdx.x / group_threads;
       r < num_rows; r += gridDim.x * groups_per_block) {
    // Entries of row r; within it positions increase (the sort is stable).
    const int64_t begin = LowerBound(sorted_rows, num_indices, r);
    const int64_t end = LowerBound(sorted_rows, num_indices, r + 1);
    for (int c = lane; c < chunks; c += group_threads) {
      float acc[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
      for (int64_t e = begin; e < end; ++e) {
        const int64_t pos = static_cast<int64_t>(sorted_positions[e]);
        const int64_t src = source_row != nullptr ? source_row[pos] : pos;
        const float s = scale[pos];
        float v[kVec];
        LoadFloats<kVec>(grad_output + src * dim + c * kVec, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          acc[i] = e == begin ? s * v[i] : acc[i] + s * v[i];
        }
      }
      StoreFloats<kVec>(grad_rows + r * dim + c * kVec, acc);
    }
  }
}

template <typename IndexT>
absl::Status BackwardSorted(const EmbeddingBagBackwardArgs& a,
                            cudaStream_t stream) {
  const int64_t n = a.num_indices;
  const bool pooled = a.pooling != PoolingMode::kNone;
  // Keys are in [0, num_rows]: sort only the bits that can be set.
  int end_bit = 1;
  while (end_bit < static_cast<int>(sizeof(IndexT) * 8) &&
         (static_cast<uint64_t>(a.num_rows) >> end_bit) != 0) {
    ++end_bit;
  }
  size_t sort_bytes = 0;
  RETURN_IF_CUDA_ERROR(
      cub::DeviceRadixSort::SortPairs(
          nullptr, sort_bytes, static_cast<const IndexT*>(nullptr),
          static_cast<IndexT*>(nullptr), static_cast<const IndexT*>(nullptr),
          static_cast<IndexT*>(nullptr), n, 0, end_bit, stream),
      "cub::DeviceRadixSort::SortPairs (size query)");

  ScratchLayout layout;
  const size_t keys_in = layout.Add(n * sizeof(IndexT));
  const size_t keys_out = layout.Add(n * sizeof(IndexT));
  const size_t pos_in = layout.Add(n * sizeof(IndexT));
  const size_t pos_out = layout.Add(n * sizeof(IndexT));
  const size_t source = layout.Add(pooled ? n * sizeof(int64_t) : 0);
  const size_t scale = layout.Add(n * sizeof(float));
  const size_t sort_temp = layout.Add(sort_bytes);
  StreamBuffer scratch(stream);
  RETURN_IF_ERROR(
      scratch.Allocate(layout.total(), "EmbeddingBagBackward scratch"));
  char* base = scratch.get<char>();
  auto at = [base](size_t offset) { return base + offset; };
  IndexT* d_keys_in = reinterpret_cast<IndexT*>(at(keys_in));
  IndexT* d_keys_out = reinterpret_cast<IndexT*>(at(keys_out));
  IndexT* d_pos_in = reinterpret_cast<IndexT*>(at(pos_in));
  IndexT* d_pos_out = reinterpret_cast<IndexT*>(at(pos_out));
  int64_t* d_source = pooled ? reinterpret_cast<int64_t*>(at(source)) : nullptr;
  float* d_scale = reinterpret_cast<float*>(at(scale));

  PrepareSortKernel<IndexT><<<GridBlocks(n), kBlockThreads, 0, stream>>>(
      a.indices, n, pooled ? a.offsets : nullptr, a.num_bags,
      a.per_sample_weights, a.pooling == PoolingMode::kMean, a.num_rows,
      d_keys_in, d_pos_in, d_source, d_scale);
  RETURN_IF_LAUNCH_ERROR("EmbeddingBagBackward PrepareSortKernel");

  RETURN_IF_CUDA_ERROR(cub::DeviceRadixSort::SortPairs(
                           at(sort_temp), sort_bytes, d_keys_in, d_keys_out,
                           d_pos_in, d_pos_out, n, 0, end_bit, stream),
                       "cub::DeviceRadixSort::SortPairs");

  const bool vec4 =
      a.dim % 4 == 0 && Aligned16(a.grad_output) && Aligned16(a.grad_rows);
  const int vec = vec4 ? 4 : 1;
  const int group_threads = ThreadsPerRow(a.dim / vec);
  const unsigned blocks = GridBlocks(a.num_rows, kBlockThreads / group_threads);
  if (vec4) {
    AccumulateKernel<IndexT, 4><<<blocks, kBlockThreads, 0, stream>>>(
        a.grad_output, a.dim, d_keys_out, d_pos_out, n, d_source, d_scale,
        a.num_rows, a.grad_rows, group_threads);
  } else {
    AccumulateKernel<IndexT, 1><<<blocks, kBlockThreads, 0, stream>>>(
        a.grad_output, a.dim, d_keys_out, d_pos_out, n, d_source, d_scale,
        a.num_rows, a.grad_rows, group_threads);
  }
  RETURN_IF_LAUNCH_ERROR("EmbeddingBagBackward AccumulateKernel");
  return absl::OkStatus();  // scratch is released in stream order
}

}  // namespace

absl::Status EmbeddingBagForwardCuda(const EmbeddingBagForwardArgs& args,
                                     const ExecContext& ctx) {
  const char* op = "EmbeddingBagForwardCuda";
  int64_t out_rows = 0;
  RETURN_IF_ERROR(CheckJagged(
      op, args.dim, args.indices, args.num_indices, args.offsets, args.num_bags,
      args.per_sample_weights, args.pooling, &out_rows));
  if (args.num_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": num_rows must be >= 0, got ", args.num_rows));
  }
  if (args.output_stride != 0 && args.output_stride != args.dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": output_stride ", args.output_stride, " (only 0 or dim on CUDA)"));
  }
  if (args.row_stride < args.dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": row_stride ", args.row_stride, " is less than dim ", args.dim));
  }
  if (args.dtype != RowDType::kFloat32 && args.dtype != RowDType::kFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": unknown row dtype ", static_cast<int>(args.dtype)));
  }
  if (args.num_rows > 0 && args.rows == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": rows is null"));
  }
  if (out_rows > 0 && args.output == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": output is null"));
  }
  if (out_rows == 0) return absl::OkStatus();

  const bool pooled = args.pooling != PoolingMode::kNone;
  const ForwardParams p{args.rows,
                        args.num_rows,
                        args.row_stride,
                        args.dim,
                        args.indices,
                        args.num_indices,
                        pooled ? args.offsets : nullptr,
                        out_rows,
                        args.per_sample_weights,
                        args.pooling == PoolingMode::kMean,
                        args.output};
  const cudaStream_t stream = StreamOf(ctx);
  // A 16-byte vector needs every row start, chunk and output row aligned.
  const bool aligned = Aligned16(args.rows) && Aligned16(args.output);
  if (args.dtype == RowDType::kFloat32) {
    if (aligned && args.dim % 4 == 0 && args.row_stride % 4 == 0) {
      return LaunchForward<float, 4>(p, stream);
    }
    return LaunchForward<float, 1>(p, stream);
  }
  if (aligned && args.dim % 8 == 0 && args.row_stride % 8 == 0) {
    return LaunchForward<uint16_t, 8>(p, stream);
  }
  return LaunchForward<uint16_t, 1>(p, stream);
}

absl::Status EmbeddingBagBackwardCuda(const EmbeddingBagBackwardArgs& args,
                                      const ExecContext& ctx) {
  const char* op = "EmbeddingBagBackwardCuda";
  int64_t out_rows = 0;
  RETURN_IF_ERROR(CheckJagged(
      op, args.dim, args.indices, args.num_indices, args.offsets, args.num_bags,
      args.per_sample_weights, args.pooling, &out_rows));
  if (args.num_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": num_rows must be >= 0, got ", args.num_rows));
  }
  if ((args.grad_output_stride != 0 && args.grad_output_stride != args.dim) ||
      args.accumulate) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": grad_output_stride ", args.grad_output_stride, " and accumulate ",
        args.accumulate ? "true" : "false", " (only 0 or dim, and false, on CUDA)"));
  }
  if (args.num_indices > 0 && args.grad_output == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": grad_output is null"));
  }
  if (args.num_rows > 0 && args.grad_rows == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": grad_rows is null"));
  }
  if (args.num_rows == 0) return absl::OkStatus();

  const cudaStream_t stream = StreamOf(ctx);
  if (args.num_indices == 0) {
    RETURN_IF_CUDA_ERROR(
        cudaMemsetAsync(args.grad_rows, 0,
                        sizeof(float) * args.num_rows * args.dim, stream),
        "cudaMemsetAsync of grad_rows");
    return absl::OkStatus();
  }
  // 32-bit sort keys and positions halve the sort's traffic when they fit
  // (the key num_rows marks skipped positions).
  constexpr int64_t kMax32 = std::numeric_limits<uint32_t>::max();
  if (args.num_rows < kMax32 && args.num_indices <= kMax32) {
    return BackwardSorted<uint32_t>(args, stream);
  }
  return BackwardSorted<uint64_t>(args, stream);
}

}  // namespace recps::kernels
