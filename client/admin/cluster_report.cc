#include "client/admin/cluster_report.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/imbalance.h"
#include "common/wire/shard_map.h"

namespace recps::client::admin {
namespace {

const v1::RpcStats* FindRpc(const v1::StatsResponse& stats,
                            absl::string_view rpc) {
  for (const v1::RpcStats& r : stats.rpcs()) {
    if (r.rpc() == rpc) return &r;
  }
  return nullptr;
}

const v1::StatsResponse* StatsOf(const ClusterSnapshot& snapshot,
                                 const std::string& address) {
  for (size_t i = 0; i < snapshot.servers.size(); ++i) {
    if (snapshot.servers[i] == address && snapshot.stats[i].ok()) {
      return &*snapshot.stats[i];
    }
  }
  return nullptr;
}

// Slots owned by each server index of `map`.
std::vector<std::vector<uint32_t>> SlotsByServer(const v1::ShardMap& map) {
  std::vector<std::vector<uint32_t>> slots(map.servers_size());
  for (int slot = 0; slot < map.slot_owner_size(); ++slot) {
    const uint32_t owner = map.slot_owner(slot);
    if (owner < slots.size())
      slots[owner].push_back(static_cast<uint32_t>(slot));
  }
  return slots;
}

// Backups per unit of the map (0 without replication).
int BackupsPerUnit(const v1::ShardMap& map) {
  return std::max<int>(1, static_cast<int>(map.replication())) - 1;
}

// The slots of the global slot owners each server holds as a backup.
std::vector<std::vector<uint32_t>> BackupSlotsByServer(const v1::ShardMap& map) {
  std::vector<std::vector<uint32_t>> slots(map.servers_size());
  const int per = BackupsPerUnit(map);
  if (per == 0 || map.slot_backups_size() != map.slot_owner_size() * per) return slots;
  for (int slot = 0; slot < map.slot_owner_size(); ++slot) {
    for (int k = 0; k < per; ++k) {
      const uint32_t b = map.slot_backups(slot * per + k);
      if (b < slots.size()) slots[b].push_back(static_cast<uint32_t>(slot));
    }
  }
  return slots;
}

// Units with a backup lost and not yet replaced (0 for a map that does
// not parse: its problems are reported elsewhere).
int64_t UnderReplicatedUnits(const v1::ShardMap& map) {
  const absl::StatusOr<ShardMap> parsed = ShardMap::FromProto(map);
  return parsed.ok() ? parsed->UnderReplicatedUnits() : 0;
}

int IndexIn(const v1::ShardMap& map, const std::string& address) {
  for (int i = 0; i < map.servers_size(); ++i) {
    if (map.servers(i) == address) return i;
  }
  return -1;
}

int64_t LookupIds(const v1::StatsResponse& stats) {
  int64_t n = 0;
  for (const v1::TableStats& t : stats.tables()) n += t.lookup_ids();
  return n;
}

int64_t UpdateIds(const v1::StatsResponse& stats) {
  int64_t n = 0;
  for (const v1::TableStats& t : stats.tables()) n += t.update_ids();
  return n;
}

std::string MemberName(const v1::Member& m) {
  if (m.role() == v1::WORKER) {
    return absl::StrCat(m.member_id(), " (worker rank ", m.rank(), ")");
  }
  return absl::StrCat(m.member_id(), " (", m.address(), ")");
}

std::string ExpiredProblem(const v1::Member& m, absl::Time now) {
  const absl::Duration silent =
      now - absl::FromUnixMillis(m.last_heartbeat_unix_ms());
  return absl::StrCat(
      "lease expired: no heartbeat for ",
      absl::FormatDuration(absl::Trunc(silent, absl::Seconds(1))));
}

void FillRates(const v1::StatsResponse* before, const v1::StatsResponse& after,
               v1::ServerStatus* out) {
  // A restarted server (uptime went back) counts from its start.
  if (before != nullptr && before->uptime_seconds() >= after.uptime_seconds()) {
    before = nullptr;
  }
  const double seconds = before != nullptr
                             ? after.uptime_seconds() - before->uptime_seconds()
                             : after.uptime_seconds();
  if (seconds > 0) {
    out->set_lookup_ids_per_second(
        (LookupIds(after) - (before ? LookupIds(*before) : 0)) / seconds);
    out->set_update_ids_per_second(
        (UpdateIds(after) - (before ? UpdateIds(*before) : 0)) / seconds);
  }
  struct Method {
    const char* rpc;
    v1::LatencySummary* out;
  };
  for (const Method& m : {Method{"Lookup", out->mutable_lookup()},
                          Method{"PushGradients", out->mutable_push()}}) {
    const v1::RpcStats* a = FindRpc(after, m.rpc);
    if (a == nullptr) continue;
    *m.out =
        SummarizeRpc(before ? FindRpc(*before, m.rpc) : nullptr, *a, seconds);
  }
}

}  // namespace

double HistogramQuantile(const std::vector<double>& upper_bounds,
                         const std::vector<int64_t>& counts, double q) {
  int64_t total = 0;
  for (int64_t c : counts) total += std::max<int64_t>(c, 0);
  if (total == 0 || upper_bounds.empty()) return 0;
  const double rank = q * static_cast<double>(total);
  double below = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double c = static_cast<double>(std::max<int64_t>(counts[i], 0));
    if (below + c >= rank && c > 0) {
      if (i >= upper_bounds.size()) return upper_bounds.back();  // overflow
      const double lo = i == 0 ? 0.0 : upper_bounds[i - 1];
      const double hi = upper_bounds[i];
      return lo + (hi - lo) * (rank - below) / c;
    }
    below += c;
  }
  return upper_bounds.back();
}

