#include "kernels/loss.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace recps::kernels {
namespace {

using ::recps::kernels::testing::AllNear;
using ::recps::kernels::testing::RandomFloats;
using ::testing::HasSubstr;

struct Result {
  float loss = 0.0f;
  std::vector<float> probabilities, grad_logits;
};

Result RunBce(const std::vector<float>& logits,
              const std::vector<float>& labels, const ExecContext& ctx) {
  Result r;
  r.probabilities.assign(logits.size(), -1.0f);
  r.grad_logits.assign(logits.size(), -1.0f);
  SigmoidBceArgs a;
  a.n = static_cast<int64_t>(logits.size());
  a.logits = logits.data();
  a.labels = labels.data();
  a.loss = &r.loss;
  a.probabilities = r.probabilities.data();
  a.grad_logits = r.grad_logits.data();
  const absl::Status s = SigmoidBceCpu(a, ctx);
  EXPECT_TRUE(s.ok()) << s;
  return r;
}

// Straight from the definitions, in double: -y log p - (1 - y) log(1 - p)
// with log p and log(1 - p) taken as -log1p(exp(-x)) and -log1p(exp(x)).
struct Reference {
  double loss = 0.0;
  std::vector<float> probabilities, grad_logits;
};

Reference ReferenceBce(const std::vector<float>& logits,
                       const std::vector<float>& labels) {
  Reference r;
  const double n = static_cast<double>(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const double x = logits[i], y = labels[i];
    const double p = 1.0 / (1.0 + std::exp(-x));
    const double log_p = -std::log1p(std::exp(-x));
    const double log_1mp = -std::log1p(std::exp(x));
    r.loss += -y * log_p - (1.0 - y) * log_1mp;
    r.probabilities.push_back(static_cast<float>(p));
    r.grad_logits.push_back(static_cast<float>((p - y) / n));
  }
  r.loss /= n;
  return r;
}

std::vector<float> Labels(size_t n, uint64_t seed, bool fractional) {
  std::vector<float> y = RandomFloats(n, seed, 0.0f, 1.0f);
  if (!fractional) {
    for (float& v : y) v = v < 0.5f ? 0.0f : 1.0f;
  }
  return y;
}

void ExpectMatchesReference(const std::vector<float>& logits,
                            const std::vector<float>& labels,
                            const std::string& what) {
  const Result got = RunBce(logits, labels, ExecContext());
  const Reference want = ReferenceBce(logits, labels);
  EXPECT_NEAR(got.loss, want.loss, 1e-6 * std::fabs(want.loss) + 1e-7) << what;
  EXPECT_TRUE(AllNear(got.probabilities, want.probabilities, 1e-7, 1e-6))
      << what;
  const double grad_atol = 2e-7 / static_cast<double>(logits.size());
  EXPECT_TRUE(AllNear(got.grad_logits, want.grad_logits, grad_atol, 1e-5))
      << what;
}

TEST(SigmoidBceCpuTest, MatchesReference) {
  uint64_t seed = 1;
  for (size_t n : {1, 7, 33, 4096, 10000}) {
    for (bool fractional : {false, true}) {
      const std::vector<float> logits = RandomFloats(n, ++seed, -8.0f, 8.0f);
      ExpectMatchesReference(logits, Labels(n, ++seed, fractional),
                             "n=" + std::to_string(n) +
                                 " fractional=" + std::to_string(fractional));
    }
  }
}

TEST(SigmoidBceCpuTest, ExtremeLogitsStayFinite) {
  const std::vector<float> logits = {100.0f, -100.0f, 100.0f, -100.0f,
                                     1e4f,   -1e4f,   88.0f,  -88.0f,
                                     3e38f,  -3e38f,  0.0f,   -0.0f};
  const std::vector<float> labels = {1.0f, 0.0f, 0.0f, 1.0f, 0.5f, 0.25f,
                                     1.0f, 1.0f, 0.0f, 1.0f, 1.0f, 0.0f};
  const Result got = RunBce(logits, labels, ExecContext());
  EXPECT_TRUE(std::isfinite(got.loss)) << got.loss;
  for (size_t i = 0; i < logits.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got.probabilities[i])) << "x=" << logits[i];
    EXPECT_TRUE(std::isfinite(got.grad_logits[i])) << "x=" << logits[i];
    EXPECT_GE(got.probabilities[i], 0.0f);
    EXPECT_LE(got.probabilities[i], 1.0f);
  }
  // Confident and right: no loss. Confident and wrong: loss |x|.
  const Result right = RunBce({100.0f, -100.0f}, {1.0f, 0.0f}, ExecContext());
  EXPECT_NEAR(right.loss, 0.0f, 1e-30f);
  const Result wrong = RunBce({100.0f, -100.0f}, {0.0f, 1.0f}, ExecContext());
  EXPECT_FLOAT_EQ(wrong.loss, 100.0f);
  EXPECT_FLOAT_EQ(wrong.grad_logits[0], 0.5f);
  EXPECT_FLOAT_EQ(wrong.grad_logits[1], -0.5f);
  // Within the range the reference handles, match it too.
  ExpectMatchesReference({100.0f, -100.0f, 88.0f, -88.0f, 30.0f, -30.0f},
                         {1.0f, 0.0f, 0.0f, 1.0f, 0.3f, 0.7f}, "extremes");
}

