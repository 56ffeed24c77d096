#include "common/config/job_config.h"

#include <functional>
#include <string>
#include <vector>

#include "common/config/table_config.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace recps::config {
namespace {

std::string Example(const char* name) {
  return std::string(RECPS_SOURCE_DIR) + "/examples/" + name;
}

TEST(JobConfig, ExamplesAreValid) {
  for (const char* name : {"small.textproto", "criteo.textproto"}) {
    absl::StatusOr<v1::JobConfig> job = config::ReadJobConfig(Example(name));
    ASSERT_TRUE(job.ok()) << name << ": " << job.status();
  }
  absl::StatusOr<v1::JobConfig> criteo = config::ReadJobConfig(Example("criteo.textproto"));
  EXPECT_EQ(criteo->features_size(), 26);
  EXPECT_EQ(criteo->data().synthetic().num_dense(), 13);
}

TEST(JobConfig, ParseErrorsNameTheLine) {
  absl::StatusOr<v1::JobConfig> job = config::ReadJobConfig("/nonexistent/job.textproto");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound);
}

// Each mistake, made on the small example, and the field its error names.
struct Mistake {
  const char* field;
  std::function<void(v1::JobConfig&)> make;
};

TEST(JobConfig, EachMistakeNamesItsField) {
  const std::vector<Mistake> mistakes = {
      {"features[2].table", [](v1::JobConfig& j) { j.mutable_features(2)->set_table("nope"); }},
      {"features[1].name", [](v1::JobConfig& j) { j.mutable_features(1)->set_name("f0"); }},
      {"tables[0]", [](v1::JobConfig& j) { j.mutable_tables(0)->set_dim(0); }},
      {"tables[3]", [](v1::JobConfig& j) {
         j.mutable_tables(3)->mutable_optimizer()->set_learning_rate(-1);
       }},
      {"tables[1].name", [](v1::JobConfig& j) { j.mutable_tables(1)->set_name("t0"); }},
      {"tables[2]", [](v1::JobConfig& j) {
         j.mutable_tables(2)->set_precision(static_cast<v1::StoragePrecision>(9));
       }},
      {"model.bottom_mlp", [](v1::JobConfig& j) { j.mutable_model()->set_bottom_mlp(1, 8); }},
      {"model.top_mlp", [](v1::JobConfig& j) { j.mutable_model()->add_top_mlp(4); }},
      {"training.batch_size", [](v1::JobConfig& j) { j.mutable_training()->set_batch_size(0); }},
      {"training.dense_optimizer.kind", [](v1::JobConfig& j) {
         j.mutable_training()->mutable_dense_optimizer()->set_kind(
             v1::OptimizerConfig::ROWWISE_ADAGRAD);
       }},
      {"training.consistency.staleness", [](v1::JobConfig& j) {
         j.mutable_training()->mutable_consistency()->set_mode(v1::ConsistencyConfig::BOUNDED);
       }},
      {"data.synthetic.features", [](v1::JobConfig& j) {
         j.mutable_data()->mutable_synthetic()->mutable_features()->RemoveLast();
       }},
      {"data.synthetic.features[0]", [](v1::JobConfig& j) {
         j.mutable_data()->mutable_synthetic()->mutable_features(0)->set_max_ids_per_bag(0);
       }},
      {"data", [](v1::JobConfig& j) { j.mutable_data()->Clear(); }},
      {"training.checkpoint.dir", [](v1::JobConfig& j) {
         j.mutable_training()->mutable_checkpoint()->set_every_steps(10);
       }},
      {"training.checkpoint.every_steps", [](v1::JobConfig& j) {
         j.mutable_training()->mutable_checkpoint()->set_every_steps(-1);
       }},
      {"training.checkpoint.keep_last", [](v1::JobConfig& j) {
         j.mutable_training()->mutable_checkpoint()->set_keep_last(-2);
       }},
      {"training.wire_precision", [](v1::JobConfig& j) {
         j.mutable_training()->set_wire_precision(
             static_cast<v1::TrainingConfig::WirePrecision>(7));
       }},
      {"data.criteo.hash_buckets", [](v1::JobConfig& j) {
         j.mutable_data()->mutable_criteo()->add_train_paths("train.tsv");
         for (int i = 0; i < 26; ++i) j.mutable_data()->mutable_criteo()->add_hash_buckets(10);
       }},
  };
  absl::StatusOr<v1::JobConfig> good = config::ReadJobConfig(Example("small.textproto"));
  ASSERT_TRUE(good.ok()) << good.status();
  for (const Mistake& m : mistakes) {
    v1::JobConfig job = *good;
    m.make(job);
    const absl::Status s = config::ValidateJobConfig(job);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << m.field;
    EXPECT_EQ(s.message().substr(0, std::string(m.field).size()), m.field) << s;
  }
}

