#include "common/row_init.h"

#include <cmath>

namespace recps {

using row_init_internal::RowKey;
using row_init_internal::UniformColumns;
using row_init_internal::UnitOpen;

void InitRow(const RowInit& init, uint64_t seed, uint64_t table_key, int64_t id,
             int dim, float* out) {
  const uint64_t row_key = RowKey(init, seed, table_key, id);
  // Column c of the (unsplit) row goes to out[c - first].
  const int first = init.column_offset;
  const int last = first + dim;
  if (init.distribution == RowInit::Distribution::kUniform) {
    UniformColumns(init.a, init.b - init.a, row_key, first, dim, out);
    return;
  }
  // Box-Muller on column pairs: columns 2k and 2k+1 share two uniforms (a
  // group may start or end inside a pair).
  for (int c = first - (first & 1); c < last; c += 2) {
    const uint64_t pair = row_key + static_cast<uint64_t>(c);
    const float u1 = UnitOpen(Mix64(pair));
    const float u2 = UnitOpen(Mix64(pair ^ 0x9e3779b97f4a7c15ULL));
    const float r = std::sqrt(-2.0f * std::log(u1));
    const float theta = 6.28318530718f * u2;
    if (c >= first) out[c - first] = init.a + init.b * r * std::cos(theta);
    if (c + 1 >= first && c + 1 < last) {
      out[c + 1 - first] = init.a + init.b * r * std::sin(theta);
    }
  }
}

}  // namespace recps
