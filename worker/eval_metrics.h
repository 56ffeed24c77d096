// Evaluation metrics of a binary classifier: log loss, exact AUC and
// normalised entropy (NE, the log loss divided by the entropy of the base
// rate: below 1 means better than predicting the average CTR).
#ifndef RECPS_WORKER_EVAL_METRICS_H_
#define RECPS_WORKER_EVAL_METRICS_H_

#include <cstdint>

#include "absl/types/span.h"

namespace recps::worker {

struct EvalMetrics {
  int64_t samples = 0;
  double log_loss = 0;
  double auc = 0.5;  // 0.5 when only one class is present
  double ne = 0;
  double positive_rate = 0;
};

// `probabilities` in (0, 1) (clamped to [1e-7, 1 - 1e-7] for the log loss),
// `labels` 0 or 1, same length. AUC is exact: scores are sorted and tied
// scores share their average rank (the Mann-Whitney statistic).
EvalMetrics ComputeEvalMetrics(absl::Span<const float> probabilities,
                               absl::Span<const float> labels);

}  // namespace recps::worker

#endif  // RECPS_WORKER_EVAL_METRICS_H_
