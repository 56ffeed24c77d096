#include "common/config/job_config.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/config/text_proto.h"
#include "common/config/table_config.h"

namespace recps::config {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status ValidateData(const v1::JobConfig& job) {
  const v1::DataConfig& data = job.data();
  switch (data.source_case()) {
    case v1::DataConfig::kSynthetic: {
      const v1::SyntheticDataConfig& s = data.synthetic();
      if (s.num_dense() < 0) return Bad("data.synthetic.num_dense", "must be >= 0");
      if (s.features_size() != job.features_size()) {
        return Bad("data.synthetic.features",
                   absl::StrCat("has ", s.features_size(), " entries; the job has ",
                                job.features_size(), " features (one each, in order)"));
      }
      for (int i = 0; i < s.features_size(); ++i) {
        const v1::SyntheticFeatureConfig& f = s.features(i);
        const std::string path = absl::StrCat("data.synthetic.features[", i, "]");
        if (f.id_space() < 1) return Bad(path + ".id_space", "must be >= 1");
        if (!(f.zipf_exponent() >= 0)) return Bad(path + ".zipf_exponent", "must be >= 0");
        if (f.min_ids_per_bag() < 0 || f.max_ids_per_bag() < f.min_ids_per_bag() ||
            f.max_ids_per_bag() < 1) {
          return Bad(path, absl::StrCat("needs 0 <= min_ids_per_bag <= max_ids_per_bag "
                                        "and max >= 1, got ", f.min_ids_per_bag(), "..",
                                        f.max_ids_per_bag()));
        }
        // A fixed table must hold every id the generator can draw.
        for (const v1::TableConfig& t : job.tables()) {
          if (t.name() == job.features(i).table() && t.num_rows() > 0 &&
              f.id_space() > t.num_rows()) {
            return Bad(path + ".id_space",
                       absl::StrCat(f.id_space(), " exceeds table '", t.name(),
                                    "' num_rows ", t.num_rows()));
          }
        }
      }
      if (!(s.label_noise() >= 0 && s.label_noise() < 0.5)) {
        return Bad("data.synthetic.label_noise", "must be in [0, 0.5)");
      }
      if (s.informative_features() < 0 ||
          s.informative_features() > job.features_size()) {
        return Bad("data.synthetic.informative_features",
                   absl::StrCat("must be in [0, ", job.features_size(), "]"));
      }
      return absl::OkStatus();
    }
    case v1::DataConfig::kCriteo: {
      const v1::CriteoDataConfig& c = data.criteo();
      if (c.train_paths_size() == 0) return Bad("data.criteo.train_paths", "is empty");
      if (job.features_size() != 26) {
        return Bad("features", absl::StrCat("Criteo data has 26 categorical "
                                            "features; the job declares ",
                                            job.features_size()));
      }
      if (c.hash_buckets_size() != 0 && c.hash_buckets_size() != 26) {
        return Bad("data.criteo.hash_buckets", "needs 26 entries (or none)");
      }
      return absl::OkStatus();
    }
    default:
      return Bad("data", "set either synthetic or criteo");
  }
}

}  // namespace

absl::Status ValidateJobConfig(const v1::JobConfig& job) {
  if (job.tables_size() == 0) return Bad("tables", "the job declares no tables");
  absl::flat_hash_map<std::string, int> dims;
  for (int i = 0; i < job.tables_size(); ++i) {
    absl::StatusOr<TableSpec> spec =
        TableSpecFromConfig(job.tables(i));
    if (!spec.ok()) {
      return Bad(absl::StrCat("tables[", i, "]"), spec.status().message());
    }
    if (!dims.emplace(spec->name, spec->dim).second) {
      return Bad(absl::StrCat("tables[", i, "].name"),
                 absl::StrCat("table '", spec->name, "' is declared twice"));
    }
  }
  if (job.features_size() == 0) return Bad("features", "the job declares no features");
  absl::flat_hash_set<std::string> feature_names;
  int dim = -1;
  for (int i = 0; i < job.features_size(); ++i) {
    const v1::FeatureConfig& f = job.features(i);
    const std::string path = absl::StrCat("features[", i, "]");
    if (f.name().empty()) return Bad(path + ".name", "is empty");
    if (!feature_names.insert(f.name()).second) {
      return Bad(path + ".name", absl::StrCat("feature '", f.name(), "' is declared twice"));
    }
    auto it = dims.find(f.table());
    if (it == dims.end()) {
      return Bad(path + ".table", absl::StrCat("unknown table '", f.table(), "'"));
    }
    if (dim >= 0 && it->second != dim) {
      return Bad(path + ".table",
                 absl::StrCat("table '", f.table(), "' has dim ", it->second,
                              " but earlier features use dim ", dim,
                              "; DLRM's interaction needs one embedding dim"));
    }
    dim = it->second;
  }
  const v1::ModelConfig& m = job.model();
  if (m.bottom_mlp_size() == 0) return Bad("model.bottom_mlp", "is empty");
  if (m.top_mlp_size() == 0) return Bad("model.top_mlp", "is empty");
  for (int w : m.bottom_mlp()) {
    if (w < 1) return Bad("model.bottom_mlp", absl::StrCat("has width ", w));
  }
  for (int w : m.top_mlp()) {
    if (w < 1) return Bad("model.top_mlp", absl::StrCat("has width ", w));
  }
  if (m.bottom_mlp(m.bottom_mlp_size() - 1) != dim) {
    return Bad("model.bottom_mlp",
               absl::StrCat("ends with width ", m.bottom_mlp(m.bottom_mlp_size() - 1),
                            "; it must end with the embedding dim ", dim));
  }
  if (m.top_mlp(m.top_mlp_size() - 1) != 1) {
    return Bad("model.top_mlp", "must end with width 1 (the logit)");
  }
  const v1::TrainingConfig& t = job.training();
  if (t.batch_size() < 1) return Bad("training.batch_size", "must be >= 1");
  if (t.steps() < 1) return Bad("training.steps", "must be >= 1");
  if (t.eval_interval() < 0) return Bad("training.eval_interval", "must be >= 0");
  if (t.eval_batches() < 1) return Bad("training.eval_batches", "must be >= 1");
  if (t.consistency().mode() == v1::ConsistencyConfig::BOUNDED &&
      t.consistency().staleness() < 1) {
    return Bad("training.consistency.staleness", "must be >= 1 in BOUNDED mode");
  }
  const v1::OptimizerConfig& o = t.dense_optimizer();
  if (o.kind() == v1::OptimizerConfig::KIND_UNSPECIFIED ||
      o.kind() == v1::OptimizerConfig::ROWWISE_ADAGRAD) {
    return Bad("training.dense_optimizer.kind",
               "choose SGD, ADAGRAD, ADAM or ADAMW (row-wise Adagrad is for tables)");
  }
  if (!(o.learning_rate() > 0) || !std::isfinite(o.learning_rate())) {
    return Bad("training.dense_optimizer.learning_rate", "must be > 0");
  }
  return ValidateData(job);
}

absl::StatusOr<v1::JobConfig> ReadJobConfig(const std::string& path) {
  v1::JobConfig job;
  if (absl::Status s = ReadTextProto(path, &job); !s.ok()) return s;
  if (absl::Status s = ValidateJobConfig(job); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return job;
}

int EmbeddingDim(const v1::JobConfig& job) {
  for (const v1::TableConfig& t : job.tables()) {
    if (t.name() == job.features(0).table()) return t.dim();
  }
  return 0;
}

}  // namespace recps::config
