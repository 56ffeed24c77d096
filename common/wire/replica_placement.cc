#include "common/wire/replica_placement.h"

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

}  // namespace recps