TEST(JobConfig, TablePrecisionReachesTheTableSpec) {
  v1::TableConfig t;
  t.set_name("t");
  t.set_dim(8);
  t.mutable_optimizer()->set_kind(v1::OptimizerConfig::ADAGRAD);
  t.mutable_optimizer()->set_learning_rate(0.1f);
  const std::pair<v1::StoragePrecision, RowPrecision> cases[] = {
      {v1::STORAGE_PRECISION_UNSPECIFIED, RowPrecision::kFp32},
      {v1::FP32, RowPrecision::kFp32},
      {v1::FP16, RowPrecision::kFp16},
      {v1::BF16, RowPrecision::kBf16}};
  for (const auto& [in, want] : cases) {
    t.set_precision(in);
    absl::StatusOr<config::TableSpec> spec = config::TableSpecFromConfig(t);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->precision, want) << in;
  }
  t.set_precision(static_cast<v1::StoragePrecision>(-1));
  absl::StatusOr<config::TableSpec> bad = config::TableSpecFromConfig(t);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("precision"), std::string::npos);
  EXPECT_NE(bad.status().message().find("FP16"), std::string::npos);
  // Stochastic rounding only for 16-bit weights.
  t.set_precision(v1::FP16);
  t.set_stochastic_rounding(true);
  ASSERT_TRUE(config::TableSpecFromConfig(t).ok());
  EXPECT_TRUE(config::TableSpecFromConfig(t)->stochastic_rounding);
  t.set_precision(v1::FP32);
  bad = config::TableSpecFromConfig(t);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("stochastic_rounding"), std::string::npos);
  // The text format takes the names.
  v1::TablesConfig file;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "tables { name: 'e' dim: 4 precision: BF16 optimizer { kind: SGD "
      "learning_rate: 0.1 } }",
      &file));
  absl::StatusOr<std::vector<config::TableSpec>> specs =
      config::TableSpecsFromConfig(file);
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_EQ((*specs)[0].precision, RowPrecision::kBf16);
}

TEST(JobConfig, OptimizerKindsComeFromTheRegistry) {
  // Every OptimizerConfig kind maps to the registered kind of that name.
  const std::pair<v1::OptimizerConfig::Kind, OptimizerKind> cases[] = {
      {v1::OptimizerConfig::SGD, OptimizerKind::kSgd},
      {v1::OptimizerConfig::ADAGRAD, OptimizerKind::kAdagrad},
      {v1::OptimizerConfig::ROWWISE_ADAGRAD, OptimizerKind::kRowWiseAdagrad},
      {v1::OptimizerConfig::ADAM, OptimizerKind::kAdam},
      {v1::OptimizerConfig::ADAMW, OptimizerKind::kAdamW}};
  v1::OptimizerConfig o;
  o.set_learning_rate(0.1f);
  for (const auto& [kind, want] : cases) {
    o.set_kind(kind);
    absl::StatusOr<OptimizerParams> p = OptimizerParamsFromConfig(o);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->kind, want);
  }
  o.set_kind(v1::OptimizerConfig::KIND_UNSPECIFIED);
  EXPECT_EQ(OptimizerParamsFromConfig(o).status().message(),
            "kind is not set; choose SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM or ADAMW");
  // A dense optimizer needs a dense form.
  absl::StatusOr<v1::JobConfig> job = ReadJobConfig(Example("small.textproto"));
  ASSERT_TRUE(job.ok()) << job.status();
  job->mutable_training()->mutable_dense_optimizer()->set_kind(
      v1::OptimizerConfig::ROWWISE_ADAGRAD);
  EXPECT_EQ(ValidateJobConfig(*job).message(),
            "training.dense_optimizer.kind: choose SGD, ADAGRAD, ADAM or ADAMW "
            "(row-wise Adagrad is for tables)");
}

