// Re-replication (docs/replication.md): the coordinator's side. After a
// failover some units have a lost backup (kNoBackup); the orchestrator's
// thread copies each to a live server that becomes its new backup, with the
// slot-move machinery (moves with add_backup; move_orchestrator.cc runs
// them as it runs a rebalance's moves).
//
// Units an owner got by promotion step on the lost primary's clock, which a
// new backup cannot follow, until the owner merges that lineage into its
// own clock (the first step every worker pushed to both): until then their
// owner refuses to export them for a backup. They are skipped: those this
// coordinator promoted by its record (Coordinator::PromotedUnits, cleared
// by the owner's heartbeat), those promoted before it started by the
// refusal (which skips the refused copy's units until their owner changes
// or says, by a heartbeat of a newer map, that no lineage is left).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/wire/replica_placement.h"
#include "common/wire/shard_map.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/move_orchestrator.h"

namespace recps::server {
namespace {

// The address of the owner of global slot `slot` ("" when none).
std::string SlotOwner(const v1::ShardMap& m, uint32_t slot) {
  if (static_cast<int>(slot) >= m.slot_owner_size()) return "";
  const uint32_t owner = m.slot_owner(static_cast<int>(slot));
  return static_cast<int>(owner) < m.servers_size() ? m.servers(static_cast<int>(owner)) : "";
}

bool TableWise(const v1::TableRouting& t) {
  return t.column_groups_size() == 0 && t.slot_owner_size() == 0;
}

// The address of the owner of table-wise table `table` ("" when none).
std::string TableOwner(const v1::ShardMap& m, const std::string& table) {
  for (const v1::TableRouting& t : m.tables()) {
    if (t.table() != table || !TableWise(t)) continue;
    return static_cast<int>(t.owner()) < m.servers_size() ? m.servers(static_cast<int>(t.owner()))
                                                          : "";
  }
  return "";
}

}  // namespace

void MoveOrchestrator::ObserveMap(const v1::ShardMap& map) {
  absl::MutexLock lock(&mu_);
  // Epochs only grow, and one epoch names one map.
  if (seen_epoch_ == map.epoch() && seen_epoch_ != 0) return;
  // A new map (a failover, say) may let copies through: no back-off.
  failed_rounds_ = 0;
  next_re_replication_ = std::min(next_re_replication_, Now() + options_.retry_interval);
  // A skipped unit whose owner changed again is planned like any other.
  for (auto it = skip_.begin(); it != skip_.end();) {
    const auto& [owner, table, slot] = it->first;
    const std::string now = table.empty() ? SlotOwner(map, slot) : TableOwner(map, table);
    it = now == owner ? std::next(it) : skip_.erase(it);
  }
  seen_epoch_ = map.epoch();
}

void MoveOrchestrator::SkipRefused(const v1::MoveRecord& record, const absl::Status& refusal) {
  {
    absl::MutexLock lock(&mu_);
    for (uint32_t slot : record.slots()) skip_[{record.source(), "", slot}] = seen_epoch_;
    for (const std::string& table : record.tables()) {
      skip_[{record.source(), table, 0}] = seen_epoch_;
    }
  }
  LogWarning("re-replication: ", record.source(), " refuses to export ", record.slots_size(),
             " slot(s) and ", record.tables_size(), " table(s) for a new backup (",
             refusal.message(), "); they are not tried again until their owner changes or "
             "says it steps them on its own clock");
}

void MoveOrchestrator::ForgetMergedSkips() {
  std::set<std::string> owners;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [unit, epoch] : skip_) owners.insert(std::get<0>(unit));
  }
  if (owners.empty()) return;
  // Asked outside mu_ (the coordinator's lock is not taken under it).
  std::map<std::string, uint64_t> free_at;
  for (const std::string& owner : owners) free_at[owner] = coordinator_->LineageFreeEpoch(owner);
  absl::MutexLock lock(&mu_);
  for (auto it = skip_.begin(); it != skip_.end();) {
    const auto at = free_at.find(std::get<0>(it->first));
    const bool merged = at != free_at.end() && at->second >= it->second;
    it = merged ? skip_.erase(it) : std::next(it);
  }
}

