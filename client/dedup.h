// Deduplication of id lists in first-seen order: the client sends each id of
// a table once per request, and the worker pools embedding bags through the
// inverse map.
#ifndef RECPS_CLIENT_DEDUP_H_
#define RECPS_CLIENT_DEDUP_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace recps::client {

struct Dedup {
  // Distinct ids in the order they were first seen.
  std::vector<int64_t> unique;
  // One entry per input id: its index in `unique`.
  std::vector<int32_t> inverse;
  // Scratch: open-addressing table of (index in `unique`) + 1, 0 = empty.
  // Kept here so repeated calls reuse its memory; always mirrors `unique`.
  std::vector<int32_t> table;
};

// Fills `out` with the distinct ids of `ids` and the inverse map, reusing
// out's capacity. REQUIRES: ids.size() < 2^30.
void Deduplicate(absl::Span<const int64_t> ids, Dedup* out);

// Like Deduplicate, but continues `out`: ids already in out->unique keep their
// index, new ones are appended, and one inverse entry per id is appended. For
// several id lists of one table. REQUIRES: out came from Deduplicate or
// DeduplicateAppend (or is empty) and was not modified since.
void DeduplicateAppend(absl::Span<const int64_t> ids, Dedup* out);

// Takes `ids`, which the caller knows to be distinct, as out->unique with
// the identity inverse, without hashing (an id list deduplicated once
// upstream). A later DeduplicateAppend on `out` rebuilds the hash table
// first. REQUIRES: ids distinct, ids.size() < 2^30.
void AssignDistinct(absl::Span<const int64_t> ids, Dedup* out);

}  // namespace recps::client

#endif  // RECPS_CLIENT_DEDUP_H_
