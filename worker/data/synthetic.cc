#include "worker/data/synthetic.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "worker/data/criteo.h"

namespace recps::worker {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
// Zipf spaces up to this size sample from a CDF table (fastest, 8 bytes per
// id); larger ones use rejection-inversion, which needs no memory.
constexpr int64_t kZipfTableMax = int64_t{1} << 16;
// Dense counts stop here so that round(expm1(float(log1p(k)))) == k: the
// TSV round trip is exact. Counts this large have probability < 1e-200.
constexpr int64_t kMaxDenseCount = 65535;
// Hidden model constants: with 10% label noise the hidden logit's AUC is
// about 0.8 and 30-50% of labels are 1 (the dense part alone gives about
// 0.63).
constexpr double kBias = -1.0;
constexpr double kDenseScale = 1.0;
constexpr double kSparseScale = 2.5;
constexpr double kIdWeightRange = 1.5;

// SplitMix64 started from a sample's key: a counter-based stream, so sample
// s needs nothing from the samples before it.
class SampleRng {
 public:
  explicit SampleRng(uint64_t key) : state_(key) {}
  uint64_t Next() {
    state_ += kGolden;
    return Mix64(state_);
  }
  double Uniform() { return UnitFromBits(Next()); }  // [0, 1)
  static double UnitFromBits(uint64_t bits) {
    return static_cast<double>(bits >> 11) * 0x1.0p-53;
  }

 private:
  uint64_t state_;
};

// Zipf ranks in [0, n) with P(r) ~ (r + 1)^-s.
class ZipfSampler {
 public:
  ZipfSampler(int64_t n, double s)
      : n_(std::max<int64_t>(n, 1)), s_(std::max(s, 0.0)) {
    if (n_ <= kZipfTableMax) {
      cdf_.resize(n_);
      double total = 0;
      for (int64_t r = 0; r < n_; ++r) {
        total += std::pow(static_cast<double>(r + 1), -s_);
        cdf_[r] = total;
      }
      for (double& c : cdf_) c /= total;
      cdf_.back() = 1.0;
    } else {
      h_integral_x1_ = HIntegral(1.5) - 1.0;
      h_integral_n_ = HIntegral(static_cast<double>(n_) + 0.5);
      sv_ = 2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0));
    }
  }

  int64_t Sample(SampleRng& rng) const {
    if (!cdf_.empty()) {
      const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), rng.Uniform());
      return std::min<int64_t>(it - cdf_.begin(), n_ - 1);
    }
    // Hörmann & Derflinger, "Rejection-inversion to generate variates from
    // monotone discrete distributions" (1996), as in Apache Commons RNG.
    while (true) {
      const double u =
          h_integral_n_ + rng.Uniform() * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      const double k =
          std::clamp(std::floor(x + 0.5), 1.0, static_cast<double>(n_));
      if (k - x <= sv_ || u >= HIntegral(k + 0.5) - H(k)) {
        return static_cast<int64_t>(k) - 1;
      }
    }
  }

 private:
  double H(double x) const { return std::exp(-s_ * std::log(x)); }
  double HIntegral(double x) const {
    const double log_x = std::log(x);
    return Helper2((1.0 - s_) * log_x) * log_x;
  }
  double HIntegralInverse(double x) const {
    return std::exp(Helper1(std::max(x * (1.0 - s_), -1.0)) * x);
  }
  // log(1 + x) / x and (exp(x) - 1) / x, accurate near 0 (s close to 1).
  static double Helper1(double x) {
    return std::abs(x) > 1e-8 ? std::log1p(x) / x
                              : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  static double Helper2(double x) {
    return std::abs(x) > 1e-8
               ? std::expm1(x) / x
               : 1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x));
  }

  int64_t n_;
  double s_;
  std::vector<double> cdf_;  // when n_ <= kZipfTableMax
  double h_integral_x1_ = 0, h_integral_n_ = 0, sv_ = 0;
};

