#include "server/coordinator/move_orchestrator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_store.h"
#include "server/coordinator/rebalance_plan.h"

namespace recps::server {
namespace {

constexpr char kMovePrefix[] = "move/";
constexpr char kRebalanceSeqKey[] = "rebalance_seq";

bool Finished(v1::MoveRecord::State s) {
  return s == v1::MoveRecord::DONE || s == v1::MoveRecord::ABORTED ||
         s == v1::MoveRecord::FAILED;
}

std::string Describe(const v1::MoveRecord& r) {
  return absl::StrCat("move ", r.move_id(), " (", r.slots_size(), " slots",
                      r.tables_size() > 0 ? absl::StrCat(", tables ", absl::StrJoin(r.tables(), ","))
                                          : "",
                      ", ", r.source(), " -> ", r.target(),
                      r.add_backup() ? " as a new backup" : "", ")");
}

}  // namespace

struct MoveOrchestrator::Metrics {
  explicit Metrics(prometheus::Registry& registry)
      : moves(prometheus::BuildCounter()
                  .Name("recps_coordinator_moves_total")
                  .Help("Slot moves finished, by outcome (done, aborted, failed)")
                  .Register(registry)),
        bytes(prometheus::BuildCounter()
                  .Name("recps_coordinator_moved_bytes_total")
                  .Help("Bytes of rows copied by finished moves")
                  .Register(registry)
                  .Add({})),
        in_flight(prometheus::BuildGauge()
                      .Name("recps_coordinator_moves_in_flight")
                      .Help("Slot moves started and not finished")
                      .Register(registry)
                      .Add({})) {
    // Every outcome from the start, at 0: a rate over "failed" then reads 0,
    // not "no data", before the first failure.
    for (const char* outcome : {"done", "aborted", "failed"}) moves.Add({{"outcome", outcome}});
  }
  prometheus::Family<prometheus::Counter>& moves;
  prometheus::Counter& bytes;
  prometheus::Gauge& in_flight;
};

MoveOrchestrator::MoveOrchestrator(Coordinator* coordinator, CoordinatorStore* store,
                                   MoveOrchestratorOptions options,
                                   std::function<absl::Time()> clock,
                                   prometheus::Registry* registry)
    : coordinator_(coordinator),
      store_(store),
      options_([&] {
        if (options.rpc == nullptr) options.rpc = MakeGrpcShardMoveRpc();
        options.max_parallel_copies = std::max(1, options.max_parallel_copies);
        return std::move(options);
      }()),
      clock_(std::move(clock)) {
  if (registry != nullptr) metrics_ = std::make_unique<Metrics>(*registry);
}

MoveOrchestrator::~MoveOrchestrator() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  options_.rpc->CancelAll();
  if (thread_.joinable()) thread_.join();
}

