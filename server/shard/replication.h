// A shard server's part in replication (docs/replication.md). As a primary
// it forwards every push it accepts to the backups of the push's ids and
// acknowledges the push only once they took it (ForwardJoin); as a backup
// it applies the pushes each primary forwards on a step clock of that
// primary's own, so that in sync mode its rows follow the primary's bit for
// bit: the same pushes, summed in the same rank order, applied once per
// step. The backup's own pushes (as a primary of other slots) keep their
// own clock: a step completes on each clock with the pushes that clock saw.
//
// Failover: a backup promoted to own a lost primary's units keeps stepping
// them on its replica clock of that primary (their lineage), which holds
// the lost primary's state: the steps it applied and the pushes of the
// current step it had forwarded. Pushes to this server are split by
// lineage (SplitByLineage), lookups wait for every lineage clock. Once a
// lineage clock and the own clock are between steps at one step (every
// worker pushed to both since the failover: sync and bounded modes), the
// lineage is merged into the own clock (MergeSettledLineages): from then
// on those units are like any other, and re-replication can copy them.
#ifndef RECPS_SERVER_SHARD_REPLICATION_H_
#define RECPS_SERVER_SHARD_REPLICATION_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "recps/v1/shard.pb.h"
#include "recps/v1/shard_admin.pb.h"
#include "server/shard/shard_map_keeper.h"
#include "server/shard/shard_peer.h"
#include "server/shard/shard_server_options.h"
#include "server/shard/step_clock.h"
#include "server/store/layered_store.h"

namespace recps::server {

// The answers of one push's forwards: runs its continuation once every
// backup answered, with the first error (naming the backup) or OK.
class ForwardJoin {
 public:
  explicit ForwardJoin(int pending) : pending_(pending) {}
  void Arrive(absl::Status status);
  // `then` runs once, from the thread of the last answer (or here, when
  // every answer is in already).
  void Then(absl::AnyInvocable<void(absl::Status) &&> then);

 private:
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::AnyInvocable<void(absl::Status) &&> then_ ABSL_GUARDED_BY(mu_);
};

class Replication {
 public:
  // Every pointer outlives this object.
  Replication(LayeredStore* store, const ShardServerOptions* options);
  // Shutdown()s.
  ~Replication();

  // Primary: sends `push` (checked against `view`, fp32, distinct ids) to
  // every backup of its ids, each the ids it backs, with `header`'s rank,
  // step and part. Null when no id has a backup (no replication, or every
  // backup lost): nothing to wait for.
  std::shared_ptr<ForwardJoin> Forward(const ShardMapKeeper::View& view,
                                       const v1::RequestHeader& header,
                                       const GradientPush& push);

  // Backup: applies a push forwarded by `primary` (checked against the map
  // by the caller) on that primary's clock; a retried part is dropped.
  absl::Status ApplyForwarded(const std::string& primary, const v1::RequestHeader& header,
                              GradientPush push);

  // A map was installed (`view`): makes a clock for each primary it lists
  // this server as a backup of (once: a map installed before any push can
  // be forwarded under it), starting where this server's own clock `own`
  // starts: fresh, or at the step a restore resumed it at; and gives the
  // units this server was promoted to own (it backed them in the map
  // before) the lineage of their lost primary's clock.
  void OnMapInstalled(const ShardMapKeeper::View& view, const StepClock& own);

  // ---- Lineage: the clocks of the units this server owns ----
  // Whether any owned unit steps on a clock other than this server's own.
  bool HasLineage() const;
  // One part of a push for one clock.
  struct ClockPart {
    StepClock* clock;
    GradientPush push;
  };
  // `push` split by the clock of each id's unit: [0] this server's own
  // clock `own`, then each lineage clock; every entry exists (empty ones
  // too, so that each clock sees every rank arrive). One entry when
  // HasLineage() is false (the push itself). The caller holds push_mu()
  // (shared) from the split until every part is in its clock.
  std::vector<ClockPart> SplitByLineage(StepClock* own, GradientPush push) const
      ABSL_SHARED_LOCKS_REQUIRED(push_mu_);
  absl::Mutex& push_mu() const ABSL_LOCK_RETURNED(push_mu_) { return push_mu_; }
  // OK once the lineage of shard map `epoch` is computed. The keeper
  // publishes a map before it calls OnMapInstalled: a request routed by it
  // in between would be split, or wait, by the map before's lineage (a
  // promoted unit's push on the own clock, applied a second time where the
  // lost primary had forwarded it). UNAVAILABLE before (the caller
  // retries). Called under push_mu() by a push, so that no install comes
  // between the check and the split.
  absl::Status LineageReadyFor(uint64_t epoch) const;
  // The epoch of the newest map whose lineage is computed (0: none yet).
  uint64_t lineage_epoch() const;
  // Merges each lineage clock that is between steps at the own clock's
  // step (`own`) into it (StepClock::MergeInto); an idle own clock starts
  // at the lineage's step. Sync and bounded modes (async lineages stay).
  // Only tries: a push being handed to its clocks makes it a no-op, for
  // the next push to try again. Called after each push.
  void MergeSettledLineages(StepClock* own);
  // The own clock's applied step at the newest merge (-1: none): the
  // updated-ids set of that step lacks the merged units' ids.
  int64_t merged_at_step() const { return merged_at_step_.load(std::memory_order_acquire); }
  // For the coordinator (heartbeats): the epoch of the newest map whose
  // lineage is computed, and how many lost primaries' clocks step units
  // of this server under it (a promoted unit can get a new backup once
  // its lineage is merged).
  struct LineageReport {
    uint64_t epoch = 0;
    int lost_primary_clocks = 0;
  };
  LineageReport Report() const;
  // The lineage clocks (not the own one).
  std::vector<StepClock*> LineageClocks() const;
  // Whether this server's own clock steps none of the units it owns (each
  // is on a lineage clock): a server that owned nothing, backed a lost
  // primary up and was promoted. Its own clock never took part in a step,
  // and must not hold pushes, lookups or cuts back.
  bool OwnClockIdle() const { return own_clock_idle_.load(std::memory_order_acquire); }
  // ---- Re-replication (a new backup of units this server owns) ----
  // OK when each of `units` steps on this server's own clock; else
  // FAILED_PRECONDITION naming the first that steps on a lost primary's
  // clock (a backup of it can be made once that lineage is merged).
  absl::Status CheckOwnClock(absl::Span<const StoreUnit> units) const;
  // Backup, before a map makes it a backup of units of `primary`: makes
  // its clock of `primary` unless one exists (then it already takes every
  // push of `primary`), joined at `step` (steps up to it count as applied)
  // or fresh (-1: async, pushes apply on arrival). FAILED_PRECONDITION when
  // the clock of that address is a lineage this server owns units of (a
  // server restarted at a lost primary's address).
  absl::Status JoinAsBackup(const std::string& primary, int64_t step);

