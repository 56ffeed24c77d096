// Failover of a lost shard server (docs/replication.md): the coordinator's
// part. The lost server's lease ran out, and with it its right to accept
// writes (a shard server fences itself when its lease lapses), so its
// backups are promoted in a new map epoch; workers refresh and retry as
// they do after a slot move.
#include <algorithm>
#include <iterator>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/wire/replica_placement.h"
#include "common/wire/shard_map.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_metrics.h"

namespace recps::server {

void Coordinator::FailOver(const std::string& address, absl::Time last_heartbeat,
                           Deferred* deferred) {
  if (map_.epoch() == 0) return;
  absl::StatusOr<ShardMap> map = ShardMap::FromProto(map_);
  if (!map.ok()) return;
  const int lost = map->IndexOf(address);
  if (lost < 0 || map->replication() <= 1 ||
      !(map->OwnsAnything(lost) || map->BacksAnything(lost))) {
    return;  // not in the map, nothing of it to replace, or no backups to promote
  }
  const auto count = [&](const char* result) {
    if (metrics_ != nullptr) metrics_->failovers.Add({{"result", result}}).Increment();
  };
  const v1::ShardMap map_before = map_;
  absl::StatusOr<ShardMap> promoted = PromoteBackups(*map, lost);
  if (!promoted.ok()) {
    count("data_loss");
    LogError("cannot fail over shard server ", address, ": ", promoted.status().message(),
             "; the job restarts from its last checkpoint");
    return;
  }
  const v1::ShardMap next = promoted->ToProto();
  if (absl::Status s = CommitMap(next, address, deferred); !s.ok()) {
    count("store_error");
    LogError("cannot store the failover map of shard server ", address, ": ", s.message());
    return;
  }
  count("promoted");
  // Which units changed owner: their new owner steps them on the lost
  // primary's clock (re-replication leaves them for now).
  const v1::ShardMap& before = map_before;
  for (int slot = 0; slot < before.slot_owner_size() && slot < next.slot_owner_size(); ++slot) {
    if (before.slot_owner(slot) != next.slot_owner(slot)) {
      promoted_units_[{next.servers(static_cast<int>(next.slot_owner(slot))), "",
                       static_cast<uint32_t>(slot)}] = next.epoch();
    }
  }
  for (int t = 0; t < before.tables_size() && t < next.tables_size(); ++t) {
    const v1::TableRouting& was = before.tables(t);
    const v1::TableRouting& is = next.tables(t);
    if (was.slot_owner_size() == 0 && was.column_groups_size() == 0 && was.owner() != is.owner()) {
      promoted_units_[{next.servers(static_cast<int>(is.owner())), is.table(), 0}] = next.epoch();
    }
  }
  const absl::Duration took = Now() - last_heartbeat;
  if (metrics_ != nullptr) metrics_->failover_seconds.Observe(absl::ToDoubleSeconds(took));
  LogWarning("failover: shard server ", address, " lost (", absl::FormatDuration(took),
             " since its last heartbeat); its backups own its rows in shard map epoch ",
             next.epoch(), " (", promoted->UnderReplicatedUnits(),
             " unit(s) now without a backup)");
}

void Coordinator::NoteShardRestart(const MemberEntry& entry, const v1::RegisterRequest& request,
                                   Deferred* deferred) {
  const uint64_t was = entry.record.incarnation();
  if (was == 0 || request.incarnation() == 0 || was == request.incarnation()) return;
  LogWarning("shard server ", request.address(), " restarted (incarnation ",
             absl::Hex(was, absl::kZeroPad16), ", now ",
             absl::Hex(request.incarnation(), absl::kZeroPad16),
             "): its old process, and the rows it held, are gone");
  // Its lease would never lapse: the new process renews it as the same
  // member. The old one cannot still serve: only one process binds an
  // address (a StatefulSet pod's name too), so no fencing is waited for.
  if (entry.record.state() == v1::ALIVE) FailOver(request.address(), entry.last_heartbeat, deferred);
}

std::set<Coordinator::PromotedUnit> Coordinator::PromotedUnits() const {
  absl::MutexLock lock(&mu_);
  std::set<PromotedUnit> out;
  for (const auto& [unit, epoch] : promoted_units_) out.insert(unit);
  return out;
}

uint64_t Coordinator::LineageFreeEpoch(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  const MemberEntry* e = members_.FindSame(v1::SHARD_SERVER, address, -1);
  return e != nullptr ? e->lineage_free_epoch : 0;
}

void Coordinator::NoteLineage(MemberEntry& entry, const v1::HeartbeatRequest& request) {
  if (entry.record.role() != v1::SHARD_SERVER || request.shard_map_epoch() == 0 ||
      request.lost_primary_clocks() != 0) {
    return;
  }
  entry.lineage_free_epoch = std::max(entry.lineage_free_epoch, request.shard_map_epoch());
  // Its units taken over by that map or before step on its own clock now.
  for (auto it = promoted_units_.begin(); it != promoted_units_.end();) {
    const bool merged = std::get<0>(it->first) == entry.record.address() &&
                        it->second <= request.shard_map_epoch();
    it = merged ? promoted_units_.erase(it) : std::next(it);
  }
}

Coordinator::ServerLiveness Coordinator::LivenessOf(
    const std::vector<std::string>& addresses) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  ServerLiveness out;
  for (const std::string& address : addresses) {
    const MemberEntry* e = members_.FindSame(v1::SHARD_SERVER, address, -1);
    out.alive.push_back(e != nullptr && e->record.state() == v1::ALIVE &&
                        now - e->last_heartbeat <= options_.lease);
    out.zones.push_back(e != nullptr ? e->record.capacity().zone() : "");
  }
  return out;
}

}  // namespace recps::server