absl::Status MoveOrchestrator::Start() {
  ASSIGN_OR_RETURN(auto stored, store_->Scan(kMovePrefix));
  absl::StatusOr<std::string> seq = store_->Get(kRebalanceSeqKey);
  if (!seq.ok() && !absl::IsNotFound(seq.status())) return seq.status();
  {
    absl::MutexLock lock(&mu_);
    if (seq.ok()) {
      int64_t n = 0;
      if (absl::SimpleAtoi(*seq, &n)) next_rebalance_ = n;
    }
    for (const auto& [key, value] : stored) {
      v1::MoveRecord r;
      if (!r.ParseFromString(value)) {
        return absl::DataLossError(absl::StrCat("coordinator state in ", store_->path(),
                                                ": cannot parse ", key));
      }
      if (!Finished(r.state())) unresolved_.insert(r.move_id());
      moves_.push_back(std::move(r));
    }
    if (!unresolved_.empty()) {
      LogWarning(unresolved_.size(), " slot move(s) left in flight by the previous "
                 "coordinator: resolving them with their servers");
    }
  }
  // Owner changes are seen from this map on; earlier promotions show as
  // AllowExport refusals (SkipRefused).
  if (absl::StatusOr<v1::ShardMap> map = coordinator_->GetShardMap(); map.ok()) {
    ObserveMap(*map);
  }
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

std::vector<std::string> MoveOrchestrator::AliveNewServers() const {
  absl::StatusOr<v1::ShardMap> map = coordinator_->GetShardMap();
  std::vector<std::string> out;
  if (!map.ok()) return out;
  const std::set<std::string> in_map(map->servers().begin(), map->servers().end());
  const v1::ListMembersResponse members = coordinator_->ListMembers();
  for (const v1::Member& m : members.members()) {
    if (m.role() == v1::SHARD_SERVER && m.state() == v1::ALIVE &&
        in_map.count(m.address()) == 0) {
      out.push_back(m.address());
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::StatusOr<v1::PlanRebalanceResponse> MoveOrchestrator::Plan(
    const v1::PlanRebalanceRequest& request) {
  if (request.max_bytes() < 0 || request.max_moves() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rebalance: --max_bytes (", request.max_bytes(), ") and --max_moves (",
        request.max_moves(), ") must be >= 0 (0: no bound)"));
  }
  ASSIGN_OR_RETURN(v1::ShardMap map, coordinator_->GetShardMap());
  RebalanceInput input;
  input.map = map;
  input.new_servers = AliveNewServers();
  input.drain.assign(request.drain().begin(), request.drain().end());
  input.max_bytes = request.max_bytes();
  input.max_moves = request.max_moves();
  // Stats of every server at once.
  input.stats.resize(map.servers_size());
  std::vector<absl::Status> errors(map.servers_size());
  RunEachOnItsOwnThread(map.servers_size(), [&](int i) {
    absl::StatusOr<v1::StatsResponse> s = options_.rpc->Stats(map.servers(i), options_.rpc_timeout);
    if (s.ok()) {
      input.stats[i] = *std::move(s);
    } else {
      errors[i] = s.status();
    }
  });
  for (int i = 0; i < map.servers_size(); ++i) {
    if (!errors[i].ok()) {
      return absl::UnavailableError(absl::StrCat(
          "rebalance: cannot read the load of ", map.servers(i), ": ", errors[i].message()));
    }
  }
  const v1::ListRebalanceMovesResponse listed = List();
  input.move_bytes_per_second = listed.move_bytes_per_second() > 0
                                    ? listed.move_bytes_per_second()
                                    : options_.move_rate_estimate;
  input.move_rate_measured = listed.move_bytes_per_second() > 0;
  v1::PlanRebalanceResponse response;
  ASSIGN_OR_RETURN(*response.mutable_plan(), PlanRebalance(input));
  return response;
}

absl::StatusOr<v1::ApplyRebalanceResponse> MoveOrchestrator::Apply(
    const v1::ApplyRebalanceRequest& request) {
  if (request.max_bytes_per_second() < 0) {
    return absl::InvalidArgumentError("rebalance: max_bytes_per_second must be >= 0");
  }
  ASSIGN_OR_RETURN(v1::ShardMap map, coordinator_->GetShardMap());
  const std::vector<std::string> new_servers = AliveNewServers();
  absl::MutexLock lock(&mu_);
  if (!running_.empty() || !to_run_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rebalance: ", running_.empty() ? to_run_ : running_,
        " is running; wait for it (`recpsctl moves`) before applying another plan"));
  }
  if (!unresolved_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rebalance: move(s) ", absl::StrJoin(unresolved_, ", "),
        " left in flight are not resolved yet (their servers do not answer); "
        "`recpsctl moves` shows them"));
  }
  RETURN_IF_ERROR(CheckPlan(request.plan(), map, new_servers));
  const int64_t seq = next_rebalance_;
  const std::string id =
      absl::StrFormat("r%06d-%d", seq, absl::ToUnixSeconds(Now()));
  std::vector<v1::MoveRecord> records;
  for (int i = 0; i < request.plan().moves_size(); ++i) {
    const v1::SlotMove& m = request.plan().moves(i);
    v1::MoveRecord r;
    r.set_move_id(absl::StrFormat("%s-m%03d", id, i));
    r.set_rebalance_id(id);
    r.set_source(m.source());
    r.set_target(m.target());
    *r.mutable_slots() = m.slots();
    *r.mutable_tables() = m.tables();
    r.set_rows(m.rows());
    r.set_bytes(m.bytes());
    r.set_state(v1::MoveRecord::PENDING);
    r.set_created_unix_ms(absl::ToUnixMillis(Now()));
    records.push_back(std::move(r));
  }
  const size_t moves = records.size();
  RETURN_IF_ERROR(QueueRun(id, seq, std::move(records),
                           request.max_bytes_per_second() > 0 ? request.max_bytes_per_second()
                                                              : options_.max_bytes_per_second));
  LogInfo("rebalance ", id, ": ", moves, " move(s), ",
          request.plan().slots_to_move(), " slots, ", request.plan().tables_to_move(),
          " tables, ", request.plan().bytes_to_move(), " bytes, from shard map epoch ",
          map.epoch());
  v1::ApplyRebalanceResponse response;
  response.set_rebalance_id(id);
  response.set_moves(static_cast<int32_t>(moves));
  return response;
}