// grad_logits against central differences of the kernel's own mean loss.
TEST(SigmoidBceCpuTest, GradientMatchesFiniteDifferences) {
  constexpr float kStep = 1e-2f;
  uint64_t seed = 50;
  for (size_t n : {1, 5, 33}) {
    for (bool fractional : {false, true}) {
      std::vector<float> logits = RandomFloats(n, ++seed, -4.0f, 4.0f);
      const std::vector<float> labels = Labels(n, ++seed, fractional);
      const Result got = RunBce(logits, labels, ExecContext());
      std::vector<float> fd(n);
      for (size_t i = 0; i < n; ++i) {
        const float saved = logits[i];
        logits[i] = saved + kStep;
        const float up = RunBce(logits, labels, ExecContext()).loss;
        logits[i] = saved - kStep;
        const float down = RunBce(logits, labels, ExecContext()).loss;
        logits[i] = saved;
        fd[i] = static_cast<float>((static_cast<double>(up) - down) /
                                   (2.0 * kStep));
      }
      EXPECT_TRUE(AllNear(got.grad_logits, fd, 2e-5, 1e-3))
          << "n=" << n << " fractional=" << fractional;
    }
  }
}

TEST(SigmoidBceCpuTest, OutputsAreOptional) {
  const std::vector<float> logits = RandomFloats(33, 7, -3.0f, 3.0f);
  const std::vector<float> labels = Labels(33, 8, true);
  const Result all = RunBce(logits, labels, ExecContext());
  for (int mask = 0; mask < 8; ++mask) {
    float loss = -1.0f;
    std::vector<float> p(33, -1.0f), g(33, -1.0f);
    SigmoidBceArgs a;
    a.n = 33;
    a.logits = logits.data();
    a.labels = labels.data();
    a.loss = (mask & 1) ? &loss : nullptr;
    a.probabilities = (mask & 2) ? p.data() : nullptr;
    a.grad_logits = (mask & 4) ? g.data() : nullptr;
    ASSERT_TRUE(SigmoidBceCpu(a, ExecContext()).ok()) << "mask=" << mask;
    EXPECT_EQ(loss, (mask & 1) ? all.loss : -1.0f) << "mask=" << mask;
    EXPECT_EQ(p, (mask & 2) ? all.probabilities : std::vector<float>(33, -1.0f))
        << "mask=" << mask;
    EXPECT_EQ(g, (mask & 4) ? all.grad_logits : std::vector<float>(33, -1.0f))
        << "mask=" << mask;
  }
}

TEST(SigmoidBceCpuTest, ThreadPoolGivesIdenticalBits) {
  ThreadPool pool(3);
  ExecContext threaded;
  threaded.pool = &pool;
  for (size_t n : {1, 33, 20000, 65537}) {
    const std::vector<float> logits = RandomFloats(n, n, -10.0f, 10.0f);
    const std::vector<float> labels = Labels(n, n + 1, true);
    const Result r1 = RunBce(logits, labels, ExecContext());
    const Result r3 = RunBce(logits, labels, threaded);
    EXPECT_EQ(r1.loss, r3.loss) << "n=" << n;
    EXPECT_EQ(r1.probabilities, r3.probabilities) << "n=" << n;
    EXPECT_EQ(r1.grad_logits, r3.grad_logits) << "n=" << n;
  }
}

TEST(SigmoidBceCpuTest, RejectsBadArguments) {
  const std::vector<float> x(4), y(4);
  float loss = 0.0f;
  auto run = [&](auto mutate) {
    SigmoidBceArgs a;
    a.n = 4;
    a.logits = x.data();
    a.labels = y.data();
    a.loss = &loss;
    mutate(a);
    return SigmoidBceCpu(a, ExecContext());
  };
  const std::pair<absl::Status, const char*> cases[] = {
      {run([](SigmoidBceArgs& a) { a.n = 0; }), "got 0"},
      {run([](SigmoidBceArgs& a) { a.n = -3; }), "got -3"},
      {run([](SigmoidBceArgs& a) { a.logits = nullptr; }), "logits is null"},
      {run([](SigmoidBceArgs& a) { a.labels = nullptr; }), "labels is null"},
  };
  for (const auto& [status, field] : cases) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << field << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(field));
  }
}

}  // namespace
}  // namespace recps::kernels
