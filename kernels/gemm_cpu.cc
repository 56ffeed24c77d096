// CPU GEMM: argument checks, then OpenBLAS's cblas_sgemm (row-major), split
// over the caller's pool when it has one.
#include <cblas.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/cpu_features.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "kernels/gemm.h"

namespace recps::kernels {
namespace {

// Checks one operand's leading dimension against its stored (row-major)
// shape: the row stride must cover every column.
absl::Status CheckLeadingDim(const char* name, const char* ld_name, int64_t ld,
                             int64_t stored_rows, int64_t stored_cols,
                             bool transposed) {
  if (ld < stored_cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemmCpu: ", ld_name, "=", ld, " is smaller than the ", stored_cols,
        " columns of ", name, ", stored row-major as ", stored_rows, " x ",
        stored_cols, transposed ? " (transposed)" : "",
        "; the leading dimension is the row stride in elements"));
  }
  return absl::OkStatus();
}

absl::Status ValidateGemm(const GemmArgs& g) {
  if (g.m < 0 || g.n < 0 || g.k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemmCpu: negative size m=", g.m, " n=", g.n, " k=", g.k));
  }
  // Row-major storage: A is m x k (k x m when transposed), B is k x n
  // (n x k when transposed), C is m x n.
  const int64_t a_rows = g.trans_a ? g.k : g.m;
  const int64_t a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_rows = g.trans_b ? g.n : g.k;
  const int64_t b_cols = g.trans_b ? g.k : g.n;
  RETURN_IF_ERROR(
      CheckLeadingDim("A", "lda", g.lda, a_rows, a_cols, g.trans_a));
  RETURN_IF_ERROR(
      CheckLeadingDim("B", "ldb", g.ldb, b_rows, b_cols, g.trans_b));
  RETURN_IF_ERROR(CheckLeadingDim("C", "ldc", g.ldc, g.m, g.n, false));
  // cblas takes `blasint`, 32-bit in the usual OpenBLAS builds.
  constexpr int64_t kBlasMax = std::numeric_limits<blasint>::max();
  const int64_t largest = std::max({g.m, g.n, g.k, g.lda, g.ldb, g.ldc});
  if (largest > kBlasMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemmCpu: a size or leading dimension (m=", g.m, " n=", g.n, " k=", g.k,
        " lda=", g.lda, " ldb=", g.ldb, " ldc=", g.ldc,
        ") exceeds the BLAS integer limit ", kBlasMax, "; split the product"));
  }
  if (g.a == nullptr && g.m > 0 && g.k > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemmCpu: a is null but op(A) is ", g.m, " x ", g.k));
  }
  if (g.b == nullptr && g.k > 0 && g.n > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemmCpu: b is null but op(B) is ", g.k, " x ", g.n));
  }
  if (g.c == nullptr && g.m > 0 && g.n > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemmCpu: c is null but C is ", g.m, " x ", g.n));
  }
  return absl::OkStatus();
}

void Sgemm(const GemmArgs& g, int64_t m, int64_t n, const float* a,
           const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
              g.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(g.k), g.alpha, a,
              static_cast<blasint>(g.lda), b, static_cast<blasint>(g.ldb),
              g.beta, c, static_cast<blasint>(g.ldc));
}

// Products below this many multiply-adds (~0.1 ms) run as one call.
constexpr int64_t kSplitMinMacs = int64_t{1} << 20;
// Blocks are whole multiples of this many rows or columns: the widest
// register tile of OpenBLAS's sgemm kernels, so no block adds edge tiles.
constexpr int64_t kSplitAlign = 16;

}  // namespace

