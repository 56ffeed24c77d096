// The shard server's request handling, without gRPC: checks a request
// (epoch, rank, tables, ids, sizes), orders it by the step clock, and runs it
// against the table store. The gRPC services (shard_service.h) are thin
// adapters over this class, which tests drive directly.
//
// A lookup that may run at once runs on the calling thread (gRPC's callback
// thread); pushes, and lookups a push releases, run on the server's work
// queue. Every method that takes a `done` callback calls it exactly once,
// from some thread (possibly before it returns).
#ifndef RECPS_SERVER_SHARD_SHARD_SERVER_H_
#define RECPS_SERVER_SHARD_SHARD_SERVER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/buffer_pool.h"
#include "common/wire/shard_map.h"
#include "common/wire/wire_format.h"  // kShardMapEpochKey
#include "common/work_queue.h"
#include "recps/v1/shard.pb.h"
#include "recps/v1/shard_admin.pb.h"
#include "server/store/embedding_store.h"
#include "server/shard/export_grants.h"
#include "server/shard/lookup_response.h"
#include "server/store/layered_store.h"
#include "server/shard/shard_peer.h"
#include "server/shard/shard_snapshots.h"
#include "server/shard/step_clock.h"

namespace recps::server {

class ShardMetrics;

struct ShardServerOptions {
  // This server's address as it appears in shard maps (SetShardMap may set
  // it when the server learns its port only after binding).
  std::string self_address;
  // The cluster's slot count; every shard map must use it (and the store
  // must have been built with it).
  uint32_t num_slots = 4096;
  // Most ids (summed over tables) one request may carry.
  int64_t max_ids_per_request = int64_t{1} << 22;
  ConsistencyOptions consistency;
  // Threads that run pushes and the lookups a step's apply releases.
  int work_threads = 0;  // 0: one per hardware thread
  // Builds a store for tables the server gains from a shard map: the column
  // groups it owns of a table split column-wise. Give it the options of the
  // server's own store (seed, num_slots, row limit), e.g. a
  // CreateHostEmbeddingStore call. Unset: maps that give this server a
  // column group are refused.
  std::function<absl::StatusOr<std::unique_ptr<EmbeddingStore>>(
      std::vector<config::TableSpec>)>
      create_store;
  // Called (under the install lock, never concurrently) each time a map
  // that lists this server is installed, its tables created: the server can
  // serve from then on (recps-shard flips its health status).
  std::function<void()> on_map_installed;
  // Slot moves: how this server reaches another shard server (recps-shard
  // passes ConnectGrpcShardPeer). Unset: MigrateIn and HandOver are
  // FAILED_PRECONDITION.
  ConnectPeerFn connect_peer;
  // Longest a move's stream or shard-to-shard call may take.
  absl::Duration move_rpc_timeout = absl::Minutes(10);
  // Copy rounds of a MigrateIn: the first copies every row, each later one
  // the rows changed meanwhile, until a round carries at most
  // max(move_catch_up_rows, 1% of the rows) or move_max_rounds ran.
  int move_max_rounds = 8;
  int64_t move_catch_up_rows = 4096;
  // Rows per chunk of an export: at most this many bytes (ExportRows'
  // max_chunk_bytes may ask for less or more, up to 16 MiB).
  int64_t move_chunk_bytes = int64_t{1} << 20;
  // ExportRows streams a copy round runs at once (each over every k-th
  // slot of the move).
  int move_streams = 2;
};

class ShardServer {
 public:
  // `initial_map` may be empty (no servers): data requests then get
  // UNAVAILABLE until SetShardMap installs one. `metrics` may be null.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Create(
      std::unique_ptr<EmbeddingStore> store, ShardMap initial_map,
      ShardServerOptions options, ShardMetrics* metrics);
  ~ShardServer();

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
  // to rows[i] (ids x dim floats), no response is built.
  void LookupInto(const v1::LookupRequest* request,
                  absl::Span<float* const> rows, Done done,
                  std::function<bool()> cancelled = nullptr);
  // Checks the push completely, then hands it to the step clock; done(OK)
  // means it was accepted (applied at once in async mode). `grads`, if not
  // empty (an in-process caller, client::InProcessShard::PushGradientsFrom),
  // has one entry per request table: the table's fp32 gradients, read in
  // place until done runs, or null for those in the request's bytes.
  void PushGradients(const v1::PushGradientsRequest* request,
                     v1::PushGradientsResponse* response, Done done,
                     absl::Span<const float* const> grads = {});

  absl::Status Stats(const v1::StatsRequest& request,
                     v1::StatsResponse* response) const;
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