// Dense feature j is a geometric count with this mean: 0.5 .. 128.
double DenseMeanCount(int j) { return 0.5 * std::pow(4.0, j % 5); }

int NumInformative(const SyntheticConfig& config) {
  const int f = static_cast<int>(config.features.size());
  return config.informative_features < 0
             ? f
             : std::min(config.informative_features, f);
}

// The hidden model behind the labels. Every term is standardised, so the
// logit's spread, and with it the AUC, hardly depends on the config.
class HiddenModel {
 public:
  explicit HiddenModel(const SyntheticConfig& config)
      : key_(Mix64(config.seed ^ 0x68696464656eULL)) {
    const int d = std::max(config.num_dense, 0);
    for (int j = 0; j < d; ++j) {
      const double w = 2 * SampleRng::UnitFromBits(Mix64(key_ + j)) - 1;
      dense_weight_.push_back(kDenseScale * w / std::sqrt(d));
      // Mean and spread of float(log1p(k)) under the truncated geometric.
      const double p = 1.0 / (1.0 + DenseMeanCount(j));
      double pk = p, m1 = 0, m2 = 0;
      for (int64_t k = 0; k <= kMaxDenseCount && pk > 1e-18; ++k) {
        const double v = CriteoDenseTransform(static_cast<double>(k));
        m1 += pk * v;
        m2 += pk * v * v;
        pk *= 1 - p;
      }
      dense_mean_.push_back(m1);
      dense_inv_sd_.push_back(1.0 / std::sqrt(std::max(m2 - m1 * m1, 1e-12)));
    }
    const int informative = NumInformative(config);
    for (int f = 0; f < informative; ++f) {
      // A bag mean of n ids has 1/n the variance of one id: scale by
      // 1 / sqrt(E[1/n]) so every informative feature weighs the same.
      const SyntheticFeature& feature = config.features[f];
      double inv_n = 0;
      int sizes = 0;
      for (int n = std::max(feature.min_ids_per_bag, 1);
           n <= feature.max_ids_per_bag; ++n, ++sizes) {
        inv_n += 1.0 / n;
      }
      const double scale = sizes == 0 ? 0 : 1.0 / std::sqrt(inv_n / sizes);
      bag_scale_.push_back(kSparseScale * scale / std::sqrt(informative));
    }
  }

  double Logit(const Batch& batch, int64_t i) const {
    double z = kBias;
    const float* dense = batch.dense.data() + i * batch.num_dense;
    for (size_t j = 0; j < dense_weight_.size(); ++j) {
      z += dense_weight_[j] * (dense[j] - dense_mean_[j]) * dense_inv_sd_[j];
    }
    for (size_t f = 0; f < bag_scale_.size(); ++f) {
      const int64_t begin = batch.offsets[f][i], end = batch.offsets[f][i + 1];
      if (begin == end) continue;
      double sum = 0;
      for (int64_t k = begin; k < end; ++k) sum += IdWeight(f, batch.ids[f][k]);
      z += bag_scale_[f] * sum / static_cast<double>(end - begin);
    }
    return z;
  }

 private:
  // g(f, id), uniform in [-kIdWeightRange, kIdWeightRange].
  double IdWeight(size_t f, int64_t id) const {
    const uint64_t h =
        Mix64(key_ ^ Mix64(static_cast<uint64_t>(id) + (f + 1) * kGolden));
    return (2 * SampleRng::UnitFromBits(h) - 1) * kIdWeightRange;
  }

  uint64_t key_;
  std::vector<double> dense_weight_, dense_mean_, dense_inv_sd_;
  std::vector<double> bag_scale_;  // per informative feature
};

struct FeatureGen {
  ZipfSampler zipf;
  uint64_t mask;    // id_space - 1 for a power-of-two space, else 0
  uint64_t offset;  // added to the scrambled rank in that case
  int min_bag, max_bag;
};

