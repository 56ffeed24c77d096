#include "common/wire/replica_placement.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace recps {

absl::StatusOr<std::vector<std::vector<uint32_t>>> PlaceBackups(
    int replication, int num_servers, absl::Span<const std::string> zones) {
  if (replication < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("replication ", replication, " must be at least 1"));
  }
  if (replication > num_servers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replication ", replication, " needs at least ", replication,
        " shard servers; the shard map has ", num_servers));
  }
  if (!zones.empty() && static_cast<int>(zones.size()) != num_servers) {
    return absl::InvalidArgumentError(absl::StrCat(
        zones.size(), " zones for ", num_servers, " shard servers"));
  }
  // A server without a zone is a zone of its own.
  const auto zone_of = [&](int server) {
    return zones.empty() || zones[server].empty() ? absl::StrCat("\x01server-", server)
                                                  : zones[server];
  };
  absl::flat_hash_set<std::string> distinct;
  for (int s = 0; s < num_servers; ++s) distinct.insert(zone_of(s));
  if (static_cast<int>(distinct.size()) < replication) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replication ", replication, " needs ", replication,
        " zones (--zone of each shard server); the servers are in ", distinct.size()));
  }
  // Each backup goes to the eligible server (no replica of the unit in its
  // zone) that backs up the least so far, the first in ring order after
  // the owner on a tie: without zones that is the next servers in order.
  std::vector<std::vector<uint32_t>> out(num_servers);
  std::vector<int> load(num_servers, 0);
  for (int owner = 0; owner < num_servers; ++owner) {
    absl::flat_hash_set<std::string> used = {zone_of(owner)};
    while (static_cast<int>(out[owner].size()) < replication - 1) {
      int best = -1;
      for (int k = 1; k < num_servers; ++k) {
        const int s = (owner + k) % num_servers;
        if (used.contains(zone_of(s))) continue;
        if (best < 0 || load[s] < load[best]) best = s;
      }
      used.insert(zone_of(best));  // one exists: enough zones, checked above
      ++load[best];
      out[owner].push_back(static_cast<uint32_t>(best));
    }
  }
  return out;
}

absl::Status AddBackups(int replication, absl::Span<const std::string> zones,
                        ShardMap* map) {
  ASSIGN_OR_RETURN(const std::vector<std::vector<uint32_t>> backups,
                   PlaceBackups(replication, map->num_servers(), zones));
  return map->SetBackups(replication, [&](int owner) { return backups[owner]; });
}

