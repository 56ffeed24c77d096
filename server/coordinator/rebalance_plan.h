// Rebalance plans (docs/operations.md, Rebalancing): from the current shard
// map and the servers' live load (ShardAdmin.Stats with per-slot rows,
// bytes and rates), a greedy planner proposes which slots and whole tables
// (table-wise tables, column groups) move where, so that bytes and load
// even out over the servers in use, servers to drain end up empty and
// servers that joined late take their share. Pure functions: no RPCs, no
// clock; the same input always gives the same plan.
#ifndef RECPS_SERVER_COORDINATOR_REBALANCE_PLAN_H_
#define RECPS_SERVER_COORDINATOR_REBALANCE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "recps/v1/coordinator.pb.h"
#include "recps/v1/shard_admin.pb.h"
#include "recps/v1/shard_map.pb.h"

namespace recps::server {

struct RebalanceInput {
  v1::ShardMap map;
  // One per map.servers entry, same order: Stats with include_slots.
  std::vector<v1::StatsResponse> stats;
  // Alive shard servers not in the map (they own nothing yet), sorted.
  std::vector<std::string> new_servers;
  // Servers (addresses in the map) to empty.
  std::vector<std::string> drain;
  // Bounds, 0: none. max_moves counts slots and whole tables.
  int64_t max_bytes = 0;
  int64_t max_moves = 0;
  // For the time estimate.
  double move_bytes_per_second = 100e6;
  bool move_rate_measured = false;
};

// The plan, or INVALID_ARGUMENT (an unknown server to drain, stats that do
// not match the map) / FAILED_PRECONDITION (draining every server).
absl::StatusOr<v1::RebalancePlan> PlanRebalance(const RebalanceInput& input);

// `map` with the slots and tables of `moves` given to their targets (a
// target not yet in map.servers is appended, so no index changes) and
// epoch `epoch`. INVALID_ARGUMENT when a move names a slot out of range, a
// slot or table its source does not own, an unknown table or source, or a
// move to itself.
absl::StatusOr<v1::ShardMap> ApplyMovesToMap(const v1::ShardMap& map,
                                             const std::vector<v1::SlotMove>& moves,
                                             uint64_t epoch);

// Whether `plan` can be carried out on `map` with `new_servers` (alive,
// not in the map) as further targets: FAILED_PRECONDITION when the map
// changed since the plan (epoch); INVALID_ARGUMENT for an empty plan, an
// unknown server, a slot out of range, a move to itself, a slot or table
// its source does not own or that moves twice.
absl::Status CheckPlan(const v1::RebalancePlan& plan, const v1::ShardMap& map,
                       const std::vector<std::string>& new_servers);

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_REBALANCE_PLAN_H_
