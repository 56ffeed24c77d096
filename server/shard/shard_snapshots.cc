#include "server/shard/shard_snapshots.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <system_error>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "server/shard/replication.h"
#include "server/checkpoint/checkpoint.h"
#include "server/checkpoint/file_util.h"
#include "server/checkpoint/store_rows.h"
#include "server/shard/shard_metrics.h"

namespace recps::server {
namespace {

// Snapshot states kept for SaveRowsStatus, and bases kept for increments.
constexpr size_t kMaxSaveStates = 64;
constexpr size_t kMaxBases = 16;

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The row file's directory exists (created when missing) and is writable.
absl::Status PrepareDir(const std::string& path) {
  const std::string dir = DirName(path);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return checkpoint::ErrnoStatus(ec.value(),
                                   "cannot create the directory of row file",
                                   path);
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return checkpoint::ErrnoStatus(errno, "cannot write row file", path);
  }
  return absl::OkStatus();
}

}  // namespace

int64_t DropUnits(SlotTransfer& store, absl::Span<const StoreUnit> units) {
  int64_t dropped = 0;
  for (const StoreUnit& u : units) {
    absl::StatusOr<int64_t> n = store.DropSlot(u.first, u.second);
    if (n.ok()) dropped += *n;
  }
  return dropped;
}

ShardSnapshots::ShardSnapshots(LayeredStore* store, StepClock* clock,
                               Replication* replicas, ShardMetrics* metrics,
                               absl::Duration step_timeout, MapFacts map)
    : store_(store),
      clock_(clock),
      replicas_(replicas),
      metrics_(metrics),
      step_timeout_(step_timeout),
      map_(std::move(map)) {}

ShardSnapshots::~ShardSnapshots() { Stop(); }

void ShardSnapshots::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t ShardSnapshots::NextMark() {
  absl::MutexLock lock(&mu_);
  const uint64_t mark = next_cut_++;
  if (absl::Status s = store_->MarkGeneration(mark); !s.ok()) {
    LogError("generation mark ", mark, ": ", s.message());
  }
  return mark;
}

void ShardSnapshots::KeepUnits(absl::Span<const StoreUnit> units) {
  const absl::flat_hash_set<StoreUnit> keep(units.begin(), units.end());
  absl::MutexLock lock(&mu_);
  deferred_drops_.erase(
      std::remove_if(deferred_drops_.begin(), deferred_drops_.end(),
                     [&](const StoreUnit& u) { return keep.contains(u); }),
      deferred_drops_.end());
}

void ShardSnapshots::Post(
    absl::AnyInvocable<void(bool cancelled) &&> task) {
  absl::MutexLock lock(&mu_);
  if (stop_) {
    std::move(task)(true);
    return;
  }
  tasks_.push_back(std::move(task));
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { RunTasks(); });
  }
}

void ShardSnapshots::RunTasks() {
  for (;;) {
    absl::AnyInvocable<void(bool) &&> task;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ShardSnapshots* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->stop_ || !s->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stopping, nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
      stop = stop_;
    }
    std::move(task)(stop);
  }
}

void ShardSnapshots::AddBase(uint64_t step, uint64_t cut) {
  bases_[step] = cut;
  while (bases_.size() > kMaxBases) bases_.erase(bases_.begin());
}

void ShardSnapshots::SaveRows(const v1::SaveRowsRequest* request,
                           v1::SaveRowsResponse* response, Done done) {
  Post([this, request, response,
                      done = std::move(done)](bool cancelled) mutable {
    if (cancelled) {
      std::move(done)(absl::UnavailableError("shard server is shutting down"));
      return;
    }
    const v1::SaveRowsRequest copy = *request;  // the call ends with done
    const int num_tables = store_->num_tables();
    absl::StatusOr<std::shared_ptr<SaveState>> save =
        TakeSnapshot(copy, response);
    uint64_t since = 0;
    if (save.ok() && copy.incremental()) {
      absl::MutexLock lock(&mu_);
      since = bases_.at(copy.base_step());
    }
    std::move(done)(save.status());
    if (save.ok()) WriteSnapshot(copy, *save, num_tables, since);
  });
}

