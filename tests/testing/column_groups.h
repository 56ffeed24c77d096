// Test maps with column-wise tables: one place that writes TableRouting's
// column groups.
#ifndef RECPS_TESTS_TESTING_COLUMN_GROUPS_H_
#define RECPS_TESTS_TESTING_COLUMN_GROUPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "recps/v1/shard_map.pb.h"

namespace recps::testing {

// Adds to `map` a routing of `table` split at `bounds` (column boundaries,
// first 0, last the table's dim), group g owned by server owners[g].
inline void AddColumnGroups(v1::ShardMap* map, const std::string& table,
                            const std::vector<uint32_t>& bounds,
                            const std::vector<uint32_t>& owners) {
  v1::TableRouting* t = map->add_tables();
  t->set_table(table);
  for (size_t g = 0; g + 1 < bounds.size(); ++g) {
    v1::ColumnGroupRouting* cg = t->add_column_groups();
    cg->set_column_begin(bounds[g]);
    cg->set_column_end(bounds[g + 1]);
    cg->set_owner(owners[g]);
  }
}

}  // namespace recps::testing

#endif  // RECPS_TESTS_TESTING_COLUMN_GROUPS_H_
