// Async mode's answer to "up to which step has this server applied every
// worker's pushes" (LookupResponse.applied_step). In sync and bounded modes
// the step clock knows: it applies a step once every worker's push of it is
// in. In async mode it applies each push on arrival and counts the newest
// step of any worker (StepClock::applied_step), so a lookup's staleness
// would leave out the slow workers. This keeps each worker rank's last
// applied step and answers the oldest of them.
//
// A push is recorded after it was applied, so Oldest() never runs ahead of
// the rows. Thread-safe: one relaxed atomic per rank, no lock; Oldest()
// reads world_size integers (per lookup request, not per id).
#ifndef RECPS_SERVER_SHARD_WORKER_STEPS_H_
#define RECPS_SERVER_SHARD_WORKER_STEPS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>

namespace recps::server {

class WorkerSteps {
 public:
  // Every rank starts as having applied nothing (step -1).
  explicit WorkerSteps(int world_size)
      : size_(std::max(world_size, 1)),
        last_(std::make_unique<std::atomic<int64_t>[]>(size_)) {
    Reset(-1);
  }

  // Every rank counts as having applied up to `step`: the clock starts, or
  // starts again, at step + 1 (a fresh clock, ResumeAt, a rollback).
  void Reset(int64_t step) {
    for (int r = 0; r < size_; ++r) last_[r].store(step, std::memory_order_relaxed);
  }

  // Rank `rank`'s push of `step` was applied (a late retry of an older step
  // changes nothing). Ranks outside [0, world_size) are ignored (the server
  // refused their pushes).
  void Applied(int rank, int64_t step) {
    if (rank < 0 || rank >= size_) return;
    std::atomic<int64_t>& last = last_[rank];
    int64_t seen = last.load(std::memory_order_relaxed);
    while (seen < step &&
           !last.compare_exchange_weak(seen, step, std::memory_order_relaxed)) {
    }
  }

  // The oldest rank's last applied step (-1: some rank applied none).
  int64_t Oldest() const {
    int64_t oldest = std::numeric_limits<int64_t>::max();
    for (int r = 0; r < size_; ++r) {
      oldest = std::min(oldest, last_[r].load(std::memory_order_relaxed));
    }
    return oldest;
  }

 private:
  const int size_;
  const std::unique_ptr<std::atomic<int64_t>[]> last_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_WORKER_STEPS_H_