absl::StatusOr<ShardMap> PromoteBackups(const ShardMap& map, int lost) {
  if (lost < 0 || lost >= map.num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server index ", lost, " is not in shard map epoch ", map.epoch()));
  }
  const uint32_t gone = static_cast<uint32_t>(lost);
  const int per = map.replication() - 1;
  v1::ShardMap p = map.ToProto();
  p.set_epoch(map.epoch() + 1);
  // One unit: its owner (in place) and its `per` backups from `backups`.
  const auto promote = [&](absl::string_view what, uint32_t* owner,
                           google::protobuf::RepeatedField<uint32_t>* backups,
                           int first) -> absl::Status {
    for (int k = first; k < first + per; ++k) {
      if (backups->Get(k) == gone) backups->Set(k, kNoBackup);
    }
    if (*owner != gone) return absl::OkStatus();
    for (int k = first; k < first + per; ++k) {
      if (backups->Get(k) != kNoBackup) {
        *owner = backups->Get(k);
        // The other backups followed the lost primary's pushes, which the
        // promoted one steps on a clock of their own (its lineage): they
        // are let go, and re-replication gives the unit fresh ones.
        for (int j = first; j < first + per; ++j) backups->Set(j, kNoBackup);
        return absl::OkStatus();
      }
    }
    return absl::DataLossError(absl::StrCat(
        what, " of shard map epoch ", map.epoch(), " has no copy left but on ",
        map.servers()[gone], ": restore it from a checkpoint"));
  };
  const auto promote_slots = [&](absl::string_view what,
                                 google::protobuf::RepeatedField<uint32_t>* owners,
                                 google::protobuf::RepeatedField<uint32_t>* backups)
      -> absl::Status {
    for (int slot = 0; slot < owners->size(); ++slot) {
      uint32_t owner = owners->Get(slot);
      RETURN_IF_ERROR(promote(absl::StrCat(what, "slot ", slot), &owner, backups, slot * per));
      owners->Set(slot, owner);
    }
    return absl::OkStatus();
  };
  if (per == 0) {
    // No backups: only a server that owns nothing can go.
    if (map.OwnsAnything(lost)) {
      return absl::DataLossError(absl::StrCat(
          map.servers()[gone], " owns rows of shard map epoch ", map.epoch(),
          " and the map keeps no backups (replication 1): restore from a checkpoint"));
    }
    return ShardMap::FromProto(p);
  }
  RETURN_IF_ERROR(promote_slots("", p.mutable_slot_owner(), p.mutable_slot_backups()));
  for (v1::TableRouting& t : *p.mutable_tables()) {
    const std::string what = absl::StrCat("table ", t.table());
    if (t.column_groups_size() > 0) {
      for (v1::ColumnGroupRouting& g : *t.mutable_column_groups()) {
        uint32_t owner = g.owner();
        RETURN_IF_ERROR(promote(absl::StrCat("a column group of ", what), &owner,
                                g.mutable_backups(), 0));
        g.set_owner(owner);
      }
    } else if (t.slot_owner_size() > 0) {
      RETURN_IF_ERROR(promote_slots(absl::StrCat(what, " "), t.mutable_slot_owner(),
                                    t.mutable_slot_backups()));
    } else {
      uint32_t owner = t.owner();
      RETURN_IF_ERROR(promote(what, &owner, t.mutable_backups(), 0));
      t.set_owner(owner);
    }
  }
  return ShardMap::FromProto(p);
}

namespace {

// A server without a zone is a zone of its own (as PlaceBackups).
std::string ZoneOf(absl::Span<const std::string> zones, int server) {
  return server < 0 || static_cast<size_t>(server) >= zones.size() || zones[server].empty()
             ? absl::StrCat("\x01server-", server)
             : zones[server];
}

}  // namespace

std::vector<BackupCopy> PlanReReplication(
    const ShardMap& map, const std::vector<bool>& alive, absl::Span<const std::string> zones,
    const std::function<bool(int owner, const std::string& table, uint32_t slot)>& skip) {
  const int per = map.replication() - 1;
  const int n = map.num_servers();
  std::vector<BackupCopy> out;
  if (per <= 0) return out;
  const auto is_alive = [&](int s) {
    return s >= 0 && static_cast<size_t>(s) < alive.size() && alive[s];
  };
  const v1::ShardMap p = map.ToProto();
  // Units each server backs now (and as planned): the least loaded first.
  std::vector<int64_t> load(n, 0);
  const auto count = [&](const google::protobuf::RepeatedField<uint32_t>& backups) {
    for (uint32_t b : backups) {
      if (b != kNoBackup && static_cast<int>(b) < n) ++load[b];
    }
  };
  count(p.slot_backups());
  for (const v1::TableRouting& t : p.tables()) count(t.backups());
  std::map<std::pair<int, int>, BackupCopy> copies;
  // The new backup of one unit (its owner and current backups), or -1.
  const auto choose = [&](int owner, const uint32_t* backups) {
    bool lost = false;
    absl::flat_hash_set<std::string> used = {ZoneOf(zones, owner)};
    absl::flat_hash_set<int> copies_of = {owner};
    for (int k = 0; k < per; ++k) {
      if (backups[k] == kNoBackup) {
        lost = true;
      } else {
        used.insert(ZoneOf(zones, static_cast<int>(backups[k])));
        copies_of.insert(static_cast<int>(backups[k]));
      }
    }
    if (!lost || !is_alive(owner)) return -1;
    int best = -1;
    for (int k = 1; k < n; ++k) {
      const int s = (owner + k) % n;
      if (!is_alive(s) || copies_of.contains(s) || used.contains(ZoneOf(zones, s))) continue;
      if (best < 0 || load[s] < load[best]) best = s;
    }
    if (best >= 0) ++load[best];
    return best;
  };
  const auto copy_of = [&](int owner, int backup) -> BackupCopy& {
    BackupCopy& c = copies[{owner, backup}];
    c.owner = owner;
    c.backup = backup;
    return c;
  };
  if (p.slot_backups_size() == p.slot_owner_size() * per) {
    for (int slot = 0; slot < p.slot_owner_size(); ++slot) {
      const int owner = static_cast<int>(p.slot_owner(slot));
      if (skip && skip(owner, "", static_cast<uint32_t>(slot))) continue;
      const int b = choose(owner, p.slot_backups().data() + slot * per);
      if (b >= 0) copy_of(owner, b).slots.push_back(static_cast<uint32_t>(slot));
    }
  }
  for (const v1::TableRouting& t : p.tables()) {
    if (t.column_groups_size() > 0 || t.slot_owner_size() > 0 || t.backups_size() != per) {
      continue;
    }
    const int owner = static_cast<int>(t.owner());
    if (skip && skip(owner, t.table(), 0)) continue;
    const int b = choose(owner, t.backups().data());
    if (b >= 0) copy_of(owner, b).tables.push_back(t.table());
  }
  for (auto& [key, c] : copies) out.push_back(std::move(c));
  return out;
}

