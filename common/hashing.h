// Stable hashes. Their values are part of the on-disk and on-wire contract
// (slot assignment, row initialisation): never change them.
#ifndef RECPS_COMMON_HASHING_H_
#define RECPS_COMMON_HASHING_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/host_device.h"

namespace recps {

// SplitMix64's finaliser: a bijective 64-bit mix with good avalanche.
RECPS_HOST_DEVICE inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// FNV-1a 64 of a string, then mixed: a table's stable key from its name, so
// hashing does not depend on the order tables appear in a config.
inline uint64_t StableNameKey(absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return Mix64(h);
}

// The slot of (table, id) among num_slots: every (table, id) of the cluster
// lands in one slot; the shard map assigns slots to servers.
// REQUIRES: num_slots > 0.
inline uint32_t SlotOf(uint64_t table_key, int64_t id, uint32_t num_slots) {
  const uint64_t h = Mix64(table_key ^ Mix64(static_cast<uint64_t>(id)));
  // Multiply-shift maps the hash onto [0, num_slots) without a division.
  return static_cast<uint32_t>(((h >> 32) * num_slots) >> 32);
}

}  // namespace recps

#endif  // RECPS_COMMON_HASHING_H_
