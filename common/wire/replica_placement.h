// Where the backups of each shard server's rows go (docs/replication.md):
// the rule the coordinator, the planner and the rebalancer keep. A unit's
// replicas are on different servers, and on different zones (failure
// domains: racks, Kubernetes topology zones) whenever the servers say which.
#ifndef RECPS_COMMON_WIRE_REPLICA_PLACEMENT_H_
#define RECPS_COMMON_WIRE_REPLICA_PLACEMENT_H_

#include <cstdint>
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

}  // namespace recps

#endif  // RECPS_COMMON_WIRE_REPLICA_PLACEMENT_H_
