// How unevenly a quantity spreads over servers: the largest over the mean
// (1.0 is perfectly even). The one definition the rebalance planner and
// `recpsctl status` both report.
#ifndef RECPS_COMMON_IMBALANCE_H_
#define RECPS_COMMON_IMBALANCE_H_

#include <algorithm>
#include <vector>

namespace recps {

// max / mean of `values`; 0 when empty or the mean is not positive.
inline double MaxOverMean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0, max = 0;
  for (double v : values) {
    sum += v;
    max = std::max(max, v);
  }
  const double mean = sum / static_cast<double>(values.size());
  return mean > 0 ? max / mean : 0;
}

}  // namespace recps

#endif  // RECPS_COMMON_IMBALANCE_H_