absl::StatusOr<ShardMap> AddBackupToMap(const ShardMap& map, const BackupCopy& copy,
                                        uint64_t epoch) {
  const int per = map.replication() - 1;
  const int n = map.num_servers();
  if (copy.owner < 0 || copy.owner >= n || copy.backup < 0 || copy.backup >= n ||
      copy.owner == copy.backup) {
    return absl::InvalidArgumentError(absl::StrCat(
        "owner ", copy.owner, " and backup ", copy.backup, " must be two servers of shard map "
        "epoch ", map.epoch(), " (", n, " servers)"));
  }
  if (per <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard map epoch ", map.epoch(), " keeps no backups (replication 1)"));
  }
  v1::ShardMap p = map.ToProto();
  p.set_epoch(epoch);
  const uint32_t owner = static_cast<uint32_t>(copy.owner);
  const uint32_t backup = static_cast<uint32_t>(copy.backup);
  const auto add = [&](const std::string& what, uint32_t unit_owner,
                       google::protobuf::RepeatedField<uint32_t>* backups,
                       int first) -> absl::Status {
    if (unit_owner != owner) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " is owned by ", map.servers()[unit_owner], ", not by ",
          map.servers()[owner], " at shard map epoch ", map.epoch()));
    }
    int lost = -1;
    for (int k = first; k < first + per; ++k) {
      if (backups->Get(k) == backup) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, " is backed by ", map.servers()[backup], " already"));
      }
      if (lost < 0 && backups->Get(k) == kNoBackup) lost = k;
    }
    if (lost < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " has all its ", per, " backup(s) at shard map epoch ", map.epoch()));
    }
    backups->Set(lost, backup);
    return absl::OkStatus();
  };
  for (uint32_t slot : copy.slots) {
    if (static_cast<int>(slot) >= p.slot_owner_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slot ", slot, " is not below the map's ", p.slot_owner_size(), " slots"));
    }
    RETURN_IF_ERROR(add(absl::StrCat("slot ", slot), p.slot_owner(static_cast<int>(slot)),
                        p.mutable_slot_backups(), static_cast<int>(slot) * per));
  }
  for (const std::string& table : copy.tables) {
    auto it = std::find_if(p.mutable_tables()->begin(), p.mutable_tables()->end(),
                           [&](const v1::TableRouting& t) { return t.table() == table; });
    if (it == p.mutable_tables()->end() || it->column_groups_size() > 0 ||
        it->slot_owner_size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", table, " is not a table-wise table of shard map epoch ", map.epoch()));
    }
    RETURN_IF_ERROR(add(absl::StrCat("table ", table), it->owner(), it->mutable_backups(), 0));
  }
  return ShardMap::FromProto(p);
}

}  // namespace recps