absl::StatusOr<v1::ShardMap> MoveOrchestrator::BackupMap(const v1::ShardMap& current,
                                                         const v1::MoveRecord& record) {
  ASSIGN_OR_RETURN(ShardMap map, ShardMap::FromProto(current));
  BackupCopy copy;
  copy.owner = map.IndexOf(record.source());
  copy.backup = map.IndexOf(record.target());
  if (copy.owner < 0 || copy.backup < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        copy.owner < 0 ? record.source() : record.target(), " is not in shard map epoch ",
        current.epoch()));
  }
  copy.slots.assign(record.slots().begin(), record.slots().end());
  copy.tables.assign(record.tables().begin(), record.tables().end());
  ASSIGN_OR_RETURN(ShardMap next, AddBackupToMap(map, copy, current.epoch() + 1));
  return next.ToProto();
}

void MoveOrchestrator::MaybeReReplicate() {
  absl::StatusOr<v1::ShardMap> proto = coordinator_->GetShardMap();
  if (!proto.ok()) return;
  ObserveMap(*proto);
  if (proto->replication() <= 1) return;
  std::set<std::tuple<std::string, std::string, uint32_t>> skip;
  {
    absl::MutexLock lock(&mu_);
    if (!running_.empty() || !to_run_.empty() || !unresolved_.empty()) return;
    if (!last_re_replication_.empty()) {
      // A copy that keeps failing should not fill the move list and the log.
      // (A copy, not the member, in the lambda: the lock analysis cannot
      // see into it.)
      const std::string last = last_re_replication_;
      const bool copied = std::any_of(moves_.begin(), moves_.end(), [&](const v1::MoveRecord& r) {
        return r.rebalance_id() == last && r.state() == v1::MoveRecord::DONE;
      });
      last_re_replication_.clear();
      failed_rounds_ = copied ? 0 : failed_rounds_ + 1;
      const absl::Duration wait = options_.retry_interval * (1 << std::min(failed_rounds_, 6));
      next_re_replication_ = std::max(next_re_replication_, Now() + wait);
    }
    if (Now() < next_re_replication_) return;
    next_re_replication_ = Now() + options_.retry_interval;
  }
  ForgetMergedSkips();
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [unit, epoch] : skip_) skip.insert(unit);
  }
  for (const Coordinator::PromotedUnit& u : coordinator_->PromotedUnits()) skip.insert(u);
  absl::StatusOr<ShardMap> map = ShardMap::FromProto(*proto);
  if (!map.ok()) return;
  const int64_t under = map->UnderReplicatedUnits();
  if (under == 0) return;
  const Coordinator::ServerLiveness live = coordinator_->LivenessOf(map->servers());
  const std::vector<BackupCopy> copies = PlanReReplication(
      *map, live.alive, live.zones, [&](int owner, const std::string& table, uint32_t slot) {
        return skip.count({map->servers()[owner], table, slot}) > 0;
      });
  absl::MutexLock lock(&mu_);
  if (copies.empty()) {
    if (noted_epoch_ != proto->epoch()) {
      noted_epoch_ = proto->epoch();
      LogInfo("re-replication: ", under, " unit(s) lack a backup in shard map epoch ",
              proto->epoch(), "; none can be copied now (promoted at a failover, owner "
              "down, column groups, or no live server left in another zone)");
    }
    return;
  }
  if (!running_.empty() || !to_run_.empty()) return;  // a rebalance came first
  const int64_t seq = next_rebalance_;
  const std::string id = absl::StrFormat("re-replication-%06d", seq);
  std::vector<v1::MoveRecord> records;
  for (const BackupCopy& copy : copies) {
    v1::MoveRecord r;
    r.set_move_id(absl::StrFormat("%s-m%03d", id, records.size()));
    r.set_rebalance_id(id);
    r.set_source(map->servers()[copy.owner]);
    r.set_target(map->servers()[copy.backup]);
    r.mutable_slots()->Add(copy.slots.begin(), copy.slots.end());
    for (const std::string& t : copy.tables) r.add_tables(t);
    r.set_add_backup(true);
    r.set_state(v1::MoveRecord::PENDING);
    r.set_created_unix_ms(absl::ToUnixMillis(Now()));
    records.push_back(std::move(r));
  }
  std::vector<std::string> started;
  for (const v1::MoveRecord& r : records) {
    started.push_back(absl::StrCat("re-replication: copying ", r.slots_size(), " slot(s) and ",
                                   r.tables_size(), " table(s) of ", r.source(),
                                   " to new backup ", r.target(), " (", r.move_id(), ")"));
  }
  if (absl::Status s = QueueRun(id, seq, std::move(records), options_.max_bytes_per_second);
      !s.ok()) {
    LogWarning("re-replication: cannot store the copies: ", s.message());
    return;
  }
  last_re_replication_ = id;
  for (const std::string& line : started) LogInfo(line);
}

}  // namespace recps::server