TEST(JobConfig, WirePrecisionChoosesTheRowEncoding) {
  v1::TrainingConfig t;
  EXPECT_EQ(WireEncoding(t), v1::ROW_ENCODING_FLOAT32);
  t.set_wire_precision(v1::TrainingConfig::FLOAT32);
  EXPECT_EQ(WireEncoding(t), v1::ROW_ENCODING_FLOAT32);
  t.set_wire_precision(v1::TrainingConfig::FLOAT16);
  EXPECT_EQ(WireEncoding(t), v1::ROW_ENCODING_FLOAT16);
  t.set_wire_precision(v1::TrainingConfig::BFLOAT16);
  EXPECT_EQ(WireEncoding(t), v1::ROW_ENCODING_BFLOAT16);
  absl::StatusOr<v1::JobConfig> job = config::ReadJobConfig(Example("small.textproto"));
  ASSERT_TRUE(job.ok());
  job->mutable_training()->set_wire_precision(v1::TrainingConfig::BFLOAT16);
  EXPECT_TRUE(config::ValidateJobConfig(*job).ok());
}

// Criteo-format TSV has one categorical field per job feature: the small
// example's 8 features read an 8-field file, with one hash bucket each.
TEST(JobConfig, CriteoDataTakesOneFieldPerFeature) {
  absl::StatusOr<v1::JobConfig> job = config::ReadJobConfig(Example("small.textproto"));
  ASSERT_TRUE(job.ok());
  v1::CriteoDataConfig* c = job->mutable_data()->mutable_criteo();
  c->add_train_paths("train.tsv");
  EXPECT_TRUE(config::ValidateJobConfig(*job).ok());
  for (int i = 0; i < 8; ++i) c->add_hash_buckets(1000);
  EXPECT_TRUE(config::ValidateJobConfig(*job).ok());
  c->add_hash_buckets(1000);
  const absl::Status s = config::ValidateJobConfig(*job);
  EXPECT_NE(s.message().find("has 9 entries; it needs one per feature (8)"),
            absl::string_view::npos) << s;
}

TEST(JobConfig, DifferentTableDimsAreRefused) {
  absl::StatusOr<v1::JobConfig> job = config::ReadJobConfig(Example("small.textproto"));
  ASSERT_TRUE(job.ok());
  job->mutable_tables(5)->set_dim(8);
  const absl::Status s = config::ValidateJobConfig(*job);
  EXPECT_NE(s.message().find("one embedding dim"), absl::string_view::npos) << s;
}

