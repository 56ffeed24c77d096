// The shard server's data plane, without gRPC: checks a request (epoch,
// rank, tables, ids, sizes), orders it by the step clock, and runs it
// against the table store (RowDataPlane): lookups, and pushes validated and
// applied in one place (shard_data_plane_push.cc). It owns the step clock,
// the lookup response buffers, the request counters and sync mode's record
// of the last step's updated ids.
//
// A lookup that may run at once runs on the calling thread (gRPC's callback
// thread); pushes, and lookups a push releases, run on the server's work
// queue. Every method that takes a `done` callback calls it exactly once,
// from some thread (possibly before it returns).
#ifndef RECPS_SERVER_SHARD_SHARD_DATA_PLANE_H_
#define RECPS_SERVER_SHARD_SHARD_DATA_PLANE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/buffer_pool.h"
#include "common/work_queue.h"
#include "recps/v1/shard.pb.h"
#include "server/shard/lookup_response.h"
#include "server/shard/shard_map_keeper.h"
#include "server/shard/slot_load.h"
#include "server/shard/shard_server_options.h"
#include "server/shard/step_clock.h"
#include "server/shard/unit_holds.h"
#include "server/shard/replication.h"
#include "server/shard/worker_steps.h"
#include "server/store/layered_store.h"

namespace recps::server {

class ShardMetrics;

class ShardDataPlane {
 public:
  // Every pointer outlives this object; `metrics` may be null.
  ShardDataPlane(LayeredStore* store, const ShardServerOptions* options,
                 ShardMetrics* metrics, uint64_t incarnation,
                 ShardMapKeeper* map, UnitHolds* holds, WorkQueue* work);

  using Done = absl::AnyInvocable<void(absl::Status) &&>;

  // Fills `response` (owned by the caller, alive until done), a serialized
  // v1::LookupResponse, once the step clock lets the lookup run.
  // `cancelled`, if set, tells whether the caller gave up: a lookup that
  // waits for its step is then dropped (CANCELLED) without waiting for the
  // step timeout. It must stay callable until done runs.
  void Lookup(const v1::LookupRequest* request,
              SerializedLookupResponse* response, Done done,
              std::function<bool()> cancelled = nullptr);
  // As Lookup, for an in-process caller (client::InProcessShard::LookupInto)
  // of fp32 rows without updated_only: request table i's rows are written
  // to rows[i] (ids x dim floats), no response is built; `applied_step`, if
  // set, receives what LookupResponse.applied_step would carry before
  // done(OK).
  void LookupInto(const v1::LookupRequest* request,
                  absl::Span<float* const> rows, Done done,
                  std::function<bool()> cancelled = nullptr,
                  int64_t* applied_step = nullptr);
  // Checks the push completely, then hands it to the step clock; done(OK)
  // means it was accepted (applied at once in async mode). `grads`, if not
  // empty (an in-process caller, client::InProcessShard::PushGradientsFrom),
  // has one entry per request table: the table's fp32 gradients, read in
  // place until done runs, or null for those in the request's bytes.
  void PushGradients(const v1::PushGradientsRequest* request,
                     v1::PushGradientsResponse* response, Done done,
                     absl::Span<const float* const> grads = {});

  // Replication, on a backup: checks a push forwarded by its primary
  // (ReplicatePushRequest) and applies it on that primary's clock.
  void ReplicatePush(const v1::ReplicatePushRequest* request,
                     v1::PushGradientsResponse* response, Done done);
  // Stops forwarding pushes (their callers get UNAVAILABLE). Idempotent.
  void StopReplication();
  // After each map install that lists this server: clocks for the
  // primaries it now backs up (Replication::EnsureClocks).
  void OnMapInstalled();
  Replication& replication() { return *replication_; }

  absl::Status Stats(const v1::StatsRequest& request,
                     v1::StatsResponse* response) const;
  // Sets the metrics that are levels, not counts (resident memory, rows per
  // table) from the sources Stats reports. Stats calls it; recps-shard also
  // calls it periodically.
  void RefreshGauges() const;

  // Fencing (replication): the coordinator lease is held until `until`;
  // once it lapses, requests under a replicated map are refused (UNAVAILABLE)
  // until it is renewed: the coordinator may have promoted this server's
  // backups, and two primaries must never accept the same rows. No fence
  // until first called (a server without a coordinator).
  void SetLeaseHeldUntil(absl::Time until);
  // UNAVAILABLE (logged once per lapse) when `view` is replicated and the
  // lease lapsed; else OK. Checked by every push and lookup, and by parked
  // lookups while they wait (a fenced server's clock may never move again).
  absl::Status Fence(const ShardRouting& view);

  StepClock& clock() { return *clock_; }
  // The step every clock of this server's units applied (its own, and
  // after a failover the lineage clocks of the units it was promoted to).
  int64_t applied_step() const;