class SyntheticSource : public BatchSource {
 public:
  SyntheticSource(const SyntheticConfig& config, int rank, int world_size,
                  int64_t batch_size, int64_t num_batches)
      : num_dense_(std::max(config.num_dense, 0)),
        label_noise_(config.label_noise),
        model_(config),
        sample_key_(Mix64(config.seed ^ 0x73616d706c65ULL)),
        world_size_(std::max(world_size, 1)),
        rank_(std::clamp(rank, 0, world_size_ - 1)),
        batch_size_(std::max<int64_t>(batch_size, 1)),
        num_batches_(num_batches),
        first_sample_(static_cast<uint64_t>(config.first_sample)) {
    for (int j = 0; j < num_dense_; ++j) {
      dense_log_q_.push_back(std::log1p(-1.0 / (1.0 + DenseMeanCount(j))));
    }
    for (size_t f = 0; f < config.features.size(); ++f) {
      const SyntheticFeature& c = config.features[f];
      const int64_t n = std::max<int64_t>(c.id_space, 1);
      const bool pow2 = (n & (n - 1)) == 0;
      const int lo = std::max(c.min_ids_per_bag, 0);
      features_.push_back(FeatureGen{ZipfSampler(n, c.zipf_exponent),
                                     pow2 ? static_cast<uint64_t>(n - 1) : 0,
                                     Mix64(config.seed + (f + 1) * kGolden), lo,
                                     std::max(c.max_ids_per_bag, lo)});
    }
  }

  absl::StatusOr<bool> Next(Batch* batch) override {
    if (num_batches_ >= 0 && next_batch_ >= num_batches_) return false;
    ResetBatch(num_dense_, static_cast<int>(features_.size()), batch);
    batch->dense.resize(batch_size_ * num_dense_);
    batch->labels.resize(batch_size_);
    const uint64_t first = first_sample_ + static_cast<uint64_t>(
        (next_batch_ * world_size_ + rank_) * batch_size_);
    for (int64_t i = 0; i < batch_size_; ++i) FillSample(first + i, i, batch);
    batch->size = batch_size_;
    ++next_batch_;
    return true;
  }

  // Every batch is a pure function of its index: skipping is a jump.
  absl::StatusOr<int64_t> Skip(int64_t n) override {
    if (n <= 0) return 0;
    const int64_t left = num_batches_ < 0 ? n : std::max<int64_t>(num_batches_ - next_batch_, 0);
    const int64_t skipped = std::min(n, left);
    next_batch_ += skipped;
    return skipped;
  }

 private:
  void FillSample(uint64_t s, int64_t i, Batch* batch) const {
    SampleRng rng(Mix64(sample_key_ ^ Mix64(s)));
    float* dense = batch->dense.data() + i * num_dense_;
    for (int j = 0; j < num_dense_; ++j) {
      const double k = std::floor(std::log1p(-rng.Uniform()) / dense_log_q_[j]);
      dense[j] = CriteoDenseTransform(
          std::min(k, static_cast<double>(kMaxDenseCount)));
    }
    for (size_t f = 0; f < features_.size(); ++f) {
      const FeatureGen& g = features_[f];
      const int span = g.max_bag - g.min_bag + 1;
      const int n =
          g.min_bag + (span > 1 ? static_cast<int>(rng.Next() % span) : 0);
      std::vector<int64_t>& ids = batch->ids[f];
      for (int t = 0; t < n; ++t) {
        const uint64_t r = static_cast<uint64_t>(g.zipf.Sample(rng));
        ids.push_back(g.mask == 0 ? static_cast<int64_t>(r)
                                  : static_cast<int64_t>(
                                        (r * kGolden + g.offset) & g.mask));
      }
      batch->offsets[f].push_back(static_cast<int64_t>(ids.size()));
    }
    const double p = 1.0 / (1.0 + std::exp(-model_.Logit(*batch, i)));
    bool label = rng.Uniform() < p;
    if (rng.Uniform() < label_noise_) label = !label;
    batch->labels[i] = label ? 1.0f : 0.0f;
  }

