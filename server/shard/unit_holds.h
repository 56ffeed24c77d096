// The holds of slot hand-overs: while a source hands units over, lookups
// and pushes that touch them wait (parked as closures) until the hold ends,
// then run again and meet the new map. The data plane asks ParkIfHeld on
// every request while any hold is active (one atomic load otherwise); the
// move source adds and releases holds.
#ifndef RECPS_SERVER_SHARD_UNIT_HOLDS_H_
#define RECPS_SERVER_SHARD_UNIT_HOLDS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "common/work_queue.h"
#include "recps/v1/shard.pb.h"
#include "server/shard/step_clock.h"
#include "server/store/layered_store.h"

namespace recps::server {

class UnitHolds {
 public:
  struct Hold {
    // [table][slot]: 1 when held (tables not in the move: empty).
    std::vector<std::vector<uint8_t>> held;
    // Sync and bounded: lookups (and pushes) of this step and later wait;
    // async: every step (0).
    int64_t from_step = 0;
    // Sync and bounded, a target that owns nothing yet: every push of
    // from_step or later waits, whatever its ids (see the move source).
    bool all_pushes = false;
    std::vector<absl::AnyInvocable<void() &&>> parked;
  };

  // `store` and `work` (where released requests run) outlive this object.
  UnitHolds(const LayeredStore* store, uint32_t num_slots, WorkQueue* work)
      : store_(store), num_slots_(num_slots), work_(work) {}

  // Whether any hold is active (a lock-free check for every request).
  bool any() const { return active_.load() > 0; }
  // Records the step of a lookup or push before it checks the holds.
  void NoteRequestStep(int64_t step);
  // Whether a hold covers the request (a lookup's tables or a push's
  // parts); then it parked make_resume()'s closure, run when the hold ends.
  bool ParkIfHeld(const v1::RequestHeader& header,
                  const google::protobuf::RepeatedPtrField<v1::TableIds>* lookup,
                  const GradientPush* push,
                  absl::FunctionRef<absl::AnyInvocable<void() &&>()> make_resume);

  // Activates `hold` and returns the largest step a request noted so far
  // (a hand-over's L); from_step is L + 1, or 0 in async mode.
  int64_t Add(const std::shared_ptr<Hold>& hold, bool async);
  // Ends `hold`: its parked requests run on the work queue.
  void Release(const std::shared_ptr<Hold>& hold);

  // Async mode: pushes hold it as readers while they check holds and apply;
  // a hand-over takes it once as a writer (WaitForPushesInFlight), so no
  // push to a held unit is in flight after that.
  absl::Mutex& push_gate() { return push_gate_; }
  void WaitForPushesInFlight() {
    push_gate_.WriterLock();
    push_gate_.WriterUnlock();
  }

 private:
  const LayeredStore* const store_;
  const uint32_t num_slots_;
  WorkQueue* const work_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Hold>> holds_ ABSL_GUARDED_BY(mu_);
  // Read without the lock by every request (nonzero: check the holds).
  std::atomic<int> active_{0};
  // The largest step of a lookup or (sync, bounded) push that reached the
  // hold check: a hand-over's L.
  std::atomic<int64_t> max_request_step_{-1};
  absl::Mutex push_gate_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_UNIT_HOLDS_H_
