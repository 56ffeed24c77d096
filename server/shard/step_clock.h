// The shard server's step clock: the consistency model of the design
// notes ("Consistency is a staleness bound"; docs/shard-server.md).
//
//  - kSync (staleness 0, BSP): pushes of step t from all W workers are
//    buffered, summed per id in rank order and applied once; a lookup for
//    step t waits until step t-1 is applied.
//  - kBounded (staleness k, SSP): the same aggregation, but a lookup for step
//    t only waits for step t-1-k.
//  - kAsync: each push is applied on arrival; lookups never wait.
//
// A step that waits longer than step_timeout fails its waiting lookups with
// DEADLINE_EXCEEDED naming the workers whose pushes are missing.
//
// Plain class, no gRPC: the service calls it from its request threads.
// Thread-safe.
#ifndef RECPS_SERVER_SHARD_STEP_CLOCK_H_
#define RECPS_SERVER_SHARD_STEP_CLOCK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace recps::server {

enum class ConsistencyMode { kSync, kBounded, kAsync };

// "sync", "bounded", "async".
const char* ConsistencyModeName(ConsistencyMode mode);

struct ConsistencyOptions {
  ConsistencyMode mode = ConsistencyMode::kSync;
  // kBounded: how many steps a lookup may run ahead of the applied step.
  int staleness = 0;
  // Workers in the job; pushes name their rank in [0, world_size).
  int world_size = 1;
  // Longest a lookup waits for its step to become ready.
  absl::Duration step_timeout = absl::Seconds(60);
  // Most lookups parked at once waiting for their step, and most ids over
  // all of them (each parked lookup holds its request); a lookup past
  // either gets RESOURCE_EXHAUSTED instead of parking.
  int max_parked_lookups = 4096;
  int64_t max_parked_ids = int64_t{1} << 24;
  // Replication (server/shard/replication.h): steps a push may run ahead
  // of the window above (a replica clock takes forwards out of order).
  int forward_window = 0;
  // A replica clock: a rank's push of a step it already pushed is a
  // worker's retry, on the promoted server, of a push the lost primary had
  // forwarded here. Sync, bounded: ids already in the rank's pending push
  // are dropped when their gradients are the same bits (INVALID_ARGUMENT
  // otherwise), and a push of a step already applied is dropped. Async:
  // ids of the rank's newest step applied already are dropped (a rank
  // pushes each id once a step, and step t + 1 only once t was answered).
  bool replica = false;
};

// One table's part of a push: distinct ids and one gradient row each.
struct TableGradients {
  int table = 0;
  int dim = 0;
  std::vector<int64_t> ids;
  // ids.size() x dim gradient values: owned here, or, when `borrowed` is
  // set, read in place from the request that carried them (no copy of the
  // largest buffer of a push). A borrowed push is valid only while that
  // request is: the step clock applies it before Push returns, or Own()s it.
  std::vector<float> grads;
  const float* borrowed = nullptr;

  const float* data() const { return borrowed != nullptr ? borrowed : grads.data(); }
  // Copies borrowed values into `grads`, with room for `room_for` times as
  // many (a sync step's first push: the later ranks' new rows are appended
  // to it by SumInRankOrder without moving it all again).
  void Own(int room_for = 1);
};
using GradientPush = std::vector<TableGradients>;

class StepClock {
 public:
  // Applies one push (async) or one step's summed pushes (sync, bounded).
  // Called for one step at a time, in step order.
  using ApplyFn = absl::AnyInvocable<absl::Status(GradientPush&)>;

  StepClock(const ConsistencyOptions& options, ApplyFn apply);
  // Fails every waiting lookup with UNAVAILABLE, then stops the timer.
  ~StepClock();

  const ConsistencyOptions& options() const { return options_; }

  // Records worker `rank`'s push for `step`, and applies every step that is
  // now complete (on the calling thread). A push with borrowed rows is
  // either applied before Push returns or copied (Own) to be kept. `part`
  // is the push's identity (RequestHeader.push_part):
  //  - A part already accepted for (rank, step) is a retry: dropped, OK
  //    (remembered for the last kRememberedParts parts of each rank, so also
  //    after its step was applied).
  //  - part 0 (no identity): any push after the first of (rank, step) is
  //    dropped as a retry.
  //  - Sync, bounded: the rank's first part makes it arrived for the step
  //    (the step applies once every rank arrived); a later part with a new
  //    id is merged into the rank's push while the step is pending (its ids
  //    must not repeat one of the rank's earlier parts: INVALID_ARGUMENT),
  //    so the step's sum per id stays in rank order, bit-exact.
  //  - Async: every new part is applied on arrival.
  // Errors: INVALID_ARGUMENT for a rank outside the job; FAILED_PRECONDITION
  // for a step already applied (a new part of it too) or beyond the
  // staleness window; the apply error if applying fails.
  absl::Status Push(int rank, int64_t step, GradientPush push,
                    uint64_t part = 0);
  static constexpr int kRememberedParts = 1024;