  // What a restore (ResumeAt) and a rollback (Restart) do to this server's
  // own clock, done to every replica clock.
  absl::Status ResumeAt(int64_t step);
  absl::Status Restart(int64_t step);

  // Steps the slowest replica clock is behind `own_applied` (this
  // server's own clock's applied step); 0 without replica clocks.
  int64_t LagSteps(int64_t own_applied) const;

  // Cancels forwards in flight; later ones fail at once. Idempotent.
  void Shutdown();

 private:
  // Steps a forwarded push may run ahead of its replica clock (a worker is
  // at most a step or two ahead of a backup: its pushes are acknowledged
  // only once forwarded).
  static constexpr int kForwardWindow = 8;
  ShardPeer* PeerFor(const std::string& address);
  // The clock of `primary`'s pushes; null when no installed map made this
  // server its backup.
  StepClock* ClockOf(const std::string& primary);
  std::unique_ptr<StepClock> NewClock();
  void EnsureClocks(const ShardMapKeeper::View& view, const StepClock& own);
  // Which clock each unit this server owns in `next` steps on, from the
  // map before it. REQUIRES: mu_ not held.
  void UpdateLineage(const ShardMapKeeper::View& prev, const ShardMapKeeper::View& next,
                     const StepClock& own);

  struct Lineage {
    // Per store table: num_slots clock numbers (0: this server's own
    // clock, k: clocks[k - 1]); empty: every slot on the own clock.
    std::vector<std::vector<uint8_t>> clock_of_slot;
    std::vector<uint64_t> table_keys;  // StableNameKey per store table
    uint32_t num_slots = 0;
    std::vector<std::string> origins;  // the lost primary of clocks[k - 1]
    std::vector<StepClock*> clocks;
    // Per clock: the newest step either it or the own clock had seen when
    // the failover's map came. A worker may still send a push of that step
    // again, re-routed from the lost primary with a new part id, which only
    // the replica clock tells from new (by its ids): the lineage is merged
    // once a later step is applied, when every rank pushed past it.
    std::vector<int64_t> merge_after;
  };
  // MergeSettledLineages, once no push is between its split and its clocks.
  void MergeSettled(StepClock* own) ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // Installs `lineage` (null: none).
  void SetLineage(std::shared_ptr<const Lineage> lineage, bool own_steps_units)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  LayeredStore* const store_;
  const ShardServerOptions& options_;
  // Shared by a push from its split to its clocks; exclusive for a change
  // of lineage (a map install, a merge), so that no part of a push goes to
  // a clock that no longer steps its units. Taken before mu_.
  mutable absl::Mutex push_mu_;
  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::unique_ptr<ShardPeer>> peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<StepClock>> clocks_ ABSL_GUARDED_BY(mu_);
  // Swapped whole at map installs; null: every owned unit on the own clock.
  std::shared_ptr<const Lineage> lineage_ ABSL_GUARDED_BY(mu_);
  // lineage_ != nullptr, read without mu_ by every push and lookup (the
  // common case, no failover yet, takes no lock).
  std::atomic<bool> has_lineage_{false};
  std::atomic<bool> own_clock_idle_{false};
  std::atomic<int64_t> merged_at_step_{-1};
  uint64_t lineage_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Merged lineage clocks: out of clocks_, alive for the lookups and cuts
  // that still name them (they forward to the own clock).
  std::vector<std::unique_ptr<StepClock>> merged_ ABSL_GUARDED_BY(mu_);
  ShardMapKeeper::View last_view_;  // installs are serialised by the keeper
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_REPLICATION_H_
