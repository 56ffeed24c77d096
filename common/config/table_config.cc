#include "common/config/table_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/config/text_proto.h"
#include "common/optimizer_registry.h"

namespace recps::config {
namespace {

absl::Status Bad(const v1::TableConfig& c, absl::string_view field,
                 absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "table '", c.name(), "': ", field, " ", what));
}

}  // namespace

absl::StatusOr<OptimizerParams> OptimizerParamsFromConfig(
    const v1::OptimizerConfig& o) {
  // The registered optimizer of that OptimizerConfig.Kind value name.
  const OptimizerInfo* info =
      FindOptimizerByConfigName(v1::OptimizerConfig::Kind_Name(o.kind()));
  if (info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kind is not set; choose ",
        OptimizerConfigChoices([](const OptimizerInfo&) { return true; })));
  }
  OptimizerParams p;
  p.kind = info->kind;
  if (!(o.learning_rate() > 0) || !std::isfinite(o.learning_rate())) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning_rate is ", o.learning_rate(), "; it must be > 0"));
  }
  p.learning_rate = o.learning_rate();
  p.eps = o.eps() == 0 ? 1e-8f : o.eps();
  p.beta1 = o.beta1() == 0 ? 0.9f : o.beta1();
  p.beta2 = o.beta2() == 0 ? 0.999f : o.beta2();
  p.weight_decay = o.weight_decay();
  if (absl::Status s = ValidateOptimizerParams(p); !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  return p;
}

absl::StatusOr<TableSpec> TableSpecFromConfig(const v1::TableConfig& c) {
  TableSpec spec;
  spec.name = c.name();
  if (c.name().empty()) return Bad(c, "name", "is empty");
  if (c.dim() < 1 || c.dim() > 4096) {
    return Bad(c, "dim", absl::StrCat("is ", c.dim(), "; it must be in 1..4096"));
  }
  spec.dim = c.dim();
  if (c.num_rows() < 0) {
    return Bad(c, "num_rows", absl::StrCat("is ", c.num_rows(),
                                           "; use 0 for a dynamic table"));
  }
  spec.num_rows = c.num_rows();
  absl::StatusOr<OptimizerParams> optimizer =
      OptimizerParamsFromConfig(c.optimizer());
  if (!optimizer.ok()) return Bad(c, "optimizer:", optimizer.status().message());
  spec.optimizer = *optimizer;
  switch (c.precision()) {
    case v1::STORAGE_PRECISION_UNSPECIFIED:
    case v1::FP32:
      spec.precision = RowPrecision::kFp32;
      break;
    case v1::FP16:
      spec.precision = RowPrecision::kFp16;
      break;
    case v1::BF16:
      spec.precision = RowPrecision::kBf16;
      break;
    default:
      return Bad(c, "precision",
                 absl::StrCat("is ", static_cast<int>(c.precision()),
                              "; it must be FP32, FP16 or BF16"));
  }
  if (c.stochastic_rounding() &&
      spec.precision == RowPrecision::kFp32) {
    return Bad(c, "stochastic_rounding",
               "needs precision FP16 or BF16 (fp32 weights are not rounded)");
  }
  spec.stochastic_rounding = c.stochastic_rounding();
  const float bound = 1.0f / std::sqrt(static_cast<float>(c.dim()));
  spec.init = RowInit{RowInit::Distribution::kUniform, -bound, bound};
  if (c.init().has_uniform()) {
    const auto& u = c.init().uniform();
    if (!(u.low() < u.high())) {
      return Bad(c, "init.uniform", absl::StrCat("needs low < high, got [", u.low(),
                                                 ", ", u.high(), ")"));
    }
    spec.init = RowInit{RowInit::Distribution::kUniform, u.low(), u.high()};
  } else if (c.init().has_normal()) {
    const auto& n = c.init().normal();
    if (!(n.stddev() > 0)) {
      return Bad(c, "init.normal.stddev", absl::StrCat("is ", n.stddev(), "; it must be > 0"));
    }
    spec.init = RowInit{RowInit::Distribution::kNormal, n.mean(), n.stddev()};
  }
  return spec;
}

absl::StatusOr<std::vector<TableSpec>> TableSpecsFromConfig(
    const v1::TablesConfig& config) {
  if (config.tables_size() == 0) {
    return absl::InvalidArgumentError("the tables config declares no tables");
  }
  std::vector<TableSpec> specs;
  for (const v1::TableConfig& t : config.tables()) {
    absl::StatusOr<TableSpec> spec = TableSpecFromConfig(t);
    if (!spec.ok()) return spec.status();
    specs.push_back(*std::move(spec));
  }
  return specs;
}

absl::StatusOr<v1::TablesConfig> ReadTablesConfig(const std::string& path) {
  v1::TablesConfig config;
  if (absl::Status s = ReadTextProto(path, &config); !s.ok()) return s;
  return config;
}

}  // namespace recps::config
