// CUDA sigmoid + binary cross-entropy (loss.h).
//
// The mean loss is reduced deterministically, without float atomics: the
// number of blocks depends on n only, each block writes one partial sum
// (threads sum a fixed grid-stride subset, then a fixed tree), and a single
// block adds the partials in a fixed order. Terms and sums are in double.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda_util.cuh"
#include "kernels/loss.h"

namespace recps::kernels {
namespace {

constexpr int kLossThreads = 256;
constexpr int64_t kLossMaxBlocks = 1024;

// Tree sum of one value per thread of a kLossThreads block; thread 0 gets
// the total.
__device__ double BlockSum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = kLossThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

__global__ void __launch_bounds__(kLossThreads)
    SigmoidBceKernel(int64_t n, const float* logits, const float* labels,
                     float* probabilities, float* grad_logits,
                     double* block_sums) {
  __shared__ double shared[kLossThreads];
  const float n_float = static_cast<float>(n);
  double sum = 0.0;
  for (int64_t i = blockIdx.x * int64_t{kLossThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kLossThreads) {
    const float x = logits[i];
    const float y = labels[i];
    if (block_sums != nullptr) {
      // max(x, 0) - x * y + log(1 + exp(-|x|)): finite for any finite x. In
      // double, as the CPU does, so the float mean is the same in practice.
      const double xd = x;
      sum +=
          fmax(xd, 0.0) - xd * static_cast<double>(y) + log1p(exp(-fabs(xd)));
    }
    if (probabilities != nullptr || grad_logits != nullptr) {
      // exp of a non-positive argument only, so it cannot overflow.
      float prob;
      if (x >= 0.0f) {
        prob = 1.0f / (1.0f + expf(-x));
      } else {
        const float e = expf(x);
        prob = e / (1.0f + e);
      }
      if (probabilities != nullptr) probabilities[i] = prob;
      if (grad_logits != nullptr) grad_logits[i] = (prob - y) / n_float;
    }
  }
  if (block_sums == nullptr) return;  // uniform across the block
  const double total = BlockSum(sum, shared);
  if (threadIdx.x == 0) block_sums[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kLossThreads)
    MeanKernel(const double* block_sums, int num_blocks, int64_t n,
               float* loss) {
  __shared__ double shared[kLossThreads];
  double sum = 0.0;
  for (int b = threadIdx.x; b < num_blocks; b += kLossThreads) {
    sum += block_sums[b];
  }
  const double total = BlockSum(sum, shared);
  if (threadIdx.x == 0) *loss = static_cast<float>(total / n);
}

}  // namespace

absl::Status SigmoidBceCuda(const SigmoidBceArgs& args,
                            const ExecContext& ctx) {
  const char* op = "SigmoidBceCuda";
  if (args.n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": n must be >= 1, got ", args.n));
  }
  if (args.logits == nullptr || args.labels == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": logits or labels is null"));
  }
  if (args.loss == nullptr && args.probabilities == nullptr &&
      args.grad_logits == nullptr) {
    return absl::OkStatus();  // nothing asked for
  }
  const cudaStream_t stream = StreamOf(ctx);
  const int blocks =
      static_cast<int>(std::min(CeilDiv(args.n, kLossThreads), kLossMaxBlocks));
  StreamBuffer block_sums(stream);
  if (args.loss != nullptr) {
    RETURN_IF_ERROR(
        block_sums.Allocate(sizeof(double) * blocks, "SigmoidBce partials"));
  }
  SigmoidBceKernel<<<blocks, kLossThreads, 0, stream>>>(
      args.n, args.logits, args.labels, args.probabilities, args.grad_logits,
      block_sums.get<double>());
  RETURN_IF_LAUNCH_ERROR("SigmoidBceKernel");
  if (args.loss != nullptr) {
    MeanKernel<<<1, kLossThreads, 0, stream>>>(block_sums.get<double>(), blocks,
                                               args.n, args.loss);
    RETURN_IF_LAUNCH_ERROR("SigmoidBce MeanKernel");
  }
  return absl::OkStatus();
}

}  // namespace recps::kernels
