// Enumerator, partitioner and proposers. The enumerator lists where one
// table could go (table-wise on each allowed server, row-wise over the
// allowed servers, column-wise in k groups); the partition tracks what each
// server holds so far; a greedy proposer places tables one by one, each
// where the busiest server's predicted step time grows least, among
// placements that fit in memory.
#ifndef RECPS_SERVER_PLANNER_PROPOSER_H_
#define RECPS_SERVER_PLANNER_PROPOSER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "recps/v1/plan.pb.h"
#include "server/planner/cost_model.h"
#include "server/planner/table_model.h"

namespace recps::planner {

// Where one table goes.
struct Placement {
  int table = -1;
  v1::ShardingType type = v1::SHARDING_TYPE_UNSPECIFIED;
  int server = -1;                   // TABLE_WISE
  std::vector<uint32_t> slot_owner;  // ROW_WISE over some servers; empty: all
  struct Group {
    int column_begin = 0;
    int column_end = 0;
    int server = -1;
    Load load;
  };
  std::vector<Group> groups;  // COLUMN_WISE
  // Load per server it adds (server index, load).
  std::vector<std::pair<int, Load>> parts;
  Load total;
  std::string reason;
};

// The servers' loads as tables are placed.
class Partition {
 public:
  // Starts with the bytes every server spends on every table of `model`.
  explicit Partition(const Model& model);

  // Whether every server `p` touches stays within its usable memory and,
  // for a dynamic table, within its max_rows_per_table.
  bool Fits(const Placement& p) const;
  // Whether the rows `p` puts on each server stay within its
  // max_rows_per_table (always true for fixed tables).
  bool RowsFit(const Placement& p) const;
  // Bytes over the usable memory on the server `p` overfills most (<= 0
  // when it fits), and that server.
  std::pair<double, int> Shortfall(const Placement& p) const;
  // Max over all servers of the step time with `p` added; and the max
  // over the servers it touches.
  std::pair<double, double> StepAfter(const Placement& p) const;
  double MaxMemoryUseAfter(const Placement& p) const;  // fraction of usable
  void Apply(const Placement& p);

  const std::vector<Load>& loads() const { return loads_; }
  double MaxStep() const;
  double MaxMemoryUse() const;

 private:
  void Refresh(int server);

  const Model& model_;
  std::vector<Load> loads_;
  // Per server: step seconds and memory use of loads_ (kept with Apply).
  std::vector<double> steps_;
  std::vector<double> memory_use_;
};

// The plan's global slot layout: slot s belongs to server s * N / S.
std::vector<uint32_t> GlobalSlotOwner(const Model& model);

// Where table `t` could go now. `types` (a ShardingType bit mask, 1 << type)
// limits the kinds tried; a pinned type or pinned servers always win.
// Column groups go to the least loaded allowed servers of `partition`.
std::vector<Placement> EnumeratePlacements(const Model& model, int t,
                                           const Partition& partition,
                                           uint32_t types);

inline constexpr uint32_t kAllTypes =
    (1u << v1::TABLE_WISE) | (1u << v1::ROW_WISE) | (1u << v1::COLUMN_WISE);

struct Proposal {
  std::string proposer;
  // One per table, in the model's order (on failure: those placed).
  std::vector<Placement> placements;
  double max_step = 0;
  double max_memory_use = 0;
  // -1, or the table that fit nowhere (placements are then incomplete).
  int failed_table = -1;
};

enum class GreedyOrder {
  kBytes,    // largest table first
  kTraffic,  // most bytes moved per step first
};

// Places the tables greedily in `order`, trying `types`. The first
// `free_tables` tables in that order choose freely; the rest go table-wise
// where that fits (and only otherwise try `types`). Placing one table at a
// time, spreading a small table row-wise always looks cheapest (it adds a
// little to every server), while keeping small tables whole and spreading
// the big ones balances better: the free_tables sweep finds that split.
Proposal ProposeGreedy(const Model& model, GreedyOrder order, uint32_t types,
                       int free_tables, std::string name);

// Best placements of one table if it were placed into `partition`: used to
// explain a failure.
Placement LeastShortPlacement(const Model& model, int t,
                              const Partition& partition, uint32_t types);

const char* ShardingTypeName(v1::ShardingType type);

}  // namespace recps::planner

#endif  // RECPS_SERVER_PLANNER_PROPOSER_H_
