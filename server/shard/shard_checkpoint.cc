// ShardServer's checkpoint RPCs: SaveRows (a snapshot at the cut, the row
// file written in the background), SaveRowsStatus and RestoreRows (the
// slots this server owns now, from a whole chain). The row file format and
// the import are server/checkpoint/.
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "server/checkpoint/checkpoint.h"
#include "server/checkpoint/file_util.h"
#include "server/checkpoint/store_rows.h"
#include "server/shard/shard_metrics.h"
#include "server/shard/shard_server.h"

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

void ShardServer::PostCheckpointTask(
    absl::AnyInvocable<void(bool cancelled) &&> task) {
  absl::MutexLock lock(&ckpt_mu_);
  if (ckpt_stop_) {
    std::move(task)(true);
    return;
  }
  ckpt_tasks_.push_back(std::move(task));
  if (!ckpt_thread_.joinable()) {
    ckpt_thread_ = std::thread([this] { RunCheckpointTasks(); });
  }
}

void ShardServer::RunCheckpointTasks() {
  for (;;) {
    absl::AnyInvocable<void(bool) &&> task;
    bool stop = false;
    {
      absl::MutexLock lock(&ckpt_mu_);
      ckpt_mu_.Await(absl::Condition(
          +[](ShardServer* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->ckpt_mu_) {
            return s->ckpt_stop_ || !s->ckpt_tasks_.empty();
          },
          this));
      if (ckpt_tasks_.empty()) return;  // stopping, nothing left
      task = std::move(ckpt_tasks_.front());
      ckpt_tasks_.pop_front();
      stop = ckpt_stop_;
    }
    std::move(task)(stop);
  }
}

void ShardServer::AddBase(uint64_t step, uint64_t cut) {
  bases_[step] = cut;
  while (bases_.size() > kMaxBases) bases_.erase(bases_.begin());
}

void ShardServer::SaveRows(const v1::SaveRowsRequest* request,
                           v1::SaveRowsResponse* response, Done done) {
  PostCheckpointTask([this, request, response,
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
      absl::MutexLock lock(&ckpt_mu_);
      since = bases_.at(copy.base_step());
    }
    std::move(done)(save.status());
    if (save.ok()) WriteSnapshot(copy, *save, num_tables, since);
  });
}

absl::StatusOr<std::shared_ptr<ShardServer::SaveState>>
ShardServer::TakeSnapshot(const v1::SaveRowsRequest& request,
                          v1::SaveRowsResponse* response) {
  if (request.path().empty()) {
    return absl::InvalidArgumentError("SaveRows: path is empty");
  }
  if (request.step() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SaveRows: step ", request.step(), " is out of range"));
  }
  if (CurrentMap()->self < 0) {
    return absl::FailedPreconditionError(
        "SaveRows: this server has no shard map that lists it yet");
  }
  {
    absl::MutexLock lock(&ckpt_mu_);
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
          absl::MutexLock lock(&ckpt_mu_);
          save->cut = next_cut_++;
          RETURN_IF_ERROR(store_->BeginSnapshot(save->cut));
          snapshot_open_ = true;
        }
        // What this server owns at the cut (moves change it while the
        // file is written).
        const MapView view = CurrentMap();
        const v1::ShardMap proto = view->map.ToProto();
        save->owned.resize(store_->num_tables());
        for (int t = 0; t < store_->num_tables(); ++t) {
          save->owned[t].resize(options_.num_slots);
          for (uint32_t slot = 0; slot < options_.num_slots; ++slot) {
            const std::string owner = UnitOwner(view->map, proto, {t, slot});
            // Column groups are routed by group, not by slot: kept whole.
            save->owned[t][slot] =
                owner.empty() || owner == view->self_address ||
                t >= store_->num_base_tables();
          }
        }
        stall = absl::ToDoubleSeconds(absl::Now() - start);
        return absl::OkStatus();
      };
  // A server that owns nothing takes part in no step (workers do not push
  // to it), so its clock would never reach the cut: its file is empty at
  // any step, cut at once.
  const MapView at_save = CurrentMap();
  if (!at_save->map.OwnsAnything(at_save->self)) {
    RETURN_IF_ERROR(cut());
  } else {
    RETURN_IF_ERROR(clock_->RunAtCut(static_cast<int64_t>(request.step()),
                                     options_.consistency.step_timeout, cut));
  }
  int64_t rows = 0;
  for (int64_t r : store_->RowsPerSlot()) rows += r;
  save->rows_total = rows;
  {
    absl::MutexLock lock(&ckpt_mu_);
    next_cut_ = std::max(next_cut_, save->cut + 1);
    saves_[request.step()] = save;
    while (saves_.size() > kMaxSaveStates) saves_.erase(saves_.begin());
  }
  response->set_rows(rows);
  response->set_snapshot_seconds(stall);
  if (metrics_ != nullptr) metrics_->SetSnapshotStall(stall);
  return save;
}