absl::Status MoveOrchestrator::QueueRun(const std::string& id, int64_t seq,
                                        std::vector<v1::MoveRecord> records,
                                        int64_t bandwidth) {
  std::vector<std::pair<std::string, std::string>> puts;
  puts.emplace_back(kRebalanceSeqKey, absl::StrCat(seq + 1));
  for (const v1::MoveRecord& r : records) {
    puts.emplace_back(absl::StrCat(kMovePrefix, r.move_id()), r.SerializeAsString());
  }
  RETURN_IF_ERROR(store_->PutAll(puts));
  next_rebalance_ = seq + 1;
  copy_queue_.clear();
  for (v1::MoveRecord& r : records) {
    copy_queue_.push_back(r.move_id());
    moves_.push_back(std::move(r));
  }
  next_copy_ = 0;
  ready_.clear();
  to_run_ = id;
  copy_bandwidth_ = bandwidth;
  return absl::OkStatus();
}

v1::MoveRecord MoveOrchestrator::Get(const std::string& move_id) const {
  absl::MutexLock lock(&mu_);
  for (const v1::MoveRecord& r : moves_) {
    if (r.move_id() == move_id) return r;
  }
  return v1::MoveRecord();
}

void MoveOrchestrator::Save(const v1::MoveRecord& record) {
  if (absl::Status s = store_->Put(absl::StrCat(kMovePrefix, record.move_id()),
                                   record.SerializeAsString());
      !s.ok()) {
    LogError("cannot store ", Describe(record), ": ", s.message());
  }
  absl::MutexLock lock(&mu_);
  for (v1::MoveRecord& r : moves_) {
    if (r.move_id() == record.move_id()) r = record;
  }
  // Keep the newest finished ones.
  int finished = 0;
  for (const v1::MoveRecord& r : moves_) finished += Finished(r.state());
  while (finished > options_.max_kept_moves) {
    auto it = std::find_if(moves_.begin(), moves_.end(),
                           [](const v1::MoveRecord& r) { return Finished(r.state()); });
    if (it == moves_.end()) break;
    if (absl::Status s = store_->Delete(absl::StrCat(kMovePrefix, it->move_id())); !s.ok()) {
      LogError("cannot drop old move ", it->move_id(), ": ", s.message());
    }
    moves_.erase(it);
    --finished;
  }
  if (metrics_ != nullptr) {
    int in_flight = 0;
    for (const v1::MoveRecord& r : moves_) in_flight += !Finished(r.state());
    metrics_->in_flight.Set(in_flight);
    if (Finished(record.state())) {
      metrics_->moves
          .Add({{"outcome", record.state() == v1::MoveRecord::DONE      ? "done"
                            : record.state() == v1::MoveRecord::ABORTED ? "aborted"
                                                                        : "failed"}})
          .Increment();
      if (record.state() == v1::MoveRecord::DONE) {
        metrics_->bytes.Increment(static_cast<double>(record.copied_bytes()));
      }
    }
  }
}

