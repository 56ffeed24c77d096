#include "kernels/dense_layer.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
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
  int64_t batch, n;
};

const Shape kShapes[] = {{1, 1},  {1, 7},   {7, 1},    {7, 33},
                         {33, 7}, {33, 33}, {5, 1000}, {257, 3}};

std::vector<float> Forward(std::vector<float> y, const std::vector<float>& bias,
                           int64_t batch, int64_t n, bool relu,
                           const ExecContext& ctx) {
  BiasActivationForwardArgs a;
  a.y = y.data();
  a.bias = bias.data();
  a.batch = batch;
  a.n = n;
  a.relu = relu;
  const absl::Status s = BiasActivationForwardCpu(a, ctx);
  EXPECT_TRUE(s.ok()) << s;
  return y;
}

struct Grads {
  std::vector<float> dx;  // dy after the in-place masking
  std::vector<float> grad_bias;
};

Grads Backward(const std::vector<float>& y, std::vector<float> dy,
               int64_t batch, int64_t n, bool relu, const ExecContext& ctx) {
  std::vector<float> grad_bias(n, std::numeric_limits<float>::quiet_NaN());
  BiasActivationBackwardArgs a;
  a.y = y.data();
  a.dy = dy.data();
  a.grad_bias = grad_bias.data();
  a.batch = batch;
  a.n = n;
  a.relu = relu;
  const absl::Status s = BiasActivationBackwardCpu(a, ctx);
  EXPECT_TRUE(s.ok()) << s;
  return {std::move(dy), std::move(grad_bias)};
}

TEST(BiasActivationCpuTest, ForwardMatchesReference) {
  uint64_t seed = 10;
  for (const Shape& s : kShapes) {
    for (bool relu : {false, true}) {
      const std::vector<float> x = RandomFloats(s.batch * s.n, ++seed);
      const std::vector<float> bias = RandomFloats(s.n, ++seed);
      std::vector<float> want(x.size());
      for (int64_t i = 0; i < s.batch; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          const double v = static_cast<double>(x[i * s.n + j]) + bias[j];
          want[i * s.n + j] = static_cast<float>(relu ? std::max(v, 0.0) : v);
        }
      }
      // One float add per element, rounded once: exact.
      EXPECT_TRUE(AllNear(Forward(x, bias, s.batch, s.n, relu, ExecContext()),
                          want, 0.0))
          << "batch=" << s.batch << " n=" << s.n << " relu=" << relu;
    }
  }
}

TEST(BiasActivationCpuTest, ForwardReluKeepsNaN) {
  const std::vector<float> y = {std::numeric_limits<float>::quiet_NaN(), -1.0f};
  const std::vector<float> out =
      Forward(y, {0.0f, 0.5f}, 1, 2, /*relu=*/true, ExecContext());
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], 0.0f);
}

TEST(BiasActivationCpuTest, BackwardMatchesReference) {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    for (bool relu : {false, true}) {
      // y as the forward leaves it: ReLU output has exact zeros.
      std::vector<float> y = RandomFloats(s.batch * s.n, ++seed);
      if (relu) {
        for (float& v : y) v = std::max(v, 0.0f);
      }
      const std::vector<float> dy = RandomFloats(y.size(), ++seed);
      std::vector<float> want_dx(y.size());
      std::vector<double> sum(s.n, 0.0);
      for (int64_t i = 0; i < s.batch; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          const int64_t e = i * s.n + j;
          want_dx[e] = (!relu || y[e] > 0.0f) ? dy[e] : 0.0f;
          sum[j] += want_dx[e];
        }
      }
      const std::vector<float> want_bias(sum.begin(), sum.end());
      const Grads got = Backward(y, dy, s.batch, s.n, relu, ExecContext());
      EXPECT_TRUE(AllNear(got.dx, want_dx, 0.0))
          << "batch=" << s.batch << " n=" << s.n << " relu=" << relu;
      EXPECT_TRUE(AllNear(got.grad_bias, want_bias, 2e-6 * s.batch, 1e-6))
          << "batch=" << s.batch << " n=" << s.n << " relu=" << relu;
    }
  }
}

