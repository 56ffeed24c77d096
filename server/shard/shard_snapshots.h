// The shard server's snapshot writer: SaveRows (a snapshot at the cut, the
// row file written in the background), SaveRowsStatus, RestoreRows (the
// slots the server owns now, from a whole chain), and what they share with
// slot moves: the one sequence of snapshot cuts and generation marks
// (NextMark), and the handed-over units an open snapshot still reads, whose
// drop waits for its file. The row file format and the import are
// server/checkpoint/.
//
// Checkpoint work runs on one thread of its own, one request at a time,
// never on the caller's: SaveRows waits there (at most the step timeout)
// for the cut, takes the snapshot, calls done, then writes the row file
// while training goes on; a SaveRows that arrives meanwhile waits for that
// write. RestoreRows imports there.
#ifndef RECPS_SERVER_SHARD_SHARD_SNAPSHOTS_H_
#define RECPS_SERVER_SHARD_SHARD_SNAPSHOTS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
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
#include "server/shard/step_clock.h"
#include "server/store/layered_store.h"

namespace recps::server {

class ShardMetrics;
class Replication;

// Removes the rows of `units` from `store`; returns the rows removed (a
// unit whose drop fails counts none).
int64_t DropUnits(SlotTransfer& store, absl::Span<const StoreUnit> units);

class ShardSnapshots {
 public:
  // What the snapshot writer reads of its server's shard map, each at the
  // moment it asks.
  struct MapFacts {
    // Whether the map lists this server / gives it any slot or table.
    std::function<bool()> listed;
    std::function<bool()> owns_anything;
    // [table][slot]: 1 when this server owns the unit (what a file holds).
    std::function<std::vector<std::vector<uint8_t>>()> owned_units;
    // Per store table, the slots whose rows a restore imports here.
    std::function<std::vector<std::vector<uint32_t>>()> restore_slots;
  };
  // `store`, `clock`, `replicas` and `metrics` outlive this object;
  // `replicas` (the replica clocks a restore resumes and a rollback
  // restarts with `clock`) and `metrics` may be null.
  ShardSnapshots(LayeredStore* store, StepClock* clock, Replication* replicas,
                 ShardMetrics* metrics, absl::Duration step_timeout, MapFacts map);
  // Stop()s.
  ~ShardSnapshots();

  using Done = absl::AnyInvocable<void(absl::Status) &&>;

  // See shard_admin.proto for the contract of each.
  void SaveRows(const v1::SaveRowsRequest* request,
                v1::SaveRowsResponse* response, Done done);
  absl::Status SaveRowsStatus(const v1::SaveRowsStatusRequest& request,
                              v1::SaveRowsStatusResponse* response) const;
  void RestoreRows(const v1::RestoreRowsRequest* request,
                   v1::RestoreRowsResponse* response, Done done);

  // A generation mark (SlotTransfer::MarkGeneration) from the sequence the
  // snapshot cuts use, so marks and cuts never collide.
  uint64_t NextMark();
  // Drops handed-over units now, or after the file of the open snapshot
  // (which must still read them) is written.
  void DropHandedOver(std::vector<StoreUnit> units);
  // Forgets deferred drops of `units`: a move takes them back, so no late
  // drop may hit the rows it copies in.
  void KeepUnits(absl::Span<const StoreUnit> units);

  // Ends the checkpoint thread after the task it runs; tasks still queued
  // are answered UNAVAILABLE, later ones at once. Idempotent.
  void Stop();

 private:
  // One SaveRows, from its snapshot to its file.
  struct SaveState {
    uint64_t step = 0;
    uint64_t cut = 0;
    v1::SaveRowsStatusResponse::State state =
        v1::SaveRowsStatusResponse::WRITING;
    std::string error;
    absl::StatusCode error_code = absl::StatusCode::kOk;  // FAILED: the code
    v1::CheckpointFile file;
    int64_t rows_total = 0;
    std::atomic<int64_t> rows_written{0};
    // [table][slot]: 1 when this server owned the unit at the cut (only
    // those go to the file).
    std::vector<std::vector<uint8_t>> owned;
  };

  // Runs task(false) on the checkpoint thread, or task(true) when stopped.
  void Post(absl::AnyInvocable<void(bool cancelled) &&> task);
  void RunTasks();
  // On the checkpoint thread: the cut and the snapshot (SaveRows' reply).
  absl::StatusOr<std::shared_ptr<SaveState>> TakeSnapshot(
      const v1::SaveRowsRequest& request, v1::SaveRowsResponse* response);
  // On the checkpoint thread, after the reply: the row file.
  void WriteSnapshot(const v1::SaveRowsRequest& request,
                     const std::shared_ptr<SaveState>& save, int num_tables,
                     uint64_t since);
  absl::Status DoRestoreRows(const v1::RestoreRowsRequest& request,
                             v1::RestoreRowsResponse* response);
  // RestoreRowsRequest.replace: restarts the clock at step 0 and drops
  // every row of every table.
  absl::Status ForgetEverything();
  // Ends the open snapshot's hold on handed-over units: drops them.
  void RunDeferredDrops();
  // Records `cut` as the snapshot of `step` that increments may build on.
  void AddBase(uint64_t step, uint64_t cut) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  LayeredStore* const store_;
  StepClock* const clock_;
  Replication* const replicas_;
  ShardMetrics* const metrics_;
  const absl::Duration step_timeout_;
  const MapFacts map_;

  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<SaveState>> saves_ ABSL_GUARDED_BY(mu_);
  // step -> the cut of its snapshot (written or restored): the bases an
  // incremental SaveRows may name.
  std::map<uint64_t, uint64_t> bases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_cut_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<absl::AnyInvocable<void(bool) &&>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // A snapshot is open (BeginSnapshot to EndSnapshot), and the units
  // handed over meanwhile, dropped when it ends.
  bool snapshot_open_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<StoreUnit> deferred_drops_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SHARD_SNAPSHOTS_H_
