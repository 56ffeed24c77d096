// A shard server without gRPC: a thin wrapper that builds and wires the
// objects that own its state (docs/architecture.md, "The shard server's
// parts"): the store, the map keeper, the data plane (lookups, pushes, the
// step clock), the unit holds, the snapshot writer and the slot moves. The
// gRPC services (shard_service.h) are thin adapters over it, which tests
// drive directly.
#ifndef RECPS_SERVER_SHARD_SHARD_SERVER_H_
#define RECPS_SERVER_SHARD_SHARD_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/wire/shard_map.h"
#include "common/wire/wire_format.h"  // kShardMapEpochKey
#include "common/work_queue.h"
#include "recps/v1/shard.pb.h"
#include "recps/v1/shard_admin.pb.h"
#include "server/store/embedding_store.h"
#include "server/shard/lookup_response.h"
#include "server/store/layered_store.h"
#include "server/shard/shard_data_plane.h"
#include "server/shard/shard_map_keeper.h"
#include "server/shard/shard_server_options.h"
#include "server/shard/slot_moves.h"
#include "server/shard/shard_snapshots.h"
#include "server/shard/unit_holds.h"
#include "server/shard/step_clock.h"

namespace recps::server {

class ShardMetrics;

class ShardServer {
 public:
  // `initial_map` may be empty (no servers): data requests then get
  // UNAVAILABLE until SetShardMap installs one. `metrics` may be null.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Create(
      std::unique_ptr<EmbeddingStore> store, ShardMap initial_map,
      ShardServerOptions options, ShardMetrics* metrics);
  ~ShardServer();

  using Done = ShardDataPlane::Done;

  // The data plane (ShardDataPlane has the contracts).
  void Lookup(const v1::LookupRequest* request,
              SerializedLookupResponse* response, Done done,
              std::function<bool()> cancelled = nullptr) {
    data_->Lookup(request, response, std::move(done), std::move(cancelled));
  }
  void LookupInto(const v1::LookupRequest* request,
                  absl::Span<float* const> rows, Done done,
                  std::function<bool()> cancelled = nullptr,
                  int64_t* applied_step = nullptr) {
    data_->LookupInto(request, rows, std::move(done), std::move(cancelled), applied_step);
  }
  void PushGradients(const v1::PushGradientsRequest* request,
                     v1::PushGradientsResponse* response, Done done,
                     absl::Span<const float* const> grads = {}) {
    data_->PushGradients(request, response, std::move(done), grads);
  }
  // Replication, on a backup: a push its primary forwards.
  void ReplicatePush(const v1::ReplicatePushRequest* request,
                     v1::PushGradientsResponse* response, Done done) {
    data_->ReplicatePush(request, response, std::move(done));
  }
  absl::Status Stats(const v1::StatsRequest& request,
                     v1::StatsResponse* response) const {
    return data_->Stats(request, response);
  }
  v1::ShardMap GetShardMap() const;
  // Installs a newer map. The same map again (a retry) is OK; any other map
  // whose epoch is not newer is ALREADY_EXISTS (nothing changes).
  // FAILED_PRECONDITION naming the slots and their new owners when the map
  // would move a slot that holds rows (of any table) away from this server:
  // its new owner would start them from their initial values (rows move by
  // MigrateIn and HandOver, whose own install allows it). A map that gives
  // this server slots it holds copied rows of is accepted. INVALID_ARGUMENT
  // when it is malformed or does not list `self`. Column
  // groups the map gives this server are created first (as tables named
  // ColumnGroupTableName, initialised as the unsplit table's columns);
  // INVALID_ARGUMENT when that fails (a group of a table this server does
  // not have, groups that do not cover the table's dim, no create_store).
  absl::Status SetShardMap(const v1::SetShardMapRequest& request);

  // Checkpoints (SaveRows, SaveRowsStatus, RestoreRows).
  ShardSnapshots& snapshots() { return *snapshots_; }

  // Slot moves (MigrateIn, HandOver, AbortMove, FinishMove, ListMoves,
  // ExportRows, AllowExport).
  SlotMoves& moves() { return *moves_; }

  // Runs fn on the server's work queue.
  void Schedule(absl::AnyInvocable<void() &&> fn);
  // Ends the moves in flight (SlotMoves::Stop) and the pushes forwarded to
  // backups. recps-shard calls it before it stops its gRPC server, whose
  // shutdown waits for the calls in flight.
  void StopMoves();

  // Whether the server holds a map that lists it (and its tables).
  bool serving() const { return CurrentMap()->self >= 0; }
  void RefreshGauges() const { data_->RefreshGauges(); }
  // The coordinator lease (ShardDataPlane::SetLeaseHeldUntil).
  void SetLeaseHeldUntil(absl::Time until) { data_->SetLeaseHeldUntil(until); }
  // What the heartbeats tell the coordinator about failover lineage.
  Replication::LineageReport LineageReport() const { return data_->replication().Report(); }

  // The address SetShardMap looks for when its request names no `self`.
  void SetSelfAddress(std::string address);

  const EmbeddingStore& store() const { return *store_; }
  // Per table of the store, the rows of a fixed table that the current map
  // gives this server (ExpectedFixedRows of its share); 0 for dynamic
  // tables and before a map lists this server.
  std::vector<int64_t> OwnedFixedRows() const;
  // EmbeddingStore::CommitFixedRows on the server's store: seconds for
  // large tables, so not on a request thread.
  void CommitFixedRows(int table, int64_t rows) { store_->CommitFixedRows(table, rows); }
  // Random, nonzero, fixed for this object's life (one per process): sent
  // on every Lookup and PushGradients response so that clients notice a
  // restarted server (whose rows are gone).
  uint64_t incarnation() const { return incarnation_; }
  int64_t applied_step() const { return data_->applied_step(); }

 private:
  ShardServer(std::unique_ptr<EmbeddingStore> store, ShardMap map,
              ShardServerOptions options, ShardMetrics* metrics);

  using MapView = ShardMapKeeper::View;
  MapView CurrentMap() const { return map_->Current(); }

  std::unique_ptr<LayeredStore> store_;
  ShardServerOptions options_;
  ShardMetrics* metrics_;
  const uint64_t incarnation_;

  std::unique_ptr<ShardMapKeeper> map_;

  // Destroyed bottom up: the moves' threads end first, then the work queue
  // drains (its tasks use the parts above it), then the data plane's clock.
  std::unique_ptr<ShardDataPlane> data_;
  std::unique_ptr<ShardSnapshots> snapshots_;  // its thread: stopped first
  std::unique_ptr<UnitHolds> holds_;  // releases onto work_
  std::unique_ptr<WorkQueue> work_;
  std::unique_ptr<SlotMoves> moves_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SHARD_SERVER_H_
