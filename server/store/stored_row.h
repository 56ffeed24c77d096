// How a table's rows are stored (kernels/embedding_optimizer.h: weights in
// the table's precision, fp32 optimizer state, padding) and the conversions
// between stored rows and the fp32 fused rows that leave and enter every
// store (SlotChunk, ReadRows, ImportRows, checkpoints). Shared by the host
// store and the device store, so both keep the same bits for the same
// table.
#ifndef RECPS_SERVER_STORE_STORED_ROW_H_
#define RECPS_SERVER_STORE_STORED_ROW_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/config/table_spec.h"
#include "common/wire/wire_format.h"
#include "kernels/embedding_optimizer.h"

namespace recps::server {

struct StoredRowFormat {
  int dim = 0;
  OptimizerKind kind = OptimizerKind::kSgd;
  RowPrecision precision = RowPrecision::kFp32;
  // Floats per fused fp32 row as rows leave and enter the store:
  // FusedRowStride(kind, dim).
  int64_t stride = 0;
  // 4-byte words per stored row and where its fp32 optimizer state starts.
  // For fp32 tables row_words == stride and state_offset == dim.
  int64_t row_words = 0;
  int64_t state_offset = 0;

  static StoredRowFormat For(const config::TableSpec& spec);

  bool Is16Bit() const { return precision != RowPrecision::kFp32; }
  // The wire encoding of 16-bit weights. REQUIRES: Is16Bit().
  v1::RowEncoding Encoding16() const {
    return precision == RowPrecision::kFp16
               ? v1::ROW_ENCODING_FLOAT16
               : v1::ROW_ENCODING_BFLOAT16;
  }
  int64_t RowBytes() const {
    return row_words * static_cast<int64_t>(sizeof(float));
  }

  // The dim weights of a stored row as floats (exact for every precision:
  // widening loses nothing).
  void ReadWeights(const float* row, float* out) const;
  // Stored row -> fp32 fused row of `stride` floats (zero padding).
  void ExportRow(const float* row, float* out) const;
  // fp32 fused row (validated: ValidateImportedRow) -> stored row: 16-bit
  // weights round to nearest even; the state is copied, padding zeroed.
  void ImportRow(const float* src, float* dst) const;
  // dim float weights -> the stored row's weights (rounded to nearest even
  // for 16-bit rows, the pad half-word zeroed); the state is not touched.
  void StoreWeights(const float* weights, float* row) const;
  // A new row's initial value: the weights of `init` for `id` (rounded for
  // 16-bit rows) and zero optimizer state, padding zeroed.
  void InitStoredRow(const RowInit& init, uint64_t seed,
                     uint64_t table_key, int64_t id, float* row) const;
};

// OK when `row` (a whole fp32 fused row of `spec`) may be stored: weights
// and optimizer state finite, second moments >= 0, and, for FP16 tables,
// weights within fp16's range. Adam's step count (uint32 bits) takes any
// value; padding is not read. The error names the table, id, position and
// column.
absl::Status ValidateImportedRow(const config::TableSpec& spec,
                                 const float* row, int64_t id,
                                 size_t position);

}  // namespace recps::server

#endif  // RECPS_SERVER_STORE_STORED_ROW_H_
