// Fused optimizer update of embedding rows: for each updated row, the
// gradient is applied and the optimizer state advanced in one pass over the
// row, so no gradient buffer for the whole table ever exists.
//
// A fused row is fp32: [ weights (dim) | optimizer state | padding ], with
// the state laid out per kind (see FusedRowStateWidth):
//   SGD              : nothing
//   Adagrad          : sum of squares (dim)
//   Row-wise Adagrad : sum of mean squares (1)
//   Adam / AdamW     : m (dim), v (dim), step count (1, uint32 bits)
// Adam's bias correction uses the row's own step count, which counts the
// updates this row has received.
#ifndef RECPS_KERNELS_EMBEDDING_OPTIMIZER_H_
#define RECPS_KERNELS_EMBEDDING_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/exec_context.h"
#include "kernels/optimizer.h"

namespace recps::kernels {

// Floats of optimizer state after the weights of a row.
int64_t FusedRowStateWidth(OptimizerKind kind, int dim);

// dim + state, rounded up to a multiple of 4 floats so every row starts on a
// 16-byte boundary (vector loads on CPU and GPU).
int64_t FusedRowStride(OptimizerKind kind, int dim);

// Initial optimizer state of a row (all kinds: zeros, step count 0).
void InitFusedRowState(OptimizerKind kind, int dim, float* row);

struct FusedUpdateArgs {
  // num_rows fused rows of row_stride floats
  // (row_stride >= dim + FusedRowStateWidth).
  float* rows = nullptr;
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
