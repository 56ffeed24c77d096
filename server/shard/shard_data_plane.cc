#include "server/shard/shard_data_plane.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/wire/wire_format.h"
#include "server/shard/shard_metrics.h"
#include "server/store/table_checks.h"

namespace recps::server {
namespace {

// Free response buffers kept for reuse: enough for a few concurrent lookups
// of the largest batches the benchmarks and the worker send.
constexpr size_t kMaxFreeResponseBytes = size_t{256} << 20;

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return pages_resident * sysconf(_SC_PAGESIZE);
}

}  // namespace

absl::Status StaleEpochError(absl::string_view message, uint64_t epoch) {
  absl::Status s = absl::AbortedError(message);
  s.SetPayload(kShardMapEpochKey, absl::Cord(absl::StrCat(epoch)));
  return s;
}

ShardDataPlane::ShardDataPlane(LayeredStore* store,
                               const ShardServerOptions* options,
                               ShardMetrics* metrics, uint64_t incarnation,
                               ShardMapKeeper* map, UnitHolds* holds,
                               WorkQueue* work)
    : store_(store),
      options_(*options),
      metrics_(metrics),
      start_time_(absl::Now()),
      incarnation_(incarnation),
      map_(map),
      holds_(holds),
      work_(work),
      response_buffers_(BufferPool::Create(kMaxFreeResponseBytes)),
      slot_load_(std::make_unique<SlotLoad>(store->num_slots(), start_time_)),
      replication_(std::make_unique<Replication>(store, options)),
      worker_steps_(options->consistency.world_size) {
  // The clock decides when a step's pushes apply; ApplyPush
  // (shard_data_plane_push.cc, beside the push's checks) applies them.
  clock_ = std::make_unique<StepClock>(
      options_.consistency, [this](GradientPush& push) { return ApplyPush(push); });
}

absl::Status ShardDataPlane::CheckHeader(const v1::RequestHeader& header,
                                      const MapView& view, bool forwarded) const {
  const uint64_t epoch = view->map.epoch();
  // A request routed by an older map than this server's is stale first:
  // the caller takes the new map, which may no longer send it here (a
  // server restarted at this address after a failover gave it nothing: a
  // retry of a call to the old process is then no loss).
  if (view->self >= 0 && header.shard_map_epoch() < epoch && !forwarded) {
    return StaleEpochError(
        absl::StrCat("stale shard map: request routed with epoch ", header.shard_map_epoch(),
                     ", this server is at epoch ", epoch, "; refresh the map and retry"),
        epoch);
  }
  // Then: a caller that knew another process at this address must learn
  // that its rows are gone now, not after a wait for a map (UNAVAILABLE,
  // retried) or for a step this fresh clock never saw (parked until the
  // step timeout, or refused as ahead of the sync window).
  if (header.incarnation() != 0 && header.incarnation() != incarnation_) {
    return absl::DataLossError(absl::StrCat(
        "the request names incarnation ",
        absl::Hex(header.incarnation(), absl::kZeroPad16),
        ", this server process is incarnation ",
        absl::Hex(incarnation_, absl::kZeroPad16),
        ": the rows the old process held were lost (this one serves "
        "freshly initialised rows)"));
  }
  if (view->self < 0) {
    return absl::UnavailableError(absl::StrCat(
        "shard server ", view->self_address,
        " has no shard map that lists it yet (epoch ", epoch, ")"));
  }
  if (header.shard_map_epoch() > epoch) {
    return absl::UnavailableError(absl::StrCat(
        "this server is at shard map epoch ", epoch,
        ", behind the request's ", header.shard_map_epoch(), "; retry shortly"));
  }
  const int world = options_.consistency.world_size;
  if (header.worker_rank() < 0 || header.worker_rank() >= world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker rank ", header.worker_rank(), " is outside the job's ranks [0, ",
        world, ")"));
  }
  if (header.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative step ", header.step()));
  }
  return absl::OkStatus();
}

