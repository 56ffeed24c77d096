// A deterministic synthetic data set with Criteo's shape: non-negative
// integer-like dense counts (log(1+x) transformed), Zipf-distributed sparse
// ids and labels drawn from a hidden model, so a trained model has something
// real to learn (the hidden logit's AUC is about 0.75-0.85; a constant
// predictor gets 0.5).
#ifndef RECPS_WORKER_DATA_SYNTHETIC_H_
#define RECPS_WORKER_DATA_SYNTHETIC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "recps/v1/job.pb.h"
#include "worker/data/batch.h"

namespace recps::worker {

struct SyntheticFeature {
  // Ids lie in [0, id_space). REQUIRES: id_space >= 1.
  int64_t id_space = 1000;
  // P(rank r) ~ 1 / (r + 1)^zipf_exponent; 0 is uniform. Rank r is id r,
  // except for a power-of-two id_space, where ranks are spread over the space
  // by an odd multiplier so hot ids are not all small.
  double zipf_exponent = 1.05;
  // Bag size is uniform in [min, max]; 0 allows empty bags.
  int min_ids_per_bag = 1;
  int max_ids_per_bag = 1;
};

struct SyntheticConfig {
  uint64_t seed = 0;
  int num_dense = 13;
  std::vector<SyntheticFeature> features;
  // Probability that a label drawn from the hidden model is flipped.
  double label_noise = 0.1;
  // The hidden model reads the first this many sparse features; the rest are
  // noise. -1 (or more than there are) means all of them.
  int informative_features = -1;
  // Sample numbers start here: another range of the same distribution and
  // hidden model, e.g. held-out data at 2^40.
  int64_t first_sample = 0;
};

// A Criteo-like shape: 13 dense and 26 sparse features whose id spaces cycle
// through 10 .. 1e6 (capped at max_id_space), one id per bag.
SyntheticConfig CriteoLikeSyntheticConfig(uint64_t seed,
                                          int64_t max_id_space = 1000000);

// The data set a job's data.synthetic describes (every field as given;
// first_sample 0).
SyntheticConfig ToSyntheticConfig(const v1::SyntheticDataConfig& s);

// Batches of `batch_size` samples for `rank` of `world_size` readers. Sample
// number s = batch_index * world_size * batch_size + rank * batch_size + i is
// a pure function of (config, s), so the data set does not depend on how it
// is split: world_size W with batch B reads what 1 reader with batch W * B
// reads. num_batches = -1 is endless, otherwise each rank stops after
// num_batches batches. Next never fails.
// REQUIRES: 0 <= rank < world_size, batch_size >= 1 (out-of-range values
// are clamped).
std::unique_ptr<BatchSource> MakeSyntheticSource(const SyntheticConfig& config,
                                                 int rank, int world_size,
                                                 int64_t batch_size,
                                                 int64_t num_batches);

// The hidden model's logit for each sample of `batch` (made by a synthetic
// source of `config`): the ceiling a trained model can approach, and the
// labels' ground truth in tests.
std::vector<double> SyntheticHiddenLogits(const SyntheticConfig& config,
                                          const Batch& batch);

// Writes up to `num_samples` samples from `source` (all of them when
// num_samples < 0) to `path` as Criteo TSV: label, the dense values as
// integers round(exp(x) - 1) (exact for synthetic counts, so reading the file
// back gives the same floats), and each sparse bag as 8-digit lowercase hex
// ids joined by ',' (empty for an empty bag; Criteo itself has exactly one
// id per field). Errors: the source's, or the file's.
absl::Status WriteCriteoTsv(BatchSource& source, int64_t num_samples,
                            const std::string& path);

}  // namespace recps::worker

#endif  // RECPS_WORKER_DATA_SYNTHETIC_H_
