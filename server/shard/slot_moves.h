// The shard server's slot moves, both sides (docs/operations.md, "Slot
// migration: the servers"; the protocol in proto/recps/v1/shard_admin.proto).
// As a target (slot_migration.cc): MigrateIn copies the moving units' rows
// from the source in rounds, FinishMove takes the last changes and installs
// the new map, AbortMove drops the copy. As a source
// (slot_migration_source.cc): ExportRows streams rows from a generation
// mark, HandOver holds the units at a step boundary, has the target finish,
// installs the new map and drops the rows. The bookkeeping (ListMoves,
// threads, shutdown) is in slot_migration.cc.
//
// Re-replication (docs/replication.md) is the same protocol with the
// source keeping the units: MigrateIn as_backup copies them to a new
// backup, HandOver add_backup holds them at a step boundary and installs a
// map that only adds the target to their backups; the target's replica
// clock of the source joins at that step (Replication::JoinAsBackup).
#ifndef RECPS_SERVER_SHARD_SLOT_MOVES_H_
#define RECPS_SERVER_SHARD_SLOT_MOVES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "recps/v1/shard_admin.pb.h"
#include "server/shard/export_grants.h"
#include "server/shard/replication.h"
#include "server/shard/shard_map_keeper.h"
#include "server/shard/shard_server_options.h"
#include "server/shard/shard_snapshots.h"
#include "server/shard/step_clock.h"
#include "server/shard/unit_holds.h"
#include "server/store/layered_store.h"

namespace recps::server {

class SlotMoves {
 public:
  // Every pointer outlives this object.
  SlotMoves(LayeredStore* store, const ShardServerOptions* options,
            ShardMapKeeper* map, UnitHolds* holds, StepClock* clock,
            ShardSnapshots* snapshots, Replication* replication)
      : store_(store),
        options_(*options),
        map_(map),
        holds_(holds),
        clock_(clock),
        snapshots_(snapshots),
        replication_(replication) {}
  // Stop()s.
  ~SlotMoves();

  using Done = absl::AnyInvocable<void(absl::Status) &&>;

  // Long work (copies, hand-overs, the target's last pull) runs on a thread
  // of the move's own, never on the caller's; done is called from it.
  void MigrateIn(const v1::MigrateInRequest* request,
                 v1::MigrateInResponse* response, Done done);
  void HandOver(const v1::HandOverRequest* request,
                v1::HandOverResponse* response, Done done);
  void AbortMove(const v1::AbortMoveRequest* request,
                 v1::AbortMoveResponse* response, Done done);
  void FinishMove(const v1::FinishMoveRequest* request,
                  v1::FinishMoveResponse* response, Done done);
  absl::Status ListMoves(const v1::ListMovesRequest& request,
                         v1::ListMovesResponse* response) const;
  // ExportRows, as a cursor the service pulls chunks from (each call reads
  // at most about max_chunk_bytes of rows, holding one slot's lock at a
  // time). Start checks the request and takes the mark.
  struct RowExport {
    std::vector<std::pair<int, uint32_t>> units;  // (table, slot), sorted
    size_t next = 0;  // units[next] is being read
    SlotCursor cursor;
    SlotChunk scratch;
    uint64_t since = 0;
    uint64_t mark = 0;
    int64_t max_bytes = 0;
    int64_t rows_sent = 0;
    bool sent_any = false;
  };
  // FAILED_PRECONDITION unless export_grants() allows the request.
  absl::StatusOr<std::unique_ptr<RowExport>> StartExport(
      const v1::ExportRowsRequest& request);
  // Grants an export (export_grants()); one for a new backup
  // (for_backup) only of units on this server's own clock.
  absl::Status AllowExport(const v1::AllowExportRequest& request);
  // The moves this server, as a source, may export (AllowExport).
  ExportGrants& export_grants() { return export_grants_; }
  // Fills `chunk`; false once the export is complete (chunk then unset).
  absl::StatusOr<bool> NextExportChunk(RowExport& exp,
                                       v1::ExportRowsChunk* chunk);
  // Ends the moves in flight (their shard-to-shard calls are cancelled, their
  // callers answered) and refuses new ones. Idempotent.
  void Stop();

 private:
  struct Move;
  using Unit = StoreUnit;  // (table, slot)
  using MapView = ShardMapKeeper::View;
  MapView CurrentMap() const { return map_->Current(); }
  // The (table, slot) units of slots (row-wise tables) and whole tables;
  // each must be owned by `owner` in `view`'s map.
  absl::StatusOr<std::vector<Unit>> ResolveUnits(
      const MapView& view, absl::Span<const uint32_t> slots,
      absl::Span<const std::string> tables, const std::string& owner) const;
  // The units whose owner is `from` in `current` and `to` in `next`;
  // INVALID_ARGUMENT when any other unit's owner differs, or none moves.
  absl::StatusOr<std::vector<Unit>> MoveDiff(const ShardMap& current,
                                             const ShardMap& next,
                                             const std::string& from,
                                             const std::string& to) const;
  // Re-replication: the units owned by `owner` whose backups gain
  // `backup` from `current` to `next`; INVALID_ARGUMENT when anything else
  // differs (an owner, another backup), or nothing is added.
  absl::StatusOr<std::vector<Unit>> BackupDiff(const ShardMap& current, const ShardMap& next,
                                               const std::string& owner,
                                               const std::string& backup) const;
  // FAILED_PRECONDITION unless `self` is neither the owner nor a backup of
  // each of `units` in `map` (a new backup's copy).
  absl::Status CheckNotACopy(const ShardMap& map, absl::Span<const Unit> units,
                             const std::string& self) const;
  void StartMoveThread(absl::AnyInvocable<void() &&> fn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(moves_mu_);
  absl::Status RunCopy(const std::shared_ptr<Move>& move);
  absl::Status PullRows(const std::shared_ptr<Move>& move, uint64_t since,
                        uint64_t* mark, int64_t* rows, bool rate_limited);
  absl::Status PullStream(const std::shared_ptr<Move>& move,
                          const v1::ExportRowsRequest& request,
                          absl::Time start, std::atomic<int64_t>* pulled,
                          uint64_t* mark, int64_t* rows, bool rate_limited);
  absl::Status RunFinish(const std::shared_ptr<Move>& move,
                         const v1::FinishMoveRequest& request,
                         v1::FinishMoveResponse* response);
  absl::Status RunHandOver(const v1::HandOverRequest& request,
                           v1::HandOverResponse* response);
  std::shared_ptr<Move> FindMove(const std::string& id, bool target) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(moves_mu_);

  LayeredStore* const store_;
  const ShardServerOptions& options_;
  ShardMapKeeper* const map_;
  UnitHolds* const holds_;
  StepClock* const clock_;
  ShardSnapshots* const snapshots_;
  Replication* const replication_;

  // Slot moves. Lock order: moves_mu_, then the map keeper's locks.
  ExportGrants export_grants_;
  mutable absl::Mutex moves_mu_;
  std::vector<std::shared_ptr<Move>> moves_ ABSL_GUARDED_BY(moves_mu_);
  bool moves_stop_ ABSL_GUARDED_BY(moves_mu_) = false;
  // Each with a flag set when it ended (joined by the next start).
  std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>>
      move_threads_ ABSL_GUARDED_BY(moves_mu_);
  bool handing_over_ ABSL_GUARDED_BY(moves_mu_) = false;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SLOT_MOVES_H_