absl::Status ShardDataPlane::CheckOwned(const MapView& view, const config::TableSpec& spec,
                                     absl::Span<const int64_t> ids) const {
  const uint64_t key = StableNameKey(spec.name);
  const TableRoute route = view->map.RouteOf(key);
  if (route.column_split()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", spec.name, " is split column-wise at shard map epoch ",
        view->map.epoch(), ": request its column groups (table ",
        view->map.ColumnGroupsOf(key)[0].table,
        " and the others of the map's column_groups)"));
  }
  for (int64_t id : ids) {
    if (route.OwnerOf(id) != view->self) {
      return StaleEpochError(
          absl::StrCat("id ", id, " of table ", spec.name, " (slot ",
                       SlotOf(key, id, view->map.num_slots()),
                       ") is not owned by ", view->self_address,
                       " at shard map epoch ", view->map.epoch()),
          view->map.epoch());
    }
  }
  return absl::OkStatus();
}

absl::Status ShardDataPlane::CheckBacked(const MapView& view, const config::TableSpec& spec,
                                         absl::Span<const int64_t> ids, int primary,
                                         uint64_t routed_epoch) const {
  const uint64_t key = StableNameKey(spec.name);
  const TableRoute route = view->map.RouteOf(key);
  for (int64_t id : ids) {
    bool backs = false;
    for (uint32_t b : route.BackupsOf(id)) backs |= static_cast<int>(b) == view->self;
    if (route.OwnerOf(id) != primary && routed_epoch < view->map.epoch()) {
      return StaleEpochError(
          absl::StrCat("id ", id, " of table ", spec.name, " (slot ",
                       SlotOf(key, id, view->map.num_slots()), ") is no longer owned by ",
                       view->map.servers()[primary], " at shard map epoch ",
                       view->map.epoch(), " (the push was routed with epoch ",
                       routed_epoch, ")"),
          view->map.epoch());
    }
    if (route.OwnerOf(id) != primary || !backs) {
      return absl::FailedPreconditionError(absl::StrCat(
          "id ", id, " of table ", spec.name, " (slot ", SlotOf(key, id, view->map.num_slots()),
          ") is not owned by ", view->map.servers()[primary], " with ", view->self_address,
          " as a backup at shard map epoch ", view->map.epoch()));
    }
  }
  return absl::OkStatus();
}

void ShardDataPlane::CountLoad(const MapView& view, const config::TableSpec& spec,
                               absl::Span<const int64_t> ids, SlotLoad::Kind kind) const {
  const uint64_t key = StableNameKey(spec.name);
  const TableRoute route = view->map.RouteOf(key);
  if (route.single_owner() >= 0 || route.column_split()) return;
  slot_load_->Count(kind, key, ids);
}

void ShardDataPlane::Lookup(const v1::LookupRequest* request,
                         SerializedLookupResponse* response, Done done,
                         std::function<bool()> cancelled) {
  StartLookup(request, LookupOutput{response, {}}, std::move(done), std::move(cancelled));
}

int64_t ShardDataPlane::StepAppliedByAll() const {
  return options_.consistency.mode == ConsistencyMode::kAsync ? worker_steps_.Oldest()
                                                             : applied_step();
}

void ShardDataPlane::LookupInto(const v1::LookupRequest* request,
                             absl::Span<float* const> rows, Done done,
                             std::function<bool()> cancelled, int64_t* applied_step) {
  absl::Status s;
  if (request->updated_only()) {
    s = absl::InvalidArgumentError("an updated_only lookup cannot write rows in place");
  } else if (BytesPerElement(request->row_encoding()) != sizeof(float)) {
    s = absl::InvalidArgumentError("rows written in place are fp32");
  } else if (rows.size() != static_cast<size_t>(request->tables_size()) ||
             std::find(rows.begin(), rows.end(), nullptr) != rows.end()) {
    s = absl::InvalidArgumentError(absl::StrCat(
        "lookup of ", request->tables_size(), " tables with ", rows.size(),
        " destinations (none may be null)"));
  }
  if (!s.ok()) {
    std::move(done)(s);
    return;
  }
  StartLookup(request, LookupOutput{nullptr, rows, applied_step}, std::move(done),
              std::move(cancelled));
}

