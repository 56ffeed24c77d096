#include "common/config/job_config.h"

#include <functional>

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

TEST(JobConfig, DifferentTableDimsAreRefused) {
  absl::StatusOr<v1::JobConfig> job = config::ReadJobConfig(Example("small.textproto"));
  ASSERT_TRUE(job.ok());
  job->mutable_tables(5)->set_dim(8);
  const absl::Status s = config::ValidateJobConfig(*job);
  EXPECT_NE(s.message().find("one embedding dim"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace recps::config