 private:
  using MapView = ShardMapKeeper::View;
  MapView CurrentMap() const { return map_->Current(); }
  // DATA_LOSS for a header that names another incarnation (checked first:
  // see RequestHeader.incarnation); then the map, the rank and the step.
  // A `forwarded` push (replication) may carry an older epoch than this
  // server's: the primary routed it by its map, CheckBacked decides.
  absl::Status CheckHeader(const v1::RequestHeader& header, const MapView& view,
                           bool forwarded = false) const;
  absl::Status CheckOwned(const MapView& view, const config::TableSpec& spec,
                          absl::Span<const int64_t> ids) const;
  // Replication: that server index `primary` owns each id and this server
  // is one of its backups in `view`. A push routed by an older map
  // (`routed_epoch`) of ids `primary` no longer owns here is refused as a
  // stale map (ABORTED with the epoch: the worker re-routes it to the
  // promoted server, and the old primary's copy is out of the map).
  absl::Status CheckBacked(const MapView& view, const config::TableSpec& spec,
                           absl::Span<const int64_t> ids, int primary,
                           uint64_t routed_epoch) const;
  // Adds `ids` to their slots' load (a table routed by slot; whole tables
  // and column groups move as one and are weighed by TableStats).
  void CountLoad(const MapView& view, const config::TableSpec& spec,
                 absl::Span<const int64_t> ids, SlotLoad::Kind kind) const;
  // Where a lookup's rows go: the serialized response, or (LookupInto)
  // the caller's rows, one run per request table and the applied step
  // (may be null).
  struct LookupOutput {
    SerializedLookupResponse* response = nullptr;
    absl::Span<float* const> rows;
    int64_t* applied_step = nullptr;
  };
  // LookupResponse.applied_step now: the newest step every worker's pushes
  // were applied up to.
  int64_t StepAppliedByAll() const;
  void StartLookup(const v1::LookupRequest* request, LookupOutput out,
                   Done done, std::function<bool()> cancelled);
  absl::Status RunLookup(const v1::LookupRequest& request, LookupOutput out);
  // Applies a step's pushes (the step clock calls it when the step is
  // complete, or at once in async mode): records sync mode's updated ids,
  // then the store's fused update, table by table.
  absl::Status ApplyPush(GradientPush& push);
  // Checked against `view`. `owns_nothing`: the map gives this server
  // nothing (its pushes then take no part in step accounting). `direct`:
  // as PushGradients' `grads`. `primary` >= 0: a push that server index
  // forwarded, of ids this server backs (CheckBacked, not CheckOwned).
  absl::StatusOr<GradientPush> DecodePush(const MapView& view,
                                          const v1::PushGradientsRequest& request,
                                          absl::Span<const float* const> direct,
                                          bool* owns_nothing, int primary = -1);
  void RunReplicaPush(const v1::ReplicatePushRequest* request,
                      v1::PushGradientsResponse* response, Done done);
  void LookupAfterHold(const v1::LookupRequest* request, LookupOutput out,
                       Done done, std::function<bool()> cancelled);
  void RunPush(const v1::PushGradientsRequest* request,
               absl::Span<const float* const> direct,
               v1::PushGradientsResponse* response, Done done);
  // The push's status, or nullopt when a hand-over holds it (it took
  // `done` and runs RunPush again when the hold ends).
  // Gives each clock of the push's units its part (Replication's lineage);
  // an empty part of a rank whose push of the step a clock has is skipped.
  absl::Status PushToClocks(const v1::RequestHeader& header, GradientPush push);
  // done(OK) once a lookup for `step` may run on every clock.
  void AwaitLookupOnClocks(int64_t step, absl::AnyInvocable<void(absl::Status) &&> done,
                           int64_t ids, std::function<bool()> cancelled);
  std::optional<absl::Status> HoldOrApply(
      const v1::PushGradientsRequest* request,
      absl::Span<const float* const> direct,
      v1::PushGradientsResponse* response, GradientPush push, Done& done);

  LayeredStore* const store_;
  const ShardServerOptions& options_;
  ShardMetrics* const metrics_;
  const absl::Time start_time_;
  const uint64_t incarnation_;
  ShardMapKeeper* const map_;
  UnitHolds* const holds_;
  WorkQueue* const work_;

  // Lookup responses' buffers, reused across requests.
  const std::shared_ptr<BufferPool> response_buffers_;

  std::atomic<int64_t> lookup_requests_{0};
  std::atomic<int64_t> push_requests_{0};
  std::atomic<int64_t> lease_until_ns_{std::numeric_limits<int64_t>::max()};
  std::atomic<bool> fenced_{false};  // a push was refused since the last renewal
  // Ids per slot, for Stats' per-slot rates (counters only: no state the
  // requests depend on, hence written from const paths).
  const std::unique_ptr<SlotLoad> slot_load_;

  // Sync mode's exact overlap (LookupRequest.updated_only): the ids each
  // table's rows were updated with by the newest applied step, recorded by
  // the apply, and a membership set built from them by the first lookup
  // that needs it: for a fixed-size table of up to kMaxUpdateBitmapRows
  // rows a bitmap over its ids (12.5 KB for 100k rows: setting and testing
  // a bit stays in L1, where inserting 262k ids into a hash set cost more
  // than the lookup of the updated rows), a hash set otherwise.
  struct StepUpdates {
    std::vector<int64_t> ids;
    absl::flat_hash_set<int64_t> set;
    std::vector<uint64_t> bits;  // bit `id` set for each of `ids` when built
    bool set_built = false;
    bool uses_bits = false;
    // Forgets the step's ids (and clears their bits).
    void Clear();
  };
  static constexpr int64_t kMaxUpdateBitmapRows = int64_t{1} << 28;
  // Positions of `ids` that the newest applied step updated in `table`.
  void UpdatedPositions(int table, absl::Span<const int64_t> ids,
                        std::vector<int32_t>* positions);
  absl::Mutex updates_mu_;
  absl::flat_hash_map<int, StepUpdates> last_step_updates_
      ABSL_GUARDED_BY(updates_mu_);

  std::unique_ptr<StepClock> clock_;
  // Forwards pushes to backups, applies those forwarded to this server.
  const std::unique_ptr<Replication> replication_;
  // Runs forwarded pushes: never on work_, whose threads may wait for this
  // server's own forwards (servers back each other up in a ring).
  WorkQueue replica_work_{2};
  // Async mode: each worker's newest applied push (StepAppliedByAll).
  WorkerSteps worker_steps_;
};

// An ABORTED status telling the caller to refresh its map to `epoch`.
absl::Status StaleEpochError(absl::string_view message, uint64_t epoch);

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SHARD_DATA_PLANE_H_