  // ---- Slot moves (ShardAdmin; see shard_admin.proto for the contract;
  // docs/operations.md, "Slot migration: the servers") ----
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
  // The moves this server, as a source, may export (AllowExport).
  ExportGrants& export_grants() { return export_grants_; }
  // Fills `chunk`; false once the export is complete (chunk then unset).
  absl::StatusOr<bool> NextExportChunk(RowExport& exp,
                                       v1::ExportRowsChunk* chunk);
  // Runs fn on the server's work queue.
  void Schedule(absl::AnyInvocable<void() &&> fn);
  // Ends the moves in flight (their shard-to-shard calls are cancelled, their
  // callers answered) and refuses new ones. recps-shard calls it before it
  // stops its gRPC server, whose shutdown waits for the calls in flight.
  void StopMoves();

  // Whether the server holds a map that lists it (and its tables).
  bool serving() const { return CurrentMap()->self >= 0; }
  // Sets the metrics that are levels, not counts (resident memory, rows per
  // table) from the sources Stats reports. Stats calls it; recps-shard also
  // calls it periodically.
  void RefreshGauges() const;

  // The address SetShardMap looks for when its request names no `self`.
  void SetSelfAddress(std::string address);

  const EmbeddingStore& store() const { return *store_; }
  // Random, nonzero, fixed for this object's life (one per process): sent
  // on every Lookup and PushGradients response so that clients notice a
  // restarted server (whose rows are gone).
  uint64_t incarnation() const { return incarnation_; }
  int64_t applied_step() const { return clock_->applied_step(); }

 private:
  ShardServer(std::unique_ptr<EmbeddingStore> store, ShardMap map,
              ShardServerOptions options, ShardMetrics* metrics);

  // The map, this server's index in it (-1: not listed) and its address.
  struct Routing {
    ShardMap map;
    int self = -1;
    std::string self_address;
  };
  using MapView = std::shared_ptr<const Routing>;
  MapView CurrentMap() const;
  // DATA_LOSS for a header that names another incarnation (checked first:
  // see RequestHeader.incarnation); then the map, the rank and the step.
  absl::Status CheckHeader(const v1::RequestHeader& header,
                           const MapView& view) const;
  absl::Status CheckOwned(const MapView& view, const config::TableSpec& spec,
                          absl::Span<const int64_t> ids) const;
  // Where a lookup's rows go: the serialized response, or (LookupInto)
  // the caller's rows, one run per request table.
  struct LookupOutput {
    SerializedLookupResponse* response = nullptr;
    absl::Span<float* const> rows;
  };
  void StartLookup(const v1::LookupRequest* request, LookupOutput out,
                   Done done, std::function<bool()> cancelled);
  absl::Status RunLookup(const v1::LookupRequest& request, LookupOutput out);
  // Applies a step's pushes (the step clock calls it when the step is
  // complete, or at once in async mode): records sync mode's updated ids,
  // then the store's fused update, table by table.
  absl::Status ApplyPush(GradientPush& push);
  // `owns_nothing`: the map the request was checked against gives this
  // server nothing (its pushes then take no part in step accounting).
  // `direct`: as PushGradients' `grads`.
  absl::StatusOr<GradientPush> DecodePush(const v1::PushGradientsRequest& request,
                                          absl::Span<const float* const> direct,
                                          bool* owns_nothing);
  // FAILED_PRECONDITION when installing `next` (`next_proto` in proto form)
  // would take a slot holding rows away from `self`. REQUIRES: install_mu_.
  // Units in `handed_over` (table, slot) may move away: a hand-over sent
  // their rows.
  absl::Status CheckNoRowsMove(
      const Routing& current, const v1::ShardMap& next_proto,
      const ShardMap& next, const std::string& self,
      const absl::flat_hash_set<std::pair<int, uint32_t>>* handed_over =
          nullptr) const;
  absl::Status InstallMap(
      const v1::SetShardMapRequest& request,
      const absl::flat_hash_set<std::pair<int, uint32_t>>* handed_over);

