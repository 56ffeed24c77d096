// CUDA DLRM dot interaction (interaction.h): one block per sample.
//
// The sample's T = [dense; sparse] is staged in shared memory with an odd
// row stride (so threads reading different rows at one column hit different
// banks). Forward: one thread per pair, computing the dot product in the
// CPU's order. Backward: one thread per element of grad T, summing over the
// other rows in increasing order, as the CPU does. No atomics: both are
// deterministic and match the CPU bit for bit. Samples whose T does not
// fit in shared memory read it from global memory instead.
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda_util.cuh"
#include "kernels/interaction.h"

namespace recps::kernels {
namespace {

struct InteractionParams {
  int64_t batch;
  int num_sparse;
  int dim;
  const float* dense;
  const float* sparse;
  const float* grad_output;  // backward only
  float* output;             // forward: output; backward: grad_dense
  float* grad_sparse;        // backward only
};

// Shared-memory row stride: dim rounded up to an odd number.
__host__ __device__ inline int SmemStride(int dim) { return dim | 1; }

// Pair k of the output, ordered (1,0), (2,0), (2,1), (3,0), ...: returns i
// and sets j < i with k = i * (i - 1) / 2 + j.
__device__ inline int PairOf(int64_t k, int* j) {
  int64_t i = static_cast<int64_t>((1.0 + sqrt(1.0 + 8.0 * k)) / 2.0);
  while (i * (i - 1) / 2 > k) --i;  // guard against sqrt rounding
  while ((i + 1) * i / 2 <= k) ++i;
  *j = static_cast<int>(k - i * (i - 1) / 2);
  return static_cast<int>(i);
}

// The CPU's dot product, term for term: 8 strided partial sums, a tail,
// then a fixed tree, so both twins give the same bits.
__device__ inline float Dot(const float* a, const float* b, int dim) {
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int k = 0;
  for (; k + 8 <= dim; k += 8) {
#pragma unroll
    for (int l = 0; l < 8; ++l) acc[l] += a[k + l] * b[k + l];
  }
  float tail = 0.0f;
  for (; k < dim; ++k) tail += a[k] * b[k];
  return (((acc[0] + acc[4]) + (acc[1] + acc[5])) +
          ((acc[2] + acc[6]) + (acc[3] + acc[7]))) +
         tail;
}

__device__ inline int64_t PairIndex(int i, int j) {  // j < i
  return int64_t{i} * (i - 1) / 2 + j;
}

// Stages T of sample b in `t` (shared path); returns the base of row r.
template <bool kShared>
struct SampleRows {
  const float* t;  // shared copy (kShared)
  const float* dense;
  const float* sparse;
  int dim;
  __device__ const float* row(int r) const {
    if constexpr (kShared) {
      return t + r * SmemStride(dim);
    } else {
      return r == 0 ? dense : sparse + int64_t{r - 1} * dim;
    }
  }
};

template <bool kShared>
__device__ SampleRows<kShared> LoadSample(const InteractionParams& p, int64_t b,
                                          float* smem) {
  const float* dense = p.dense + b * p.dim;
  const float* sparse = p.sparse + b * p.num_sparse * int64_t{p.dim};
  if constexpr (kShared) {
    const int stride = SmemStride(p.dim);
    const int elems = (p.num_sparse + 1) * p.dim;
    for (int e = threadIdx.x; e < elems; e += blockDim.x) {
      const int r = e / p.dim;
      const int d = e % p.dim;
      smem[r * stride + d] = r == 0 ? dense[d] : sparse[e - p.dim];
    }
  }
  return {smem, dense, sparse, p.dim};
}

template <bool kShared>
__global__ void __launch_bounds__(kBlockThreads)
    ForwardKernel(InteractionParams p) {
  extern __shared__ float smem[];
  const int64_t pairs = int64_t{p.num_sparse + 1} * p.num_sparse / 2;
  const int64_t width = p.dim + pairs;
  for (int64_t b = blockIdx.x; b < p.batch; b += gridDim.x) {
    const SampleRows<kShared> t = LoadSample<kShared>(p, b, smem);
    float* out = p.output + b * width;
    for (int d = threadIdx.x; d < p.dim; d += blockDim.x) out[d] = t.dense[d];
    if constexpr (kShared) __syncthreads();
    for (int64_t k = threadIdx.x; k < pairs; k += blockDim.x) {
      int j;
      const int i = PairOf(k, &j);
      const float* ti = t.row(i);
      const float* tj = t.row(j);
      out[p.dim + k] = Dot(ti, tj, p.dim);
    }
    if constexpr (kShared) __syncthreads();  // before T is overwritten
  }
}

template <bool kShared>
__global__ void __launch_bounds__(kBlockThreads)
    BackwardKernel(InteractionParams p) {
  extern __shared__ float smem[];
  const int rows = p.num_sparse + 1;
  const int64_t pairs = int64_t{rows} * p.num_sparse / 2;
  const int64_t width = p.dim + pairs;
  // Shared path: pair gradients follow T in shared memory.
  float* smem_grad = smem + rows * SmemStride(p.dim);
  for (int64_t b = blockIdx.x; b < p.batch; b += gridDim.x) {
    const SampleRows<kShared> t = LoadSample<kShared>(p, b, smem);
    const float* grad_out = p.grad_output + b * width;
    const float* grad_pairs = grad_out + p.dim;
    if constexpr (kShared) {
      for (int64_t k = threadIdx.x; k < pairs; k += blockDim.x) {
        smem_grad[k] = grad_pairs[k];
      }
      grad_pairs = smem_grad;
      __syncthreads();
    }
    float* grad_dense = p.output + b * p.dim;
    float* grad_sparse = p.grad_sparse + b * p.num_sparse * int64_t{p.dim};
    for (int e = threadIdx.x; e < rows * p.dim; e += blockDim.x) {
      const int r = e / p.dim;
      const int d = e % p.dim;
      // d out / d T_r = sum over pairs with r of g_pair * T_other, in pair
      // order: (r, s) for s < r come before (s, r) for s > r.
      float acc = r == 0 ? grad_out[d] : 0.0f;
      for (int s = 0; s < rows; ++s) {
        if (s == r) continue;
        const int64_t k = s < r ? PairIndex(r, s) : PairIndex(s, r);
        acc += grad_pairs[k] * t.row(s)[d];
      }
      if (r == 0) {
        grad_dense[d] = acc;
      } else {
        grad_sparse[e - p.dim] = acc;
      }
    }
    if constexpr (kShared) __syncthreads();
  }
}

// Launches Kernel<true> when `smem_bytes` fit in a block's shared memory
// (opting in above the default 48 KiB where the device allows), else
// Kernel<false>.
absl::Status LaunchSample(void (*shared_kernel)(InteractionParams),
                          void (*global_kernel)(InteractionParams),
                          const InteractionParams& p, size_t smem_bytes,
                          cudaStream_t stream, const char* name) {
  constexpr size_t kDefaultSmem = 48 * 1024;
  bool use_shared = smem_bytes <= kDefaultSmem;
  if (!use_shared) {
    int device = 0;
    int max_optin = 0;
    RETURN_IF_CUDA_ERROR(cudaGetDevice(&device), "cudaGetDevice");
    RETURN_IF_CUDA_ERROR(
        cudaDeviceGetAttribute(&max_optin,
                               cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
    if (smem_bytes <= static_cast<size_t>(max_optin)) {
      RETURN_IF_CUDA_ERROR(
          cudaFuncSetAttribute(shared_kernel,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem_bytes)),
          "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
      use_shared = true;
    }
  }
  const unsigned blocks = GridBlocks(p.batch, 1);
  if (use_shared) {
    shared_kernel<<<blocks, kBlockThreads, smem_bytes, stream>>>(p);
  } else {
    global_kernel<<<blocks, kBlockThreads, 0, stream>>>(p);
  }
  RETURN_IF_CUDA_ERROR(cudaGetLastError(), name);
  return absl::OkStatus();
}

absl::Status CheckSizes(const char* op, int64_t batch, int num_sparse,
                        int dim) {
  if (batch < 0 || num_sparse < 0 || dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": need batch >= 0, num_sparse >= 0 and dim >= 1 (got ", batch,
        ", ", num_sparse, ", ", dim, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DotInteractionForwardCuda(const DotInteractionForwardArgs& args,
                                       const ExecContext& ctx) {
  const char* op = "DotInteractionForwardCuda";
  RETURN_IF_ERROR(CheckSizes(op, args.batch, args.num_sparse, args.dim));
  if (args.batch == 0) return absl::OkStatus();
  if (args.dense == nullptr || args.output == nullptr ||
      (args.num_sparse > 0 && args.sparse == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dense, sparse or output is null"));
  }
  const InteractionParams p{args.batch,  args.num_sparse, args.dim,
                            args.dense,  args.sparse,     nullptr,
                            args.output, nullptr};
  const size_t smem = sizeof(float) * (args.num_sparse + 1) *
                      static_cast<size_t>(SmemStride(args.dim));
  return LaunchSample(ForwardKernel<true>, ForwardKernel<false>, p, smem,
                      StreamOf(ctx), "launch of interaction ForwardKernel");
}

absl::Status DotInteractionBackwardCuda(const DotInteractionBackwardArgs& args,
                                        const ExecContext& ctx) {
  const char* op = "DotInteractionBackwardCuda";
  RETURN_IF_ERROR(CheckSizes(op, args.batch, args.num_sparse, args.dim));
  if (args.batch == 0) return absl::OkStatus();
  if (args.dense == nullptr || args.grad_output == nullptr ||
      args.grad_dense == nullptr ||
      (args.num_sparse > 0 &&
       (args.sparse == nullptr || args.grad_sparse == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": dense, sparse, grad_output, grad_dense or grad_sparse is null"));
  }
  const InteractionParams p{args.batch,      args.num_sparse, args.dim,
                            args.dense,      args.sparse,     args.grad_output,
                            args.grad_dense, args.grad_sparse};
  const size_t rows = args.num_sparse + 1;
  const size_t pairs = rows * args.num_sparse / 2;
  const size_t smem = sizeof(float) * (rows * SmemStride(args.dim) + pairs);
  return LaunchSample(BackwardKernel<true>, BackwardKernel<false>, p, smem,
                      StreamOf(ctx), "launch of interaction BackwardKernel");
}

}  // namespace recps::kernels
