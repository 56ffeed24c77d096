#include "common/fused_row.h"

#include <cstring>

namespace recps {

const char* RowPrecisionName(RowPrecision precision) {
  switch (precision) {
    case RowPrecision::kFp32:
      return "fp32";
    case RowPrecision::kFp16:
      return "fp16";
    case RowPrecision::kBf16:
      return "bf16";
  }
  return "unknown";
}

int64_t FusedRowStateWidth(OptimizerKind kind, int dim) {
  const OptimizerInfo* info = FindOptimizer(kind);
  return info != nullptr ? info->RowStateWidth(dim) : 0;
}

int64_t FusedRowStride(OptimizerKind kind, int dim) {
  const int64_t used = dim + FusedRowStateWidth(kind, dim);
  return (used + 3) / 4 * 4;
}

int64_t FusedRowStateOffset(int dim, RowPrecision precision) {
  if (precision == RowPrecision::kFp32) return dim;
  // dim halves padded to whole 4-byte words.
  return (int64_t{dim} + 1) / 2;
}

int64_t FusedRowStride(OptimizerKind kind, int dim, RowPrecision precision) {
  if (precision == RowPrecision::kFp32) return FusedRowStride(kind, dim);
  const int64_t used =
      FusedRowStateOffset(dim, precision) + FusedRowStateWidth(kind, dim);
  return (used + 3) / 4 * 4;
}

void InitFusedRowState(OptimizerKind kind, int dim, float* row) {
  // Zero floats and a zero uint32 step count have the same bits.
  std::memset(row + dim, 0, sizeof(float) * FusedRowStateWidth(kind, dim));
}

}  // namespace recps