  // ---- Slot moves ----
  // Waits (at most `timeout`) until step `step` is applied and no apply
  // runs. OK at once for step < 0 or when a later step is applied;
  // DEADLINE_EXCEEDED naming the missing pushes; UNAVAILABLE while
  // shutting down; the apply error after a failed apply.
  absl::Status WaitApplied(int64_t step, absl::Duration timeout);

  // Calls done(OK) when a lookup for `step` may run: at once (inline) when it
  // already may, later from the thread that applies the step it waits for,
  // or done(DEADLINE_EXCEEDED) after step_timeout. INVALID_ARGUMENT for a
  // negative step. A lookup that must wait counts `ids` against
  // max_parked_ids; RESOURCE_EXHAUSTED (at once) naming the limit when it
  // would pass either parking limit. `cancelled`, if set, is polled while
  // the lookup waits (every 50 ms; it must stay callable until done runs):
  // once it returns true the lookup is dropped with done(CANCELLED), so a
  // client that gave up does not hold memory for the whole step timeout.
  void AwaitLookup(int64_t step, absl::AnyInvocable<void(absl::Status) &&> done,
                   int64_t ids = 0, std::function<bool()> cancelled = nullptr);

  // ---- Checkpoints ----
  // Waits (at most `timeout`) until every step before `step` is applied and
  // no apply runs, then calls fn() with the clock held: no step is applied
  // (and no lookup released) while fn runs, so fn sees the state after
  // exactly `step` steps (sync and bounded modes; in async mode pushes are
  // applied outside the clock and the cut is per row). Returns fn's status;
  // FAILED_PRECONDITION when step `step` or a later one was already
  // applied; DEADLINE_EXCEEDED naming the missing pushes; UNAVAILABLE while
  // shutting down; the apply error after a failed apply.
  absl::Status RunAtCut(int64_t step, absl::Duration timeout,
                        absl::FunctionRef<absl::Status()> fn);
  // Restarts the clock at `step` (steps completed, e.g. a restored
  // checkpoint's): step-1 counts as applied, so lookups for `step` run and
  // pushes for `step` are the next to apply; waiting lookups that may now
  // run are released. FAILED_PRECONDITION once any push arrived or a step
  // was applied (the clock only moves forward from a fresh start);
  // INVALID_ARGUMENT for a negative step.
  absl::Status ResumeAt(int64_t step);

  // A rollback (RestoreRowsRequest.replace): waits for the apply that runs
  // (if any), then forgets the earlier run: buffered pushes, remembered
  // push identities, an apply error and AdoptStep's step; fails waiting
  // lookups with ABORTED; and starts again as ResumeAt(step) on a fresh
  // clock would. INVALID_ARGUMENT for a negative step.
  absl::Status Restart(int64_t step);

  // A server that starts owning slots while the job trains (a new or
  // drained server, the target of a slot move) joins at the source's step:
  // steps up to `step` count as applied (lookups of step+1 run, pushes of
  // step+1 are the next to apply), waiting lookups that may now run are
  // released, and pushes kept from before (the server owned nothing since)
  // are dropped. From then on an EMPTY push of a step <= `step` is
  // accepted and dropped (a rank that routed that step by an older map
  // had nothing for this server); one with ids stays FAILED_PRECONDITION.
  // No-op when the clock is already past `step`. INVALID_ARGUMENT for a
  // step < -1.
  absl::Status AdoptStep(int64_t step);

  // Whether worker `rank`'s push of `step` is in: the step was applied,
  // or the rank's push of it is pending.
  bool Arrived(int rank, int64_t step) const;

