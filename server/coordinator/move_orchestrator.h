// The coordinator's side of live rebalancing (docs/operations.md,
// Rebalancing): plans from the servers' live load (rebalance_plan.h) and
// carrying a plan out as slot moves between shard servers:
//
//   per (source, target) group of the plan one move, with an id;
//   1. MigrateIn on the target (copies in parallel, at most
//      --max_parallel_moves at once, the bandwidth limit shared by them);
//   2. HandOver on the source with the coordinator's current map in which
//      only this move's slots and tables changed owner, epoch + 1. Hand-overs
//      run one at a time, in the order copies finish, so each map differs
//      from the one before by exactly one move;
//   3. the coordinator stores that map, pushes it to the other servers and
//      publishes it to watchers (Coordinator::SetShardMap).
//
// A failed copy or hand-over is rolled back (AbortMove on the target); the
// source keeps owning what it had. Every move is stored (RocksDB
// "move/...") before each step, so a restarted coordinator resolves the
// moves it left in flight: a copy is aborted; a hand-over is completed when
// the target or the source shows the new map (or the move HANDED_OVER),
// else aborted on the target; while neither answers it stays unresolved
// (retried, and new rebalances are refused, naming it).
//
// Re-replication (docs/replication.md; re_replication.cc): while the map
// has units whose backup was lost at a failover, the same thread plans
// copies of them to live servers (PlanReReplication) and runs them as moves
// with add_backup: the target becomes a backup, the source keeps owning.
//
// One background thread runs rebalances (one at a time) and resolutions;
// copies run on up to max_parallel_copies threads it starts. No lock is
// held across an RPC. Thread-safe.
#ifndef RECPS_SERVER_COORDINATOR_MOVE_ORCHESTRATOR_H_
#define RECPS_SERVER_COORDINATOR_MOVE_ORCHESTRATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "recps/v1/coordinator.pb.h"
#include "recps/v1/shard_admin.pb.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace recps::server {

class Coordinator;
class CoordinatorStore;