void ShardDataPlane::StartLookup(const v1::LookupRequest* request, LookupOutput out,
                              Done done, std::function<bool()> cancelled) {
  lookup_requests_.fetch_add(1, std::memory_order_relaxed);
  // Runs on the caller's thread (the gRPC callback thread): a lookup that
  // may run is pure CPU work, and the hop to a work thread cost 8-33% of the
  // server's CPU per 16k-id lookup (A/B runs, busy and quiet hours). One
  // that must wait for its step is parked in the step clock, not waited for.
  const MapView view = CurrentMap();
  absl::Status s = CheckHeader(request->header(), view);
  if (s.ok()) s = Fence(*view);
  if (s.ok() && request->tables_size() == 0) {
    s = absl::InvalidArgumentError("empty lookup: no tables in the request");
  }
  if (s.ok() && BytesPerElement(request->row_encoding()) == 0) {
    s = absl::InvalidArgumentError(absl::StrCat(
        "unknown row encoding ", request->row_encoding()));
  }
  if (!s.ok()) {
    std::move(done)(s);
    return;
  }
  // Hand-overs: a lookup of a held unit waits for the hand-over's end.
  holds_->NoteRequestStep(request->header().step());
  if (holds_->any() &&
      holds_->ParkIfHeld(request->header(), &request->tables(), nullptr,
                 [&]() -> absl::AnyInvocable<void() &&> {
                   return [this, request, out, done = std::move(done),
                           cancelled = std::move(cancelled)]() mutable {
                     LookupAfterHold(request, out, std::move(done),
                                     std::move(cancelled));
                   };
                 })) {
    return;
  }
  LookupAfterHold(request, out, std::move(done), std::move(cancelled));
}

void ShardDataPlane::LookupAfterHold(const v1::LookupRequest* request, LookupOutput out,
                                  Done done, std::function<bool()> cancelled) {
  // What a parked lookup holds, counted from the bytes (nothing decoded).
  int64_t ids = 0;
  for (const v1::TableIds& t : request->tables()) {
    ids += static_cast<int64_t>(t.ids().size() / sizeof(int64_t));
  }
  const absl::Time wait_start = absl::Now();
  // A replicated server fenced while the lookup waits: its clock may never
  // reach the step (the workers push to the promoted servers now).
  if (CurrentMap()->map.replication() > 1) {
    cancelled = [this, client_gone = std::move(cancelled)] {
      return (client_gone && client_gone()) || !Fence(*CurrentMap()).ok();
    };
  }
  // The clocks it waits for are those of the map it was routed by.
  if (absl::Status ready = replication_->LineageReadyFor(request->header().shard_map_epoch());
      !ready.ok()) {
    std::move(done)(std::move(ready));
    return;
  }
  // True while AwaitLookup runs on this thread: a callback from it then is
  // the "ready at once" case and runs the lookup here.
  auto awaiting = std::make_shared<std::atomic<bool>>(true);
  const std::thread::id caller = std::this_thread::get_id();
  AwaitLookupOnClocks(
      request->header().step(),
      [this, request, out, wait_start, awaiting, caller,
       done = std::move(done)](absl::Status ready) mutable {
        if (!ready.ok()) {
          // Dropped for the fence: say so (UNAVAILABLE), not CANCELLED.
          if (absl::IsCancelled(ready)) {
            if (absl::Status fenced = Fence(*CurrentMap()); !fenced.ok()) ready = fenced;
          }
          std::move(done)(ready);
          return;
        }
        if (metrics_ != nullptr) {
          metrics_->RecordSyncWait(absl::ToDoubleSeconds(absl::Now() - wait_start));
        }
        if (awaiting->load() && std::this_thread::get_id() == caller) {
          std::move(done)(RunLookup(*request, out));
          return;
        }
        // Released by a push: off the thread that applies the step.
        work_->Schedule([this, request, out, done = std::move(done)]() mutable {
          std::move(done)(RunLookup(*request, out));
        });
      },
      ids, std::move(cancelled));
  awaiting->store(false);
}

