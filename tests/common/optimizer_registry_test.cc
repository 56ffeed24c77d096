// The optimizer registry: one entry per kind, named as the configs name
// them, with the state widths the stores and the kernels lay out.
#include "common/optimizer_registry.h"

#include <set>
#include <string>

#include "common/fused_row.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "recps/v1/table.pb.h"

namespace recps {
namespace {

using ::testing::HasSubstr;

TEST(OptimizerRegistry, EveryKindHasOneEntryFoundByItsKindAndConfigName) {
  std::set<std::string> names, config_names;
  for (const OptimizerInfo& info : Optimizers()) {
    SCOPED_TRACE(info.name);
    EXPECT_EQ(FindOptimizer(info.kind), &info);
    EXPECT_EQ(FindOptimizerByConfigName(info.config_name), &info);
    EXPECT_STREQ(OptimizerName(info.kind), info.name);
    EXPECT_TRUE(names.insert(info.name).second);
    EXPECT_TRUE(config_names.insert(info.config_name).second);
    // The substitute is registered and usable where this one is not.
    const OptimizerInfo* instead = FindOptimizer(info.instead);
    ASSERT_NE(instead, nullptr);
    EXPECT_TRUE(instead->has_dense_form());
    EXPECT_EQ(instead->unsplittable_because, nullptr);
  }
  EXPECT_EQ(Optimizers().size(), 5u);
  EXPECT_EQ(FindOptimizer(static_cast<OptimizerKind>(5)), nullptr);
  EXPECT_EQ(FindOptimizer(static_cast<OptimizerKind>(-1)), nullptr);
  EXPECT_EQ(FindOptimizerByConfigName("KIND_UNSPECIFIED"), nullptr);
  EXPECT_STREQ(OptimizerName(static_cast<OptimizerKind>(9)), "unknown");
}

TEST(OptimizerRegistry, ConfigNamesAreTheOptimizerConfigKinds) {
  for (const OptimizerInfo& info : Optimizers()) {
    v1::OptimizerConfig::Kind kind;
    EXPECT_TRUE(v1::OptimizerConfig::Kind_Parse(info.config_name, &kind))
        << info.config_name;
  }
  const google::protobuf::EnumDescriptor* kinds =
      v1::OptimizerConfig::Kind_descriptor();
  for (int i = 0; i < kinds->value_count(); ++i) {
    const std::string& name = kinds->value(i)->name();
    if (kinds->value(i)->number() == v1::OptimizerConfig::KIND_UNSPECIFIED)
      continue;
    EXPECT_NE(FindOptimizerByConfigName(name), nullptr)
        << name << " has no registry entry";
  }
}

TEST(OptimizerRegistry, StateWidthsAreTheFusedRowLayout) {
  for (int dim : {1, 2, 7, 16, 128, 4096}) {
    SCOPED_TRACE(dim);
    EXPECT_EQ(FusedRowStateWidth(OptimizerKind::kSgd, dim), 0);
    EXPECT_EQ(FusedRowStateWidth(OptimizerKind::kAdagrad, dim), dim);
    EXPECT_EQ(FusedRowStateWidth(OptimizerKind::kRowWiseAdagrad, dim), 1);
    EXPECT_EQ(FusedRowStateWidth(OptimizerKind::kAdam, dim), 2 * dim + 1);
    EXPECT_EQ(FusedRowStateWidth(OptimizerKind::kAdamW, dim), 2 * dim + 1);
    for (const OptimizerInfo& info : Optimizers()) {
      const int64_t stride = FusedRowStride(info.kind, dim);
      EXPECT_EQ(stride % 4, 0);
      EXPECT_GE(stride, dim + info.RowStateWidth(dim));
      EXPECT_LT(stride, dim + info.RowStateWidth(dim) + 4);
      EXPECT_LE(FusedRowStride(info.kind, dim, RowPrecision::kFp16), stride);
    }
  }
  EXPECT_EQ(FusedRowStateWidth(static_cast<OptimizerKind>(7), 16), 0);
}

TEST(OptimizerRegistry, DenseFormsAndColumnSplits) {
  EXPECT_EQ(FindOptimizer(OptimizerKind::kSgd)->dense_state_per_param, 0);
  EXPECT_EQ(FindOptimizer(OptimizerKind::kAdagrad)->dense_state_per_param, 1);
  EXPECT_EQ(FindOptimizer(OptimizerKind::kAdam)->dense_state_per_param, 2);
  EXPECT_EQ(FindOptimizer(OptimizerKind::kAdamW)->dense_state_per_param, 2);
  const OptimizerInfo& rowwise = *FindOptimizer(OptimizerKind::kRowWiseAdagrad);
  EXPECT_FALSE(rowwise.has_dense_form());
  EXPECT_NE(rowwise.unsplittable_because, nullptr);
  EXPECT_EQ(rowwise.instead, OptimizerKind::kAdagrad);
  EXPECT_EQ(OptimizerConfigChoices([](const OptimizerInfo&) { return true; }),
            "SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM or ADAMW");
  EXPECT_EQ(OptimizerConfigChoices(
                [](const OptimizerInfo& i) { return i.has_dense_form(); }),
            "SGD, ADAGRAD, ADAM or ADAMW");
}

TEST(OptimizerRegistry, ValidationNamesTheBadHyperParameter) {
  for (const OptimizerInfo& info : Optimizers()) {
    OptimizerParams p;
    p.kind = info.kind;
    EXPECT_TRUE(ValidateOptimizerParams(p).ok()) << info.name;
    p.beta2 = 1.0f;
    const absl::Status s = ValidateOptimizerParams(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(std::string(info.name) + " beta2 is 1"));
  }
  OptimizerParams unknown;
  unknown.kind = static_cast<OptimizerKind>(42);
  EXPECT_EQ(ValidateOptimizerParams(unknown).message(),
            "unknown optimizer kind 42");
}

}  // namespace
}  // namespace recps
