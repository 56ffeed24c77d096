// What the planner knows about each table and server once inputs are
// checked and defaults applied: rows, widths, traffic per step, pins.
#ifndef RECPS_SERVER_PLANNER_TABLE_MODEL_H_
#define RECPS_SERVER_PLANNER_TABLE_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/optimizer_registry.h"
#include "recps/v1/plan.pb.h"
#include "server/planner/planner.h"

namespace recps::planner {

// A shard server with its cost parameters' defaults applied.
struct ServerModel {
  std::string address;
  int64_t usable_bytes = 0;  // memory_bytes less the reserve
  double network_bytes_per_s = 0;
  double row_seconds = 0;
  double table_request_seconds = 0;
  int64_t max_rows_per_table = 0;  // of a dynamic table
};

struct TableModel {
  std::string name;
  uint64_t key = 0;  // StableNameKey(name)
  int dim = 0;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  v1::StoragePrecision precision = v1::FP32;  // the table config's
  // Rows the table will hold (over all servers).
  int64_t rows = 0;
  // num_rows 0: the server caps its rows at max_rows_per_table.
  bool dynamic = false;
  int num_workers = 0;
  // Distinct ids looked up per step, summed over workers.
  double ids_per_step = 0;
  // Small fixed tables: rows in each slot, exactly (num_slots entries);
  // otherwise empty and rows spread evenly over slots.
  std::vector<int64_t> rows_per_slot;
  // With rows_per_slot: the index bytes of each slot's map, exactly.
  std::vector<double> index_bytes_of_slot;
  // Expected index bytes one slot's map allocates (rows spread evenly).
  double index_bytes_per_slot = 0;
  // Index bytes of the whole table (all slots).
  double index_bytes = 0;
  // A fixed table's id -> row map, which every server keeps whatever share
  // it holds (server::HostDenseIndexBytes; 0: none).
  double dense_index_bytes = 0;
  v1::ShardingType pinned_type = v1::SHARDING_TYPE_UNSPECIFIED;
  // Servers the table may use (indices; all unless pinned).
  std::vector<int> allowed_servers;
  bool servers_pinned = false;
  int column_groups = 0;  // hint; 0: the planner chooses
};

struct Model {
  std::vector<ServerModel> servers;
  std::vector<TableModel> tables;
  uint32_t num_slots = 0;
  int num_workers = 0;
  int64_t batch_size = 0;
  double memory_reserve_fraction = 0;
};

// Checks tables (as the shard server would), hints and topology, and
// applies defaults. INVALID_ARGUMENT names the table, hint or server.
absl::StatusOr<Model> BuildModel(const PlannerInput& input);

// Expected distinct values among n draws from `rows` equally likely ones:
// the ids one worker's batch leaves after dedup.
double ExpectedDistinct(double n, double rows);

// Expected bytes one slot's index allocates when its row count is Poisson
// with mean `mean_rows` (rows hash evenly into slots).
double ExpectedIndexBytesPerSlot(double mean_rows);

}  // namespace recps::planner

#endif  // RECPS_SERVER_PLANNER_TABLE_MODEL_H_