int64_t ShardDataPlane::applied_step() const {
  const std::vector<StepClock*> lineage = replication_->LineageClocks();
  int64_t applied = replication_->OwnClockIdle() && !lineage.empty()
                        ? lineage[0]->applied_step()
                        : clock_->applied_step();
  for (const StepClock* c : lineage) applied = std::min(applied, c->applied_step());
  return applied;
}

void ShardDataPlane::AwaitLookupOnClocks(int64_t step,
                                         absl::AnyInvocable<void(absl::Status) &&> done,
                                         int64_t ids, std::function<bool()> cancelled) {
  std::vector<StepClock*> clocks = replication_->LineageClocks();
  if (clocks.empty()) {
    clock_->AwaitLookup(step, std::move(done), ids, std::move(cancelled));
    return;
  }
  // One clock after the other, each from the thread that released the
  // one before (inline when ready at once).
  if (!replication_->OwnClockIdle()) clocks.insert(clocks.begin(), clock_.get());
  struct Chain {
    std::vector<StepClock*> clocks;
    int64_t step;
    int64_t ids;
    std::function<bool()> cancelled;
    absl::AnyInvocable<void(absl::Status) &&> done;
    static void Next(std::shared_ptr<Chain> chain, size_t k) {
      StepClock* clock = chain->clocks[k];
      clock->AwaitLookup(
          chain->step,
          [chain, k](absl::Status ready) mutable {
            if (!ready.ok() || k + 1 == chain->clocks.size()) {
              std::move(chain->done)(std::move(ready));
              return;
            }
            Next(std::move(chain), k + 1);
          },
          chain->ids, chain->cancelled);
    }
  };
  auto chain = std::make_shared<Chain>(
      Chain{std::move(clocks), step, ids, std::move(cancelled), std::move(done)});
  Chain::Next(std::move(chain), 0);
}

