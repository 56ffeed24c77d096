#include "kernels/interaction.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "common/cpu_features.h"
#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace recps::kernels {
namespace {

using ::recps::kernels::testing::AllNear;
using ::recps::kernels::testing::RandomFloats;
using ::testing::HasSubstr;

struct Shape {
  int64_t batch;
  int num_sparse;
  int dim;
};

std::string Describe(const Shape& s) {
  return "batch=" + std::to_string(s.batch) +
         " num_sparse=" + std::to_string(s.num_sparse) +
         " dim=" + std::to_string(s.dim);
}

const Shape kShapes[] = {{1, 0, 1}, {1, 1, 1},  {1, 3, 7},   {7, 1, 33},
                         {7, 7, 7}, {33, 4, 9}, {5, 26, 16}, {3, 2, 130}};

struct Inputs {
  std::vector<float> dense, sparse;
};

Inputs MakeInputs(const Shape& s, uint64_t seed) {
  return {RandomFloats(s.batch * s.dim, seed),
          RandomFloats(s.batch * s.num_sparse * s.dim, seed + 1)};
}

// Row r of sample b's T = [dense; sparse_0; ...].
const float* TRow(const Inputs& in, const Shape& s, int64_t b, int r) {
  return r == 0 ? in.dense.data() + b * s.dim
                : in.sparse.data() + (b * s.num_sparse + r - 1) * s.dim;
}

std::vector<float> Forward(const Inputs& in, const Shape& s,
                           const ExecContext& ctx) {
  const int64_t width = DotInteractionOutputWidth(s.num_sparse, s.dim);
  std::vector<float> out(s.batch * width, -1.0f);
  DotInteractionForwardArgs a;
  a.batch = s.batch;
  a.num_sparse = s.num_sparse;
  a.dim = s.dim;
  a.dense = in.dense.data();
  a.sparse = in.sparse.data();
  a.output = out.data();
  const absl::Status st = DotInteractionForwardCpu(a, ctx);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

Inputs Backward(const Inputs& in, const Shape& s,
                const std::vector<float>& grad_output, const ExecContext& ctx) {
  // Filled with garbage: the kernel must overwrite every element.
  Inputs grad{std::vector<float>(in.dense.size(), 1e30f),
              std::vector<float>(in.sparse.size(), 1e30f)};
  DotInteractionBackwardArgs a;
  a.batch = s.batch;
  a.num_sparse = s.num_sparse;
  a.dim = s.dim;
  a.dense = in.dense.data();
  a.sparse = in.sparse.data();
  a.grad_output = grad_output.data();
  a.grad_dense = grad.dense.data();
  a.grad_sparse = grad.sparse.data();
  const absl::Status st = DotInteractionBackwardCpu(a, ctx);
  EXPECT_TRUE(st.ok()) << st;
  return grad;
}

std::vector<float> ReferenceForward(const Inputs& in, const Shape& s) {
  const int64_t width = DotInteractionOutputWidth(s.num_sparse, s.dim);
  std::vector<float> out(s.batch * width);
  for (int64_t b = 0; b < s.batch; ++b) {
    float* row = out.data() + b * width;
    for (int k = 0; k < s.dim; ++k) row[k] = in.dense[b * s.dim + k];
    int64_t p = s.dim;
    for (int i = 1; i <= s.num_sparse; ++i) {
      for (int j = 0; j < i; ++j) {
        double dot = 0.0;
        for (int k = 0; k < s.dim; ++k) {
          dot +=
              static_cast<double>(TRow(in, s, b, i)[k]) * TRow(in, s, b, j)[k];
        }
        row[p++] = static_cast<float>(dot);
      }
    }
  }
  return out;
}

Inputs ReferenceBackward(const Inputs& in, const Shape& s,
                         const std::vector<float>& grad_output) {
  const int64_t width = DotInteractionOutputWidth(s.num_sparse, s.dim);
  const int rows = s.num_sparse + 1;
  Inputs grad{std::vector<float>(in.dense.size()),
              std::vector<float>(in.sparse.size())};
  std::vector<double> g(rows * s.dim);
  for (int64_t b = 0; b < s.batch; ++b) {
    const float* go = grad_output.data() + b * width;
    std::fill(g.begin(), g.end(), 0.0);
    for (int k = 0; k < s.dim; ++k) g[k] = go[k];
    int64_t p = s.dim;
    for (int i = 1; i < rows; ++i) {
      for (int j = 0; j < i; ++j, ++p) {
        for (int k = 0; k < s.dim; ++k) {
          g[i * s.dim + k] += static_cast<double>(go[p]) * TRow(in, s, b, j)[k];
          g[j * s.dim + k] += static_cast<double>(go[p]) * TRow(in, s, b, i)[k];
        }
      }
    }
    for (int k = 0; k < s.dim; ++k)
      grad.dense[b * s.dim + k] = static_cast<float>(g[k]);
    for (int r = 1; r < rows; ++r) {
      for (int k = 0; k < s.dim; ++k) {
        grad.sparse[(b * s.num_sparse + r - 1) * s.dim + k] =
            static_cast<float>(g[r * s.dim + k]);
      }
    }
  }
  return grad;
}

TEST(DotInteractionCpuTest, OutputWidth) {
  EXPECT_EQ(DotInteractionOutputWidth(0, 4), 4);
  EXPECT_EQ(DotInteractionOutputWidth(1, 4), 5);
  EXPECT_EQ(DotInteractionOutputWidth(26, 128), 128 + 351);
  // 64-bit arithmetic: no int overflow for a large F.
  EXPECT_EQ(DotInteractionOutputWidth(100000, 1), 1 + 5000050000LL);
}

TEST(DotInteractionCpuTest, ForwardOrdersPairsByIThenJ) {
  // dim 1 makes each dot a product: T = [2; 3; 5; 7].
  const Shape s{1, 3, 1};
  const Inputs in{{2.0f}, {3.0f, 5.0f, 7.0f}};
  EXPECT_EQ(Forward(in, s, ExecContext()),
            (std::vector<float>{2, 3 * 2, 5 * 2, 5 * 3, 7 * 2, 7 * 3, 7 * 5}));
}

TEST(DotInteractionCpuTest, ForwardMatchesReference) {
  uint64_t seed = 1;
  for (const Shape& s : kShapes) {
    const Inputs in = MakeInputs(s, seed += 2);
    EXPECT_TRUE(AllNear(Forward(in, s, ExecContext()), ReferenceForward(in, s),
                        1e-6 * s.dim, 1e-5))
        << Describe(s);
  }
}

TEST(DotInteractionCpuTest, EveryIsaGivesIdenticalBits) {
  // The loops are built per ISA without FMA contraction: same bits on every
  // vector width, including the M-p1 shape (26 tables, dim 64).
  Shape shapes[std::size(kShapes) + 1];
  std::copy(std::begin(kShapes), std::end(kShapes), shapes);
  shapes[std::size(kShapes)] = {64, 26, 64};
  uint64_t seed = 500;
  for (const Shape& s : shapes) {
    const Inputs in = MakeInputs(s, seed += 3);
    const std::vector<float> go = RandomFloats(
        s.batch * DotInteractionOutputWidth(s.num_sparse, s.dim), seed + 2);
    ExecContext portable;
    portable.isa = CpuIsa::kPortable;
    const std::vector<float> want_out = Forward(in, s, portable);
    const Inputs want = Backward(in, s, go, portable);
    for (CpuIsa isa : SupportedCpuIsas()) {
      ExecContext ctx;
      ctx.isa = isa;
      SCOPED_TRACE(std::string(CpuIsaName(isa)) + " " + Describe(s));
      const std::vector<float> out = Forward(in, s, ctx);
      const Inputs got = Backward(in, s, go, ctx);
      ASSERT_EQ(out.size(), want_out.size());
      EXPECT_EQ(0, std::memcmp(out.data(), want_out.data(), 4 * out.size()));
      EXPECT_EQ(0, std::memcmp(got.dense.data(), want.dense.data(), 4 * got.dense.size()));
      EXPECT_EQ(0, std::memcmp(got.sparse.data(), want.sparse.data(), 4 * got.sparse.size()));
    }
  }
}

// The backward is, for every element, the float sum in a fixed order:
// g's copy (T_0) or 0, then w_ij * T_j for j ascending. The widths with a
// register-held sum (16, 32, 64, 128) and the generic loop (others) must
// both give exactly that, on every ISA.
TEST(DotInteractionCpuTest, BackwardIsTheOrderedSumBitForBit) {
  const Shape shapes[] = {{9, 26, 64}, {5, 8, 16}, {4, 3, 32}, {3, 5, 128}, {6, 4, 48},
                          {2, 3, 7}};
  uint64_t seed = 900;
  for (const Shape& s : shapes) {
    const Inputs in = MakeInputs(s, seed += 3);
    const int64_t width = DotInteractionOutputWidth(s.num_sparse, s.dim);
    const std::vector<float> go = RandomFloats(s.batch * width, seed + 2);
    const int rows = s.num_sparse + 1;
    Inputs want{std::vector<float>(in.dense.size()), std::vector<float>(in.sparse.size())};
    for (int64_t b = 0; b < s.batch; ++b) {
      const float* g = go.data() + b * width;
      for (int i = 0; i < rows; ++i) {
        float* out = i == 0 ? want.dense.data() + b * s.dim
                            : want.sparse.data() + (b * s.num_sparse + i - 1) * s.dim;
        for (int k = 0; k < s.dim; ++k) {
          float acc = i == 0 ? g[k] : 0.0f;
          for (int j = 0; j < rows; ++j) {
            if (j == i) continue;
            const int hi = std::max(i, j), lo = std::min(i, j);
            const float w = g[s.dim + static_cast<int64_t>(hi) * (hi - 1) / 2 + lo];
            const float product = w * TRow(in, s, b, j)[k];
            acc += product;
          }
          out[k] = acc;
        }
      }
    }
    for (CpuIsa isa : SupportedCpuIsas()) {
      ExecContext ctx;
      ctx.isa = isa;
      SCOPED_TRACE(std::string(CpuIsaName(isa)) + " " + Describe(s));
      const Inputs got = Backward(in, s, go, ctx);
      EXPECT_EQ(0, std::memcmp(got.dense.data(), want.dense.data(), 4 * got.dense.size()));
      EXPECT_EQ(0, std::memcmp(got.sparse.data(), want.sparse.data(), 4 * got.sparse.size()));
    }
  }
}

TEST(DotInteractionCpuTest, BackwardMatchesReference) {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    const Inputs in = MakeInputs(s, seed += 3);
    const std::vector<float> go = RandomFloats(
        s.batch * DotInteractionOutputWidth(s.num_sparse, s.dim), seed + 2);
    const Inputs got = Backward(in, s, go, ExecContext());
    const Inputs want = ReferenceBackward(in, s, go);
    const double atol = 1e-6 * (s.num_sparse + 1);
    EXPECT_TRUE(AllNear(got.dense, want.dense, atol, 1e-5)) << Describe(s);
    EXPECT_TRUE(AllNear(got.sparse, want.sparse, atol, 1e-5)) << Describe(s);
  }
}

// Backward against central differences of L = sum_o w_o * output_o through
// the forward kernel. L is linear in each single input element (no T_i is
// dotted with itself), so a large step loses nothing to truncation and
// keeps float rounding small relative to the difference.
TEST(DotInteractionCpuTest, BackwardMatchesFiniteDifferences) {
  constexpr float kStep = 0.125f;
  uint64_t seed = 200;
  for (const Shape& s : {Shape{1, 1, 1}, Shape{3, 4, 7}, Shape{2, 6, 33}}) {
    Inputs in = MakeInputs(s, seed += 3);
    const std::vector<float> w = RandomFloats(
        s.batch * DotInteractionOutputWidth(s.num_sparse, s.dim), seed + 2);
    auto loss = [&](const Inputs& x) {
      const std::vector<float> out = Forward(x, s, ExecContext());
      double l = 0.0;
      for (size_t o = 0; o < out.size(); ++o) {
        l += static_cast<double>(w[o]) * out[o];
      }
      return l;
    };
    auto fd = [&](std::vector<float>& v, size_t e) {
      const float saved = v[e];
      v[e] = saved + kStep;
      const double up = loss(in);
      v[e] = saved - kStep;
      const double down = loss(in);
      v[e] = saved;
      return static_cast<float>((up - down) / (2.0 * kStep));
    };
    const Inputs got = Backward(in, s, w, ExecContext());
    std::vector<float> fd_dense(in.dense.size()), fd_sparse(in.sparse.size());
    for (size_t e = 0; e < fd_dense.size(); ++e) fd_dense[e] = fd(in.dense, e);
    for (size_t e = 0; e < fd_sparse.size(); ++e) {
      fd_sparse[e] = fd(in.sparse, e);
    }
    EXPECT_TRUE(AllNear(got.dense, fd_dense, 1e-3, 1e-3)) << Describe(s);
    EXPECT_TRUE(AllNear(got.sparse, fd_sparse, 1e-3, 1e-3)) << Describe(s);
  }
}

TEST(DotInteractionCpuTest, ThreadPoolGivesIdenticalBits) {
  ThreadPool pool(3);
  ExecContext threaded;
  threaded.pool = &pool;
  // Big enough batches to cut into several tasks.
  const Shape shapes[] = {{2000, 3, 7}, {64, 26, 16}, {1, 5, 33}, {500, 0, 9}};
  uint64_t seed = 300;
  for (const Shape& s : shapes) {
    const Inputs in = MakeInputs(s, seed += 3);
    const std::vector<float> go = RandomFloats(
        s.batch * DotInteractionOutputWidth(s.num_sparse, s.dim), seed + 2);
    EXPECT_EQ(Forward(in, s, ExecContext()), Forward(in, s, threaded))
        << Describe(s);
    const Inputs g1 = Backward(in, s, go, ExecContext());
    const Inputs g3 = Backward(in, s, go, threaded);
    EXPECT_EQ(g1.dense, g3.dense) << Describe(s);
    EXPECT_EQ(g1.sparse, g3.sparse) << Describe(s);
  }
}

TEST(DotInteractionCpuTest, NoSparseFeaturesNeedsNoSparsePointers) {
  const Shape s{2, 0, 3};
  const std::vector<float> dense = {1, 2, 3, 4, 5, 6};
  std::vector<float> out(6), grad_dense(6);
  DotInteractionForwardArgs f;
  f.batch = s.batch;
  f.dim = s.dim;
  f.dense = dense.data();
  f.output = out.data();
  ASSERT_TRUE(DotInteractionForwardCpu(f, ExecContext()).ok());
  EXPECT_EQ(out, dense);
  DotInteractionBackwardArgs b;
  b.batch = s.batch;
  b.dim = s.dim;
  b.dense = dense.data();
  b.grad_output = dense.data();
  b.grad_dense = grad_dense.data();
  ASSERT_TRUE(DotInteractionBackwardCpu(b, ExecContext()).ok());
  EXPECT_EQ(grad_dense, dense);
}

TEST(DotInteractionCpuTest, RejectsBadArguments) {
  std::vector<float> buf(1000);
  auto forward = [&](auto mutate) {
    DotInteractionForwardArgs a;
    a.batch = 2;
    a.num_sparse = 3;
    a.dim = 4;
    a.dense = a.sparse = buf.data();
    a.output = buf.data();
    mutate(a);
    return DotInteractionForwardCpu(a, ExecContext());
  };
  auto backward = [&](auto mutate) {
    DotInteractionBackwardArgs a;
    a.batch = 2;
    a.num_sparse = 3;
    a.dim = 4;
    a.dense = a.sparse = a.grad_output = buf.data();
    a.grad_dense = a.grad_sparse = buf.data();
    mutate(a);
    return DotInteractionBackwardCpu(a, ExecContext());
  };
  using F = DotInteractionForwardArgs;
  using B = DotInteractionBackwardArgs;
  const std::pair<absl::Status, const char*> cases[] = {
      {forward([](F& a) { a.batch = -1; }), "batch=-1"},
      {forward([](F& a) { a.num_sparse = -1; }), "num_sparse=-1"},
      {forward([](F& a) { a.dim = 0; }), "dim=0"},
      {forward([](F& a) { a.dense = nullptr; }), "dense is null"},
      {forward([](F& a) { a.sparse = nullptr; }), "sparse is null"},
      {forward([](F& a) { a.output = nullptr; }), "output is null"},
      {backward([](B& a) { a.batch = -5; }), "batch=-5"},
      {backward([](B& a) { a.dim = -1; }), "dim=-1"},
      {backward([](B& a) { a.dense = nullptr; }), "dense is null"},
      {backward([](B& a) { a.sparse = nullptr; }), "sparse is null"},
      {backward([](B& a) { a.grad_output = nullptr; }), "grad_output is null"},
      {backward([](B& a) { a.grad_dense = nullptr; }), "grad_dense is null"},
      {backward([](B& a) { a.grad_sparse = nullptr; }), "grad_sparse is null"},
  };
  for (const auto& [status, field] : cases) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << field << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(field));
  }
}

}  // namespace
}  // namespace recps::kernels