// Sizes beyond their bounds are refused by name before anything allocates
// (each of these passed and then died with std::bad_alloc in the worker).
TEST(JobConfig, EverySizeHasAnUpperBound) {
  const std::vector<Mistake> too_big = {
      {"model.bottom_mlp[0]",
       [](v1::JobConfig& j) { j.mutable_model()->set_bottom_mlp(0, 2'000'000'000); }},
      {"model.top_mlp[1]",
       [](v1::JobConfig& j) { j.mutable_model()->set_top_mlp(1, kMaxMlpWidth + 1); }},
      {"model.top_mlp", [](v1::JobConfig& j) {
         for (int i = 0; i < kMaxMlpLayers; ++i) j.mutable_model()->mutable_top_mlp()->Add(1);
       }},
      {"training.batch_size",
       [](v1::JobConfig& j) { j.mutable_training()->set_batch_size(2'000'000'000); }},
      {"training.steps",
       [](v1::JobConfig& j) { j.mutable_training()->set_steps(kMaxSteps + 1); }},
      {"training.eval_interval",
       [](v1::JobConfig& j) { j.mutable_training()->set_eval_interval(kMaxSteps + 1); }},
      {"training.eval_batches",
       [](v1::JobConfig& j) { j.mutable_training()->set_eval_batches(kMaxEvalBatches + 1); }},
      {"training.consistency.staleness", [](v1::JobConfig& j) {
         j.mutable_training()->mutable_consistency()->set_staleness(kMaxStaleness + 1);
       }},
      {"data.synthetic.num_dense",
       [](v1::JobConfig& j) { j.mutable_data()->mutable_synthetic()->set_num_dense(kMaxNumDense + 1); }},
      {"data.synthetic.features[0].max_ids_per_bag", [](v1::JobConfig& j) {
         j.mutable_data()->mutable_synthetic()->mutable_features(0)->set_max_ids_per_bag(
             2'000'000'000);
       }},
      {"tables", [](v1::JobConfig& j) {
         while (j.tables_size() <= kMaxTables) *j.add_tables() = j.tables(0);
       }},
      {"features", [](v1::JobConfig& j) {
         while (j.features_size() <= kMaxFeatures) *j.add_features() = j.features(0);
       }},
  };
  absl::StatusOr<v1::JobConfig> good = config::ReadJobConfig(Example("small.textproto"));
  ASSERT_TRUE(good.ok()) << good.status();
  for (const Mistake& m : too_big) {
    v1::JobConfig job = *good;
    m.make(job);
    const absl::Status s = config::ValidateJobConfig(job);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << m.field;
    EXPECT_EQ(s.message().substr(0, std::string(m.field).size()), m.field) << s;
    EXPECT_NE(s.message().find("limit"), absl::string_view::npos) << s;
  }
  // At the bounds themselves the sizes pass validation (whether they fit a
  // machine is the memory check's question).
  v1::JobConfig job = *good;
  job.mutable_training()->set_batch_size(kMaxBatchSize);
  job.mutable_data()->mutable_synthetic()->mutable_features(0)->set_max_ids_per_bag(
      kMaxIdsPerBag);
  job.mutable_model()->set_bottom_mlp(0, kMaxMlpWidth);
  EXPECT_TRUE(config::ValidateJobConfig(job).ok()) << config::ValidateJobConfig(job);
}

TEST(JobConfig, MemoryEstimateOfTheSmallExample) {
  absl::StatusOr<v1::JobConfig> job = config::ReadJobConfig(Example("small.textproto"));
  ASSERT_TRUE(job.ok());
  const WorkerMemoryEstimate e = EstimateWorkerMemory(*job);
  // 13 dense -> 64 -> 16; interaction 16 + 9 * 8 / 2 = 52 -> 64 -> 32 -> 1.
  const double params = (13 * 64 + 64) + (64 * 16 + 16) + (52 * 64 + 64) +
                        (64 * 32 + 32) + (32 * 1 + 1);
  EXPECT_DOUBLE_EQ(e.dense_model, 2 * 4 * params);
  EXPECT_DOUBLE_EQ(e.optimizer_state, 2 * 4 * params);  // Adam: two moments
  EXPECT_GT(e.activations, 0);
  EXPECT_GT(e.embedding_buffers, 0);
  // Trains in well under 1 GiB.
  EXPECT_LT(e.total(), 1024.0 * 1024 * 1024);
  EXPECT_TRUE(CheckWorkerMemory(*job, int64_t{1} << 30, "test").ok());
}

// The memory check names the setting that grows the largest part.
TEST(JobConfig, MemoryCheckNamesTheSettingToLower) {
  absl::StatusOr<v1::JobConfig> good = config::ReadJobConfig(Example("small.textproto"));
  ASSERT_TRUE(good.ok());
  struct Case {
    std::function<void(v1::JobConfig&)> make;
    const char* lower;
  };
  const std::vector<Case> cases = {
      {[](v1::JobConfig& j) { j.mutable_training()->set_batch_size(kMaxBatchSize); },
       "lower training.batch_size"},
      {[](v1::JobConfig& j) {
         j.mutable_model()->set_top_mlp(0, kMaxMlpWidth);
         j.mutable_model()->set_top_mlp(1, kMaxMlpWidth);
       },
       "lower model.bottom_mlp / model.top_mlp widths"},
      {[](v1::JobConfig& j) { j.mutable_training()->set_eval_batches(kMaxEvalBatches); },
       "lower training.eval_batches"},
  };
  for (const Case& c : cases) {
    v1::JobConfig job = *good;
    c.make(job);
    ASSERT_TRUE(ValidateJobConfig(job).ok()) << ValidateJobConfig(job);
    const absl::Status s = CheckWorkerMemory(job, int64_t{256} << 20, "--memory_limit=256M");
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << c.lower;
    EXPECT_NE(s.message().find(c.lower), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find("--memory_limit=256M is 256.00 MiB"), absl::string_view::npos)
        << s;
  }
}

TEST(JobConfig, ParsesMemAvailable) {
  EXPECT_EQ(*ParseMemAvailable("MemTotal:       16384000 kB\n"
                               "MemFree:         1000 kB\n"
                               "MemAvailable:    8192000 kB\n"),
            int64_t{8192000} * 1024);
  EXPECT_EQ(ParseMemAvailable("MemTotal: 1 kB\n").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace recps::config