v1::LatencySummary SummarizeRpc(const v1::RpcStats* before,
                                const v1::RpcStats& after, double seconds) {
  // Histograms with different bounds cannot be subtracted (a server of
  // another version): use the later one alone.
  if (before != nullptr &&
      (before->bucket_counts_size() != after.bucket_counts_size() ||
       before->count() > after.count())) {
    before = nullptr;
  }
  v1::LatencySummary out;
  const int64_t count = after.count() - (before ? before->count() : 0);
  out.set_count(count);
  out.set_errors(after.errors() - (before ? before->errors() : 0));
  if (seconds > 0) out.set_per_second(static_cast<double>(count) / seconds);
  if (count <= 0) return out;
  const double sum = after.latency_seconds_sum() -
                     (before ? before->latency_seconds_sum() : 0);
  out.set_mean_ms(1e3 * sum / static_cast<double>(count));
  std::vector<int64_t> counts(after.bucket_counts().begin(),
                              after.bucket_counts().end());
  if (before != nullptr) {
    for (size_t i = 0; i < counts.size(); ++i)
      counts[i] -= before->bucket_counts(i);
  }
  const std::vector<double> bounds(after.bucket_upper_seconds().begin(),
                                   after.bucket_upper_seconds().end());
  out.set_p50_ms(1e3 * HistogramQuantile(bounds, counts, 0.5));
  out.set_p99_ms(1e3 * HistogramQuantile(bounds, counts, 0.99));
  return out;
}

