#include "server/planner/proposer.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/optimizer_registry.h"

namespace recps::planner {
namespace {

// Narrowest column group the planner makes (one 16-byte vector of floats).
constexpr int kMinColumnGroupWidth = 4;

// Fills parts and total of `p` from per-server loads.
void AddPart(Placement& p, int server, const Load& load) {
  for (auto& [s, l] : p.parts) {
    if (s == server) {
      l += load;
      p.total += load;
      return;
    }
  }
  p.parts.emplace_back(server, load);
  p.total += load;
}

Placement TableWise(const Model& m, int t, int server) {
  Placement p;
  p.table = t;
  p.type = v1::TABLE_WISE;
  p.server = server;
  AddPart(p, server, WholeUnitLoad(m.tables[t], 0, m.tables[t].dim));
  return p;
}

Placement RowWise(const Model& m, int t) {
  const TableModel& tm = m.tables[t];
  Placement p;
  p.table = t;
  p.type = v1::ROW_WISE;
  const int n = static_cast<int>(m.servers.size());
  const bool all = static_cast<int>(tm.allowed_servers.size()) == n;
  std::vector<std::vector<uint32_t>> slots(n);
  const auto k = static_cast<uint64_t>(tm.allowed_servers.size());
  if (!all) p.slot_owner.resize(m.num_slots);
  for (uint32_t s = 0; s < m.num_slots; ++s) {
    const int owner = tm.allowed_servers[s * k / m.num_slots];
    slots[owner].push_back(s);
    if (!all) p.slot_owner[s] = static_cast<uint32_t>(owner);
  }
  for (int server : tm.allowed_servers) {
    AddPart(p, server, UnitLoad(tm, 0, tm.dim, slots[server], m.num_slots));
  }
  return p;
}

Placement ColumnWise(const Model& m, int t, int groups,
                     const std::vector<int>& servers) {
  const TableModel& tm = m.tables[t];
  Placement p;
  p.table = t;
  p.type = v1::COLUMN_WISE;
  for (int g = 0; g < groups; ++g) {
    Placement::Group group;
    group.column_begin = g * tm.dim / groups;
    group.column_end = (g + 1) * tm.dim / groups;
    group.server = servers[g];
    group.load = WholeUnitLoad(tm, group.column_begin, group.column_end);
    // A group is its own table on that server: its fixed index bytes too.
    Load fixed;
    fixed.index_bytes = FixedTableBytes(tm, m.num_slots);
    Load with_fixed = group.load;
    with_fixed += fixed;
    AddPart(p, group.server, with_fixed);
    p.groups.push_back(group);
  }
  return p;
}

}  // namespace

const char* ShardingTypeName(v1::ShardingType type) {
  switch (type) {
    case v1::TABLE_WISE:
      return "table-wise";
    case v1::ROW_WISE:
      return "row-wise";
    case v1::COLUMN_WISE:
      return "column-wise";
    default:
      return "unspecified";
  }
}

Partition::Partition(const Model& model)
    : model_(model),
      loads_(model.servers.size()),
      steps_(model.servers.size()),
      memory_use_(model.servers.size()) {
  for (size_t s = 0; s < loads_.size(); ++s) {
    loads_[s].index_bytes = FixedBytesPerServer(model);
    Refresh(static_cast<int>(s));
  }
}

bool Partition::Fits(const Placement& p) const {
  return Shortfall(p).first <= 0 && RowsFit(p);
}

bool Partition::RowsFit(const Placement& p) const {
  if (p.table < 0 || !model_.tables[p.table].dynamic) return true;
  for (const auto& [s, l] : p.parts) {
    if (l.rows > static_cast<double>(model_.servers[s].max_rows_per_table))
      return false;
  }
  return true;
}

std::pair<double, int> Partition::Shortfall(const Placement& p) const {
  double worst = -1e300;
  int at = -1;
  for (const auto& [s, l] : p.parts) {
    const double over = loads_[s].bytes_stored() + l.bytes_stored() -
                        static_cast<double>(model_.servers[s].usable_bytes);
    if (over > worst) {
      worst = over;
      at = s;
    }
  }
  return {worst, at};
}

std::pair<double, double> Partition::StepAfter(const Placement& p) const {
  std::vector<char> touched(loads_.size(), 0);
  double touched_max = 0;
  for (const auto& [s, l] : p.parts) {
    touched[s] = 1;
    Load after = loads_[s];
    after += l;
    touched_max = std::max(touched_max,
                           StepTimeOf(after, model_.servers[s]).step_seconds);
  }
  double all = touched_max;
  for (size_t s = 0; s < loads_.size(); ++s) {
    if (!touched[s]) all = std::max(all, steps_[s]);
  }
  return {all, touched_max};
}

double Partition::MaxMemoryUseAfter(const Placement& p) const {
  std::vector<char> touched(loads_.size(), 0);
  double worst = 0;
  for (const auto& [s, l] : p.parts) {
    touched[s] = 1;
    worst = std::max(worst,
                     (loads_[s].bytes_stored() + l.bytes_stored()) /
                         static_cast<double>(model_.servers[s].usable_bytes));
  }
  for (size_t s = 0; s < loads_.size(); ++s) {
    if (!touched[s]) worst = std::max(worst, memory_use_[s]);
  }
  return worst;
}

void Partition::Apply(const Placement& p) {
  for (const auto& [s, l] : p.parts) {
    loads_[s] += l;
    Refresh(s);
  }
}

void Partition::Refresh(int s) {
  steps_[s] = StepTimeOf(loads_[s], model_.servers[s]).step_seconds;
  memory_use_[s] = loads_[s].bytes_stored() /
                   static_cast<double>(model_.servers[s].usable_bytes);
}

double Partition::MaxStep() const {
  return steps_.empty() ? 0 : *std::max_element(steps_.begin(), steps_.end());
}

double Partition::MaxMemoryUse() const {
  return memory_use_.empty()
             ? 0
             : *std::max_element(memory_use_.begin(), memory_use_.end());
}

std::vector<uint32_t> GlobalSlotOwner(const Model& m) {
  std::vector<uint32_t> owner(m.num_slots);
  const uint64_t n = m.servers.size();
  for (uint32_t s = 0; s < m.num_slots; ++s) {
    owner[s] = static_cast<uint32_t>(s * n / m.num_slots);
  }
  return owner;
}

std::vector<Placement> EnumeratePlacements(const Model& m, int t,
                                           const Partition& partition,
                                           uint32_t types) {
  const TableModel& tm = m.tables[t];
  if (tm.pinned_type != v1::SHARDING_TYPE_UNSPECIFIED)
    types = 1u << tm.pinned_type;
  std::vector<Placement> out;
  if (types & (1u << v1::TABLE_WISE)) {
    for (int s : tm.allowed_servers) out.push_back(TableWise(m, t, s));
  }
  if (types & (1u << v1::ROW_WISE)) out.push_back(RowWise(m, t));
  // An optimizer with state per row (row-wise Adagrad's accumulator) would
  // keep it per group: never split it (a pin to COLUMN_WISE is refused in
  // BuildModel).
  if ((types & (1u << v1::COLUMN_WISE)) &&
      FindOptimizer(tm.optimizer)->unsplittable_because == nullptr) {
    // Groups go to the least busy servers, then the emptiest.
    std::vector<int> order = tm.allowed_servers;
    const auto& loads = partition.loads();
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const double sa = StepTimeOf(loads[a], m.servers[a]).step_seconds;
      const double sb = StepTimeOf(loads[b], m.servers[b]).step_seconds;
      if (sa != sb) return sa < sb;
      return loads[a].bytes_stored() / m.servers[a].usable_bytes <
             loads[b].bytes_stored() / m.servers[b].usable_bytes;
    });
    std::vector<int> counts;
    if (tm.column_groups > 0) {
      counts.push_back(tm.column_groups);
    } else {
      for (int k = 2; k <= static_cast<int>(order.size()) &&
                      tm.dim / k >= kMinColumnGroupWidth;
           k *= 2) {
        counts.push_back(k);
      }
    }
    for (int k : counts) {
      if (k > static_cast<int>(order.size())) continue;
      out.push_back(ColumnWise(m, t, k, order));
    }
  }
  return out;
}