absl::Status ShardDataPlane::RunLookup(const v1::LookupRequest& request,
                                    LookupOutput out) {
  const MapView view = CurrentMap();  // the map may have moved while waiting
  RETURN_IF_ERROR(CheckHeader(request.header(), view));
  // Check everything before touching the store: a refused request creates
  // no rows.
  struct Part {
    int table;
    absl::Span<const int64_t> ids;
  };
  std::vector<Part> parts;
  std::vector<SerializedLookupResponse::Table> layout;
  std::vector<std::vector<int64_t>> scratch(request.tables_size());
  absl::flat_hash_set<int> seen_tables;
  int64_t total_ids = 0;
  const size_t width = BytesPerElement(request.row_encoding());
  for (int i = 0; i < request.tables_size(); ++i) {
    const v1::TableIds& t = request.tables(i);
    ASSIGN_OR_RETURN(const int table, store_->FindTable(t.table()));
    if (!seen_tables.insert(table).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", t.table(), " appears twice in one lookup"));
    }
    Part part{table, {}};
    RETURN_IF_ERROR(DecodeIds(t.ids(), t.table().c_str(), &scratch[i], &part.ids));
    total_ids += part.ids.size();
    if (total_ids > options_.max_ids_per_request) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "lookup carries more than max_ids_per_request=",
          options_.max_ids_per_request, " ids; split the batch"));
    }
    const config::TableSpec& spec = store_->spec(table);
    RETURN_IF_ERROR(CheckOwned(view, spec, part.ids));
    CountLoad(view, spec, part.ids, SlotLoad::Kind::kLookup);
    // The store checks ranges too, but table by table: an id outside a
    // later fixed table would refuse the request after earlier tables
    // created rows (found by tests/fuzz/fuzz_shard_lookup).
    RETURN_IF_ERROR(CheckIdsInRange(spec, part.ids));
    parts.push_back(part);
    layout.push_back({spec.name, spec.dim, part.ids.size() * spec.dim * width, false, {}});
  }
  // updated_only (sync mode): the worker holds every row as it was before
  // step `step - 1` was applied; only the rows that step updated changed
  // since. Answered only when the clock shows exactly that step as the
  // newest applied (otherwise every row, which is always right).
  const bool updated_only =
      request.updated_only() &&
      options_.consistency.mode == ConsistencyMode::kSync &&
      !replication_->HasLineage() &&  // the set holds the own clock's step only
      clock_->applied_step() == request.header().step() - 1 &&
      clock_->applied_step() > replication_->merged_at_step();  // merged units too
  std::vector<std::vector<int32_t>> positions;
  std::vector<std::vector<int64_t>> updated_ids;
  if (updated_only) {
    positions.resize(parts.size());
    updated_ids.resize(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      UpdatedPositions(parts[i].table, parts[i].ids, &positions[i]);
      updated_ids[i].reserve(positions[i].size());
      for (const int32_t p : positions[i]) updated_ids[i].push_back(parts[i].ids[p]);
      parts[i].ids = updated_ids[i];
      layout[i].rows_bytes = parts[i].ids.size() * store_->spec(parts[i].table).dim * width;
      layout[i].updated_only = true;
      layout[i].positions = absl::string_view(
          reinterpret_cast<const char*>(positions[i].data()),
          positions[i].size() * sizeof(int32_t));
    }
  }
  // Read before the rows: they hold at least the pushes it counts.
  const int64_t applied_step = StepAppliedByAll();
  if (out.applied_step != nullptr) *out.applied_step = applied_step;
  SerializedLookupResponse* const response = out.response;
  if (response != nullptr) {
    RETURN_IF_ERROR(response->Init(*response_buffers_, layout, incarnation_, applied_step));
  }
  std::vector<float> converted;
  int64_t bytes = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& part = parts[i];
    const size_t n = part.ids.size() * store_->spec(part.table).dim;
    if (response == nullptr) {
      // LookupInto: straight into the in-process caller's rows.
      RETURN_IF_ERROR(store_->Lookup(part.table, part.ids, out.rows[i]));
    } else if (width == sizeof(float)) {
      // Rows land straight in the response buffer (64-byte aligned).
      RETURN_IF_ERROR(store_->Lookup(
          part.table, part.ids, reinterpret_cast<float*>(response->rows(i))));
    } else {
      converted.resize(n);
      RETURN_IF_ERROR(store_->Lookup(part.table, part.ids, converted.data()));
      EncodeRows(converted.data(), n, request.row_encoding(), response->rows(i));
    }
    bytes += layout[i].rows_bytes;
  }
  if (metrics_ != nullptr) metrics_->AddLookedUpIds(total_ids, bytes);
  return absl::OkStatus();
}

void ShardDataPlane::StepUpdates::Clear() {
  if (set_built && uses_bits) {
    for (const int64_t id : ids) {
      if (id >= 0 && static_cast<uint64_t>(id >> 6) < bits.size()) {
        bits[id >> 6] &= ~(uint64_t{1} << (id & 63));
      }
    }
  }
  ids.clear();
  set_built = false;
}