std::string SlotRanges(const std::vector<uint32_t>& slots) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < slots.size();) {
    size_t j = i;
    while (j + 1 < slots.size() && slots[j + 1] == slots[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(slots[i])
                           : absl::StrCat(slots[i], "-", slots[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

v1::ClusterStatus BuildClusterStatus(const ClusterSnapshot* before,
                                     const ClusterSnapshot& after) {
  v1::ClusterStatus out;
  out.set_coordinator(after.coordinator);
  out.set_shard_map_epoch(after.map.epoch());
  out.set_num_slots(after.map.num_slots());
  out.set_replication(std::max<uint32_t>(1, after.map.replication()));
  out.set_under_replicated_units(UnderReplicatedUnits(after.map));
  if (out.under_replicated_units() > 0) {
    out.add_problems(absl::StrCat(out.under_replicated_units(),
                                  " units (slots, tables) have fewer than ",
                                  out.replication(), " copies"));
  }
  if (before != nullptr) {
    out.set_sample_seconds(absl::ToDoubleSeconds(after.taken - before->taken));
  }
  if (after.map.epoch() == 0) {
    out.add_problems(absl::StrCat("no shard map yet: ", after.map_error));
  }
  absl::flat_hash_map<std::string, const v1::Member*> shard_members;
  if (after.members.has_value()) {
    out.set_expected_shard_servers(after.members->expected_shard_servers());
    out.set_lease_expirations(after.members->lease_expirations());
    for (const v1::MapPushRefusal& r : after.members->map_push_refusals()) {
      out.add_problems(absl::StrCat("shard server ", r.address(),
                                    " refused shard map epoch ", r.epoch(), ": ",
                                    r.message()));
    }
    for (const v1::Member& m : after.members->members()) {
      *out.add_members() = m;
      if (m.role() == v1::SHARD_SERVER) {
        // A re-registered address keeps its member; the latest entry wins.
        shard_members[m.address()] = &m;
      }
    }
  }
  const std::vector<std::vector<uint32_t>> slots = SlotsByServer(after.map);
  const std::vector<std::vector<uint32_t>> backup_slots = BackupSlotsByServer(after.map);

  std::vector<double> rows, lookup_rates;
  for (size_t i = 0; i < after.servers.size(); ++i) {
    const std::string& address = after.servers[i];
    v1::ServerStatus* s = out.add_servers();
    s->set_address(address);
    const int index = IndexIn(after.map, address);
    s->set_slots(index >= 0 ? static_cast<int64_t>(slots[index].size()) : 0);
    s->set_backup_slots(index >= 0 ? static_cast<int64_t>(backup_slots[index].size()) : 0);
    if (auto it = shard_members.find(address); it != shard_members.end()) {
      s->set_member_id(it->second->member_id());
      s->set_member_state(it->second->state());
      if (it->second->state() == v1::EXPIRED) {
        s->add_problems(ExpiredProblem(*it->second, after.taken));
      }
    } else if (after.members.has_value()) {
      s->add_problems("not registered with the coordinator");
    }
    const absl::StatusOr<v1::StatsResponse>& stats = after.stats[i];
    if (!stats.ok()) {
      s->set_error(std::string(stats.status().message()));
      s->add_problems(absl::StrCat("unreachable: ", stats.status().message()));
      continue;
    }
    s->set_reachable(true);
    s->set_shard_map_epoch(stats->shard_map_epoch());
    if (after.map.epoch() > 0 && index >= 0 &&
        stats->shard_map_epoch() != after.map.epoch()) {
      s->add_problems(
          absl::StrCat("routes by shard map epoch ", stats->shard_map_epoch(),
                       "; the current map is epoch ", after.map.epoch()));
    }
    s->set_rows(stats->total_rows());
    s->set_row_bytes(stats->row_bytes());
    s->set_resident_bytes(stats->resident_bytes());
    s->set_applied_step(stats->applied_step());
    s->set_uptime_seconds(stats->uptime_seconds());
    FillRates(before != nullptr ? StatsOf(*before, address) : nullptr, *stats,
              s);
    out.set_total_rows(out.total_rows() + s->rows());
    out.set_total_row_bytes(out.total_row_bytes() + s->row_bytes());
    // Spare servers (not in the map) hold nothing by design: not part of
    // the balance. A mapped server without global slots may still hold
    // table-wise tables of a planned map, so it counts.
    if (index >= 0 || after.map.epoch() == 0) {
      rows.push_back(static_cast<double>(s->rows()));
      lookup_rates.push_back(s->lookup_ids_per_second());
    }
  }
  out.set_rows_imbalance(MaxOverMean(rows));
  out.set_lookup_imbalance(MaxOverMean(lookup_rates));

  // Expired members that have no server row (workers, replaced servers).
  for (const v1::Member& m : out.members()) {
    if (m.state() != v1::EXPIRED) continue;
    const bool has_row = m.role() == v1::SHARD_SERVER &&
                         std::find(after.servers.begin(), after.servers.end(),
                                   m.address()) != after.servers.end();
    if (!has_row) {
      out.add_problems(absl::StrCat("member ", MemberName(m), ": ",
                                    ExpiredProblem(m, after.taken)));
    }
  }
  if (after.moves.has_value()) {
    for (const v1::MoveRecord& r : after.moves->moves()) {
      if (r.state() == v1::MoveRecord::DONE || r.state() == v1::MoveRecord::ABORTED ||
          r.state() == v1::MoveRecord::FAILED) {
        continue;
      }
      *out.add_moves_in_flight() = r;
    }
    out.set_rebalance_running(after.moves->running());
    out.set_last_rebalance(after.moves->last_outcome());
  }
  out.set_sharding(after.sharding);
  bool healthy = out.problems().empty();
  for (const v1::ServerStatus& s : out.servers())
    healthy &= s.problems().empty();
  out.set_healthy(healthy);
  return out;
}

v1::TablesReport BuildTablesReport(const ClusterSnapshot& snapshot) {
  v1::TablesReport out;
  out.set_shard_map_epoch(snapshot.map.epoch());
  absl::flat_hash_map<std::string, v1::TableReport*> by_name;
  for (size_t i = 0; i < snapshot.servers.size(); ++i) {
    if (!snapshot.stats[i].ok()) {
      out.add_unreachable(snapshot.servers[i]);
      continue;
    }
    for (const v1::TableStats& t : snapshot.stats[i]->tables()) {
      v1::TableReport*& table = by_name[t.name()];
      if (table == nullptr) {
        table = out.add_tables();
        table->set_name(t.name());
        table->set_dim(t.dim());
      }
      table->set_rows(table->rows() + t.rows());
      table->set_bytes(table->bytes() + t.bytes());
      table->set_lookup_ids(table->lookup_ids() + t.lookup_ids());
      table->set_update_ids(table->update_ids() + t.update_ids());
      v1::TablePlacement* p = table->add_servers();
      p->set_server(snapshot.servers[i]);
      p->set_rows(t.rows());
      p->set_bytes(t.bytes());
    }
  }
  return out;
}

v1::ShardsReport BuildShardsReport(const ClusterSnapshot& snapshot) {
  v1::ShardsReport out;
  out.set_shard_map_epoch(snapshot.map.epoch());
  out.set_num_slots(snapshot.map.num_slots());
  out.set_replication(std::max<uint32_t>(1, snapshot.map.replication()));
  out.set_under_replicated_units(UnderReplicatedUnits(snapshot.map));
  const std::vector<std::vector<uint32_t>> slots = SlotsByServer(snapshot.map);
  const std::vector<std::vector<uint32_t>> backup_slots = BackupSlotsByServer(snapshot.map);
  for (size_t i = 0; i < snapshot.servers.size(); ++i) {
    v1::ServerShards* s = out.add_servers();
    s->set_address(snapshot.servers[i]);
    const int index = IndexIn(snapshot.map, snapshot.servers[i]);
    s->set_index(index);
    if (index >= 0) {
      s->set_slot_count(static_cast<int64_t>(slots[index].size()));
      s->set_slot_ranges(SlotRanges(slots[index]));
      s->set_backup_slot_count(static_cast<int64_t>(backup_slots[index].size()));
      s->set_backup_slot_ranges(SlotRanges(backup_slots[index]));
    }
    const absl::StatusOr<v1::StatsResponse>& stats = snapshot.stats[i];
    if (!stats.ok()) {
      s->set_error(std::string(stats.status().message()));
      continue;
    }
    s->set_rows(stats->total_rows());
    *s->mutable_slots() = stats->slots();
  }
  for (const v1::TableRouting& t : snapshot.map.tables()) {
    v1::RoutedTable* r = out.add_routed_tables();
    r->set_table(t.table());
    auto server_name = [&](uint32_t index) {
      return index < static_cast<uint32_t>(snapshot.map.servers_size())
                 ? snapshot.map.servers(index)
                 : absl::StrCat("#", index);
    };
    if (t.slot_owner().empty()) {
      r->set_layout("table-wise");
      r->add_servers(server_name(t.owner()));
    } else {
      r->set_layout("own slots");
      std::vector<uint32_t> owners(t.slot_owner().begin(),
                                   t.slot_owner().end());
      std::sort(owners.begin(), owners.end());
      owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
      for (uint32_t o : owners) r->add_servers(server_name(o));
    }
  }
  return out;
}

}  // namespace recps::client::admin
