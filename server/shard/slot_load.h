// Ids looked up and pushed per slot, for the rebalancer's load
// (ShardAdmin.Stats: SlotStats.lookup_ids_per_second and
// update_ids_per_second; the rebalance planner moves hot slots by them).
// Cheap on the request path: a request's ids are counted into a scratch
// array of the calling thread (one add per id, no atomics, no allocation
// once the thread has seen the slot count), then each slot it touched is
// added once to the shared counters (one relaxed atomic add per slot).
#ifndef RECPS_SERVER_SHARD_SLOT_LOAD_H_
#define RECPS_SERVER_SHARD_SLOT_LOAD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace recps::server {

class SlotLoad {
 public:
  enum class Kind { kLookup, kUpdate };

  // Rates cover the last `window` to 2 x `window` (the counters' values
  // are kept once per window), and everything since `start` until the
  // first window has passed.
  SlotLoad(uint32_t num_slots, absl::Time start, absl::Duration window = absl::Minutes(1));

  // Counts the ids of one request of a table routed by slot: `key` is the
  // table's StableNameKey (the slot of an id is SlotOf(key, id, slots)).
  void Count(Kind kind, uint64_t key, absl::Span<const int64_t> ids);

  struct Rates {
    std::vector<double> lookup_ids_per_second;  // one per slot
    std::vector<double> update_ids_per_second;
  };
  // Ids per second of each slot, up to `now`.
  Rates RatesAt(absl::Time now);

  uint32_t num_slots() const { return num_slots_; }

 private:
  struct Snapshot {
    absl::Time time;
    std::vector<uint64_t> lookups, updates;
  };
  Snapshot Read(absl::Time now) const;

  const uint32_t num_slots_;
  const absl::Duration window_;
  std::unique_ptr<std::atomic<uint64_t>[]> lookups_, updates_;
  absl::Mutex mu_;
  // The counters one window ago (or at start), and at the newest rotation.
  Snapshot older_ ABSL_GUARDED_BY(mu_), newer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SLOT_LOAD_H_