// The shard servers' RPCs a move needs, behind an interface so the
// orchestration is testable with fake servers. One attempt each, with
// `timeout`; errors name the server.
class ShardMoveRpc {
 public:
  virtual ~ShardMoveRpc() = default;
  virtual absl::StatusOr<v1::StatsResponse> Stats(const std::string& address,
                                                  absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::MigrateInResponse> MigrateIn(
      const std::string& address, const v1::MigrateInRequest& request,
      absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::AllowExportResponse> AllowExport(
      const std::string& address, const v1::AllowExportRequest& request,
      absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::HandOverResponse> HandOver(
      const std::string& address, const v1::HandOverRequest& request,
      absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::AbortMoveResponse> AbortMove(
      const std::string& address, const v1::AbortMoveRequest& request,
      absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::ListMovesResponse> ListMoves(const std::string& address,
                                                          absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::ShardMap> GetShardMap(const std::string& address,
                                                   absl::Duration timeout) = 0;
  // Ends calls in flight and refuses new ones (CANCELLED), for a stop.
  virtual void CancelAll() {}
};

// ShardAdmin over rpc::MakeChannel (kControl channels).
std::unique_ptr<ShardMoveRpc> MakeGrpcShardMoveRpc();

struct MoveOrchestratorOptions {
  // Copies running at once (--max_parallel_moves).
  int max_parallel_copies = 4;
  // Bandwidth of all copies together, bytes/s (--move_max_bytes_per_second;
  // 0: none); each copy gets its share.
  int64_t max_bytes_per_second = 0;
  // Move rate assumed by a plan's time estimate until moves were measured
  // (--move_rate_estimate, bytes/s).
  double move_rate_estimate = 100e6;
  // Deadlines: one MigrateIn (--move_copy_timeout), one HandOver, other calls.
  absl::Duration copy_timeout = absl::Minutes(30);
  absl::Duration handover_timeout = absl::Minutes(2);
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Between two attempts to resolve a move left in flight, between two
  // checks for new servers (auto_rebalance_new_servers), and between two
  // re-replication plans.
  absl::Duration retry_interval = absl::Seconds(1);
  // --auto_rebalance_new_servers: a shard server that registers while not
  // in the map gets its share by a rebalance started by the coordinator.
  bool auto_rebalance_new_servers = false;
  // Finished moves kept in the state and listed (--max_kept_moves).
  int max_kept_moves = 1000;
  // Default: MakeGrpcShardMoveRpc().
  std::shared_ptr<ShardMoveRpc> rpc;
};

class MoveOrchestrator {
 public:
  // `coordinator` and `store` must outlive this; `registry` may be null.
  MoveOrchestrator(Coordinator* coordinator, CoordinatorStore* store,
                   MoveOrchestratorOptions options, std::function<absl::Time()> clock,
                   prometheus::Registry* registry);
  // Stops the thread; moves in flight stay stored and are resolved by the
  // next coordinator on this state.
  ~MoveOrchestrator();

  // Once, before serving: loads the stored moves (DATA_LOSS when one does
  // not parse) and starts the thread, which first resolves moves a
  // previous coordinator left in flight.
  absl::Status Start();

  // Collects the live load (Stats with per-slot counts) of every server of
  // the map and of alive shard servers not in it, and plans. UNAVAILABLE
  // naming a server that does not answer; UNAVAILABLE before the first map.
  absl::StatusOr<v1::PlanRebalanceResponse> Plan(const v1::PlanRebalanceRequest& request);
  // Checks the plan (CheckPlan), stores its moves and starts them; returns
  // at once. FAILED_PRECONDITION while a rebalance runs or a move is
  // unresolved.
  absl::StatusOr<v1::ApplyRebalanceResponse> Apply(const v1::ApplyRebalanceRequest& request);
  v1::ListRebalanceMovesResponse List() const;
  // Moves not DONE/ABORTED/FAILED (in flight or unresolved).
  int InFlight() const;
  // True once no rebalance runs and nothing is unresolved (tests).
  bool WaitIdle(absl::Duration timeout);

 private:
  struct Metrics;
  void Loop();
  void RunRebalance(const std::string& rebalance_id);
  void CopyWorker(int64_t bytes_per_second);
  void HandOverOne(const std::string& move_id);
  // One attempt to decide a move left in flight; false: still unresolved.
  bool Resolve(const std::string& move_id, const std::string& why);
  void MaybeAutoRebalance();
  // Re-replication (re_replication.cc). At most once per retry_interval
  // (longer while runs copy nothing): plans copies of the units without a
  // full set of backups onto live servers, queued as add_backup moves.
  void MaybeReReplicate();
  // A new map: the next plan may run at once, and refused units whose
  // owner changed since are planned again.
  void ObserveMap(const v1::ShardMap& map);
  // An owner refused to export units for a backup (FAILED_PRECONDITION:
  // it steps them on a lost primary's clock): they are skipped until their
  // owner changes or its heartbeat says that lineage is merged.
  void SkipRefused(const v1::MoveRecord& record, const absl::Status& refusal);
  // Drops the skips of owners whose heartbeat said, at a map as new as the
  // refusal's, that no lost primary's clock steps their units.
  void ForgetMergedSkips();
  // The map an add_backup move's hand-over installs: `current` with the
  // target as a new backup of the record's units, epoch + 1.
  static absl::StatusOr<v1::ShardMap> BackupMap(const v1::ShardMap& current,
                                                const v1::MoveRecord& record);
  // Stores `records` (moves of the new run `id`, which takes sequence
  // number `seq`) and queues them for the loop. REQUIRES: nothing runs.
  absl::Status QueueRun(const std::string& id, int64_t seq,
                        std::vector<v1::MoveRecord> records, int64_t bandwidth)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Installs a map that lists the targets not in it yet (owning nothing):
  // a server takes part in moves only once its map lists it.
  absl::Status AddNewTargets();
  // Polls `address` until it routes by `epoch` or newer (map pushes are
  // asynchronous); false after the RPC timeout.
  bool WaitForEpoch(const std::string& address, uint64_t epoch);
  // Completes a handed-over move: the coordinator's map, the record.
  void Complete(v1::MoveRecord record, const std::string& how);
  // Stores `record` (and prunes old finished ones); updates moves_.
  void Save(const v1::MoveRecord& record);
  v1::MoveRecord Get(const std::string& move_id) const;
  std::vector<std::string> AliveNewServers() const;
  absl::Time Now() const { return clock_(); }

  Coordinator* const coordinator_;
  CoordinatorStore* const store_;
  const MoveOrchestratorOptions options_;
  const std::function<absl::Time()> clock_;
  std::unique_ptr<Metrics> metrics_;

  mutable absl::Mutex mu_;
  // Every kept move, oldest first (store key order).
  std::vector<v1::MoveRecord> moves_ ABSL_GUARDED_BY(mu_);
  int64_t next_rebalance_ ABSL_GUARDED_BY(mu_) = 1;
  std::string running_ ABSL_GUARDED_BY(mu_);      // rebalance in progress
  std::string to_run_ ABSL_GUARDED_BY(mu_);       // applied, not yet started
  std::set<std::string> unresolved_ ABSL_GUARDED_BY(mu_);
  // Copies finished (or failed), waiting for their hand-over.
  std::deque<std::string> ready_ ABSL_GUARDED_BY(mu_);
  size_t next_copy_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> copy_queue_ ABSL_GUARDED_BY(mu_);
  std::string last_outcome_ ABSL_GUARDED_BY(mu_);
  // Bandwidth of the applied rebalance's copies together (0: none).
  int64_t copy_bandwidth_ ABSL_GUARDED_BY(mu_) = 0;
  // New servers an automatic rebalance was tried for.
  std::vector<std::string> auto_tried_ ABSL_GUARDED_BY(mu_);
  // Re-replication: units (owner address, table, slot; as
  // PlanReReplication's skip) that cannot get a backup yet, with the map
  // epoch they were refused at; the epoch of the last map ObserveMap saw,
  // and when the next plan may run.
  std::map<std::tuple<std::string, std::string, uint32_t>, uint64_t> skip_ ABSL_GUARDED_BY(mu_);
  uint64_t seen_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time next_re_replication_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Epoch of the last map a "nothing to copy" note was logged for.
  uint64_t noted_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // The last re-replication run, and how many runs in a row copied nothing
  // (each waits twice as long, up to 64 retry intervals; a new map resets).
  std::string last_re_replication_ ABSL_GUARDED_BY(mu_);
  int failed_rounds_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_MOVE_ORCHESTRATOR_H_
