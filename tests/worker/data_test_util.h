// Helpers shared by the data reader tests.
#ifndef RECPS_TESTS_WORKER_DATA_TEST_UTIL_H_
#define RECPS_TESTS_WORKER_DATA_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/batch.h"

namespace recps::worker::data_testing {

// Sample i of a batch as plain values, to compare samples across batches.
struct Sample {
  std::vector<float> dense;
  float label;
  std::vector<std::vector<int64_t>> bags;
  bool operator==(const Sample& o) const {
    return dense == o.dense && label == o.label && bags == o.bags;
  }
};

inline Sample SampleOf(const Batch& b, int64_t i) {
  Sample s;
  s.dense.assign(b.dense.begin() + i * b.num_dense,
                 b.dense.begin() + (i + 1) * b.num_dense);
  s.label = b.labels[i];
  for (int f = 0; f < b.num_sparse(); ++f) {
    s.bags.emplace_back(b.ids[f].begin() + b.offsets[f][i],
                        b.ids[f].begin() + b.offsets[f][i + 1]);
  }
  return s;
}

inline void ExpectBatchEq(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.num_dense, b.num_dense);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.offsets, b.offsets);
}

// Checks the shape invariants every source promises.
inline void ExpectWellFormed(const Batch& b) {
  ASSERT_EQ(b.dense.size(), static_cast<size_t>(b.size * b.num_dense));
  ASSERT_EQ(b.labels.size(), static_cast<size_t>(b.size));
  ASSERT_EQ(b.offsets.size(), b.ids.size());
  for (int f = 0; f < b.num_sparse(); ++f) {
    ASSERT_EQ(b.offsets[f].size(), static_cast<size_t>(b.size + 1));
    EXPECT_EQ(b.offsets[f].front(), 0);
    EXPECT_EQ(b.offsets[f].back(), static_cast<int64_t>(b.ids[f].size()));
    EXPECT_TRUE(std::is_sorted(b.offsets[f].begin(), b.offsets[f].end()));
  }
}

// Area under the ROC curve of `scores` for 0/1 `labels`, ties counted half.
inline double Auc(const std::vector<double>& scores,
                  const std::vector<float>& labels) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double positives = 0, rank_sum = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double mid_rank = (i + j + 1) / 2.0;  // 1-based average rank
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        positives += 1;
        rank_sum += mid_rank;
      }
    }
    i = j;
  }
  const double negatives = static_cast<double>(scores.size()) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

}  // namespace recps::worker::data_testing

#endif  // RECPS_TESTS_WORKER_DATA_TEST_UTIL_H_
