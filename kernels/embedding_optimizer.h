// Fused optimizer update of embedding rows: for each updated row, the
// gradient is applied and the optimizer state advanced in one pass over the
// row, so no gradient buffer for the whole table ever exists.
//
// The rows are fused rows (common/fused_row.h: weights, then the state the
// optimizer's registry entry lists, padded to 16 bytes), fp32 or with
// 16-bit weights. Adam's bias correction uses the row's own step count,
// which counts the updates this row has received.
// The update widens 16-bit weights to fp32, applies exactly the fp32 rule to
// them and the state, and rounds the weights back once per update: to
// nearest even, or (stochastic_rounding, as FBGEMM offers) up or down with
// probability by closeness, random bits hashed from the value and column.
// Widening is exact, so a 16-bit row exports and re-imports bit-identically.
#ifndef RECPS_KERNELS_EMBEDDING_OPTIMIZER_H_
#define RECPS_KERNELS_EMBEDDING_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/fused_row.h"
#include "kernels/exec_context.h"
#include "kernels/optimizer.h"

namespace recps::kernels {

struct FusedUpdateArgs {
  // num_rows fused rows of row_stride 4-byte words
  // (row_stride >= FusedRowStateOffset + FusedRowStateWidth), stored in
  // `precision` (common/fused_row.h).
  float* rows = nullptr;
  RowPrecision precision = RowPrecision::kFp32;
  // 16-bit rows: round the updated weights stochastically (unbiased; see
  // optimizer_simd.cc) instead of to nearest even. Ignored for fp32.
  bool stochastic_rounding = false;
  int64_t num_rows = 0;
  int64_t row_stride = 0;
  int dim = 0;
  // num_updates row numbers, pairwise distinct, each in [0, num_rows).
  const int64_t* row_indices = nullptr;
  int64_t num_updates = 0;
  // Gradient rows of dim floats; update i applies gradient row
  // grad_indices[i] (or i when grad_indices is null) to rows[row_indices[i]].
  // The indirection lets a caller update a subset (say, one lock stripe's
  // rows) of a batch without copying its gradients.
  const float* grads = nullptr;
  const int64_t* grad_indices = nullptr;
  OptimizerParams optimizer;
};

// Returns INVALID_ARGUMENT for bad shapes or params or (CPU) an index out of
// range, before touching any row. REQUIRES: row_indices distinct (the shard
// server dedups; duplicates would race).
absl::Status FusedOptimizerUpdateCpu(const FusedUpdateArgs& args,
                                     const ExecContext& ctx);
absl::Status FusedOptimizerUpdateCuda(const FusedUpdateArgs& args,
                                      const ExecContext& ctx);

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_EMBEDDING_OPTIMIZER_H_
