// The optimizers of embedding tables and dense parameters, one registered
// entry each: its kind, the names configs and logs use, the state it keeps
// per row, whether it has a dense form, and the check of its
// hyper-parameters. The config validator, the planner, the coordinator and
// the store read these entries; the update rules themselves are in
// kernels/optimizer.h (one dispatch, kernels::VisitOptimizer). No kernels
// here: every module may include this.
//
// Adding an optimizer: a kind below, its entry in optimizer_registry.cc, its
// OptimizerConfig.Kind value (proto/recps/v1/table.proto, the entry's
// config_name), its rule in kernels/optimizer.h and a case in
// kernels::VisitOptimizer, then its branch in the CPU loops and CUDA
// kernels the compiler asks for.
#ifndef RECPS_COMMON_OPTIMIZER_REGISTRY_H_
#define RECPS_COMMON_OPTIMIZER_REGISTRY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace recps {

// Stored in checkpoints (CheckpointTable.optimizer_kind): never renumber.
enum class OptimizerKind {
  kSgd = 0,
  kAdagrad = 1,
  kRowWiseAdagrad = 2,
  kAdam = 3,
  kAdamW = 4,
};

// Hyper-parameters (formulas: kernels/optimizer.h). Which of them a kind
// reads is the kind's business; every kind's check accepts the defaults.
struct OptimizerParams {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  float eps = 1e-8f;  // torch's Adagrad default is 1e-10, Adam's 1e-8
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float weight_decay = 0.0f;
};

// One part of an embedding row's optimizer state, in order after the
// weights: per_dim * dim + per_row 4-byte words.
struct OptimizerStatePart {
  enum class Values {
    kFloat,             // any finite float
    kNonNegativeFloat,  // a finite float >= 0 (sums of squares)
    kCount,             // uint32 bits (a step count), not a float
  };
  const char* what;  // "Adam first moment m": names a bad value
  int per_dim;
  int per_row;
  Values values;

  int64_t Width(int dim) const { return int64_t{per_dim} * dim + per_row; }
};

struct OptimizerInfo {
  OptimizerKind kind;
  // "rowwise_adagrad": logs, errors, flags (OptimizerName).
  const char* name;
  // "ROWWISE_ADAGRAD": its recps.v1.OptimizerConfig.Kind value's name.
  const char* config_name;
  // "row-wise Adagrad": in prose.
  const char* display_name;
  // The state after an embedding row's weights, in order (all zero in a
  // new row; kernels/embedding_optimizer.h lays the row out).
  absl::Span<const OptimizerStatePart> row_state;
  // Floats of state per dense parameter; -1: no dense form (an
  // embedding-only optimizer).
  int dense_state_per_param;
  // Null: a table may be split column-wise (each column group then trains
  // exactly as those columns of the unsplit table). Otherwise why not
  // ("keeps one accumulator per row"): the planner never splits it.
  const char* unsplittable_because;
  // For an embedding-only or unsplittable optimizer: the one to use there
  // instead (Adagrad for row-wise Adagrad); its own kind otherwise.
  OptimizerKind instead;
  // OK, or INVALID_ARGUMENT naming the bad hyper-parameter (p.kind is this
  // entry's kind).
  absl::Status (*validate)(const OptimizerParams& p);

  // Floats of row_state for a row of `dim` weights.
  int64_t RowStateWidth(int dim) const;
  bool has_dense_form() const { return dense_state_per_param >= 0; }
};

// Every registered optimizer, in kind order.
absl::Span<const OptimizerInfo> Optimizers();

// The entry of `kind`; null for a value no entry has.
const OptimizerInfo* FindOptimizer(OptimizerKind kind);
// The entry whose config_name is `config_name` ("ADAM"); null if none.
const OptimizerInfo* FindOptimizerByConfigName(absl::string_view config_name);

// The entry's name ("adam"), or "unknown".
const char* OptimizerName(OptimizerKind kind);

// The config names of the entries `keep` accepts, as a choice: "SGD,
// ADAGRAD, ADAM or ADAMW" (for errors).
std::string OptimizerConfigChoices(bool (*keep)(const OptimizerInfo&));

// OK, or INVALID_ARGUMENT: an unregistered kind, or (the entry's check) a
// bad hyper-parameter, named. The registered kinds check that learning
// rate and weight decay are finite and >= 0, eps > 0, betas in [0, 1).
absl::Status ValidateOptimizerParams(const OptimizerParams& p);

}  // namespace recps

#endif  // RECPS_COMMON_OPTIMIZER_REGISTRY_H_
