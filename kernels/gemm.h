// Single-precision GEMM through a BLAS (CPU: OpenBLAS's cblas) or cuBLAS.
// No hand-written GEMM: the libraries are faster and better tested.
#ifndef RECPS_KERNELS_GEMM_H_
#define RECPS_KERNELS_GEMM_H_

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "kernels/exec_context.h"

namespace recps::kernels {

// C = alpha * op(A) * op(B) + beta * C, every matrix row-major.
// op(A) is m x k (A is k x m when trans_a), op(B) is k x n (B is n x k when
// trans_b), C is m x n. Leading dimensions are row strides in elements.
struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
};

// INVALID_ARGUMENT for negative sizes, too-small leading dimensions or null
// pointers. The CPU path splits large products over ctx.pool (and from the
// first such call on runs OpenBLAS single-threaded in the process); the CUDA
// path needs ctx.cublas_handle.
absl::Status GemmCpu(const GemmArgs& args, const ExecContext& ctx);
absl::Status GemmCuda(const GemmArgs& args, const ExecContext& ctx);

// Runs `gemm` on a fixed panel of small products (every transpose, sizes
// that hit the kernels' edge tiles, alpha and beta not 1 and 0) and
// compares each with a reference computed in double precision; OK, or
// FAILED_PRECONDITION naming the first product and element that is off by
// more than float rounding allows. Cheap (~1 ms): the check of the kernels
// UseFastestBlasKernels chose.
absl::Status CheckGemmAgainstReference(
    absl::FunctionRef<absl::Status(const GemmArgs&)> gemm);

// OpenBLAS picks its kernels when it loads: from the CPU, or from
// OPENBLAS_CORETYPE when that is set. An environment that pins an AVX2 core
// (machines here export OPENBLAS_CORETYPE=Haswell) halves the GEMM rate of
// a CPU with full-width AVX-512 (AMD Zen 5: 2x on the DLRM's MLPs,
// docs/performance.md). With `mode` "auto", where this CPU runs AVX-512
// and OpenBLAS runs a core without it, sets OPENBLAS_CORETYPE=SkylakeX and
// re-executes the program (same pid and arguments: OpenBLAS reads it only
// at load), once. The re-executed program then checks those kernels
// (CheckGemmAgainstReference, in a child process, so that kernels that
// crash are caught too): where they disagree with the reference it says so
// and re-executes once more with the core OpenBLAS had chosen (older
// OpenBLAS builds compute wrong results or crash with AVX-512 kernels on
// some CPUs, which is why some environments pin a core). "env" keeps
// OpenBLAS's choice. Call in main after the flags are parsed, before any
// thread starts. INVALID_ARGUMENT for another mode; returns only when it
// does not re-execute.
absl::Status UseFastestBlasKernels(const std::string& mode, char** argv);

// The kernels OpenBLAS runs with, for start-up lines: "Cooperlake", or e.g.
// "SkylakeX (chosen by recps: OpenBLAS ran Haswell)", or "Haswell (recps
// rejected SkylakeX: <why>)".
std::string BlasKernelsDescription();

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_GEMM_H_