void MoveOrchestrator::Loop() {
  absl::Time next_resolve = absl::InfinitePast();
  while (true) {
    std::string rebalance;
    std::vector<std::string> unresolved;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this] {
        mu_.AssertHeld();
        return stop_ || !to_run_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&has_work), options_.retry_interval);
      if (stop_) return;
      if (!to_run_.empty()) {
        running_ = std::move(to_run_);
        to_run_.clear();
        rebalance = running_;
      }
      unresolved.assign(unresolved_.begin(), unresolved_.end());
    }
    if (!rebalance.empty()) {
      RunRebalance(rebalance);
      continue;
    }
    if (!unresolved.empty() && Now() >= next_resolve) {
      for (const std::string& id : unresolved) {
        if (Resolve(id, "the coordinator restarted during it")) {
          absl::MutexLock lock(&mu_);
          unresolved_.erase(id);
        }
      }
      next_resolve = Now() + options_.retry_interval;
      continue;
    }
    if (unresolved.empty()) {
      MaybeAutoRebalance();
      MaybeReReplicate();
    }
  }
}

void MoveOrchestrator::RunRebalance(const std::string& rebalance_id) {
  int64_t total = 0;
  int64_t bandwidth = 0;
  {
    absl::MutexLock lock(&mu_);
    total = static_cast<int64_t>(copy_queue_.size());
    bandwidth = copy_bandwidth_;
  }
  if (absl::Status s = AddNewTargets(); !s.ok()) {
    LogWarning("rebalance ", rebalance_id, ": ", s.message());
    std::vector<std::string> ids;
    {
      absl::MutexLock lock(&mu_);
      ids = copy_queue_;
      next_copy_ = copy_queue_.size();
    }
    for (const std::string& id : ids) {
      v1::MoveRecord r = Get(id);
      r.set_state(v1::MoveRecord::FAILED);
      r.set_error(std::string(s.message()));
      r.set_finished_unix_ms(absl::ToUnixMillis(Now()));
      Save(r);
    }
    total = 0;
  }
  const int workers = static_cast<int>(std::min<int64_t>(options_.max_parallel_copies, total));
  const int64_t per_copy = bandwidth > 0 ? std::max<int64_t>(1, bandwidth / workers) : 0;
  std::vector<std::thread> copies;
  for (int i = 0; i < workers; ++i) {
    copies.emplace_back([this, per_copy] { CopyWorker(per_copy); });
  }
  // Hand-overs one at a time, in the order copies finish.
  for (int64_t done = 0; done < total; ++done) {
    std::string move_id;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this] {
        mu_.AssertHeld();
        return !ready_.empty() || stop_;
      };
      mu_.Await(absl::Condition(&ready));
      if (ready_.empty()) break;  // stopping: the rest stay stored
      move_id = ready_.front();
      ready_.pop_front();
    }
    if (Get(move_id).state() == v1::MoveRecord::COPIED) HandOverOne(move_id);
  }
  for (std::thread& t : copies) t.join();
  absl::MutexLock lock(&mu_);
  int ok = 0, failed = 0;
  std::vector<std::string> errors;
  for (const v1::MoveRecord& r : moves_) {
    if (r.rebalance_id() != rebalance_id) continue;
    if (r.state() == v1::MoveRecord::DONE) {
      ++ok;
    } else if (Finished(r.state())) {
      ++failed;
      if (errors.size() < 3) errors.push_back(absl::StrCat(r.move_id(), ": ", r.error()));
    }
  }
  last_outcome_ = absl::StrCat(rebalance_id, ": ", ok, " of ", total, " move(s) done",
                               failed > 0 ? absl::StrCat(", ", failed, " rolled back (",
                                                         absl::StrJoin(errors, "; "), ")")
                                          : "");
  if (stop_) absl::StrAppend(&last_outcome_, " (coordinator stopping)");
  LogInfo(absl::StartsWith(rebalance_id, "re-replication") ? "" : "rebalance ", last_outcome_);
  running_.clear();
}

