#include "worker/eval_metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace recps::worker {

EvalMetrics ComputeEvalMetrics(absl::Span<const float> probabilities,
                               absl::Span<const float> labels) {
  EvalMetrics m;
  const size_t n = std::min(probabilities.size(), labels.size());
  m.samples = static_cast<int64_t>(n);
  if (n == 0) return m;
  double loss = 0, positives = 0;
  for (size_t i = 0; i < n; ++i) {
    const double p = std::clamp<double>(probabilities[i], 1e-7, 1 - 1e-7);
    const double y = labels[i];
    loss -= y * std::log(p) + (1 - y) * std::log(1 - p);
    positives += y;
  }
  m.log_loss = loss / n;
  m.positive_rate = positives / n;
  const double r = std::clamp(m.positive_rate, 1e-7, 1 - 1e-7);
  const double base_entropy = -(r * std::log(r) + (1 - r) * std::log(1 - r));
  m.ne = m.log_loss / base_entropy;

  // AUC = (sum of positive ranks - P(P+1)/2) / (P * N), ranks 1-based with
  // ties averaged.
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return probabilities[a] < probabilities[b];
  });
  double positive_rank_sum = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && probabilities[order[j]] == probabilities[order[i]]) ++j;
    const double average_rank = (i + 1 + j) / 2.0;  // ranks i+1 .. j
    for (size_t k = i; k < j; ++k) positive_rank_sum += labels[order[k]] * average_rank;
    i = j;
  }
  const double negatives = n - positives;
  if (positives > 0 && negatives > 0) {
    m.auc = (positive_rank_sum - positives * (positives + 1) / 2) /
            (positives * negatives);
  }
  return m;
}

}  // namespace recps::worker
