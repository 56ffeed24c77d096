#include "worker/data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/data_test_util.h"
#include "worker/data/batch.h"

namespace recps::worker {
namespace {

using ::recps::worker::data_testing::Auc;
using ::recps::worker::data_testing::ExpectBatchEq;
using ::recps::worker::data_testing::ExpectWellFormed;
using ::recps::worker::data_testing::SampleOf;

SyntheticConfig SmallConfig(uint64_t seed) {
  SyntheticConfig config;
  config.seed = seed;
  config.num_dense = 4;
  config.features = {{1000, 1.05, 1, 1}, {64, 0.8, 0, 3}, {1 << 20, 1.2, 1, 2}};
  return config;
}

// Counts of each id of feature 0 over `samples` samples, one id per bag.
std::map<int64_t, int64_t> CountIds(const SyntheticConfig& config,
                                    int64_t samples) {
  auto source = MakeSyntheticSource(config, 0, 1, 1000, samples / 1000);
  std::map<int64_t, int64_t> counts;
  Batch batch;
  while (*source->Next(&batch)) {
    for (int64_t id : batch.ids[0]) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, config.features[0].id_space);
      ++counts[id];
    }
  }
  return counts;
}

// The two largest counts, descending.
std::vector<int64_t> TopTwo(const std::map<int64_t, int64_t>& counts) {
  std::vector<int64_t> c;
  for (const auto& [id, n] : counts) c.push_back(n);
  std::sort(c.rbegin(), c.rend());
  c.resize(2);
  return c;
}

double Harmonic(int64_t n, double s) {
  double h = 0;
  for (int64_t r = n; r >= 1; --r) h += std::pow(static_cast<double>(r), -s);
  return h;
}

TEST(SyntheticSource, SameSeedGivesSameBatches) {
  auto a = MakeSyntheticSource(SmallConfig(7), 0, 1, 64, 5);
  auto b = MakeSyntheticSource(SmallConfig(7), 0, 1, 64, 5);
  auto other = MakeSyntheticSource(SmallConfig(8), 0, 1, 64, 5);
  Batch x, y, z;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(*a->Next(&x));
    ASSERT_TRUE(*b->Next(&y));
    ASSERT_TRUE(*other->Next(&z));
    ExpectWellFormed(x);
    ExpectBatchEq(x, y);
    EXPECT_NE(x.dense, z.dense);
  }
  EXPECT_FALSE(*a->Next(&x));
  EXPECT_FALSE(*a->Next(&x));  // and stays at the end
}

TEST(SyntheticSource, RanksTogetherReadWhatOneReaderReads) {
  const int64_t kBatch = 16;
  for (int world : {2, 3}) {
    auto whole = MakeSyntheticSource(SmallConfig(3), 0, 1, world * kBatch, 4);
    std::vector<std::unique_ptr<BatchSource>> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(MakeSyntheticSource(SmallConfig(3), r, world, kBatch, 4));
    }
    Batch all, part;
    for (int b = 0; b < 4; ++b) {
      ASSERT_TRUE(*whole->Next(&all));
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(*ranks[r]->Next(&part));
        ASSERT_EQ(part.size, kBatch);
        for (int64_t i = 0; i < kBatch; ++i) {
          EXPECT_TRUE(SampleOf(part, i) == SampleOf(all, r * kBatch + i))
              << "world " << world << " batch " << b << " rank " << r;
        }
      }
    }
  }
}

TEST(SyntheticSource, BagSizesAndDenseCounts) {
  auto source = MakeSyntheticSource(SmallConfig(5), 0, 1, 500, 2);
  Batch batch;
  int empty_bags = 0;
  while (*source->Next(&batch)) {
    ExpectWellFormed(batch);
    for (int64_t i = 0; i < batch.size; ++i) {
      EXPECT_EQ(batch.offsets[0][i + 1] - batch.offsets[0][i], 1);
      const int64_t n1 = batch.offsets[1][i + 1] - batch.offsets[1][i];
      EXPECT_LE(n1, 3);
      empty_bags += n1 == 0;
      const int64_t n2 = batch.offsets[2][i + 1] - batch.offsets[2][i];
      EXPECT_TRUE(n2 == 1 || n2 == 2);
      EXPECT_TRUE(batch.labels[i] == 0.0f || batch.labels[i] == 1.0f);
    }
    // Dense values are log(1 + k) of non-negative integer counts.
    for (float x : batch.dense) {
      const double k = std::expm1(static_cast<double>(x));
      EXPECT_GE(k, 0);
      EXPECT_NEAR(k, std::round(k), 1e-3 * std::max(1.0, k));
    }
  }
  EXPECT_GT(empty_bags, 100);  // about a quarter of 1000
}