  // ---- Slot moves (slot_migration.cc) ----
  struct Move;
  struct Hold;
  using Unit = StoreUnit;  // (table, slot)
  // The (table, slot) units of slots (row-wise tables) and whole tables;
  // each must be owned by `owner` in `view`'s map.
  absl::StatusOr<std::vector<Unit>> ResolveUnits(
      const MapView& view, absl::Span<const uint32_t> slots,
      absl::Span<const std::string> tables, const std::string& owner) const;
  // The owner's address of a unit in `map` ("" for a column-split table).
  std::string UnitOwner(const ShardMap& map, const v1::ShardMap& proto,
                        const Unit& unit) const;
  // The units whose owner is `from` in `current` and `to` in `next`;
  // INVALID_ARGUMENT when any other unit's owner differs, or none moves.
  absl::StatusOr<std::vector<Unit>> MoveDiff(const ShardMap& current,
                                             const ShardMap& next,
                                             const std::string& from,
                                             const std::string& to) const;
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
  // Holds: requests touching held units wait for the hand-over's end.
  // Lookups and pushes call ParkIfHeld with their tables; true: it made the
  // resume closure and runs it (on the work queue) when the hold ends.
  bool ParkIfHeld(
      const v1::RequestHeader& header,
      const google::protobuf::RepeatedPtrField<v1::TableIds>* lookup,
      const GradientPush* push,
      absl::FunctionRef<absl::AnyInvocable<void() &&>()> make_resume);
  void LookupAfterHold(const v1::LookupRequest* request, LookupOutput out,
                       Done done, std::function<bool()> cancelled);
  void RunPush(const v1::PushGradientsRequest* request,
               absl::Span<const float* const> direct,
               v1::PushGradientsResponse* response, Done done);
  // The push's status, or nullopt when a hand-over holds it (it took
  // `done` and runs RunPush again when the hold ends).
  std::optional<absl::Status> HoldOrApply(
      const v1::PushGradientsRequest* request,
      absl::Span<const float* const> direct,
      v1::PushGradientsResponse* response, GradientPush push, Done& done);
  void ReleaseHold(const std::shared_ptr<Hold>& hold);
  // Records the step of a lookup or push before it checks the holds.
  void NoteRequestStep(int64_t step);
  // Creates the tables of the column groups that `map` gives server index
  // `self` and that do not exist yet.
  absl::Status AddColumnGroupTables(const ShardMap& map, int self);

  // What the snapshot writer reads of the map (ShardSnapshots::MapFacts).
  std::vector<std::vector<uint8_t>> OwnedUnitsNow() const;
  std::vector<std::vector<uint32_t>> RestoreSlotsNow() const;

  std::unique_ptr<LayeredStore> store_;
  ShardServerOptions options_;
  ShardMetrics* metrics_;
  const absl::Time start_time_;
  const uint64_t incarnation_;

  // Held by SetShardMap and SetSelfAddress throughout (they may create
  // tables); map_mu_ only guards the swap, so requests do not wait for that.
  absl::Mutex install_mu_;
  mutable absl::Mutex map_mu_;
  MapView routing_ ABSL_GUARDED_BY(map_mu_);

  // Lookup responses' buffers, reused across requests.
  const std::shared_ptr<BufferPool> response_buffers_;

  std::atomic<int64_t> lookup_requests_{0};
  std::atomic<int64_t> push_requests_{0};

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

  // Slot moves. Lock order: moves_mu_, then install_mu_, then map_mu_.
  ExportGrants export_grants_;
  mutable absl::Mutex moves_mu_;
  std::vector<std::shared_ptr<Move>> moves_ ABSL_GUARDED_BY(moves_mu_);
  bool moves_stop_ ABSL_GUARDED_BY(moves_mu_) = false;
  // Each with a flag set when it ended (joined by the next start).
  std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>>
      move_threads_ ABSL_GUARDED_BY(moves_mu_);
  bool handing_over_ ABSL_GUARDED_BY(moves_mu_) = false;
  // Holds of hand-overs in progress. active_holds_ is read without the lock
  // by every request (nonzero: check the holds); max_request_step_ is the
  // largest step of a lookup or (sync, bounded) push that reached the hold
  // check: a hand-over's L.
  mutable absl::Mutex hold_mu_;
  std::vector<std::shared_ptr<Hold>> holds_ ABSL_GUARDED_BY(hold_mu_);
  std::atomic<int> active_holds_{0};
  std::atomic<int64_t> max_request_step_{-1};
  // Async mode: pushes hold it as readers while they check holds and apply;
  // a hand-over takes it once as a writer, so no push to a held unit is in
  // flight after that.
  absl::Mutex push_gate_;

  // Declared last: destroyed first, so no task outlives the members above.
  std::unique_ptr<StepClock> clock_;
  std::unique_ptr<ShardSnapshots> snapshots_;  // its thread: stopped first
  std::unique_ptr<WorkQueue> work_;
};

// An ABORTED status telling the caller to refresh its map to `epoch`.
absl::Status StaleEpochError(absl::string_view message, uint64_t epoch);

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SHARD_SERVER_H_
