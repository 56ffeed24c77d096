// CUDA bias + ReLU forward and backward (dense_layer.h).
//
// The backward's bias gradient is a column sum over the batch, reduced
// without float atomics so that it is deterministic. It uses the CPU's
// split (dense_layer_cpu.cc): rows cut into blocks whose size depends only on
// (batch, n), each block summed in row order from zero, the block sums then
// added in block order. Same order, same bits as the CPU.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda_util.cuh"
#include "kernels/dense_layer.h"

namespace recps::kernels {
namespace {

// Mirrors dense_layer_cpu.cc: row blocks hold at least this many elements,
// and there are at most kMaxRowBlocks of them.
constexpr int64_t kRowBlockElements = 1 << 15;
constexpr int64_t kMaxRowBlocks = 256;
// Backward block shape: 32 columns x kSlices threads, each thread summing
// every kSlices-th row block of its column.
constexpr int kSlices = 8;

int64_t RowBlockRows(int64_t batch, int64_t n) {
  const int64_t by_size = CeilDiv(kRowBlockElements, std::max<int64_t>(n, 1));
  const int64_t by_count = CeilDiv(batch, kMaxRowBlocks);
  return std::max<int64_t>(1, std::max(by_size, by_count));
}

__global__ void __launch_bounds__(kBlockThreads)
    BiasActivationForwardKernel(float* y, const float* bias, int64_t batch,
                                int64_t n, bool relu) {
  const int64_t total = batch * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = y[i] + bias[i % n];
    // `v < 0 ? 0 : v` keeps NaN, as the CPU (and PyTorch's relu) does.
    y[i] = relu && v < 0.0f ? 0.0f : v;
  }
}

__global__ void __launch_bounds__(kWarpSize* kSlices)
    BiasActivationBackwardKernel(const float* y, float* dy, float* grad_bias,
                                 int64_t batch, int64_t n, bool relu,
                                 int64_t block_rows) {
  __shared__ float block_sums[kMaxRowBlocks][kWarpSize];
  const int64_t num_blocks = CeilDiv(batch, block_rows);
  const int64_t col_tiles = CeilDiv(n, kWarpSize);
  for (int64_t tile = blockIdx.x; tile < col_tiles; tile += gridDim.x) {
    const int64_t j = tile * kWarpSize + threadIdx.x;
    if (j < n) {
      for (int64_t rb = threadIdx.y; rb < num_blocks; rb += kSlices) {
        const int64_t end = min(batch, (rb + 1) * block_rows);
        float sum = 0.0f;
        for (int64_t i = rb * block_rows; i < end; ++i) {
          float d = dy[i * n + j];
          if (relu) {
            d = y[i * n + j] > 0.0f ? d : 0.0f;
            dy[i * n + j] = d;
          }
          sum += d;
        }
        block_sums[rb][threadIdx.x] = sum;
      }
    }
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
      float total = 0.0f;  // batch == 0 gives zeros
      for (int64_t rb = 0; rb < num_blocks; ++rb) {
        total = rb == 0 ? block_sums[0][threadIdx.x]
                        : total + block_sums[rb][threadIdx.x];
      }
      grad_bias[j] = total;
    }
    __syncthreads();  // block_sums is reused by the next tile
  }
}

absl::Status CheckShape(const char* op, int64_t batch, int64_t n) {
  if (batch < 0 || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": negative size (batch ", batch, ", n ", n, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BiasActivationForwardCuda(const BiasActivationForwardArgs& args,
                                       const ExecContext& ctx) {
  const char* op = "BiasActivationForwardCuda";
  RETURN_IF_ERROR(CheckShape(op, args.batch, args.n));
  if (args.batch == 0 || args.n == 0) return absl::OkStatus();
  if (args.y == nullptr || args.bias == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": y or bias is null (batch ", args.batch, ", n ", args.n, ")"));
  }
  const int64_t total = args.batch * args.n;
  BiasActivationForwardKernel<<<GridBlocks(total), kBlockThreads, 0,
                                StreamOf(ctx)>>>(args.y, args.bias, args.batch,
                                                 args.n, args.relu);
  RETURN_IF_LAUNCH_ERROR("BiasActivationForwardKernel");
  return absl::OkStatus();
}

absl::Status BiasActivationBackwardCuda(const BiasActivationBackwardArgs& args,
                                        const ExecContext& ctx) {
  const char* op = "BiasActivationBackwardCuda";
  RETURN_IF_ERROR(CheckShape(op, args.batch, args.n));
  if (args.n == 0) return absl::OkStatus();
  if (args.grad_bias == nullptr || (args.batch > 0 && args.dy == nullptr) ||
      (args.batch > 0 && args.relu && args.y == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": grad_bias, dy or (with relu) y is null (batch ",
                     args.batch, ", n ", args.n, ")"));
  }
  // batch == 0 still runs: grad_bias becomes zeros.
  BiasActivationBackwardKernel<<<GridBlocks(args.n, kWarpSize),
                                 dim3(kWarpSize, kSlices), 0, StreamOf(ctx)>>>(
      args.y, args.dy, args.grad_bias, args.batch, args.n, args.relu,
      RowBlockRows(args.batch, args.n));
  RETURN_IF_LAUNCH_ERROR("BiasActivationBackwardKernel");
  return absl::OkStatus();
}

}  // namespace recps::kernels
