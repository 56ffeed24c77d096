#include "common/config/job_config.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/message_differencer.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/config/table_config.h"
#include "common/config/text_proto.h"
#include "common/human_bytes.h"
#include "common/optimizer_registry.h"
#include "kernels/dense_optimizer.h"
#include "kernels/interaction.h"

namespace recps::config {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// "is 2000000000; the limit is 65536 (units per layer)".
absl::Status TooBig(absl::string_view field, int64_t value, int64_t limit,
                    absl::string_view unit) {
  return Bad(field, absl::StrCat("is ", value, "; the limit is ", limit, " (", unit, ")"));
}

absl::Status ValidateData(const v1::JobConfig& job) {
  const v1::DataConfig& data = job.data();
  switch (data.source_case()) {
    case v1::DataConfig::kSynthetic: {
      const v1::SyntheticDataConfig& s = data.synthetic();
      if (s.num_dense() < 0) return Bad("data.synthetic.num_dense", "must be >= 0");
      if (s.num_dense() > kMaxNumDense) {
        return TooBig("data.synthetic.num_dense", s.num_dense(), kMaxNumDense,
                      "dense features");
      }
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
        if (f.max_ids_per_bag() > kMaxIdsPerBag) {
          return TooBig(path + ".max_ids_per_bag", f.max_ids_per_bag(), kMaxIdsPerBag,
                        "ids per bag");
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
      // The TSV has one categorical field per job feature (Criteo's 26, or
      // as many as the job declares for files written in its format).
      if (c.hash_buckets_size() != 0 && c.hash_buckets_size() != job.features_size()) {
        return Bad("data.criteo.hash_buckets",
                   absl::StrCat("has ", c.hash_buckets_size(), " entries; it needs one per "
                                "feature (", job.features_size(), ") or none"));
      }
      return absl::OkStatus();
    }
    default:
      return Bad("data", "set either synthetic or criteo");
  }
}

// "choose SGD, ADAGRAD, ADAM or ADAMW (row-wise Adagrad is for tables)":
// the registered optimizers with a dense form, and those without.
std::string DenseOptimizerChoices() {
  std::vector<std::string> embedding_only;
  for (const OptimizerInfo& info : Optimizers()) {
    if (!info.has_dense_form()) embedding_only.push_back(info.display_name);
  }
  std::string choices = absl::StrCat(
      "choose ",
      OptimizerConfigChoices([](const OptimizerInfo& i) { return i.has_dense_form(); }));
  if (!embedding_only.empty()) {
    absl::StrAppend(&choices, " (", absl::StrJoin(embedding_only, " and "),
                    embedding_only.size() == 1 ? " is" : " are", " for tables)");
  }
  return choices;
}

}  // namespace

std::vector<std::string> TableDifferences(
    const v1::JobConfig& job, const google::protobuf::RepeatedPtrField<v1::TableConfig>& served) {
  std::vector<std::string> differences;
  std::map<std::string, const v1::TableConfig*> job_tables, shard_tables;
  for (const v1::TableConfig& t : job.tables()) job_tables[t.name()] = &t;
  for (const v1::TableConfig& t : served) shard_tables[t.name()] = &t;
  for (const auto& [name, t] : job_tables) {
    auto it = shard_tables.find(name);
    if (it == shard_tables.end()) {
      differences.push_back(
          absl::StrCat("it lacks the job's table '", name, "' (dim ", t->dim(), ")"));
    } else if (it->second->dim() != t->dim()) {
      differences.push_back(absl::StrCat("table '", name, "' has dim ", it->second->dim(),
                                         ", the job's has ", t->dim()));
    } else if (!google::protobuf::util::MessageDifferencer::Equals(*it->second, *t)) {
      std::string diff;
      google::protobuf::util::MessageDifferencer differencer;
      differencer.ReportDifferencesToString(&diff);
      differencer.Compare(*t, *it->second);
      if (diff.size() > 200) diff = absl::StrCat(diff.substr(0, 200), "...");
      differences.push_back(absl::StrCat("table '", name, "' differs from the job's (",
                                         absl::StripAsciiWhitespace(diff), ")"));
    }
  }
  for (const auto& [name, t] : shard_tables) {
    if (job_tables.count(name) == 0) {
      differences.push_back(absl::StrCat("it serves table '", name.substr(0, 64),
                                         "', which the job '", job.name(),
                                         "' does not have"));
    }
    if (differences.size() > 16) break;
  }
  return differences;
}

absl::Status ValidateJobConfig(const v1::JobConfig& job) {
  if (job.tables_size() == 0) return Bad("tables", "the job declares no tables");
  if (job.tables_size() > kMaxTables) {
    return TooBig("tables", job.tables_size(), kMaxTables, "tables per job");
  }
  if (job.features_size() > kMaxFeatures) {
    return TooBig("features", job.features_size(), kMaxFeatures, "features per job");
  }
  if (job.replication() > 8) {
    return TooBig("replication", static_cast<int64_t>(job.replication()), 8, "copies of a row");
  }
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
  for (const auto& [name, mlp] :
       {std::pair<const char*, const google::protobuf::RepeatedField<int32_t>*>{
            "model.bottom_mlp", &m.bottom_mlp()},
        {"model.top_mlp", &m.top_mlp()}}) {
    if (mlp->size() > kMaxMlpLayers) {
      return TooBig(name, mlp->size(), kMaxMlpLayers, "layers");
    }
    for (int i = 0; i < mlp->size(); ++i) {
      const int w = mlp->Get(i);
      if (w < 1) return Bad(name, absl::StrCat("has width ", w));
      if (w > kMaxMlpWidth) {
        return TooBig(absl::StrCat(name, "[", i, "]"), w, kMaxMlpWidth, "units per layer");
      }
    }
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
  if (t.batch_size() > kMaxBatchSize) {
    return TooBig("training.batch_size", t.batch_size(), kMaxBatchSize,
                  "samples per worker per step");
  }
  if (t.steps() < 1) return Bad("training.steps", "must be >= 1");
  if (t.steps() > kMaxSteps) return TooBig("training.steps", t.steps(), kMaxSteps, "steps");
  if (t.eval_interval() < 0) return Bad("training.eval_interval", "must be >= 0");
  if (t.eval_interval() > kMaxSteps) {
    return TooBig("training.eval_interval", t.eval_interval(), kMaxSteps, "steps");
  }
  if (t.eval_batches() < 1) return Bad("training.eval_batches", "must be >= 1");
  if (!v1::TrainingConfig::WirePrecision_IsValid(t.wire_precision())) {
    return Bad("training.wire_precision",
               absl::StrCat("unknown value ", static_cast<int>(t.wire_precision()),
                            "; use FLOAT32, FLOAT16 or BFLOAT16"));
  }
  if (t.eval_batches() > kMaxEvalBatches) {
    return TooBig("training.eval_batches", t.eval_batches(), kMaxEvalBatches,
                  "held-out batches per evaluation");
  }
  if (t.consistency().staleness() < 0) {
    return Bad("training.consistency.staleness", "must be >= 0");
  }
  if (t.consistency().staleness() > kMaxStaleness) {
    return TooBig("training.consistency.staleness", t.consistency().staleness(),
                  kMaxStaleness, "steps");
  }
  if (t.consistency().mode() == v1::ConsistencyConfig::BOUNDED &&
      t.consistency().staleness() < 1) {
    return Bad("training.consistency.staleness", "must be >= 1 in BOUNDED mode");
  }
  const v1::OptimizerConfig& o = t.dense_optimizer();
  const OptimizerInfo* dense =
      FindOptimizerByConfigName(v1::OptimizerConfig::Kind_Name(o.kind()));
  if (o.kind() == v1::OptimizerConfig::KIND_UNSPECIFIED ||
      (dense != nullptr && !dense->has_dense_form())) {
    return Bad("training.dense_optimizer.kind", DenseOptimizerChoices());
  }
  if (!(o.learning_rate() > 0) || !std::isfinite(o.learning_rate())) {
    return Bad("training.dense_optimizer.learning_rate", "must be > 0");
  }
  const v1::CheckpointConfig& c = t.checkpoint();
  if (c.every_steps() < 0) return Bad("training.checkpoint.every_steps", "must be >= 0");
  if (c.every_steps() > kMaxSteps) {
    return TooBig("training.checkpoint.every_steps", c.every_steps(), kMaxSteps, "steps");
  }
  if (c.keep_last() < 0) return Bad("training.checkpoint.keep_last", "must be >= 0 (0: 3)");
  if (c.keep_last() > kMaxKeepLast) {
    return TooBig("training.checkpoint.keep_last", c.keep_last(), kMaxKeepLast, "checkpoints");
  }
  if (c.full_every() < 0) return Bad("training.checkpoint.full_every", "must be >= 0 (0: 8)");
  if (c.dir().empty() && (c.every_steps() > 0 || c.incremental())) {
    return Bad("training.checkpoint.dir",
               "is empty; every_steps and incremental need a directory for the checkpoints");
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

v1::RowEncoding WireEncoding(const v1::TrainingConfig& training) {
  switch (training.wire_precision()) {
    case v1::TrainingConfig::FLOAT16:
      return v1::ROW_ENCODING_FLOAT16;
    case v1::TrainingConfig::BFLOAT16:
      return v1::ROW_ENCODING_BFLOAT16;
    default:
      return v1::ROW_ENCODING_FLOAT32;
  }
}

int EmbeddingDim(const v1::JobConfig& job) {
  for (const v1::TableConfig& t : job.tables()) {
    if (t.name() == job.features(0).table()) return t.dim();
  }
  return 0;
}

namespace {

// The largest number of ids a bag of feature `f` can hold.
int64_t MaxIdsPerBag(const v1::JobConfig& job, int f) {
  if (job.data().has_synthetic()) return job.data().synthetic().features(f).max_ids_per_bag();
  return 1;  // a Criteo line has one value per categorical field
}

}  // namespace

WorkerMemoryEstimate EstimateWorkerMemory(const v1::JobConfig& job) {
  constexpr double kFloat = sizeof(float), kId = sizeof(int64_t);
  const double b = static_cast<double>(job.training().batch_size());
  const int num_features = job.features_size();
  const double f = num_features;
  const double d = EmbeddingDim(job);
  const double num_dense =
      job.data().has_synthetic() ? job.data().synthetic().num_dense() : 13;
  double ids_per_sample = 0;
  for (int i = 0; i < num_features; ++i) ids_per_sample += MaxIdsPerBag(job, i);
  const double ids = b * ids_per_sample;  // per batch; at most this many unique

  // The DLRM's layers (worker/model/dlrm.cc): bottom MLP from the dense
  // features, top MLP from the interaction.
  double params = 0, layer_outputs = 0;
  double in = num_dense;
  for (int w : job.model().bottom_mlp()) {
    params += in * w + w;
    layer_outputs += w;
    in = w;
  }
  const double interaction = static_cast<double>(
      kernels::DotInteractionOutputWidth(num_features, static_cast<int>(d)));
  in = interaction;
  for (int w : job.model().top_mlp()) {
    params += in * w + w;
    layer_outputs += w;
    in = w;
  }
  WorkerMemoryEstimate e;
  e.dense_model = 2 * params * kFloat;
  absl::StatusOr<OptimizerParams> optimizer =
      OptimizerParamsFromConfig(job.training().dense_optimizer());
  if (optimizer.ok()) {
    // The state size is linear in n: scale the one of a single parameter
    // (n itself may not fit the int64 the kernel takes).
    e.optimizer_state = params * kFloat *
                        static_cast<double>(kernels::DenseOptimizerStateSize(optimizer->kind, 1));
  }
  // Model inputs, interaction and its gradient, every layer's output and its
  // gradient, logits; the trainer's d/d pooled, per-feature gradient and
  // loss scratch.
  e.activations = kFloat * b *
                  (num_dense + f * d + 2 * interaction + 2 * layer_outputs + 2 +
                   f * d + d + 3);
  // Three lookup buffer sets (two for the overlapped steps, one for
  // evaluation), each: pooled bags, a bag scratch, rows and row gradients,
  // the dedup (unique ids, inverse, hash slots) and each feature's indices;
  // then the backward scratch and the client's copy of the rows and ids.
  const double per_lookup =
      kFloat * (b * f * d + b * d + 2 * ids * d) + ids * (kId * 2 + 16 + kId);
  e.embedding_buffers =
      3 * per_lookup + kFloat * std::max(b, ids) * d + ids * (kFloat * d + 2 * kId);
  // Batches in flight: the prefetch queue (4), the one being read, the
  // trainer's two and an evaluation's.
  const double per_batch = kFloat * b * (num_dense + 1) + kId * ids + kId * (b + 1) * f;
  e.input_batches = 8 * per_batch;
  // Held-out predictions and labels kept for the AUC (with its sort), and
  // the loss of every step.
  e.evaluation = 16 * b * static_cast<double>(job.training().eval_batches()) +
                 kFloat * static_cast<double>(job.training().steps());
  return e;
}

absl::Status CheckWorkerMemory(const v1::JobConfig& job, int64_t available_bytes,
                               absl::string_view available_from) {
  const WorkerMemoryEstimate e = EstimateWorkerMemory(job);
  if (e.total() <= static_cast<double>(available_bytes)) return absl::OkStatus();
  const bool synthetic = job.data().has_synthetic();
  const double eval_predictions =
      16 * static_cast<double>(job.training().batch_size()) *
      static_cast<double>(job.training().eval_batches());
  // Each part, with the settings that grow it, largest part first.
  std::vector<std::pair<double, std::string>> parts = {
      {e.dense_model, "model.bottom_mlp / model.top_mlp widths (dense model)"},
      {e.optimizer_state,
       "model.bottom_mlp / model.top_mlp widths, or a dense_optimizer with less state "
       "(optimizer state)"},
      {e.activations, "training.batch_size or the MLP widths (activations)"},
      {e.embedding_buffers,
       synthetic ? "training.batch_size or data.synthetic.features[*].max_ids_per_bag "
                   "(embedding buffers)"
                 : "training.batch_size (embedding buffers)"},
      {e.input_batches, "training.batch_size (input batches)"},
      {e.evaluation, eval_predictions >= e.evaluation / 2
                         ? "training.eval_batches (held-out predictions)"
                         : "training.steps (the loss history)"},
  };
  std::stable_sort(parts.begin(), parts.end(),
                   [](const auto& x, const auto& y) { return x.first > y.first; });
  return absl::ResourceExhaustedError(absl::StrCat(
      "the job needs about ", HumanBytes(e.total()), " per worker (dense model ",
      HumanBytes(e.dense_model), ", optimizer state ", HumanBytes(e.optimizer_state),
      ", activations ", HumanBytes(e.activations), ", embedding buffers ",
      HumanBytes(e.embedding_buffers), ", input batches ", HumanBytes(e.input_batches),
      ", evaluation ", HumanBytes(e.evaluation), ") but ", available_from, " is ",
      HumanBytes(static_cast<double>(available_bytes)), "; lower ", parts[0].second));
}

absl::StatusOr<int64_t> ParseMemAvailable(absl::string_view meminfo) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    line = absl::StripAsciiWhitespace(line);
    const bool kib = absl::ConsumeSuffix(&line, "kB");
    line = absl::StripAsciiWhitespace(line);
    int64_t value = 0;
    if (!absl::SimpleAtoi(line, &value) || value < 0) break;
    return kib ? value * 1024 : value;
  }
  return absl::NotFoundError("no MemAvailable line in /proc/meminfo");
}

}  // namespace recps::config