absl::StatusOr<std::shared_ptr<ShardSnapshots::SaveState>>
ShardSnapshots::TakeSnapshot(const v1::SaveRowsRequest& request,
                          v1::SaveRowsResponse* response) {
  if (request.path().empty()) {
    return absl::InvalidArgumentError("SaveRows: path is empty");
  }
  if (request.step() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SaveRows: step ", request.step(), " is out of range"));
  }
  if (!map_.listed()) {
    return absl::FailedPreconditionError(
        "SaveRows: this server has no shard map that lists it yet");
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = saves_.find(request.step());
    if (it != saves_.end() &&
        it->second->state != v1::SaveRowsStatusResponse::FAILED) {
      return absl::AlreadyExistsError(absl::StrCat(
          "a snapshot of step ", request.step(), " exists on this server (",
          v1::SaveRowsStatusResponse::State_Name(it->second->state), ", ",
          it->second->file.name().empty() ? request.path()
                                          : it->second->file.name(),
          ")"));
    }
    if (request.incremental()) {
      if (request.base_step() >= request.step()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "SaveRows: base_step ", request.base_step(),
            " must be below step ", request.step()));
      }
      if (bases_.count(request.base_step()) == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "incremental checkpoint at step ", request.step(),
            " needs this server's snapshot of base step ", request.base_step(),
            ", which this process did not take or restore; write a full "
            "checkpoint"));
      }
    }
  }
  RETURN_IF_ERROR(PrepareDir(request.path()));
  auto save = std::make_shared<SaveState>();
  save->step = request.step();
  double stall = 0;
  auto cut = [&]() -> absl::Status {
        const absl::Time start = absl::Now();
        {
          // Cuts and moves' generation marks share next_cut_ (NextMark).
          absl::MutexLock lock(&mu_);
          save->cut = next_cut_++;
          RETURN_IF_ERROR(store_->BeginSnapshot(save->cut));
          snapshot_open_ = true;
        }
        // What this server owns at the cut (moves change it while the
        // file is written).
        save->owned = map_.owned_units();
        stall = absl::ToDoubleSeconds(absl::Now() - start);
        return absl::OkStatus();
      };
  // A server that owns nothing takes part in no step (workers do not push
  // to it), so its clock would never reach the cut: its file is empty at
  // any step, cut at once.
  if (!map_.owns_anything()) {
    RETURN_IF_ERROR(cut());
  } else {
    // Every clock of the units this server owns holds at the cut (its own,
    // and after a failover the lineage clocks of the units promoted here).
    std::vector<StepClock*> clocks = replicas_ != nullptr ? replicas_->LineageClocks() : std::vector<StepClock*>{};
    // Not the own clock when it steps no unit (it never takes a step).
    if (replicas_ == nullptr || !replicas_->OwnClockIdle() || clocks.empty()) {
      clocks.insert(clocks.begin(), clock_);
    }
    std::function<absl::Status(size_t)> hold = [&](size_t k) -> absl::Status {
      if (k == clocks.size()) return cut();
      // A lineage merged into a clock held already (no merge happens while
      // that one is held): held with it.
      if (StepClock* into = clocks[k]->merged_into();
          into != nullptr && std::find(clocks.begin(), clocks.begin() + k, into) !=
                                 clocks.begin() + k) {
        return hold(k + 1);
      }
      return clocks[k]->RunAtCut(static_cast<int64_t>(request.step()), step_timeout_,
                                 [&] { return hold(k + 1); });
    };
    RETURN_IF_ERROR(hold(0));
  }
  int64_t rows = 0;
  for (int64_t r : store_->RowsPerSlot()) rows += r;
  save->rows_total = rows;
  {
    absl::MutexLock lock(&mu_);
    next_cut_ = std::max(next_cut_, save->cut + 1);
    saves_[request.step()] = save;
    while (saves_.size() > kMaxSaveStates) saves_.erase(saves_.begin());
  }
  response->set_rows(rows);
  response->set_snapshot_seconds(stall);
  if (metrics_ != nullptr) metrics_->SetSnapshotStall(stall);
  return save;
}

