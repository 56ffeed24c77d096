// CUDA GEMM through cuBLAS (gemm.h). cuBLAS is column-major; a row-major
// matrix is its transpose in column-major, so row-major C = op(A) op(B) is
// computed as column-major C^T = op(B)^T op(A)^T: swap the operands and
// m/n, keep each operand's transpose flag.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_util.cuh"
#include "kernels/gemm.h"

namespace recps::kernels {
namespace {

__global__ void __launch_bounds__(kBlockThreads)
    ScaleKernel(float* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < m * n;
       e += int64_t{gridDim.x} * blockDim.x) {
    float* x = c + (e / n) * ldc + e % n;
    *x = beta == 0.0f ? 0.0f : *x * beta;
  }
}

}  // namespace

absl::Status GemmCuda(const GemmArgs& args, const ExecContext& ctx) {
  const char* op = "GemmCuda";
  if (args.m < 0 || args.n < 0 || args.k < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": negative size (m ",
                                                   args.m, ", n ", args.n,
                                                   ", k ", args.k, ")"));
  }
  // Row-major storage: each leading dimension is at least the row length.
  const int64_t a_cols = args.trans_a ? args.m : args.k;
  const int64_t b_cols = args.trans_b ? args.k : args.n;
  if (args.lda < a_cols || args.ldb < b_cols || args.ldc < args.n) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": leading dimension too small (lda ", args.lda, " < ",
                     a_cols, ", ldb ", args.ldb, " < ", b_cols, " or ldc ",
                     args.ldc, " < ", args.n, ")"));
  }
  if ((args.a == nullptr && args.m > 0 && args.k > 0) ||
      (args.b == nullptr && args.k > 0 && args.n > 0) ||
      (args.c == nullptr && args.m > 0 && args.n > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": a, b or c is null for a non-empty operand (m ",
                     args.m, ", n ", args.n, ", k ", args.k, ")"));
  }
  // Required even where cuBLAS is not called, so a missing handle shows up
  // on the first call, not the first non-trivial one.
  if (ctx.cublas_handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": ExecContext.cublas_handle is null"));
  }
  if (args.m == 0 || args.n == 0) return absl::OkStatus();
  const cudaStream_t stream = StreamOf(ctx);
  if (args.k == 0) {
    // Empty inner product: C = beta * C, done here as the CPU does (BLASes
    // differ on k == 0). beta == 0 stores zeros without reading C.
    if (args.beta == 1.0f) return absl::OkStatus();
    ScaleKernel<<<GridBlocks(args.m * args.n), kBlockThreads, 0, stream>>>(
        args.c, args.m, args.n, args.ldc, args.beta);
    RETURN_IF_LAUNCH_ERROR("Gemm ScaleKernel");
    return absl::OkStatus();
  }
  const auto handle = static_cast<cublasHandle_t>(ctx.cublas_handle);
  absl::StatusOr<const CublasApi*> cublas = Cublas();
  if (!cublas.ok()) return cublas.status();
  // The handle is the caller's; it is left bound to this stream.
  RETURN_IF_CUBLAS_ERROR((*cublas)->set_stream(handle, stream), "cublasSetStream");
  RETURN_IF_CUBLAS_ERROR(
      (*cublas)->sgemm_64(handle, args.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                     args.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, args.n, args.m,
                     args.k, &args.alpha, args.b, args.ldb, args.a, args.lda,
                     &args.beta, args.c, args.ldc),
      "cublasSgemm_64");
  return absl::OkStatus();
}

}  // namespace recps::kernels
