// Deterministic initial rows: value (seed, table, id, column) -> float from a
// counter-based generator. The value does not depend on which server holds
// the row, when it was touched, or how the cluster is sharded, which is what
// makes runs with 1 and N shard servers bit-identical.
#ifndef RECPS_COMMON_ROW_INIT_H_
#define RECPS_COMMON_ROW_INIT_H_

#include <cstdint>

namespace recps {

struct RowInit {
  enum class Distribution { kUniform, kNormal };
  Distribution distribution = Distribution::kUniform;
  // Uniform: [a, b). Normal: mean a, standard deviation b.
  float a = -0.05f;
  float b = 0.05f;
  // A column group of a table split column-wise (common/wire/shard_map.h) holds
  // columns [column_offset, column_offset + dim) of the unsplit table with
  // key `source_key`, and starts with exactly their values. source_key 0:
  // the table's own key, column_offset 0.
  uint64_t source_key = 0;
  int column_offset = 0;
};

// Writes the dim initial weights of row `id` of the table with key
// `table_key` (StableNameKey of its name); for a column group, columns
// [init.column_offset, init.column_offset + dim) of row `id` of the table
// with key init.source_key.
void InitRow(const RowInit& init, uint64_t seed, uint64_t table_key, int64_t id,
             int dim, float* out);

}  // namespace recps

#endif  // RECPS_COMMON_ROW_INIT_H_