absl::Status GemmCpu(const GemmArgs& args, const ExecContext& ctx) {
  RETURN_IF_ERROR(ValidateGemm(args));
  const GemmArgs& g = args;
  if (g.m == 0 || g.n == 0) return absl::OkStatus();
  if (g.k == 0) {
    // Empty inner product: C = beta * C. Done here because BLASes disagree
    // on k == 0 and on lda/ldb checks for empty operands. beta == 0 stores
    // zeros without reading C, the BLAS convention (NaN in C is dropped).
    if (g.beta == 1.0f) return absl::OkStatus();
    for (int64_t i = 0; i < g.m; ++i) {
      float* row = g.c + i * g.ldc;
      if (g.beta == 0.0f) {
        std::fill(row, row + g.n, 0.0f);
      } else {
        for (int64_t j = 0; j < g.n; ++j) row[j] *= g.beta;
      }
    }
    return absl::OkStatus();
  }
  // OpenBLAS always runs on one thread of its own, from the first call on:
  // its results can depend on how it splits a product among its threads
  // (on AMD Zen 2, one thread and two give different bits), so a call
  // without a pool must not change bits with OpenBLAS's default thread
  // count or with whether a pooled call came first.
  static const bool single = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)single;
  const int threads = ctx.pool != nullptr ? ctx.pool->num_threads() : 1;
  if (threads == 1 || g.m * g.n * g.k < kSplitMinMacs) {
    Sgemm(g, g.m, g.n, g.a, g.b, g.c);
    return absl::OkStatus();
  }
  // With a pool the product is split into blocks of C's rows (or columns,
  // when C is wider than tall), one call per pool thread. OpenBLAS's own
  // pthreads spin on sched_yield between calls, taking the CPU from the
  // lookups and pushes that run beside the GEMMs: the split cut a 2-core
  // worker's CPU time by 28% at issue 17's S-p20 (docs/performance.md).
  // The blocks follow the pool's thread count, and OpenBLAS's bits can
  // depend on them (Zen 2 again): a product's bits are fixed for a given
  // pool size, not across sizes (docs/kernels.md, Determinism).
  const bool by_rows = g.m >= g.n;
  const int64_t extent = by_rows ? g.m : g.n;
  const int64_t blocks = std::min<int64_t>(threads, std::max<int64_t>(1, extent / kSplitAlign));
  const int64_t per_block = (extent / blocks + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
  ParallelFor(ctx.pool, (extent + per_block - 1) / per_block, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t block = lo; block < hi; ++block) {
      const int64_t begin = block * per_block;
      const int64_t size = std::min(per_block, extent - begin);
      if (by_rows) {
        // Rows [begin, begin+size) of op(A) and of C.
        const float* a = g.trans_a ? g.a + begin : g.a + begin * g.lda;
        Sgemm(g, size, g.n, a, g.b, g.c + begin * g.ldc);
      } else {
        // Columns [begin, begin+size) of op(B) and of C.
        const float* b = g.trans_b ? g.b + begin * g.ldb : g.b + begin;
        Sgemm(g, g.m, size, g.a, b, g.c + begin);
      }
    }
  });
  return absl::OkStatus();
}

namespace {
// Set beside OPENBLAS_CORETYPE by UseFastestBlasKernels: the core OpenBLAS
// ran before (also the guard against a second re-execution).
constexpr char kPreviousCoreEnv[] = "RECPS_OPENBLAS_PREVIOUS_CORE";

// OpenBLAS's x86 cores with AVX-512 kernels.
bool IsAvx512Core(const char* core) {
  for (const char* name : {"skylakex", "cooperlake", "sapphirerapids"}) {
    if (strcasecmp(core, name) == 0) return true;
  }
  return false;
}
}  // namespace

absl::Status UseFastestBlasKernels(const std::string& mode, char** argv) {
  if (mode == "env") return absl::OkStatus();
  if (mode != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--blas_kernels=", mode, ": expected auto or env"));
  }
  const char* core = openblas_get_corename();
  if (core == nullptr || IsAvx512Core(core) || !CpuIsaSupported(CpuIsa::kAvx512)) {
    return absl::OkStatus();
  }
  const std::string previous = core;
  if (std::getenv(kPreviousCoreEnv) != nullptr) {
    // Re-executed already, and OpenBLAS kept its core (it refuses AVX-512
    // kernels where its own check fails): run with it.
    LogWarning("OpenBLAS runs its ", previous, " kernels although this CPU has AVX-512: "
               "it refused OPENBLAS_CORETYPE=SkylakeX");
    return absl::OkStatus();
  }
  setenv("OPENBLAS_CORETYPE", "SkylakeX", /*overwrite=*/1);
  setenv(kPreviousCoreEnv, previous.c_str(), /*overwrite=*/1);
  std::fflush(nullptr);
  execv("/proc/self/exe", argv);
  // Still here: the exec failed; run on with the kernels OpenBLAS has.
  const int error = errno;
  LogWarning("OpenBLAS runs its ", previous, " kernels on this AVX-512 CPU: re-executing "
             "with OPENBLAS_CORETYPE=SkylakeX failed (", std::strerror(error), ")");
  return absl::OkStatus();
}

std::string BlasKernelsDescription() {
  const char* core = openblas_get_corename();
  std::string out = core != nullptr ? core : "unknown";
  if (const char* previous = std::getenv(kPreviousCoreEnv);
      previous != nullptr && (core == nullptr || strcasecmp(core, previous) != 0)) {
    absl::StrAppend(&out, " (chosen by recps: OpenBLAS ran ", previous, ")");
  }
  return out;
}

}  // namespace recps::kernels