absl::Status MoveOrchestrator::AddNewTargets() {
  ASSIGN_OR_RETURN(v1::ShardMap map, coordinator_->GetShardMap());
  std::set<std::string> involved;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : copy_queue_) {
      for (const v1::MoveRecord& r : moves_) {
        if (r.move_id() != id) continue;
        involved.insert(r.source());
        involved.insert(r.target());
      }
    }
  }
  const std::set<std::string> listed(map.servers().begin(), map.servers().end());
  std::vector<std::string> added;
  for (const std::string& address : involved) {
    if (listed.count(address) == 0) added.push_back(address);
  }
  if (!added.empty()) {
    for (const std::string& address : added) map.add_servers(address);
    map.set_epoch(map.epoch() + 1);
    RETURN_IF_ERROR(coordinator_->SetShardMap(map));
    LogInfo("shard map epoch ", map.epoch(), " lists ", absl::StrJoin(added, ", "),
            " (owning nothing yet) for the moves");
  }
  for (const std::string& address : involved) {
    if (!WaitForEpoch(address, map.epoch())) {
      return absl::UnavailableError(absl::StrCat(
          address, " did not install shard map epoch ", map.epoch(), " within ",
          absl::FormatDuration(options_.rpc_timeout), " (`recpsctl status` shows why)"));
    }
  }
  return absl::OkStatus();
}