  // ---- Failover lineage (server/shard/replication.h) ----
  // Whether the clock is between steps: none pending, none being applied
  // or held by a cut, no apply error.
  bool BetweenSteps() const;
  // The newest step a push arrived for or was applied (-1: none).
  int64_t newest_step() const;
  // Merges this clock (a lost primary's replica clock on the server that
  // took its units over) into `into`, this server's own clock, when both
  // are between steps at the same applied step: `into` remembers the push
  // identities this clock accepted (a worker's late retry of one is still
  // dropped), this clock's waiting lookups move to `into`, and its later
  // AwaitLookup, WaitApplied and RunAtCut go there. FAILED_PRECONDITION,
  // nothing changed, when the two are not at one step between steps;
  // INVALID_ARGUMENT for `into` == this.
  // Locks `into` before this clock (a checkpoint cut holds them in that
  // order). The caller stops pushes to this clock first.
  absl::Status MergeInto(StepClock* into);
  // The clock this one was merged into; null before.
  StepClock* merged_into() const { return merged_into_.load(std::memory_order_acquire); }

  // Whether any push arrived or a step was applied (ResumeAt is refused).
  bool started() const;
  // Whether any push arrived since the clock started (ResumeAt keeps it
  // false; a restart clears it).
  bool any_push() const;

  // Newest applied step; -1 before the first.
  int64_t applied_step() const;
  // Lookups currently waiting, and their ids.
  int waiting_lookups() const;
  int64_t waiting_ids() const;

 private:
  struct PendingStep {
    std::vector<std::optional<GradientPush>> by_rank;
    int arrived = 0;
  };
  // Whether (step, part) of `rank` was accepted (among the remembered).
  bool SeenPart(int rank, int64_t step, uint64_t part) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberPart(int rank, int64_t step, uint64_t part)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Waiter {
    int64_t step;
    absl::Time deadline;
    absl::AnyInvocable<void(absl::Status) &&> done;
    int64_t ids = 0;
    std::function<bool()> cancelled;
  };
  bool BetweenStepsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes waiters_[i] (swapping the last one in) and returns it.
  Waiter TakeWaiter(size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  bool LookupReady(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A complete step taken out of pending_ to be applied.
  struct TakenStep {
    int64_t step;
    std::vector<GradientPush> pushes;
  };
  // Takes step applied_step_ + 1 when every rank's push arrived and no
  // other thread applies (setting applying_); nullopt otherwise.
  std::optional<TakenStep> TakeCompleteStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a push of (rank, step) arriving now would complete the next
  // step to apply with no other thread applying: it may stay borrowed.
  bool WouldApplyAtOnce(int rank, int64_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies `taken` (if any), then complete steps in order while no other
  // thread is applying.
  absl::Status DrainCompleteSteps(std::optional<TakenStep> taken = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Describes what step `step` still waits for (the missing ranks).
  std::string Missing(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  const ConsistencyOptions options_;
  ApplyFn apply_;

  mutable absl::Mutex mu_;
  int64_t applied_step_ ABSL_GUARDED_BY(mu_) = -1;
  bool applying_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status apply_error_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, PendingStep> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  int64_t waiting_ids_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool any_push_ ABSL_GUARDED_BY(mu_) = false;
  // AdoptStep's step: empty pushes of steps up to it are dropped.
  int64_t adopted_step_ ABSL_GUARDED_BY(mu_) = -1;
  // Per rank: a ring of the last kRememberedParts accepted (step, part).
  std::vector<std::vector<std::pair<int64_t, uint64_t>>> parts_ ABSL_GUARDED_BY(mu_);
  // Async replica clocks: per rank, the newest step pushed and the (table,
  // id) keys of it applied so far, to tell a retry by its ids.
  struct AppliedIds {
    int64_t step = -1;
    absl::flat_hash_set<std::pair<int, int64_t>> keys;
  };
  std::vector<AppliedIds> async_applied_ ABSL_GUARDED_BY(mu_);
  // Drops from `push` the ids of `rank`'s step `step` applied already and
  // records the rest (async replica clocks).
  void DropAppliedIds(int rank, int64_t step, GradientPush& push)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<size_t> parts_next_ ABSL_GUARDED_BY(mu_);
  // Set (under mu_) once by MergeInto, read without a lock.
  std::atomic<StepClock*> merged_into_{nullptr};
  std::thread timer_;
};

// Sums pushes per table and per id in rank order (pushes[0] first): the
// deterministic aggregation of a sync step. Ids keep first-seen order.
GradientPush SumInRankOrder(std::vector<GradientPush>& pushes);

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_STEP_CLOCK_H_