void ShardServer::WriteSnapshot(const v1::SaveRowsRequest& request,
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
  std::vector<uint32_t> slots(options_.num_slots);
  for (uint32_t s = 0; s < options_.num_slots; ++s) slots[s] = s;
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
  absl::MutexLock lock(&ckpt_mu_);
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

absl::Status ShardServer::SaveRowsStatus(
    const v1::SaveRowsStatusRequest& request,
    v1::SaveRowsStatusResponse* response) const {
  absl::MutexLock lock(&ckpt_mu_);
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

void ShardServer::RestoreRows(const v1::RestoreRowsRequest* request,
                              v1::RestoreRowsResponse* response, Done done) {
  PostCheckpointTask([this, request, response,
                      done = std::move(done)](bool cancelled) mutable {
    if (cancelled) {
      std::move(done)(absl::UnavailableError("shard server is shutting down"));
      return;
    }
    std::move(done)(DoRestoreRows(*request, response));
  });
}

absl::Status ShardServer::DoRestoreRows(const v1::RestoreRowsRequest& request,
                                        v1::RestoreRowsResponse* response) {
  const absl::Time start = absl::Now();
  if (request.checkpoint_dirs().empty()) {
    return absl::InvalidArgumentError("RestoreRows: checkpoint_dirs is empty");
  }
  if (request.step() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RestoreRows: step ", request.step(), " is out of range"));
  }
  if (clock_->started()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RestoreRows: this server already applied pushes (up to step ",
        clock_->applied_step(), "); restore into a freshly started server"));
  }
  const MapView view = CurrentMap();
  if (view->self < 0) {
    return absl::FailedPreconditionError(
        "RestoreRows: this server has no shard map that lists it yet; install "
        "the map first (rows are restored by the slots it gives this server)");
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
  const v1::ShardMap proto = view->map.ToProto();
  const std::vector<uint32_t> global = view->map.SlotsOf(view->self);
  std::vector<uint32_t> every(options_.num_slots);
  for (uint32_t s = 0; s < options_.num_slots; ++s) every[s] = s;
  std::vector<std::vector<uint32_t>> slots_by_table(store_->num_tables());
  for (int t = 0; t < store_->num_tables(); ++t) {
    const std::string& name = store_->spec(t).name;
    const TableRoute route = view->map.RouteOf(StableNameKey(name));
    if (route.column_split()) continue;  // its groups are tables of their own
    if (route.single_owner() >= 0) {
      if (route.single_owner() == view->self) slots_by_table[t] = every;
      continue;
    }
    bool own = false;
    for (const v1::TableRouting& r : proto.tables()) {
      if (r.table() != name ||
          r.slot_owner_size() != static_cast<int>(options_.num_slots)) {
        continue;
      }
      own = true;
      for (uint32_t s = 0; s < options_.num_slots; ++s) {
        if (r.slot_owner(static_cast<int>(s)) ==
            static_cast<uint32_t>(view->self)) {
          slots_by_table[t].push_back(s);
        }
      }
    }
    if (!own) slots_by_table[t] = global;
  }
  ThreadPool pool;
  checkpoint::ImportOptions import;
  import.pool = &pool;
  ASSIGN_OR_RETURN(const checkpoint::RestoreStats stats,
                   checkpoint::RestoreChain(dirs, request.expected_digest(),
                                            *store_, slots_by_table, import));
  RETURN_IF_ERROR(clock_->ResumeAt(static_cast<int64_t>(request.step())));
  {
    // The restored state is a base for the next incremental SaveRows.
    absl::MutexLock lock(&ckpt_mu_);
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

void ShardServer::DropHandedOver(std::vector<std::pair<int, uint32_t>> units) {
  absl::MutexLock lock(&ckpt_mu_);
  if (snapshot_open_) {
    deferred_drops_.insert(deferred_drops_.end(), units.begin(), units.end());
    return;
  }
  DropCopy(units);
}

void ShardServer::RunDeferredDrops() {
  // Under ckpt_mu_: a copy that takes a unit back first removes it from the
  // list (RunCopy), so no drop hits rows copied in later.
  absl::MutexLock lock(&ckpt_mu_);
  snapshot_open_ = false;
  if (deferred_drops_.empty()) return;
  const int64_t rows = DropCopy(deferred_drops_);
  LogInfo("dropped ", rows, " handed-over rows kept for the checkpoint");
  deferred_drops_.clear();
}

}  // namespace recps::server
