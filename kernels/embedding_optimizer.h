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
//
// A 16-bit row (RowPrecision kFp16 / kBf16; FBGEMM's layout: 16-bit weights,
// fp32 optimizer state) is, in 4-byte words:
//   [ weights (dim uint16, padded to a whole word) |
//     optimizer state (fp32, as above) | padding to a multiple of 4 words ]
// Every row starts on a 16-byte boundary, as fp32 rows do, and the state
// does too whenever dim is a multiple of 8 (as the fp32 state does when dim
// is a multiple of 4). A 16-bit row is never larger than the fp32 row and
// takes 2*dim fewer bytes before padding (half for SGD).
// The update widens the weights to fp32, applies exactly the fp32 rule to
// them and the state, and rounds the weights back once per update: to
// nearest even, or (stochastic_rounding, as FBGEMM offers) up or down with
// probability by closeness, random bits hashed from the value and column.
// Rows leave and enter the store as fp32 fused rows (FusedRowStride floats):
// widening is exact, so a 16-bit row exports and re-imports bit-identically.
#ifndef RECPS_KERNELS_EMBEDDING_OPTIMIZER_H_
#define RECPS_KERNELS_EMBEDDING_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/exec_context.h"
#include "kernels/optimizer.h"

namespace recps::kernels {

// How a table stores its weights (optimizer state is always fp32).
enum class RowPrecision { kFp32, kFp16, kBf16 };

// "fp32", "fp16" or "bf16".
const char* RowPrecisionName(RowPrecision precision);

// Floats of optimizer state after the weights of a row.
int64_t FusedRowStateWidth(OptimizerKind kind, int dim);

// dim + state, rounded up to a multiple of 4 floats so every row starts on a
// 16-byte boundary (vector loads on CPU and GPU).
int64_t FusedRowStride(OptimizerKind kind, int dim);

// The stored row in `precision`, in 4-byte words: where the optimizer state
// starts (dim for fp32; ceil(dim / 2) for 16-bit weights) and the row
// stride (a multiple of 4 words). For kFp32 these are dim and
// FusedRowStride(kind, dim).
int64_t FusedRowStateOffset(int dim, RowPrecision precision);
int64_t FusedRowStride(OptimizerKind kind, int dim, RowPrecision precision);

// Initial optimizer state of a row (all kinds: zeros, step count 0).
void InitFusedRowState(OptimizerKind kind, int dim, float* row);

struct FusedUpdateArgs {
  // num_rows fused rows of row_stride 4-byte words
  // (row_stride >= FusedRowStateOffset + FusedRowStateWidth), stored in
  // `precision` (see the layout above).
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
