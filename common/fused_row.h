// The stored embedding row: weights and their optimizer's state side by
// side, so that one pass over a row applies a gradient (the fused update,
// kernels/embedding_optimizer.h). Shared by the kernels, the stores, the
// checkpoints and the planner's byte counts.
//
// A fused row is fp32: [ weights (dim) | optimizer state | padding ], the
// state laid out as its optimizer's registry entry says
// (OptimizerInfo::row_state, common/optimizer_registry.h):
//   SGD              : nothing
//   Adagrad          : sum of squares (dim)
//   Row-wise Adagrad : sum of mean squares (1)
//   Adam / AdamW     : m (dim), v (dim), step count (1, uint32 bits)
//
// A 16-bit row (RowPrecision kFp16 / kBf16; FBGEMM's layout: 16-bit weights,
// fp32 optimizer state) is, in 4-byte words:
//   [ weights (dim uint16, padded to a whole word) |
//     optimizer state (fp32, as above) | padding to a multiple of 4 words ]
// Every row starts on a 16-byte boundary, as fp32 rows do, and the state
// does too whenever dim is a multiple of 8 (as the fp32 state does when dim
// is a multiple of 4). A 16-bit row is never larger than the fp32 row and
// takes 2*dim fewer bytes before padding (half for SGD).
// Rows leave and enter the store as fp32 fused rows (FusedRowStride floats).
#ifndef RECPS_COMMON_FUSED_ROW_H_
#define RECPS_COMMON_FUSED_ROW_H_

#include <cstdint>

#include "common/optimizer_registry.h"

namespace recps {

// How a table stores its weights (optimizer state is always fp32).
enum class RowPrecision { kFp32, kFp16, kBf16 };

// "fp32", "fp16" or "bf16".
const char* RowPrecisionName(RowPrecision precision);

// Floats of optimizer state after the weights of a row (0 for a kind no
// entry has).
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

// Initial optimizer state of an fp32 row (all kinds: zeros, step count 0).
void InitFusedRowState(OptimizerKind kind, int dim, float* row);

}  // namespace recps

#endif  // RECPS_COMMON_FUSED_ROW_H_