Placement LeastShortPlacement(const Model& m, int t, const Partition& partition,
                              uint32_t types) {
  Placement best;
  double best_short = 1e300;
  for (Placement& p : EnumeratePlacements(m, t, partition, types)) {
    const double s = partition.Shortfall(p).first;
    if (s < best_short) {
      best_short = s;
      best = std::move(p);
    }
  }
  return best;
}

Proposal ProposeGreedy(const Model& m, GreedyOrder order, uint32_t types,
                       int free_tables, std::string name) {
  Proposal out;
  out.proposer = std::move(name);
  std::vector<int> tables(m.tables.size());
  std::iota(tables.begin(), tables.end(), 0);
  std::vector<double> weight(m.tables.size());
  for (size_t t = 0; t < m.tables.size(); ++t) {
    const Load whole = WholeUnitLoad(m.tables[t], 0, m.tables[t].dim);
    weight[t] = order == GreedyOrder::kBytes
                    ? whole.bytes_stored()
                    : whole.lookup_bytes + whole.update_bytes;
  }
  std::stable_sort(tables.begin(), tables.end(),
                   [&](int a, int b) { return weight[a] > weight[b]; });
  Partition partition(m);
  std::vector<Placement> placed(m.tables.size());
  for (size_t rank = 0; rank < tables.size(); ++rank) {
    const int t = tables[rank];
    const TableModel& tm = m.tables[t];
    Placement best;
    bool found = false;
    double best_all = 0, best_touched = 0, best_mem = 0;
    uint32_t fitting_types = 0;
    // Table-wise first for the tables past free_tables; all types else, or
    // when no table-wise placement fits.
    std::vector<uint32_t> passes;
    if (static_cast<int>(rank) >= free_tables &&
        (types & (1u << v1::TABLE_WISE))) {
      passes.push_back(1u << v1::TABLE_WISE);
    }
    passes.push_back(types);
    size_t pass_used = 0;
    for (uint32_t pass : passes) {
      for (Placement& p : EnumeratePlacements(m, t, partition, pass)) {
        if (!partition.Fits(p)) continue;
        fitting_types |= 1u << p.type;
        const auto [all, touched] = partition.StepAfter(p);
        const double mem = partition.MaxMemoryUseAfter(p);
        const bool better =
            !found || all < best_all ||
            (all == best_all && (touched < best_touched ||
                                 (touched == best_touched && mem < best_mem)));
        if (better) {
          best = std::move(p);
          best_all = all;
          best_touched = touched;
          best_mem = mem;
          found = true;
        }
      }
      if (found) break;
      ++pass_used;
    }
    if (!found) {
      out.failed_table = t;
      break;
    }
    if (tm.pinned_type != v1::SHARDING_TYPE_UNSPECIFIED) {
      best.reason = absl::StrCat("pinned ", ShardingTypeName(tm.pinned_type));
    } else if (tm.servers_pinned) {
      best.reason = "pinned servers; lowest predicted step time";
    } else if ((fitting_types & (fitting_types - 1)) == 0 &&
               (types & (types - 1)) != 0 && passes.size() == 1) {
      best.reason = absl::StrCat("only ", ShardingTypeName(best.type), " fits");
    } else if (passes.size() == 2 && pass_used == 0) {
      best.reason = "kept whole: table-wise balances best";
    } else {
      best.reason = "lowest predicted step time";
    }
    partition.Apply(best);
    placed[t] = std::move(best);
  }
  out.placements = std::move(placed);
  out.max_step = partition.MaxStep();
  out.max_memory_use = partition.MaxMemoryUse();
  return out;
}

}  // namespace recps::planner
