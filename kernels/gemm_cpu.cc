// CPU GEMM: argument checks, then OpenBLAS's cblas_sgemm (row-major), split
// over the caller's pool when it has one.
#include <cblas.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <string>
#include <vector>
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

absl::Status CheckGemmAgainstReference(
    absl::FunctionRef<absl::Status(const GemmArgs&)> gemm) {
  // Sizes that hit full tiles, edge tiles and single elements of the
  // usual 4/8/16-wide kernels; every transpose; padded leading dimensions.
  static constexpr int kSizes[][3] = {{1, 1, 1},    {3, 5, 7},    {16, 16, 16},
                                      {17, 31, 33}, {64, 65, 63}, {100, 48, 129}};
  static constexpr float kScales[][2] = {{1.0f, 0.0f}, {0.5f, -1.5f}};
  auto value = [](int64_t i, int64_t j, int seed) {
    return static_cast<float>((i * 7919 + j * 104729 + seed * 31) % 2001 - 1000) / 1000.0f;
  };
  std::vector<float> a, b, c, c0;
  for (const auto& size : kSizes) {
    const int64_t m = size[0], n = size[1], k = size[2];
    for (int t = 0; t < 4; ++t) {
      for (const auto& scale : kScales) {
        GemmArgs g;
        g.trans_a = (t & 1) != 0;
        g.trans_b = (t & 2) != 0;
        g.m = m;
        g.n = n;
        g.k = k;
        g.alpha = scale[0];
        g.beta = scale[1];
        g.lda = (g.trans_a ? m : k) + 3;
        g.ldb = (g.trans_b ? k : n) + 2;
        g.ldc = n + 1;  // the padding column must stay untouched
        a.resize((g.trans_a ? k : m) * g.lda);
        b.resize((g.trans_b ? n : k) * g.ldb);
        c0.resize(m * g.ldc);
        for (size_t i = 0; i < a.size(); ++i) a[i] = value(i, 1, t);
        for (size_t i = 0; i < b.size(); ++i) b[i] = value(i, 2, t);
        for (size_t i = 0; i < c0.size(); ++i) c0[i] = value(i, 3, t);
        c = c0;
        g.a = a.data();
        g.b = b.data();
        g.c = c.data();
        const std::string what = absl::StrCat(
            "GEMM ", g.trans_a ? "A^T" : "A", g.trans_b ? "B^T" : "B", " m=", m,
            " n=", n, " k=", k, " alpha=", g.alpha, " beta=", g.beta);
        RETURN_IF_ERROR(gemm(g));
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j <= n; ++j) {
            const float got = c[i * g.ldc + j];
            if (j == n) {
              if (got != c0[i * g.ldc + j]) {
                return absl::FailedPreconditionError(absl::StrCat(
                    what, ": wrote C[", i, "][", j, "] outside the product"));
              }
              continue;
            }
            double sum = 0, magnitude = 0;
            for (int64_t p = 0; p < k; ++p) {
              const double x = g.trans_a ? a[p * g.lda + i] : a[i * g.lda + p];
              const double y = g.trans_b ? b[j * g.ldb + p] : b[p * g.ldb + j];
              sum += x * y;
              magnitude += std::abs(x * y);
            }
            const double c_in = c0[i * g.ldc + j];
            const double want = g.alpha * sum + g.beta * c_in;
            // Float rounding of k products and sums, with room to spare.
            const double bound =
                4.0 * (k + 2) * std::numeric_limits<float>::epsilon() *
                    (std::abs(g.alpha) * magnitude + std::abs(g.beta * c_in)) +
                1e-6;
            if (!(std::abs(got - want) <= bound)) {
              return absl::FailedPreconditionError(absl::StrCat(
                  what, ": C[", i, "][", j, "] is ", got, ", the reference ", want));
            }
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

namespace {
// Set beside OPENBLAS_CORETYPE by UseFastestBlasKernels: the core OpenBLAS
// ran before (also the guard against a second re-execution).
constexpr char kPreviousCoreEnv[] = "RECPS_OPENBLAS_PREVIOUS_CORE";
// Set when the check rejected the core recps chose: "<core>: <why>" (also
// the guard against trying it again).
constexpr char kRejectedEnv[] = "RECPS_OPENBLAS_REJECTED";
// Tests only: the checked GEMM's results are corrupted, as a wrong kernel's
// would be, so that the fallback runs on any machine.
constexpr char kCorruptCheckEnv[] = "RECPS_TEST_CORRUPT_BLAS_CHECK";

// CheckGemmAgainstReference of OpenBLAS as loaded, in a child process: a
// kernel that crashes (an illegal instruction) fails the check instead of
// the program. Call before any thread of ours starts.
absl::Status CheckKernelsInChild() {
  int fds[2];
  if (pipe(fds) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(error)));
  }
  if (pid == 0) {
    close(fds[0]);
    openblas_set_num_threads(1);
    const bool corrupt = std::getenv(kCorruptCheckEnv) != nullptr;
    const ExecContext ctx;
    const absl::Status s = CheckGemmAgainstReference([&](const GemmArgs& g) {
      RETURN_IF_ERROR(GemmCpu(g, ctx));
      if (corrupt && g.m > 0 && g.n > 0) g.c[0] += 1.0f;
      return absl::OkStatus();
    });
    const std::string why(s.message());
    if (!why.empty() && write(fds[1], why.data(), why.size()) < 0) _exit(3);
    _exit(s.ok() ? 0 : 1);
  }
  close(fds[1]);
  std::string why;
  char buf[512];
  for (ssize_t got; (got = read(fds[0], buf, sizeof(buf))) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    why.append(buf, static_cast<size_t>(got));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the check was killed by signal ", WTERMSIG(status)));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(why.empty() ? "the check failed" : why);
}

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
  if (std::getenv(kRejectedEnv) != nullptr) return absl::OkStatus();  // fell back
  if (const char* previous = std::getenv(kPreviousCoreEnv);
      previous != nullptr && core != nullptr && strcasecmp(core, previous) != 0) {
    // Running the kernels recps chose: keep them only if they compute right.
    const absl::Status checked = CheckKernelsInChild();
    if (checked.ok()) return absl::OkStatus();
    const std::string fallback = previous;
    LogWarning("OpenBLAS's ", core, " kernels failed recps' check on this CPU (",
               checked.message(), "); running its ", fallback, " kernels instead");
    setenv(kRejectedEnv, absl::StrCat(core, ": ", checked.message()).c_str(), 1);
    setenv("OPENBLAS_CORETYPE", fallback.c_str(), /*overwrite=*/1);
    std::fflush(nullptr);
    execv("/proc/self/exe", argv);
    return absl::FailedPreconditionError(absl::StrCat(
        "OpenBLAS's ", core, " kernels compute wrong results here and re-executing with ",
        fallback, " failed (", std::strerror(errno), "); run with --blas_kernels=env"));
  }
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
  if (const char* rejected = std::getenv(kRejectedEnv); rejected != nullptr) {
    absl::StrAppend(&out, " (recps rejected ", rejected, ")");
    return out;
  }
  if (const char* previous = std::getenv(kPreviousCoreEnv);
      previous != nullptr && (core == nullptr || strcasecmp(core, previous) != 0)) {
    absl::StrAppend(&out, " (chosen by recps: OpenBLAS ran ", previous, ")");
  }
  return out;
}

}  // namespace recps::kernels
