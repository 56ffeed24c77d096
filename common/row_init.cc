#include "common/row_init.h"

#include <cmath>

#include "common/hashing.h"

namespace recps {
namespace {

// A uniform float in (0, 1) from 24 random bits (never exactly 0, so the
// logarithm of Box-Muller is finite).
inline float UnitOpen(uint64_t bits) {
  return (static_cast<float>(bits >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

}  // namespace

void InitRow(const RowInit& init, uint64_t seed, uint64_t table_key, int64_t id,
             int dim, float* out) {
  const uint64_t key = init.source_key != 0 ? init.source_key : table_key;
  const uint64_t row_key =
      Mix64(seed ^ Mix64(key ^ Mix64(static_cast<uint64_t>(id))));
  // Column c of the (unsplit) row goes to out[c - first].
  const int first = init.column_offset;
  const int last = first + dim;
  if (init.distribution == RowInit::Distribution::kUniform) {
    const float span = init.b - init.a;
    for (int c = first; c < last; ++c) {
      out[c - first] =
          init.a + span * UnitOpen(Mix64(row_key + static_cast<uint64_t>(c)));
    }
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
