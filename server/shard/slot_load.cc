#include "server/shard/slot_load.h"

#include <utility>

#include "common/hashing.h"

namespace recps::server {
namespace {

// A thread's per-slot counts of the request it is counting, and which
// slots it touched (so only those are added and cleared).
struct Scratch {
  std::vector<uint32_t> counts;
  std::vector<uint32_t> touched;
};

Scratch& ThreadScratch(uint32_t num_slots) {
  thread_local Scratch scratch;
  if (scratch.counts.size() < num_slots) scratch.counts.resize(num_slots, 0);
  return scratch;
}

}  // namespace

SlotLoad::SlotLoad(uint32_t num_slots, absl::Time start, absl::Duration window)
    : num_slots_(num_slots),
      window_(window),
      lookups_(new std::atomic<uint64_t>[num_slots]),
      updates_(new std::atomic<uint64_t>[num_slots]) {
  for (uint32_t s = 0; s < num_slots; ++s) {
    lookups_[s].store(0, std::memory_order_relaxed);
    updates_[s].store(0, std::memory_order_relaxed);
  }
  older_ = {start, std::vector<uint64_t>(num_slots, 0), std::vector<uint64_t>(num_slots, 0)};
  newer_ = older_;
}

void SlotLoad::Count(Kind kind, uint64_t key, absl::Span<const int64_t> ids) {
  if (ids.empty() || num_slots_ == 0) return;
  Scratch& s = ThreadScratch(num_slots_);
  for (int64_t id : ids) {
    const uint32_t slot = SlotOf(key, id, num_slots_);
    if (s.counts[slot]++ == 0) s.touched.push_back(slot);
  }
  std::atomic<uint64_t>* counters = kind == Kind::kLookup ? lookups_.get() : updates_.get();
  for (uint32_t slot : s.touched) {
    counters[slot].fetch_add(s.counts[slot], std::memory_order_relaxed);
    s.counts[slot] = 0;
  }
  s.touched.clear();
}

SlotLoad::Snapshot SlotLoad::Read(absl::Time now) const {
  Snapshot out{now, std::vector<uint64_t>(num_slots_), std::vector<uint64_t>(num_slots_)};
  for (uint32_t s = 0; s < num_slots_; ++s) {
    out.lookups[s] = lookups_[s].load(std::memory_order_relaxed);
    out.updates[s] = updates_[s].load(std::memory_order_relaxed);
  }
  return out;
}

SlotLoad::Rates SlotLoad::RatesAt(absl::Time now) {
  Snapshot current = Read(now);
  absl::MutexLock lock(&mu_);
  if (now - newer_.time >= window_) older_ = std::exchange(newer_, current);
  Rates rates;
  rates.lookup_ids_per_second.assign(num_slots_, 0.0);
  rates.update_ids_per_second.assign(num_slots_, 0.0);
  const double seconds = absl::ToDoubleSeconds(now - older_.time);
  if (seconds <= 0) return rates;
  for (uint32_t s = 0; s < num_slots_; ++s) {
    rates.lookup_ids_per_second[s] = (current.lookups[s] - older_.lookups[s]) / seconds;
    rates.update_ids_per_second[s] = (current.updates[s] - older_.updates[s]) / seconds;
  }
  return rates;
}

}  // namespace recps::server