void ShardSnapshots::WriteSnapshot(const v1::SaveRowsRequest& request,
                                const std::shared_ptr<SaveState>& save,
                                int num_tables, uint64_t since) {
  const absl::Time start = absl::Now();
  // Only the (table, slot) units this server owned at the cut: a move's
  // target holds copied rows of units it does not own yet, and a source
  // keeps handed-over rows until the file is written; neither belongs in
  // this server's file.
  checkpoint::RowSelection selection;
  for (int t = 0; t < num_tables; ++t) selection.tables.push_back(t);
  const std::vector<std::vector<uint8_t>>& owned = save->owned;
  selection.unit = [&owned](int t, uint32_t slot) {
    return t >= static_cast<int>(owned.size()) || slot >= owned[t].size() ||
           owned[t][slot] != 0;
  };
  std::vector<uint32_t> slots(store_->num_slots());
  for (uint32_t s = 0; s < slots.size(); ++s) slots[s] = s;
  checkpoint::RowFileMeta meta;
  meta.job_config_digest = request.job_config_digest();
  meta.step = request.step();
  meta.kind = request.incremental() ? v1::CHECKPOINT_KIND_INCREMENTAL
                                    : v1::CHECKPOINT_KIND_FULL;
  meta.base_step = request.incremental() ? request.base_step() : 0;
  checkpoint::RowFileOptions file_options;
  file_options.rows_written = &save->rows_written;
  absl::StatusOr<checkpoint::RowFileInfo> info =
      checkpoint::RowFileWriter(file_options)
          .WriteSnapshot(*store_, since, slots, request.path(), selection,
                         meta);
  store_->EndSnapshot();
  RunDeferredDrops();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  absl::MutexLock lock(&mu_);
  if (!info.ok()) {
    save->state = v1::SaveRowsStatusResponse::FAILED;
    save->error = std::string(info.status().message());
    save->error_code = info.status().code();
    LogWarning("checkpoint at step ", request.step(), " failed: ",
               save->error);
    return;
  }
  save->file.set_name(BaseName(request.path()));
  save->file.set_size_bytes(info->size_bytes);
  save->file.set_crc32c(info->crc32c);
  save->file.set_rows(info->rows);
  save->file.set_shard(request.shard());
  save->state = v1::SaveRowsStatusResponse::DONE;
  AddBase(request.step(), save->cut);
  if (metrics_ != nullptr) {
    metrics_->RecordCheckpointWrite(info->rows,
                                    static_cast<int64_t>(info->size_bytes),
                                    seconds);
  }
  LogInfo("checkpoint at step ", request.step(), ": ", info->rows,
          " rows, ", info->size_bytes, " bytes to ", request.path(), " in ",
          seconds, " s");
}

absl::Status ShardSnapshots::SaveRowsStatus(
    const v1::SaveRowsStatusRequest& request,
    v1::SaveRowsStatusResponse* response) const {
  absl::MutexLock lock(&mu_);
  auto it = saves_.find(request.step());
  if (it == saves_.end()) {
    response->set_state(v1::SaveRowsStatusResponse::STATE_UNSPECIFIED);
    return absl::OkStatus();
  }
  const SaveState& s = *it->second;
  response->set_state(s.state);
  response->set_error(s.error);
  response->set_error_code(static_cast<int32_t>(s.error_code));
  if (s.state == v1::SaveRowsStatusResponse::DONE) *response->mutable_file() = s.file;
  response->set_rows_written(s.rows_written.load(std::memory_order_relaxed));
  response->set_rows_total(s.rows_total);
  return absl::OkStatus();
}

void ShardSnapshots::RestoreRows(const v1::RestoreRowsRequest* request,
                              v1::RestoreRowsResponse* response, Done done) {
  Post([this, request, response,
                      done = std::move(done)](bool cancelled) mutable {
    if (cancelled) {
      std::move(done)(absl::UnavailableError("shard server is shutting down"));
      return;
    }
    std::move(done)(DoRestoreRows(*request, response));
  });
}

