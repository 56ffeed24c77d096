#include "kernels/gemm.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace recps::kernels {
namespace {

using ::recps::kernels::testing::AllNear;
using ::recps::kernels::testing::RandomFloats;
using ::testing::HasSubstr;

// Filler for the padding columns of C: must survive every call untouched.
constexpr float kPad = 12345.0f;

// Operands with row-major storage and optional padding of each row stride.
struct Problem {
  bool trans_a, trans_b;
  int64_t m, n, k;
  int64_t pad;  // extra elements per row beyond the stored column count
  float alpha, beta;
  std::vector<float> a, b, c;
  int64_t lda, ldb, ldc;

  GemmArgs Args(float* c_data) const {
    GemmArgs g;
    g.trans_a = trans_a;
    g.trans_b = trans_b;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.a = a.data();
    g.lda = lda;
    g.b = b.data();
    g.ldb = ldb;
    g.beta = beta;
    g.c = c_data;
    g.ldc = ldc;
    return g;
  }
};

Problem MakeProblem(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    int64_t pad, float alpha, float beta, uint64_t seed) {
  Problem p{trans_a, trans_b, m, n, k, pad, alpha, beta, {}, {}, {}, 0, 0, 0};
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  p.lda = a_cols + pad;
  p.ldb = b_cols + pad;
  p.ldc = n + pad;
  p.a = RandomFloats(a_rows * p.lda, seed);
  p.b = RandomFloats(b_rows * p.ldb, seed + 1);
  p.c = RandomFloats(m * p.ldc, seed + 2);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = n; j < p.ldc; ++j) p.c[i * p.ldc + j] = kPad;
  }
  return p;
}

// C = alpha * op(A) op(B) + beta * C in double, padding left as is.
std::vector<float> Reference(const Problem& p) {
  std::vector<float> c = p.c;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0.0;
      for (int64_t l = 0; l < p.k; ++l) {
        const double a = p.trans_a ? p.a[l * p.lda + i] : p.a[i * p.lda + l];
        const double b = p.trans_b ? p.b[j * p.ldb + l] : p.b[l * p.ldb + j];
        sum += a * b;
      }
      const double old = p.beta == 0.0f ? 0.0 : p.c[i * p.ldc + j];
      c[i * p.ldc + j] = static_cast<float>(p.alpha * sum + p.beta * old);
    }
  }
  return c;
}

std::string Describe(const Problem& p) {
  return absl::StrCat("trans_a=", p.trans_a, " trans_b=", p.trans_b, " m=", p.m,
                      " n=", p.n, " k=", p.k, " pad=", p.pad,
                      " alpha=", p.alpha, " beta=", p.beta);
}

struct Shape {
  int64_t m, n, k;
};

const Shape kShapes[] = {{1, 1, 1},    {1, 7, 33},   {33, 1, 7},
                         {7, 33, 1},   {33, 33, 33}, {64, 17, 130},
                         {5, 129, 64}, {1, 1, 257}};

TEST(GemmCpuTest, MatchesReferenceForEveryTransposeAndPadding) {
  uint64_t seed = 1;
  for (const Shape& s : kShapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (int64_t pad : {0, 3}) {
          const float alpha = pad == 0 ? 1.0f : -0.75f;
          const float beta = pad == 0 ? 0.0f : 0.5f;
          Problem p =
              MakeProblem(ta, tb, s.m, s.n, s.k, pad, alpha, beta, seed += 3);
          const std::vector<float> want = Reference(p);
          std::vector<float> got = p.c;
          ASSERT_TRUE(GemmCpu(p.Args(got.data()), ExecContext()).ok())
              << Describe(p);
          // Products of values in [-1, 1]: error grows with k.
          EXPECT_TRUE(AllNear(got, want, 2e-6 * (s.k + 1), 1e-5))
              << Describe(p);
        }
      }
    }
  }
}

// The start-up check of the BLAS kernels (UseFastestBlasKernels): OpenBLAS
// as loaded passes it; a kernel off in one element, or writing past the
// product, fails it with the product and the element named.
TEST(GemmSelfCheckTest, TheLoadedKernelsPassAndWrongOnesAreNamed) {
  const ExecContext cpu;
  EXPECT_TRUE(CheckGemmAgainstReference([&](const GemmArgs& g) { return GemmCpu(g, cpu); })
                  .ok());
  int calls = 0;
  const absl::Status off_by_a_bit = CheckGemmAgainstReference([&](const GemmArgs& g) {
    RETURN_IF_ERROR(GemmCpu(g, cpu));
    if (++calls == 30 && g.m > 1 && g.n > 1) g.c[g.ldc + 1] *= 1.001f;
    return absl::OkStatus();
  });
  EXPECT_EQ(off_by_a_bit.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(off_by_a_bit.message()), HasSubstr("C[1][1] is"));
  const absl::Status past_the_end = CheckGemmAgainstReference([&](const GemmArgs& g) {
    RETURN_IF_ERROR(GemmCpu(g, cpu));
    if (g.m > 0) g.c[g.n] = 42.0f;  // the padding column of row 0
    return absl::OkStatus();
  });
  EXPECT_THAT(std::string(past_the_end.message()), HasSubstr("outside the product"));
}

TEST(GemmCpuTest, BetaZeroDoesNotReadC) {
  Problem p = MakeProblem(false, true, 7, 33, 7, 2, 1.0f, 0.0f, 99);
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      p.c[i * p.ldc + j] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  const std::vector<float> want = Reference(p);
  std::vector<float> got = p.c;
  ASSERT_TRUE(GemmCpu(p.Args(got.data()), ExecContext()).ok());
  EXPECT_TRUE(AllNear(got, want, 1e-5, 1e-5));
}

