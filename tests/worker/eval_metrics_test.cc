#include "worker/eval_metrics.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace recps::worker {
namespace {

// O(n^2) AUC: the share of (positive, negative) pairs ranked right, ties 1/2.
double PairwiseAuc(const std::vector<float>& p, const std::vector<float>& y) {
  double good = 0, pairs = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    for (size_t j = 0; j < p.size(); ++j) {
      if (y[i] == 1 && y[j] == 0) {
        pairs += 1;
        good += p[i] > p[j] ? 1 : p[i] == p[j] ? 0.5 : 0;
      }
    }
  }
  return good / pairs;
}

TEST(EvalMetrics, AucMatchesThePairwiseDefinitionWithTies) {
  std::mt19937 rng(3);
  std::vector<float> p(500), y(500);
  for (size_t i = 0; i < p.size(); ++i) {
    y[i] = rng() % 3 == 0;
    // Coarse scores give many ties; correlated with the label.
    p[i] = std::round((0.3f * y[i] + (rng() % 1000) / 1000.0f) * 10) / 10;
  }
  EXPECT_NEAR(ComputeEvalMetrics(p, y).auc, PairwiseAuc(p, y), 1e-12);
}

TEST(EvalMetrics, PerfectInvertedAndConstantScores) {
  std::vector<float> y = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(ComputeEvalMetrics(std::vector<float>{0.1f, 0.2f, 0.8f, 0.9f}, y).auc, 1.0);
  EXPECT_DOUBLE_EQ(ComputeEvalMetrics(std::vector<float>{0.9f, 0.8f, 0.2f, 0.1f}, y).auc, 0.0);
  EXPECT_DOUBLE_EQ(ComputeEvalMetrics(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}, y).auc, 0.5);
}

TEST(EvalMetrics, LogLossAndNe) {
  std::vector<float> y = {1, 0, 0, 0};
  // Predicting the base rate 0.25 everywhere gives NE exactly 1.
  EvalMetrics base = ComputeEvalMetrics(std::vector<float>(4, 0.25f), y);
  EXPECT_NEAR(base.ne, 1.0, 1e-6);
  EXPECT_NEAR(base.log_loss, -(0.25 * std::log(0.25) + 0.75 * std::log(0.75)), 1e-6);
  EXPECT_DOUBLE_EQ(base.positive_rate, 0.25);
  EvalMetrics better = ComputeEvalMetrics(std::vector<float>{0.9f, 0.1f, 0.1f, 0.1f}, y);
  EXPECT_LT(better.ne, 1.0);
  // Probabilities of exactly 0 or 1 are clamped: finite loss.
  EvalMetrics extreme = ComputeEvalMetrics(std::vector<float>{0.0f, 1.0f, 0, 0}, y);
  EXPECT_TRUE(std::isfinite(extreme.log_loss));
}

}  // namespace
}  // namespace recps::worker