  const int num_dense_;
  const double label_noise_;
  const HiddenModel model_;
  const uint64_t sample_key_;
  const int world_size_;
  const int rank_;
  const int64_t batch_size_;
  const int64_t num_batches_;
  const uint64_t first_sample_;
  std::vector<double> dense_log_q_;  // log(1 - p) of each geometric
  std::vector<FeatureGen> features_;
  int64_t next_batch_ = 0;
};

}  // namespace

SyntheticConfig CriteoLikeSyntheticConfig(uint64_t seed, int64_t max_id_space) {
  static constexpr int64_t kSpaces[] = {10, 100, 1000, 10000, 100000, 1000000};
  SyntheticConfig config;
  config.seed = seed;
  config.num_dense = 13;
  config.informative_features = 13;  // half the features carry signal
  for (int f = 0; f < 26; ++f) {
    SyntheticFeature feature;
    feature.id_space = std::clamp<int64_t>(kSpaces[f % 6], 1,
                                           std::max<int64_t>(max_id_space, 1));
    config.features.push_back(feature);
  }
  return config;
}

SyntheticConfig ToSyntheticConfig(const v1::SyntheticDataConfig& s) {
  SyntheticConfig c;
  c.seed = s.seed();
  c.num_dense = s.num_dense();
  for (const v1::SyntheticFeatureConfig& f : s.features()) {
    SyntheticFeature sf;
    sf.id_space = f.id_space();
    sf.zipf_exponent = f.zipf_exponent();
    sf.min_ids_per_bag = f.min_ids_per_bag();
    sf.max_ids_per_bag = f.max_ids_per_bag();
    c.features.push_back(sf);
  }
  c.label_noise = s.label_noise();
  c.informative_features = s.informative_features();
  return c;
}

std::unique_ptr<BatchSource> MakeSyntheticSource(const SyntheticConfig& config,
                                                 int rank, int world_size,
                                                 int64_t batch_size,
                                                 int64_t num_batches) {
  return std::make_unique<SyntheticSource>(config, rank, world_size, batch_size,
                                           num_batches);
}

std::vector<double> SyntheticHiddenLogits(const SyntheticConfig& config,
                                          const Batch& batch) {
  const HiddenModel model(config);
  std::vector<double> logits(batch.size);
  for (int64_t i = 0; i < batch.size; ++i) logits[i] = model.Logit(batch, i);
  return logits;
}

absl::Status WriteCriteoTsv(BatchSource& source, int64_t num_samples,
                            const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(
      std::fopen(path.c_str(), "w"), &std::fclose);
  if (file == nullptr) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot create ", path));
  }
  Batch batch;
  std::string line;
  int64_t written = 0;
  while (num_samples < 0 || written < num_samples) {
    ASSIGN_OR_RETURN(const bool more, source.Next(&batch));
    if (!more) break;
    for (int64_t i = 0;
         i < batch.size && (num_samples < 0 || written < num_samples);
         ++i, ++written) {
      line.clear();
      absl::StrAppend(&line, batch.labels[i] > 0.5f ? "1" : "0");
      for (int j = 0; j < batch.num_dense; ++j) {
        const double x = batch.dense[i * batch.num_dense + j];
        absl::StrAppend(&line, "\t",
                        std::max<int64_t>(std::llround(std::expm1(x)), 0));
      }
      for (int f = 0; f < batch.num_sparse(); ++f) {
        line.push_back('\t');
        for (int64_t k = batch.offsets[f][i]; k < batch.offsets[f][i + 1];
             ++k) {
          if (k > batch.offsets[f][i]) line.push_back(',');
          absl::StrAppend(&line,
                          absl::Hex(static_cast<uint64_t>(batch.ids[f][k]),
                                    absl::kZeroPad8));
        }
      }
      line.push_back('\n');
      if (std::fwrite(line.data(), 1, line.size(), file.get()) != line.size()) {
        const int err = errno;
        return absl::ErrnoToStatus(err, absl::StrCat("cannot write ", path));
      }
    }
  }
  if (std::fclose(file.release()) != 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace recps::worker