TEST(GemmCpuTest, EmptyInnerDimensionScalesC) {
  for (float beta : {0.0f, 1.0f, -2.0f}) {
    Problem p = MakeProblem(true, false, 7, 5, 0, 1, 3.0f, beta, 7);
    if (beta == 0.0f) p.c[0] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> want = Reference(p);
    std::vector<float> got = p.c;
    GemmArgs g = p.Args(got.data());
    g.a = nullptr;  // op(A) is 7 x 0: never read
    g.b = nullptr;
    ASSERT_TRUE(GemmCpu(g, ExecContext()).ok()) << "beta=" << beta;
    EXPECT_TRUE(AllNear(got, want, 0.0)) << "beta=" << beta;
  }
}

TEST(GemmCpuTest, EmptyOutputIsANoOp) {
  // Operands with elements still need pointers, even though C is empty.
  std::vector<float> buf(64, 1.0f);
  for (const Shape& s : {Shape{0, 5, 3}, Shape{4, 0, 3}, Shape{0, 0, 0}}) {
    GemmArgs g;
    g.a = g.b = buf.data();
    g.c = buf.data();
    g.m = s.m;
    g.n = s.n;
    g.k = s.k;
    g.lda = s.k;
    g.ldb = s.n;
    g.ldc = s.n;
    EXPECT_TRUE(GemmCpu(g, ExecContext()).ok())
        << "m=" << s.m << " n=" << s.n << " k=" << s.k;
    EXPECT_EQ(buf, std::vector<float>(64, 1.0f));
  }
  // With no elements, no pointers are needed (strides are still checked).
  GemmArgs g;
  g.m = 0;
  g.n = 5;
  g.k = 0;
  g.ldb = 5;
  g.ldc = 5;
  EXPECT_TRUE(GemmCpu(g, ExecContext()).ok());
}

TEST(GemmCpuTest, SplitOverAPoolByRowsOrColumns) {
  // Large enough to be split (>= 2^20 multiply-adds): tall products by rows
  // of C, wide ones by columns, sizes that are not multiples of the block
  // alignment, every transpose, padded strides whose padding must survive.
  const Shape shapes[] = {{301, 37, 100}, {37, 301, 100}, {1000, 20, 60}, {17, 2000, 40}};
  uint64_t seed = 100;
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    ExecContext ctx;
    ctx.pool = &pool;
    for (const Shape& s : shapes) {
      ASSERT_GE(s.m * s.n * s.k, int64_t{1} << 20);
      for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
          Problem p = MakeProblem(ta, tb, s.m, s.n, s.k, 3, -0.75f, 0.5f, seed += 3);
          const std::vector<float> want = Reference(p);
          std::vector<float> got = p.c;
          ASSERT_TRUE(GemmCpu(p.Args(got.data()), ctx).ok()) << Describe(p);
          EXPECT_TRUE(AllNear(got, want, 2e-6 * (s.k + 1), 1e-5))
              << Describe(p) << " threads=" << threads;
        }
      }
    }
  }
}

// The first argument error for a valid problem modified by `mutate`.
template <typename Mutate>
absl::Status ErrorFor(bool trans_a, bool trans_b, Mutate mutate) {
  Problem p = MakeProblem(trans_a, trans_b, 4, 6, 5, 0, 1.0f, 0.0f, 3);
  std::vector<float> c = p.c;
  GemmArgs g = p.Args(c.data());
  mutate(g);
  return GemmCpu(g, ExecContext());
}

TEST(GemmCpuTest, RejectsBadArguments) {
  struct Case {
    const char* name;
    void (*mutate)(GemmArgs&);
    const char* field;
  };
  const Case cases[] = {
      {"negative m", [](GemmArgs& g) { g.m = -1; }, "m=-1"},
      {"negative n", [](GemmArgs& g) { g.n = -2; }, "n=-2"},
      {"negative k", [](GemmArgs& g) { g.k = -3; }, "k=-3"},
      {"lda one short", [](GemmArgs& g) { --g.lda; }, "lda"},
      {"ldb one short", [](GemmArgs& g) { --g.ldb; }, "ldb"},
      {"ldc one short", [](GemmArgs& g) { --g.ldc; }, "ldc"},
      {"null a", [](GemmArgs& g) { g.a = nullptr; }, "a is null"},
      {"null b", [](GemmArgs& g) { g.b = nullptr; }, "b is null"},
      {"null c", [](GemmArgs& g) { g.c = nullptr; }, "c is null"},
  };
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (const Case& c : cases) {
        const absl::Status s = ErrorFor(ta, tb, c.mutate);
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
            << c.name << " trans_a=" << ta << " trans_b=" << tb << ": " << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr(c.field)) << c.name;
      }
    }
  }
}

TEST(GemmCpuTest, LeadingDimensionFollowsTheTranspose) {
  // m=4, n=6, k=5: A is 4x5 (5x4 transposed), B is 5x6 (6x5 transposed).
  auto with_ld = [](bool ta, bool tb, int64_t lda, int64_t ldb) {
    return ErrorFor(ta, tb, [&](GemmArgs& g) {
      g.lda = lda;
      g.ldb = ldb;
    });
  };
  EXPECT_TRUE(with_ld(false, false, 5, 6).ok());
  EXPECT_TRUE(with_ld(true, true, 4, 5).ok());
  EXPECT_FALSE(with_ld(true, false, 5 - 2, 6).ok());  // needs lda >= m = 4
  EXPECT_TRUE(with_ld(true, false, 4, 6).ok());
  EXPECT_FALSE(with_ld(false, true, 5, 4).ok());  // needs ldb >= k = 5
  const absl::Status s = with_ld(false, false, 4, 6);
  EXPECT_THAT(std::string(s.message()), HasSubstr("lda=4"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("5 columns of A"));
}

}  // namespace
}  // namespace recps::kernels
