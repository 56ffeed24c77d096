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
};

// Writes the dim initial weights of row `id` of the table with key
// `table_key` (StableNameKey of its name).
void InitRow(const RowInit& init, uint64_t seed, uint64_t table_key, int64_t id,
             int dim, float* out);

}  // namespace recps

#endif  // RECPS_COMMON_ROW_INIT_H_