// Backward against central differences of L = sum_ij w_ij * y_ij through the
// forward kernel, for both the bias and the pre-activation input.
TEST(BiasActivationCpuTest, BackwardMatchesFiniteDifferences) {
  constexpr float kStep = 1e-2f;
  uint64_t seed = 200;
  for (const Shape& s : {Shape{1, 7}, Shape{7, 1}, Shape{5, 33}}) {
    for (bool relu : {false, true}) {
      std::vector<float> x = RandomFloats(s.batch * s.n, ++seed);
      const std::vector<float> bias = RandomFloats(s.n, ++seed);
      // Keep every pre-activation at least 4 steps from the ReLU kink.
      for (int64_t i = 0; i < s.batch; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          float& v = x[i * s.n + j];
          if (std::fabs(v + bias[j]) < 4 * kStep) v += 10 * kStep;
        }
      }
      const std::vector<float> w = RandomFloats(x.size(), ++seed);
      auto loss = [&](const std::vector<float>& xs,
                      const std::vector<float>& bs) {
        const std::vector<float> y =
            Forward(xs, bs, s.batch, s.n, relu, ExecContext());
        double l = 0.0;
        for (size_t e = 0; e < y.size(); ++e)
          l += static_cast<double>(w[e]) * y[e];
        return l;
      };
      const std::vector<float> y =
          Forward(x, bias, s.batch, s.n, relu, ExecContext());
      const Grads got = Backward(y, w, s.batch, s.n, relu, ExecContext());

      std::vector<float> fd_bias(s.n);
      for (int64_t j = 0; j < s.n; ++j) {
        std::vector<float> up = bias, down = bias;
        up[j] += kStep;
        down[j] -= kStep;
        fd_bias[j] = static_cast<float>((loss(x, up) - loss(x, down)) /
                                        (static_cast<double>(up[j]) - down[j]));
      }
      std::vector<float> fd_x(x.size());
      for (size_t e = 0; e < x.size(); ++e) {
        std::vector<float> up = x, down = x;
        up[e] += kStep;
        down[e] -= kStep;
        fd_x[e] = static_cast<float>((loss(up, bias) - loss(down, bias)) /
                                     (static_cast<double>(up[e]) - down[e]));
      }
      EXPECT_TRUE(AllNear(got.grad_bias, fd_bias, 1e-3, 1e-3))
          << "batch=" << s.batch << " n=" << s.n << " relu=" << relu;
      EXPECT_TRUE(AllNear(got.dx, fd_x, 1e-3, 1e-3))
          << "batch=" << s.batch << " n=" << s.n << " relu=" << relu;
    }
  }
}

TEST(BiasActivationCpuTest, ThreadPoolGivesIdenticalBits) {
  ThreadPool pool(3);
  ExecContext threaded;
  threaded.pool = &pool;
  // Shapes that cut into several tasks and several backward row blocks.
  const Shape shapes[] = {{3000, 33}, {100000, 1}, {200, 1000}, {1, 7}};
  uint64_t seed = 300;
  for (const Shape& s : shapes) {
    for (bool relu : {false, true}) {
      const std::vector<float> x = RandomFloats(s.batch * s.n, ++seed);
      const std::vector<float> bias = RandomFloats(s.n, ++seed);
      const std::vector<float> dy = RandomFloats(x.size(), ++seed);
      const std::vector<float> y1 =
          Forward(x, bias, s.batch, s.n, relu, ExecContext());
      const std::vector<float> y3 =
          Forward(x, bias, s.batch, s.n, relu, threaded);
      EXPECT_EQ(y1, y3) << "batch=" << s.batch << " n=" << s.n;
      const Grads g1 = Backward(y1, dy, s.batch, s.n, relu, ExecContext());
      const Grads g3 = Backward(y1, dy, s.batch, s.n, relu, threaded);
      EXPECT_EQ(g1.dx, g3.dx) << "batch=" << s.batch << " n=" << s.n;
      EXPECT_EQ(g1.grad_bias, g3.grad_bias)
          << "batch=" << s.batch << " n=" << s.n;
    }
  }
}