void ShardDataPlane::UpdatedPositions(int table, absl::Span<const int64_t> ids,
                                   std::vector<int32_t>* positions) {
  positions->clear();
  const int64_t num_rows = store_->spec(table).num_rows;
  absl::MutexLock lock(&updates_mu_);
  const auto it = last_step_updates_.find(table);
  if (it == last_step_updates_.end() || it->second.ids.empty()) return;
  StepUpdates& u = it->second;
  // Ids of a fixed table are in [0, num_rows): pushes and lookups with
  // others were refused before they got here.
  const bool bitmap = num_rows > 0 && num_rows <= kMaxUpdateBitmapRows;
  if (!u.set_built) {
    u.uses_bits = bitmap;
    if (bitmap) {
      u.bits.resize((num_rows + 63) / 64);  // zero: Clear unsets what it set
      for (const int64_t id : u.ids) {
        if (id >= 0 && id < num_rows) u.bits[id >> 6] |= uint64_t{1} << (id & 63);
      }
    } else {
      u.set.clear();
      u.set.reserve(u.ids.size());
      u.set.insert(u.ids.begin(), u.ids.end());
    }
    u.set_built = true;
  }
  if (u.uses_bits) {
    for (size_t p = 0; p < ids.size(); ++p) {
      const int64_t id = ids[p];
      if (id >= 0 && id < num_rows && (u.bits[id >> 6] >> (id & 63) & 1) != 0) {
        positions->push_back(static_cast<int32_t>(p));
      }
    }
    return;
  }
  for (size_t p = 0; p < ids.size(); ++p) {
    if (u.set.contains(ids[p])) positions->push_back(static_cast<int32_t>(p));
  }
}

absl::Status ShardDataPlane::Stats(const v1::StatsRequest& request,
                                v1::StatsResponse* response) const {
  int64_t total_rows = 0, row_bytes = 0;
  for (int t = 0; t < store_->num_tables(); ++t) {
    const TableInfo info = store_->Info(t);
    v1::TableStats* ts = response->add_tables();
    ts->set_name(info.name);
    ts->set_dim(info.dim);
    ts->set_rows(info.rows);
    ts->set_bytes(info.rows * info.row_bytes);
    ts->set_index_bytes(info.index_bytes);
    ts->set_lookup_ids(info.lookup_ids);
    ts->set_update_ids(info.update_ids);
    ts->set_committed_bytes(info.committed_bytes);
    total_rows += info.rows;
    row_bytes += info.rows * info.row_bytes;
    if (metrics_ != nullptr) metrics_->SetTableRows(info.name, info.rows, info.rows * info.row_bytes);
  }
  response->set_total_rows(total_rows);
  response->set_row_bytes(row_bytes);
  const int64_t resident = ResidentBytes();
  response->set_resident_bytes(resident);
  if (metrics_ != nullptr) metrics_->SetResidentBytes(resident);
  const MapView view = CurrentMap();
  response->set_shard_map_epoch(view->map.epoch());
  response->set_applied_step(applied_step());
  response->set_parked_lookups(clock_->waiting_lookups());
  response->set_parked_ids(clock_->waiting_ids());
  response->set_incarnation(incarnation_);
  response->set_lookup_requests(lookup_requests_.load());
  response->set_push_requests(push_requests_.load());
  response->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - start_time_));
  if (metrics_ != nullptr) metrics_->AppendRpcStats(response);
  if (request.include_slots() && view->self >= 0) {
    const std::vector<int64_t> per_slot = store_->RowsPerSlot();
    const std::vector<int64_t> bytes = store_->BytesPerSlot();
    const SlotLoad::Rates rates = slot_load_->RatesAt(absl::Now());
    for (uint32_t slot : view->map.SlotsOf(view->self)) {
      v1::SlotStats* ss = response->add_slots();
      ss->set_slot(slot);
      ss->set_rows(slot < per_slot.size() ? per_slot[slot] : 0);
      ss->set_bytes(slot < bytes.size() ? bytes[slot] : 0);
      if (slot < slot_load_->num_slots()) {
        ss->set_lookup_ids_per_second(rates.lookup_ids_per_second[slot]);
        ss->set_update_ids_per_second(rates.update_ids_per_second[slot]);
      }
    }
  }
  return absl::OkStatus();
}

void ShardDataPlane::RefreshGauges() const {
  if (metrics_ == nullptr) return;
  for (int t = 0; t < store_->num_tables(); ++t) {
    const TableInfo info = store_->Info(t);
    metrics_->SetTableRows(info.name, info.rows, info.rows * info.row_bytes);
  }
  metrics_->SetResidentBytes(ResidentBytes());
  metrics_->SetReplicaLagSteps(replication_->LagSteps(clock_->applied_step()));
}

}  // namespace recps::server