bool MoveOrchestrator::WaitForEpoch(const std::string& address, uint64_t epoch) {
  const absl::Time deadline = absl::Now() + options_.rpc_timeout;
  while (true) {
    absl::StatusOr<v1::ShardMap> map = options_.rpc->GetShardMap(address, options_.rpc_timeout);
    if (map.ok() && map->epoch() >= epoch) return true;
    if (absl::Now() >= deadline) return false;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return false;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

void MoveOrchestrator::CopyWorker(int64_t bytes_per_second) {
  while (true) {
    std::string move_id;
    {
      absl::MutexLock lock(&mu_);
      if (stop_ || next_copy_ >= copy_queue_.size()) return;
      move_id = copy_queue_[next_copy_++];
    }
    v1::MoveRecord r = Get(move_id);
    r.set_state(v1::MoveRecord::COPYING);
    Save(r);
    LogInfo(Describe(r), ": copying");
    v1::MigrateInRequest request;
    request.set_move_id(r.move_id());
    request.set_source(r.source());
    *request.mutable_slots() = r.slots();
    *request.mutable_tables() = r.tables();
    request.set_max_bytes_per_second(bytes_per_second);
    request.set_as_backup(r.add_backup());
    // 0: not checked. Hand-overs of other moves change the epoch while
    // this copy waits or runs; each hand-over is checked on its own.
    request.set_epoch(0);
    const absl::Time start = Now();
    // The source exports these units under this move id only, for as long
    // as the copy may take.
    v1::AllowExportRequest grant;
    grant.set_move_id(r.move_id());
    *grant.mutable_slots() = r.slots();
    *grant.mutable_tables() = r.tables();
    grant.set_ttl_ms(absl::ToInt64Milliseconds(options_.copy_timeout + options_.rpc_timeout));
    grant.set_for_backup(r.add_backup());
    const absl::Status allowed =
        options_.rpc->AllowExport(r.source(), grant, options_.rpc_timeout).status();
    if (r.add_backup() && absl::IsFailedPrecondition(allowed)) SkipRefused(r, allowed);
    absl::StatusOr<v1::MigrateInResponse> copied =
        allowed.ok() ? options_.rpc->MigrateIn(r.target(), request, options_.copy_timeout)
                     : absl::StatusOr<v1::MigrateInResponse>(allowed);
    if (copied.ok()) {
      r.set_state(v1::MoveRecord::COPIED);
      r.set_copied_bytes(copied->bytes());
      r.set_rows(copied->rows());
      r.set_copy_seconds(copied->seconds() > 0 ? copied->seconds()
                                               : absl::ToDoubleSeconds(Now() - start));
      LogInfo(Describe(r), ": copied ", copied->rows(), " rows, ", copied->bytes(),
              " bytes in ", r.copy_seconds(), " s");
    } else {
      {
        // A stopping coordinator leaves the move stored as COPYING: the
        // next one resolves it.
        absl::MutexLock lock(&mu_);
        if (stop_) return;
      }
      // The source still owns everything; the target drops what it has.
      absl::StatusOr<v1::AbortMoveResponse> aborted = options_.rpc->AbortMove(
          r.target(), [&] {
            v1::AbortMoveRequest a;
            a.set_move_id(r.move_id());
            return a;
          }(), options_.rpc_timeout);
      r.set_state(v1::MoveRecord::FAILED);
      r.set_error(absl::StrCat("copy: ", copied.status().message(),
                               aborted.ok() ? "" : absl::StrCat("; abort: ",
                                                                aborted.status().message())));
      r.set_finished_unix_ms(absl::ToUnixMillis(Now()));
      LogWarning(Describe(r), ": rolled back: ", r.error());
    }
    Save(r);
    absl::MutexLock lock(&mu_);
    ready_.push_back(move_id);
  }
}

void MoveOrchestrator::HandOverOne(const std::string& move_id) {
  // Not while a checkpoint takes its snapshots (they read one map).
  Coordinator::MapChangeGuard no_snapshot(coordinator_, Coordinator::MapChangeGuard::kHandOver);
  v1::MoveRecord r = Get(move_id);
  absl::StatusOr<v1::ShardMap> current = coordinator_->GetShardMap();
  v1::SlotMove m;
  m.set_source(r.source());
  m.set_target(r.target());
  *m.mutable_slots() = r.slots();
  *m.mutable_tables() = r.tables();
  absl::StatusOr<v1::ShardMap> new_map =
      !current.ok()     ? current
      : r.add_backup() ? BackupMap(*current, r)
                        : ApplyMovesToMap(*current, {m}, current->epoch() + 1);
  v1::AbortMoveRequest abort;
  abort.set_move_id(move_id);
  if (!new_map.ok()) {
    (void)options_.rpc->AbortMove(r.target(), abort, options_.rpc_timeout);
    r.set_state(v1::MoveRecord::FAILED);
    r.set_error(absl::StrCat("hand-over: ", new_map.status().message()));
    r.set_finished_unix_ms(absl::ToUnixMillis(Now()));
    LogWarning(Describe(r), ": rolled back: ", r.error());
    Save(r);
    return;
  }
  // Both must route by the current map, so that new_map differs from
  // theirs by this move only (pushes are asynchronous).
  for (const std::string& address : {r.source(), r.target()}) {
    if (!WaitForEpoch(address, current->epoch())) {
      LogWarning(Describe(r), ": ", address, " is not at shard map epoch ",
                 current->epoch(), " yet; handing over anyway");
    }
  }
  r.set_state(v1::MoveRecord::HANDING_OVER);
  r.set_epoch(new_map->epoch());
  *r.mutable_new_map() = *new_map;
  Save(r);
  LogInfo(Describe(r), ": handing over in shard map epoch ", new_map->epoch());
  v1::HandOverRequest request;
  request.set_move_id(move_id);
  request.set_target(r.target());
  *request.mutable_new_map() = *new_map;
  request.set_self(r.source());
  request.set_add_backup(r.add_backup());
  absl::StatusOr<v1::HandOverResponse> handed =
      options_.rpc->HandOver(r.source(), request, options_.handover_timeout);
  if (handed.ok()) {
    r.set_delta_rows(handed->delta_rows());
    r.set_hold_seconds(handed->hold_seconds());
    Complete(std::move(r), "");
    return;
  }
  LogWarning(Describe(r), ": HandOver answered: ", handed.status().message());
  if (!Resolve(move_id, absl::StrCat("HandOver failed: ", handed.status().message()))) {
    absl::MutexLock lock(&mu_);
    unresolved_.insert(move_id);
  }
}

void MoveOrchestrator::Complete(v1::MoveRecord r, const std::string& how) {
  absl::StatusOr<v1::ShardMap> current = coordinator_->GetShardMap();
  if (current.ok() && current->epoch() < r.new_map().epoch()) {
    if (absl::Status s = coordinator_->SetShardMap(r.new_map()); !s.ok()) {
      LogError(Describe(r), ": cannot install shard map epoch ", r.new_map().epoch(),
               ": ", s.message());
    }
  }
  r.set_state(v1::MoveRecord::DONE);
  r.set_resolved(how);
  r.set_finished_unix_ms(absl::ToUnixMillis(Now()));
  LogInfo(Describe(r), ": done, shard map epoch ", r.new_map().epoch(),
          how.empty() ? "" : absl::StrCat(" (", how, ")"), "; ", r.delta_rows(),
          " rows sent at the hand-over, slots held ", r.hold_seconds(), " s");
  Save(r);
}

bool MoveOrchestrator::Resolve(const std::string& move_id, const std::string& why) {
  v1::MoveRecord r = Get(move_id);
  if (Finished(r.state())) return true;
  v1::AbortMoveRequest abort;
  abort.set_move_id(move_id);
  auto roll_back = [&](const std::string& how) {
    r.set_state(v1::MoveRecord::ABORTED);
    if (r.error().empty()) r.set_error(why);
    r.set_resolved(how);
    r.set_finished_unix_ms(absl::ToUnixMillis(Now()));
    LogWarning(Describe(r), ": rolled back (", why, "): ", how);
    Save(r);
    return true;
  };
  if (r.state() != v1::MoveRecord::HANDING_OVER) {
    // No hand-over was asked for: the source owns everything.
    absl::StatusOr<v1::AbortMoveResponse> a =
        options_.rpc->AbortMove(r.target(), abort, options_.rpc_timeout);
    return roll_back(a.ok() ? "aborted on the target"
                            : absl::StrCat("the source kept its slots; the target did not "
                                           "answer AbortMove: ",
                                           a.status().message()));
  }
  const uint64_t epoch = r.new_map().epoch();
  // Handed over when either side shows the new map or the move HANDED_OVER.
  auto handed_over = [&](const std::string& address) -> absl::StatusOr<bool> {
    absl::StatusOr<v1::ShardMap> map = options_.rpc->GetShardMap(address, options_.rpc_timeout);
    if (map.ok() && map->epoch() >= epoch) return true;
    absl::StatusOr<v1::ListMovesResponse> list =
        options_.rpc->ListMoves(address, options_.rpc_timeout);
    if (!list.ok()) return list.status();
    for (const v1::MoveState& m : list->moves()) {
      if (m.move_id() == move_id && m.phase() == v1::MoveState::HANDED_OVER) return true;
    }
    return false;
  };
  absl::StatusOr<bool> target = handed_over(r.target());
  if (target.ok() && *target) {
    Complete(std::move(r), absl::StrCat(why, "; the target holds the new map"));
    return true;
  }
  absl::StatusOr<bool> source = handed_over(r.source());
  if (source.ok() && *source) {
    Complete(std::move(r), absl::StrCat(why, "; the source holds the new map"));
    return true;
  }
  if (!target.ok()) {
    // A new backup matters only once its owner forwards to it: when the
    // owner answers that its hand-over ended without the new map, the
    // units keep their backups whatever the silent target did.
    if (r.add_backup() && source.ok()) {
      absl::StatusOr<v1::ListMovesResponse> list =
          options_.rpc->ListMoves(r.source(), options_.rpc_timeout);
      const bool handing_over =
          !list.ok() || std::any_of(list->moves().begin(), list->moves().end(),
                                    [&](const v1::MoveState& m) {
                                      return m.move_id() == move_id &&
                                             m.phase() == v1::MoveState::HANDING_OVER;
                                    });
      if (!handing_over) {
        return roll_back(absl::StrCat("the owner ended its hand-over without the new map; the "
                                      "new backup does not answer: ",
                                      target.status().message()));
      }
    }
    LogWarning(Describe(r), ": unresolved (", why, "): the target does not answer: ",
               target.status().message());
    return false;
  }
  // The target has not installed the map: abort it there, so it never does.
  absl::StatusOr<v1::AbortMoveResponse> a =
      options_.rpc->AbortMove(r.target(), abort, options_.rpc_timeout);
  if (a.ok() || absl::IsNotFound(a.status())) {
    return roll_back(a.ok() ? "aborted on the target before it took the slots"
                            : "the target does not know the move (restarted)");
  }
  // It may have installed the map meanwhile: look again next time.
  LogWarning(Describe(r), ": unresolved (", why, "): AbortMove: ", a.status().message());
  return false;
}

void MoveOrchestrator::MaybeAutoRebalance() {
  if (!options_.auto_rebalance_new_servers) return;
  const std::vector<std::string> fresh = AliveNewServers();
  {
    absl::MutexLock lock(&mu_);
    if (fresh.empty() || fresh == auto_tried_ || !running_.empty() || !to_run_.empty()) {
      return;
    }
    auto_tried_ = fresh;
  }
  LogInfo("--auto_rebalance_new_servers: planning a rebalance onto ",
          absl::StrJoin(fresh, ", "));
  absl::StatusOr<v1::PlanRebalanceResponse> plan = Plan(v1::PlanRebalanceRequest());
  if (!plan.ok()) {
    LogWarning("automatic rebalance: ", plan.status().message());
    absl::MutexLock lock(&mu_);
    auto_tried_.clear();  // try again
    return;
  }
  if (plan->plan().moves_size() == 0) return;
  v1::ApplyRebalanceRequest apply;
  *apply.mutable_plan() = plan->plan();
  if (absl::StatusOr<v1::ApplyRebalanceResponse> r = Apply(apply); !r.ok()) {
    LogWarning("automatic rebalance: ", r.status().message());
    absl::MutexLock lock(&mu_);
    auto_tried_.clear();
  }
}

v1::ListRebalanceMovesResponse MoveOrchestrator::List() const {
  absl::MutexLock lock(&mu_);
  v1::ListRebalanceMovesResponse out;
  const std::string& running = running_.empty() ? to_run_ : running_;
  out.set_running(running);
  out.set_last_outcome(last_outcome_);
  double bytes = 0, seconds = 0;
  for (const v1::MoveRecord& r : moves_) {
    v1::MoveRecord* listed = out.add_moves();
    *listed = r;
    listed->clear_new_map();
    if (r.state() == v1::MoveRecord::DONE && r.copy_seconds() > 0) {
      bytes += static_cast<double>(r.copied_bytes());
      seconds += r.copy_seconds();
    }
    if (!running.empty() && r.rebalance_id() == running) {
      out.set_moves_total(out.moves_total() + 1);
      out.set_bytes_total(out.bytes_total() + r.bytes());
      if (Finished(r.state())) out.set_moves_done(out.moves_done() + 1);
      if (r.state() == v1::MoveRecord::COPIED || r.state() == v1::MoveRecord::HANDING_OVER ||
          Finished(r.state())) {
        out.set_bytes_done(out.bytes_done() + r.bytes());
      }
    }
  }
  if (seconds > 0 && bytes > 0) out.set_move_bytes_per_second(bytes / seconds);
  return out;
}

int MoveOrchestrator::InFlight() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const v1::MoveRecord& r : moves_) n += !Finished(r.state());
  return n;
}

bool MoveOrchestrator::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this] {
    mu_.AssertHeld();
    return running_.empty() && to_run_.empty() && unresolved_.empty();
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

}  // namespace recps::server
