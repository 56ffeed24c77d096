#include "client/dedup.h"

#include <algorithm>
#include <cstddef>

#include "common/hashing.h"

namespace recps::client {
namespace {

// Table size for `n` distinct ids: a power of two at most half full, so
// linear probes stay short.
size_t TableSizeFor(size_t n) {
  size_t size = 16;
  while (size < 2 * n) size *= 2;
  return size;
}

// Slot index of `id` in `table` (power-of-two size): either the slot that
// holds it or the empty slot where it belongs.
size_t Probe(const std::vector<int32_t>& table,
             const std::vector<int64_t>& unique, int64_t id) {
  const size_t mask = table.size() - 1;
  size_t i = Mix64(static_cast<uint64_t>(id)) & mask;
  while (table[i] != 0 && unique[table[i] - 1] != id) i = (i + 1) & mask;
  return i;
}

// Rebuilds the table from out->unique with room for `capacity` ids.
void Rehash(size_t capacity, Dedup* out) {
  out->table.assign(TableSizeFor(capacity), 0);
  for (size_t u = 0; u < out->unique.size(); ++u) {
    out->table[Probe(out->table, out->unique, out->unique[u])] =
        static_cast<int32_t>(u + 1);
  }
}

}  // namespace

void Deduplicate(absl::Span<const int64_t> ids, Dedup* out) {
  out->unique.clear();
  out->inverse.clear();
  // Size the table for this input only: a small call after a big one clears
  // a small table, not the big one's.
  out->table.assign(TableSizeFor(ids.size()), 0);
  DeduplicateAppend(ids, out);
}

void DeduplicateAppend(absl::Span<const int64_t> ids, Dedup* out) {
  const size_t most = out->unique.size() + ids.size();
  if (out->table.size() < 2 * most) Rehash(most, out);
  out->unique.reserve(most);
  out->inverse.reserve(out->inverse.size() + ids.size());
  for (const int64_t id : ids) {
    int32_t& slot = out->table[Probe(out->table, out->unique, id)];
    if (slot == 0) {
      out->unique.push_back(id);
      slot = static_cast<int32_t>(out->unique.size());
    }
    out->inverse.push_back(slot - 1);
  }
}

}  // namespace recps::client
