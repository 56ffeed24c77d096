// Where the backups of each shard server's rows go (docs/replication.md):
// the rule the coordinator, the planner and the rebalancer keep. A unit's
// replicas are on different servers, and on different zones (failure
// domains: racks, Kubernetes topology zones) whenever the servers say which.
#ifndef RECPS_COMMON_WIRE_REPLICA_PLACEMENT_H_
#define RECPS_COMMON_WIRE_REPLICA_PLACEMENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/wire/shard_map.h"

namespace recps {

// The replication - 1 backups of what each server owns, by server index:
// servers whose zone no replica of the unit has yet, the one backing up
// the least so far first (so servers back up alike), the next in index
// order after the owner on a tie (without zones: the next servers). `zones` is empty or one per server; an empty zone is a zone
// of its own. INVALID_ARGUMENT when replication is below 1, above the
// number of servers, or above the number of distinct zones.
absl::StatusOr<std::vector<std::vector<uint32_t>>> PlaceBackups(
    int replication, int num_servers, absl::Span<const std::string> zones);

// Gives every unit of `map` its backups by PlaceBackups.
absl::Status AddBackups(int replication, absl::Span<const std::string> zones,
                        ShardMap* map);

// The map after server index `lost` is gone, at epoch map.epoch() + 1:
// each unit it owned goes to its first backup still listed (promoted; the
// unit's other backups are let go: they followed the lost primary's
// clock), and it is a backup of nothing (kNoBackup where it was).
// It stays in the server list, owning nothing, so indices keep their
// meaning. DATA_LOSS naming the first unit of `lost` without a backup
// left (its rows exist nowhere else: a checkpoint restore); INVALID_ARGUMENT
// for an index outside the map.
absl::StatusOr<ShardMap> PromoteBackups(const ShardMap& map, int lost);

// ---- Re-replication: a lost backup replaced by a copy ----

// One copy of re-replication: `backup` becomes a backup of these units,
// which `owner` keeps owning (server indices of the map). Units: slots of
// the map's own slot_owner (every table routed by it), and table-wise
// tables by name. Tables with slot owners of their own and column groups
// are not re-replicated (they stay under-replicated).
struct BackupCopy {
  int owner = -1;
  int backup = -1;
  std::vector<uint32_t> slots;
  std::vector<std::string> tables;
};

// For every unit with a lost backup (kNoBackup), one new backup: a server
// `alive` says is up, not already a copy of the unit, in a zone none of
// the unit's copies is in (zones as PlaceBackups), the one backing the
// least so far first, the next in ring order after the owner on a tie.
// Units whose owner is not alive, and those `skip(owner, table, slot)` is
// true for (table empty for a slot of slot_owner; slot 0 for a table-wise
// table), are left. One copy per (owner, backup), owners in index order;
// empty when nothing is under-replicated or no server can take a copy.
std::vector<BackupCopy> PlanReReplication(
    const ShardMap& map, const std::vector<bool>& alive, absl::Span<const std::string> zones,
    const std::function<bool(int owner, const std::string& table, uint32_t slot)>& skip);

// `map` with `copy.backup` in place of a lost backup (the first kNoBackup)
// of each unit of `copy`, at `epoch`. FAILED_PRECONDITION naming the unit
// when `copy.owner` does not own it, it has no lost backup, or the backup
// is a copy of it already; INVALID_ARGUMENT for indices outside the map,
// an unknown table or one that is not table-wise, a slot out of range.
absl::StatusOr<ShardMap> AddBackupToMap(const ShardMap& map, const BackupCopy& copy,
                                        uint64_t epoch);

}  // namespace recps

#endif  // RECPS_COMMON_WIRE_REPLICA_PLACEMENT_H_