TEST(BiasActivationCpuTest, EveryIsaGivesIdenticalBits) {
  const Shape shapes[] = {{3000, 33}, {200, 1000}, {2048, 512}, {7, 1}};
  uint64_t seed = 700;
  for (const Shape& s : shapes) {
    for (bool relu : {false, true}) {
      const std::vector<float> x = RandomFloats(s.batch * s.n, ++seed);
      const std::vector<float> bias = RandomFloats(s.n, ++seed);
      const std::vector<float> dy = RandomFloats(x.size(), ++seed);
      ExecContext portable;
      portable.isa = CpuIsa::kPortable;
      const std::vector<float> y0 = Forward(x, bias, s.batch, s.n, relu, portable);
      const Grads g0 = Backward(y0, dy, s.batch, s.n, relu, portable);
      for (CpuIsa isa : SupportedCpuIsas()) {
        ExecContext ctx;
        ctx.isa = isa;
        SCOPED_TRACE(std::string(CpuIsaName(isa)) + " batch=" + std::to_string(s.batch) +
                     " n=" + std::to_string(s.n) + " relu=" + std::to_string(relu));
        EXPECT_EQ(Forward(x, bias, s.batch, s.n, relu, ctx), y0);
        const Grads g = Backward(y0, dy, s.batch, s.n, relu, ctx);
        EXPECT_EQ(g.dx, g0.dx);
        EXPECT_EQ(g.grad_bias, g0.grad_bias);
      }
    }
  }
}

TEST(BiasActivationCpuTest, EmptyBatchZeroesGradBias) {
  std::vector<float> grad_bias(5, 7.0f);
  BiasActivationBackwardArgs a;
  a.grad_bias = grad_bias.data();
  a.batch = 0;
  a.n = 5;
  ASSERT_TRUE(BiasActivationBackwardCpu(a, ExecContext()).ok());
  EXPECT_EQ(grad_bias, std::vector<float>(5, 0.0f));

  BiasActivationForwardArgs f;
  f.batch = 0;
  f.n = 5;
  EXPECT_TRUE(BiasActivationForwardCpu(f, ExecContext()).ok());
}

TEST(BiasActivationCpuTest, BackwardWithoutReluNeedsNoY) {
  std::vector<float> dy = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<float> grad_bias(2);
  BiasActivationBackwardArgs a;
  a.dy = dy.data();
  a.grad_bias = grad_bias.data();
  a.batch = 2;
  a.n = 2;
  a.relu = false;
  ASSERT_TRUE(BiasActivationBackwardCpu(a, ExecContext()).ok());
  EXPECT_EQ(grad_bias, (std::vector<float>{4.0f, 6.0f}));
}

TEST(BiasActivationCpuTest, RejectsBadArguments) {
  std::vector<float> buf(12), bias(4), grad_bias(4);
  auto forward = [&](auto mutate) {
    BiasActivationForwardArgs a;
    a.y = buf.data();
    a.bias = bias.data();
    a.batch = 3;
    a.n = 4;
    mutate(a);
    return BiasActivationForwardCpu(a, ExecContext());
  };
  auto backward = [&](auto mutate) {
    BiasActivationBackwardArgs a;
    a.y = buf.data();
    a.dy = buf.data();
    a.grad_bias = grad_bias.data();
    a.batch = 3;
    a.n = 4;
    mutate(a);
    return BiasActivationBackwardCpu(a, ExecContext());
  };
  using F = BiasActivationForwardArgs;
  using B = BiasActivationBackwardArgs;
  const std::pair<absl::Status, const char*> cases[] = {
      {forward([](F& a) { a.batch = -1; }), "batch=-1"},
      {forward([](F& a) { a.n = -4; }), "n=-4"},
      {forward([](F& a) { a.y = nullptr; }), "y is null"},
      {forward([](F& a) { a.bias = nullptr; }), "bias is null"},
      {backward([](B& a) { a.batch = -2; }), "batch=-2"},
      {backward([](B& a) { a.n = -1; }), "n=-1"},
      {backward([](B& a) { a.y = nullptr; }), "y is null"},
      {backward([](B& a) { a.dy = nullptr; }), "dy is null"},
      {backward([](B& a) { a.grad_bias = nullptr; }), "grad_bias is null"},
  };
  for (const auto& [status, field] : cases) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << field << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(field));
  }
}

}  // namespace
}  // namespace recps::kernels