absl::Status ShardSnapshots::DoRestoreRows(const v1::RestoreRowsRequest& request,
                                        v1::RestoreRowsResponse* response) {
  const absl::Time start = absl::Now();
  const bool forget_only = request.replace() && request.checkpoint_dirs().empty();
  if (request.checkpoint_dirs().empty() && !forget_only) {
    return absl::InvalidArgumentError("RestoreRows: checkpoint_dirs is empty");
  }
  if (forget_only && request.step() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RestoreRows: replace without checkpoint_dirs starts again at step 0, not ",
        request.step()));
  }
  if (request.step() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RestoreRows: step ", request.step(), " is out of range"));
  }
  if (clock_->started() && !request.replace()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RestoreRows: this server already applied pushes (up to step ",
        clock_->applied_step(), "); restore into a freshly started server"));
  }
  if (!map_.listed()) {
    return absl::FailedPreconditionError(
        "RestoreRows: this server has no shard map that lists it yet; install "
        "the map first (rows are restored by the slots it gives this server)");
  }
  if (request.replace()) {
    RETURN_IF_ERROR(ForgetEverything());
    if (forget_only) {
      response->set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
      return absl::OkStatus();
    }
  }
  const std::vector<std::string> dirs(request.checkpoint_dirs().begin(),
                                      request.checkpoint_dirs().end());
  ASSIGN_OR_RETURN(const v1::CheckpointManifest last,
                   checkpoint::ReadManifest(dirs.back()));
  if (last.step() != request.step()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RestoreRows: step is ", request.step(), " but the chain's last "
        "checkpoint ", dirs.back(), " is at step ", last.step()));
  }
  // The slots of each table that this server owns in its current map.
  const std::vector<std::vector<uint32_t>> slots_by_table = map_.restore_slots();
  ThreadPool pool;
  checkpoint::ImportOptions import;
  import.pool = &pool;
  ASSIGN_OR_RETURN(const checkpoint::RestoreStats stats,
                   checkpoint::RestoreChain(dirs, request.expected_digest(),
                                            *store_, slots_by_table, import));
  RETURN_IF_ERROR(clock_->ResumeAt(static_cast<int64_t>(request.step())));
  if (replicas_ != nullptr) {
    RETURN_IF_ERROR(replicas_->ResumeAt(static_cast<int64_t>(request.step())));
  }
  {
    // The restored state is a base for the next incremental SaveRows.
    absl::MutexLock lock(&mu_);
    const uint64_t cut = next_cut_++;
    RETURN_IF_ERROR(store_->BeginSnapshot(cut));
    store_->EndSnapshot();
    AddBase(request.step(), cut);
  }
  response->set_rows(stats.rows);
  response->set_files(stats.files);
  response->set_bytes(stats.bytes);
  response->set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  if (metrics_ != nullptr) metrics_->RecordRestore(stats.rows, response->seconds());
  LogInfo("restored ", stats.rows, " rows from ", stats.files, " row files (",
          dirs.size(), " checkpoint(s), last ", dirs.back(), "); next step ",
          request.step());
  return absl::OkStatus();
}

absl::Status ShardSnapshots::ForgetEverything() {
  // On the checkpoint thread: no snapshot is being written. The clock
  // first, so no push of the earlier run applies to what is restored; at
  // step 0, as a fresh server's, so the restore goes on as into one.
  RETURN_IF_ERROR(clock_->Restart(0));
  if (replicas_ != nullptr) RETURN_IF_ERROR(replicas_->Restart(0));
  int64_t rows = 0;
  for (uint32_t slot = 0; slot < store_->num_slots(); ++slot) {
    ASSIGN_OR_RETURN(const int64_t n, store_->DropSlot(SlotTransfer::kAllTables, slot));
    rows += n;
  }
  absl::MutexLock lock(&mu_);
  bases_.clear();
  deferred_drops_.clear();
  LogInfo("rollback: forgot ", rows, " rows, the buffered pushes and the step clock");
  return absl::OkStatus();
}

void ShardSnapshots::DropHandedOver(std::vector<StoreUnit> units) {
  absl::MutexLock lock(&mu_);
  if (snapshot_open_) {
    deferred_drops_.insert(deferred_drops_.end(), units.begin(), units.end());
    return;
  }
  DropUnits(*store_, units);
}

void ShardSnapshots::RunDeferredDrops() {
  // Under mu_: a copy that takes a unit back first removes it from the
  // list (KeepUnits), so no drop hits rows copied in later.
  absl::MutexLock lock(&mu_);
  snapshot_open_ = false;
  if (deferred_drops_.empty()) return;
  const int64_t rows = DropUnits(*store_, deferred_drops_);
  LogInfo("dropped ", rows, " handed-over rows kept for the checkpoint");
  deferred_drops_.clear();
}

}  // namespace recps::server