TEST(SyntheticSource, ZipfSkewFromTable) {
  SyntheticConfig config;
  config.features = {{1000, 1.05, 1, 1}};
  const int64_t kSamples = 200000;
  const std::map<int64_t, int64_t> counts = CountIds(config, kSamples);
  // Not a power of two: rank r is id r.
  EXPECT_EQ(counts.begin()->first, 0);
  const double h = Harmonic(1000, 1.05);
  EXPECT_NEAR(counts.at(0) / double(kSamples), 1 / h, 0.05 / h);
  // Within 5% and 15% of the expected frequencies of ranks 1 and 9.
  EXPECT_NEAR(counts.at(1) / double(kSamples), std::pow(2, -1.05) / h,
              0.05 * std::pow(2, -1.05) / h);
  EXPECT_NEAR(counts.at(9) / double(kSamples), std::pow(10, -1.05) / h,
              0.15 * std::pow(10, -1.05) / h);
}

TEST(SyntheticSource, ZipfSkewFromRejectionInversion) {
  // Above the table size, in a power-of-two space: hot ids are spread out.
  SyntheticConfig config;
  const int64_t kSpace = int64_t{1} << 24;
  config.features = {{kSpace, 1.05, 1, 1}};
  const int64_t kSamples = 200000;
  const std::map<int64_t, int64_t> counts = CountIds(config, kSamples);
  const std::vector<int64_t> top = TopTwo(counts);
  const double h = Harmonic(kSpace, 1.05);
  EXPECT_NEAR(top[0] / double(kSamples), 1 / h, 0.06 / h);
  EXPECT_NEAR(top[1] / double(kSamples), std::pow(2, -1.05) / h, 0.08 / h);
  // A heavy tail: many distinct ids.
  EXPECT_GT(counts.size(), 30000u);

  // Exponent 0 is uniform.
  config.features = {{kSpace, 0.0, 1, 1}};
  const std::vector<int64_t> flat = TopTwo(CountIds(config, 20000));
  EXPECT_LE(flat[0], 3);
}

TEST(SyntheticSource, LabelsAreBalancedAndPredictable) {
  for (uint64_t seed : {1, 2}) {
    for (const SyntheticConfig& config :
         {CriteoLikeSyntheticConfig(seed, 100000), SmallConfig(seed)}) {
      auto source = MakeSyntheticSource(config, 0, 1, 20000, 1);
      Batch batch;
      ASSERT_TRUE(*source->Next(&batch));
      double positives = 0;
      for (float y : batch.labels) positives += y;
      const double rate = positives / batch.size;
      EXPECT_GT(rate, 0.2);
      EXPECT_LT(rate, 0.5);
      const std::vector<double> logits = SyntheticHiddenLogits(config, batch);
      const double auc = Auc(logits, batch.labels);
      EXPECT_GE(auc, 0.75) << "seed " << seed;
      EXPECT_LE(auc, 0.88) << "seed " << seed;
      // A constant predictor has no skill.
      EXPECT_EQ(Auc(std::vector<double>(batch.size, 0.3), batch.labels), 0.5);
    }
  }
}

TEST(SyntheticSource, UninformativeFeaturesCarryNoSignal) {
  SyntheticConfig config = SmallConfig(9);
  config.num_dense = 0;
  config.informative_features = 0;
  config.label_noise = 0;
  auto source = MakeSyntheticSource(config, 0, 1, 5000, 1);
  Batch batch;
  ASSERT_TRUE(*source->Next(&batch));
  const std::vector<double> logits = SyntheticHiddenLogits(config, batch);
  for (double z : logits) EXPECT_EQ(z, logits[0]);  // the bias alone
}

// The job's data.synthetic, field by field, as recps-worker reads it.
TEST(SyntheticSource, ToSyntheticConfigCopiesEveryField) {
  v1::SyntheticDataConfig s;
  s.set_seed(42);
  s.set_num_dense(7);
  s.set_label_noise(0.25);
  s.set_informative_features(1);
  v1::SyntheticFeatureConfig* f = s.add_features();
  f->set_id_space(500);
  f->set_zipf_exponent(0.9);
  f->set_min_ids_per_bag(0);
  f->set_max_ids_per_bag(4);
  f = s.add_features();
  f->set_id_space(3);
  f->set_zipf_exponent(0);
  f->set_min_ids_per_bag(2);
  f->set_max_ids_per_bag(2);
  const SyntheticConfig c = ToSyntheticConfig(s);
  EXPECT_EQ(c.seed, 42u);
  EXPECT_EQ(c.num_dense, 7);
  EXPECT_EQ(c.label_noise, 0.25);
  EXPECT_EQ(c.informative_features, 1);
  EXPECT_EQ(c.first_sample, 0);
  ASSERT_EQ(c.features.size(), 2u);
  EXPECT_EQ(c.features[0].id_space, 500);
  EXPECT_EQ(c.features[0].zipf_exponent, 0.9);
  EXPECT_EQ(c.features[0].min_ids_per_bag, 0);
  EXPECT_EQ(c.features[0].max_ids_per_bag, 4);
  EXPECT_EQ(c.features[1].id_space, 3);
  EXPECT_EQ(c.features[1].zipf_exponent, 0);
  EXPECT_EQ(c.features[1].min_ids_per_bag, 2);
  EXPECT_EQ(c.features[1].max_ids_per_bag, 2);
}

}  // namespace
}  // namespace recps::worker
