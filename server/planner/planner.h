// The sharding planner: places a job's embedding tables on shard servers
// (table-wise, row-wise or column-wise) so that memory fits and the
// predicted step time of the busiest server is smallest. A library: it
// needs no running cluster. The coordinator runs it when it builds the
// shard map; recpsctl runs it offline. Cost model: docs/planner.md.
//
// Pipeline (each part in its own file, tested with fake topologies):
//   table_model   configs + hints -> what each table stores and moves per step
//   cost_model    bytes stored, traffic and step time of a placement
//   proposer      candidate placements per table, greedy partitioners
//   planner       runs the proposers, keeps the best plan that fits, or
//                 explains why nothing fits
#ifndef RECPS_SERVER_PLANNER_PLANNER_H_
#define RECPS_SERVER_PLANNER_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recps/v1/job.pb.h"
#include "recps/v1/plan.pb.h"
#include "recps/v1/shard_map.pb.h"
#include "recps/v1/table.pb.h"

namespace recps::planner {

// ShardingPlan.format_version written by this planner.
inline constexpr uint32_t kPlanFormatVersion = 1;

struct PlannerInput {
  // The job's tables (validated like the shard server does).
  std::vector<v1::TableConfig> tables;
  // Optional, at most one per table, naming tables of `tables`.
  std::vector<v1::TableHint> hints;
  v1::Topology topology;
  // Fraction of each server's memory left free; default 0.05.
  double memory_reserve_fraction = 0.05;
  // Ids per sample of each table when no hint gives a pooling factor or
  // lookup share (from the job's features and synthetic data); by table
  // name, missing means 1.
  std::vector<std::pair<std::string, double>> default_pooling;
  // Rows of each dynamic table when no hint gives expected_distinct_ids
  // (from the job's data config: synthetic id_space, Criteo hash buckets).
  std::vector<std::pair<std::string, int64_t>> default_distinct_ids;
};

// The input for `job` under `spec` (topology and hints): tables from the
// job, default pooling from its features (and synthetic bag sizes), default
// distinct ids from its data config.
PlannerInput PlannerInputFromJob(const v1::JobConfig& job,
                                 const v1::PlanSpec& spec);

// The plan with the smallest predicted maximum step time over servers
// among those that fit every server's memory.
// INVALID_ARGUMENT: a bad table, hint or topology (names the field).
// RESOURCE_EXHAUSTED: nothing fits; the message names the table, how many
// bytes are missing and what would make it fit (more servers, row-wise,
// lower precision).
absl::StatusOr<v1::ShardingPlan> PlanSharding(const PlannerInput& input);

// The shard map that routes like `plan`, at `epoch`: the plan's global slot
// owners, plus a table routing for each table-wise table (its one owner),
// each row-wise table with its own slot layout and each column-wise table
// (its column groups and their owners).
// INVALID_ARGUMENT for a malformed plan or one with a newer
// format_version. (The precision needs no routing: each shard server stores
// a table as its table config says.)
absl::StatusOr<v1::ShardMap> PlanToShardMap(const v1::ShardingPlan& plan,
                                            uint64_t epoch);

// A table for people: per table its type, placement and bytes; per server
// its bytes, traffic and step time.
std::string FormatPlan(const v1::ShardingPlan& plan);

}  // namespace recps::planner

#endif  // RECPS_SERVER_PLANNER_PLANNER_H_
