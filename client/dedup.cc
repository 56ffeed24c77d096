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

// Rebuilds the table from out->unique with room for `capacity` ids.
void Rehash(size_t capacity, Dedup* out) {
  out->table.assign(TableSizeFor(capacity), 0);
  const size_t mask = out->table.size() - 1;
  int32_t* const table = out->table.data();
  for (size_t u = 0; u < out->unique.size(); ++u) {
    // The ids in `unique` are distinct: find the first empty slot.
    size_t i = Mix64(static_cast<uint64_t>(out->unique[u])) & mask;
    while (table[i] != 0) i = (i + 1) & mask;
    table[i] = static_cast<int32_t>(u + 1);
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
  if (out->table.empty()) Rehash(ids.size(), out);
  out->inverse.reserve(out->inverse.size() + ids.size());
  // The table grows with the distinct ids (at most half full), not with the
  // input: several lists of one table tend to repeat each other's ids.
  size_t mask = out->table.size() - 1;
  int32_t* table = out->table.data();
  for (const int64_t id : ids) {
    size_t i = Mix64(static_cast<uint64_t>(id)) & mask;
    int32_t slot;
    while ((slot = table[i]) != 0 && out->unique[slot - 1] != id) {
      i = (i + 1) & mask;
    }
    if (slot == 0) {
      if (2 * (out->unique.size() + 1) > out->table.size()) {
        Rehash(2 * (out->unique.size() + 1), out);  // doubles the table
        mask = out->table.size() - 1;
        table = out->table.data();
        i = Mix64(static_cast<uint64_t>(id)) & mask;
        while (table[i] != 0) i = (i + 1) & mask;
      }
      out->unique.push_back(id);
      slot = static_cast<int32_t>(out->unique.size());
      table[i] = slot;
    }
    out->inverse.push_back(slot - 1);
  }
}

}  // namespace recps::client
