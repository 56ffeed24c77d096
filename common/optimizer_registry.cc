#include "common/optimizer_registry.h"

#include <cmath>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recps {
namespace {

using Values = OptimizerStatePart::Values;

// The checks every registered kind shares (torch's ranges).
absl::Status ValidateStandardParams(const OptimizerParams& p) {
  auto bad = [&](const char* field, float value, const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat(
        OptimizerName(p.kind), " ", field, " is ", value, "; ", rule));
  };
  if (!std::isfinite(p.learning_rate) || p.learning_rate < 0) {
    return bad("learning_rate", p.learning_rate, "it must be finite and >= 0");
  }
  if (!std::isfinite(p.weight_decay) || p.weight_decay < 0) {
    return bad("weight_decay", p.weight_decay, "it must be finite and >= 0");
  }
  if (!std::isfinite(p.eps) || p.eps <= 0) {
    return bad("eps", p.eps, "it must be finite and > 0");
  }
  if (!(p.beta1 >= 0 && p.beta1 < 1))
    return bad("beta1", p.beta1, "it must be in [0, 1)");
  if (!(p.beta2 >= 0 && p.beta2 < 1))
    return bad("beta2", p.beta2, "it must be in [0, 1)");
  return absl::OkStatus();
}

constexpr OptimizerStatePart kAdagradState[] = {
    {"Adagrad sum of squares", 1, 0, Values::kNonNegativeFloat},
};
constexpr OptimizerStatePart kRowWiseAdagradState[] = {
    {"row-wise Adagrad sum of mean squares", 0, 1, Values::kNonNegativeFloat},
};
constexpr OptimizerStatePart kAdamState[] = {
    {"Adam first moment m", 1, 0, Values::kFloat},
    {"Adam second moment v", 1, 0, Values::kNonNegativeFloat},
    {"Adam step count", 0, 1, Values::kCount},
};

// Indexed by kind. Fields: kind, name, config_name, display_name,
// row_state, dense_state_per_param, unsplittable_because, instead,
// validate.
// clang-format off
constexpr OptimizerInfo kOptimizers[] = {
    {OptimizerKind::kSgd, "sgd", "SGD", "SGD",
     {}, 0, nullptr, OptimizerKind::kSgd, ValidateStandardParams},
    {OptimizerKind::kAdagrad, "adagrad", "ADAGRAD", "Adagrad",
     kAdagradState, 1, nullptr, OptimizerKind::kAdagrad, ValidateStandardParams},
    {OptimizerKind::kRowWiseAdagrad, "rowwise_adagrad", "ROWWISE_ADAGRAD", "row-wise Adagrad",
     kRowWiseAdagradState, -1, "keeps one accumulator per row", OptimizerKind::kAdagrad,
     ValidateStandardParams},
    {OptimizerKind::kAdam, "adam", "ADAM", "Adam",
     kAdamState, 2, nullptr, OptimizerKind::kAdam, ValidateStandardParams},
    {OptimizerKind::kAdamW, "adamw", "ADAMW", "AdamW",
     kAdamState, 2, nullptr, OptimizerKind::kAdamW, ValidateStandardParams},
};
// clang-format on

constexpr bool IndexedByKind() {
  for (size_t i = 0; i < std::size(kOptimizers); ++i) {
    if (static_cast<size_t>(kOptimizers[i].kind) != i) return false;
  }
  return true;
}
static_assert(IndexedByKind(), "kOptimizers[i] must be the entry of kind i");

}  // namespace

int64_t OptimizerInfo::RowStateWidth(int dim) const {
  int64_t width = 0;
  for (const OptimizerStatePart& part : row_state) width += part.Width(dim);
  return width;
}

absl::Span<const OptimizerInfo> Optimizers() { return kOptimizers; }

const OptimizerInfo* FindOptimizer(OptimizerKind kind) {
  const auto i = static_cast<size_t>(kind);
  if (i >= std::size(kOptimizers)) return nullptr;
  return &kOptimizers[i];
}

const OptimizerInfo* FindOptimizerByConfigName(absl::string_view config_name) {
  for (const OptimizerInfo& info : kOptimizers) {
    if (config_name == info.config_name) return &info;
  }
  return nullptr;
}

const char* OptimizerName(OptimizerKind kind) {
  const OptimizerInfo* info = FindOptimizer(kind);
  return info != nullptr ? info->name : "unknown";
}

std::string OptimizerConfigChoices(bool (*keep)(const OptimizerInfo&)) {
  std::vector<absl::string_view> names;
  for (const OptimizerInfo& info : kOptimizers) {
    if (keep(info)) names.push_back(info.config_name);
  }
  if (names.size() <= 1) return absl::StrJoin(names, "");
  return absl::StrCat(absl::StrJoin(names.begin(), names.end() - 1, ", "),
                      " or ", names.back());
}

absl::Status ValidateOptimizerParams(const OptimizerParams& p) {
  const OptimizerInfo* info = FindOptimizer(p.kind);
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer kind ", static_cast<int>(p.kind)));
  }
  return info->validate(p);
}

}  // namespace recps
