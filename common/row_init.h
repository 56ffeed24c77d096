// Deterministic initial rows: value (seed, table, id, column) -> float from a
// counter-based generator. The value does not depend on which server holds
// the row, when it was touched, or how the cluster is sharded, which is what
// makes runs with 1 and N shard servers bit-identical.
#ifndef RECPS_COMMON_ROW_INIT_H_
#define RECPS_COMMON_ROW_INIT_H_

#include <cstdint>

#include "common/hashing.h"

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

// The parts of InitRow that kernels/row_init.h compiles once per ISA (one
// formula, so every build gives the same bits).
namespace row_init_internal {

// The row's stream: every column's value is a function of it and the column.
inline uint64_t RowKey(const RowInit& init, uint64_t seed, uint64_t table_key, int64_t id) {
  const uint64_t key = init.source_key != 0 ? init.source_key : table_key;
  return Mix64(seed ^ Mix64(key ^ Mix64(static_cast<uint64_t>(id))));
}

// A uniform float in (0, 1) from 24 random bits (never exactly 0, so the
// logarithm of Box-Muller is finite).
inline float UnitOpen(uint64_t bits) {
  return (static_cast<float>(bits >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// Columns [first, first + dim) of a uniform row into out[0, dim): a loop
// without dependences between columns, which vectorises where the ISA has
// 64-bit multiplies (-ffp-contract=off keeps a + span * u two roundings).
inline void UniformColumns(float a, float span, uint64_t row_key, int first, int dim,
                           float* __restrict out) {
  for (int j = 0; j < dim; ++j) {
    out[j] = a + span * UnitOpen(Mix64(row_key + static_cast<uint64_t>(first + j)));
  }
}

}  // namespace row_init_internal

}  // namespace recps

#endif  // RECPS_COMMON_ROW_INIT_H_
