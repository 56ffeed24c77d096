#include "server/coordinator/rebalance_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/imbalance.h"
#include "common/status_macros.h"
#include "common/wire/shard_map.h"

namespace recps::server {
namespace {

// A slot (table empty) or a whole table that can move.
struct Item {
  int64_t slot = -1;
  std::string table;
  int owner = 0;
  int64_t rows = 0;
  int64_t bytes = 0;
  double load = 0;
  bool moved = false;
};

struct Totals {
  int64_t slots = 0;
  int32_t tables = 0;
  int64_t rows = 0;
  int64_t bytes = 0;
  double load = 0;
};

v1::ImbalanceFigures Figures(const std::vector<Totals>& totals,
                             const std::vector<bool>& counted) {
  std::vector<double> rows, bytes, load;
  for (size_t i = 0; i < totals.size(); ++i) {
    if (!counted[i]) continue;
    rows.push_back(static_cast<double>(totals[i].rows));
    bytes.push_back(static_cast<double>(totals[i].bytes));
    load.push_back(totals[i].load);
  }
  v1::ImbalanceFigures f;
  f.set_rows(MaxOverMean(rows));
  f.set_bytes(MaxOverMean(bytes));
  f.set_load(MaxOverMean(load));
  return f;
}

// The stored names of the tables a map routes whole, with their owner;
// `own_slots` gets the tables routed by slot owners of their own.
std::vector<std::pair<std::string, int>> WholeTables(const v1::ShardMap& map,
                                                     std::vector<std::string>* own_slots) {
  std::vector<std::pair<std::string, int>> out;
  for (const v1::TableRouting& t : map.tables()) {
    if (t.column_groups_size() > 0) {
      for (const v1::ColumnGroupRouting& g : t.column_groups()) {
        out.emplace_back(ColumnGroupTableName(t.table(), static_cast<int>(g.column_begin()),
                                              static_cast<int>(g.column_end())),
                         static_cast<int>(g.owner()));
      }
    } else if (t.slot_owner_size() == 0) {
      out.emplace_back(t.table(), static_cast<int>(t.owner()));
    } else if (own_slots != nullptr) {
      own_slots->push_back(t.table());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

absl::StatusOr<v1::RebalancePlan> PlanRebalance(const RebalanceInput& input) {
  ASSIGN_OR_RETURN(const ShardMap parsed, ShardMap::FromProto(input.map));
  const int old_n = parsed.num_servers();
  if (static_cast<int>(input.stats.size()) != old_n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rebalance: ", input.stats.size(), " stats for ", old_n, " servers"));
  }
  std::vector<std::string> servers = parsed.servers();
  for (const std::string& s : input.new_servers) {
    if (parsed.IndexOf(s) >= 0) continue;
    servers.push_back(s);
  }
  const int n = static_cast<int>(servers.size());
  std::vector<bool> draining(n, false);
  for (const std::string& d : input.drain) {
    const int i = parsed.IndexOf(d);
    if (i < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "drain: '", d.substr(0, 128), "' is not a server of shard map epoch ",
          input.map.epoch(), " (servers: ", absl::StrJoin(parsed.servers(), ", "), ")"));
    }
    draining[i] = true;
  }
  const int in_use = static_cast<int>(std::count(draining.begin(), draining.end(), false));
  if (in_use == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "drain: cannot drain every server (", absl::StrJoin(input.drain, ", "),
        "): their slots would have nowhere to go; start another shard server "
        "first (it registers with the coordinator and can take them)"));
  }

  // Whole tables and their share of each server's per-slot counts.
  std::vector<std::string> own_slot_tables;
  const std::vector<std::pair<std::string, int>> whole = WholeTables(input.map, &own_slot_tables);
  std::vector<Item> items;
  std::vector<int64_t> whole_rows(old_n, 0), whole_bytes(old_n, 0);
  for (const auto& [name, owner] : whole) {
    Item item;
    item.table = name;
    item.owner = owner;
    const v1::StatsResponse& st = input.stats[owner];
    for (const v1::TableStats& t : st.tables()) {
      if (t.name() != name) continue;
      item.rows = t.rows();
      item.bytes = t.bytes();
      if (st.uptime_seconds() > 0) {
        item.load = static_cast<double>(t.lookup_ids() + t.update_ids()) / st.uptime_seconds();
      }
    }
    whole_rows[owner] += item.rows;
    whole_bytes[owner] += item.bytes;
    items.push_back(std::move(item));
  }
  for (int s = 0; s < old_n; ++s) {
    const v1::StatsResponse& st = input.stats[s];
    int64_t slot_rows = 0, slot_bytes = 0;
    for (const v1::SlotStats& ss : st.slots()) {
      slot_rows += ss.rows();
      slot_bytes += ss.bytes();
    }
    // Per-slot counts may include the whole tables' rows (they hash into
    // slots too): scale them to what moves with the slots.
    const double row_scale =
        slot_rows > 0 ? std::max<double>(0, slot_rows - whole_rows[s]) / slot_rows : 0;
    const double byte_scale =
        slot_bytes > 0 ? std::max<double>(0, slot_bytes - whole_bytes[s]) / slot_bytes : 0;
    // Servers that report no per-slot bytes: their average row size.
    const double row_size =
        st.total_rows() > 0 ? static_cast<double>(st.row_bytes()) / st.total_rows() : 0;
    std::map<uint32_t, const v1::SlotStats*> by_slot;
    for (const v1::SlotStats& ss : st.slots()) by_slot[ss.slot()] = &ss;
    for (uint32_t slot : parsed.SlotsOf(s)) {
      Item item;
      item.slot = slot;
      item.owner = s;
      if (auto it = by_slot.find(slot); it != by_slot.end()) {
        const v1::SlotStats& ss = *it->second;
        item.rows = std::llround(ss.rows() * row_scale);
        item.bytes = slot_bytes > 0 ? std::llround(ss.bytes() * byte_scale)
                                    : std::llround(item.rows * row_size);
        item.load = ss.lookup_ids_per_second() + ss.update_ids_per_second();
      }
      items.push_back(std::move(item));
    }
  }

  std::vector<Totals> before(n);
  for (const Item& item : items) {
    Totals& t = before[item.owner];
    if (item.slot >= 0) {
      ++t.slots;
    } else {
      ++t.tables;
    }
    t.rows += item.rows;
    t.bytes += item.bytes;
    t.load += item.load;
  }
  // Weights: each dimension relative to its mean over the servers in use,
  // so bytes and load count alike. With no bytes and no load (nothing
  // trained yet), balance slot counts.
  double sum_bytes = 0, sum_load = 0, sum_items = 0;
  for (const Totals& t : before) {
    sum_bytes += static_cast<double>(t.bytes);
    sum_load += t.load;
    sum_items += static_cast<double>(t.slots + t.tables);
  }
  const double w_bytes = sum_bytes > 0 ? in_use / sum_bytes : 0;
  const double w_load = sum_load > 0 ? in_use / sum_load : 0;
  const double w_items = (w_bytes == 0 && w_load == 0 && sum_items > 0) ? in_use / sum_items : 0;
  auto cost_of = [&](const Item& item) {
    return w_bytes * static_cast<double>(item.bytes) + w_load * item.load + w_items;
  };
  std::vector<double> cost(n, 0);
  for (const Item& item : items) cost[item.owner] += cost_of(item);

  std::vector<Totals> after = before;
  int64_t moves = 0, bytes_moved = 0;
  bool hit_moves = false, hit_bytes = false;
  auto fits = [&](const Item& item) {
    if (input.max_moves > 0 && moves + 1 > input.max_moves) {
      hit_moves = true;
      return false;
    }
    if (input.max_bytes > 0 && bytes_moved + item.bytes > input.max_bytes) {
      hit_bytes = true;
      return false;
    }
    return true;
  };
  std::vector<int> target(items.size(), -1);
  auto move = [&](size_t i, int to) {
    Item& item = items[i];
    Totals& from_t = after[item.owner];
    Totals& to_t = after[to];
    const int64_t is_slot = item.slot >= 0;
    from_t.slots -= is_slot;
    to_t.slots += is_slot;
    from_t.tables -= 1 - is_slot;
    to_t.tables += 1 - is_slot;
    from_t.rows -= item.rows;
    to_t.rows += item.rows;
    from_t.bytes -= item.bytes;
    to_t.bytes += item.bytes;
    from_t.load -= item.load;
    to_t.load += item.load;
    const double c = cost_of(item);
    cost[item.owner] -= c;
    cost[to] += c;
    target[i] = to;
    item.moved = true;
    ++moves;
    bytes_moved += item.bytes;
  };

  // 1. Drains: every item of a drained server to the server in use with
  // the lowest cost, largest items first.
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < items.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return cost_of(items[a]) > cost_of(items[b]);
  });
  int64_t left_on_drained = 0;
  for (size_t i : order) {
    if (!draining[items[i].owner]) continue;
    if (!fits(items[i])) {
      ++left_on_drained;
      continue;
    }
    int best = -1;
    for (int s = 0; s < n; ++s) {
      if (draining[s]) continue;
      if (best < 0 || cost[s] < cost[best]) best = s;
    }
    move(i, best);
  }

  // 2. Even out: move from the costliest server to the cheapest the item
  // that brings them closest, while that lowers the costlier of the two.
  const size_t max_rounds = items.size();
  for (size_t round = 0; round < max_rounds; ++round) {
    int src = -1, dst = -1;
    for (int s = 0; s < n; ++s) {
      if (draining[s]) continue;
      if (src < 0 || cost[s] > cost[src]) src = s;
      if (dst < 0 || cost[s] < cost[dst]) dst = s;
    }
    if (src < 0 || src == dst) break;
    const double gap = cost[src] - cost[dst];
    // Within 2% of the mean (1 per server): even enough.
    if (gap < 0.02) break;
    size_t best = items.size();
    double best_distance = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < items.size(); ++i) {
      const Item& item = items[i];
      if (item.moved || item.owner != src) continue;
      const double c = cost_of(item);
      if (c <= 0 || c >= gap) continue;  // would not lower the max
      const double distance = std::abs(gap / 2 - c);
      if (distance < best_distance) {
        if (input.max_bytes > 0 && bytes_moved + item.bytes > input.max_bytes) {
          hit_bytes = true;
          continue;
        }
        best = i;
        best_distance = distance;
      }
    }
    if (best == items.size()) break;
    if (!fits(items[best])) break;
    move(best, dst);
  }

  // The plan: moves grouped by (source, target).
  v1::RebalancePlan plan;
  plan.set_base_epoch(input.map.epoch());
  std::map<std::pair<int, int>, v1::SlotMove> groups;
  for (size_t i = 0; i < items.size(); ++i) {
    if (target[i] < 0) continue;
    const Item& item = items[i];
    v1::SlotMove& m = groups[{item.owner, target[i]}];
    m.set_source(servers[item.owner]);
    m.set_target(servers[target[i]]);
    if (item.slot >= 0) {
      m.add_slots(static_cast<uint32_t>(item.slot));
      plan.set_slots_to_move(plan.slots_to_move() + 1);
    } else {
      m.add_tables(item.table);
      plan.set_tables_to_move(plan.tables_to_move() + 1);
    }
    m.set_rows(m.rows() + item.rows);
    m.set_bytes(m.bytes() + item.bytes);
    m.set_load(m.load() + item.load);
    plan.set_rows_to_move(plan.rows_to_move() + item.rows);
    plan.set_bytes_to_move(plan.bytes_to_move() + item.bytes);
  }
  for (auto& [key, m] : groups) {
    std::sort(m.mutable_slots()->begin(), m.mutable_slots()->end());
    std::sort(m.mutable_tables()->begin(), m.mutable_tables()->end());
    *plan.add_moves() = std::move(m);
  }
  std::vector<bool> all(n, true), after_counted(n);
  for (int s = 0; s < n; ++s) after_counted[s] = !draining[s];
  *plan.mutable_before() = Figures(before, all);
  *plan.mutable_after() = Figures(after, after_counted);
  for (int s = 0; s < n; ++s) {
    for (int phase = 0; phase < 2; ++phase) {
      const Totals& t = phase == 0 ? before[s] : after[s];
      v1::ServerLoad* l = phase == 0 ? plan.add_servers_before() : plan.add_servers_after();
      l->set_address(servers[s]);
      l->set_slots(t.slots);
      l->set_tables(t.tables);
      l->set_rows(t.rows);
      l->set_bytes(t.bytes);
      l->set_load(t.load);
      l->set_draining(draining[s]);
      l->set_new_server(s >= old_n);
    }
  }
  plan.set_move_bytes_per_second(input.move_bytes_per_second);
  plan.set_move_rate_measured(input.move_rate_measured);
  if (input.move_bytes_per_second > 0) {
    plan.set_estimated_seconds(static_cast<double>(plan.bytes_to_move()) /
                               input.move_bytes_per_second);
  }
  for (const std::string& d : input.drain) plan.add_drain(d);
  if (left_on_drained > 0) {
    plan.add_notes(absl::StrCat("partial drain: ", left_on_drained,
                                " slots/tables stay on the drained servers (bounds)"));
  }
  if (hit_moves) plan.add_notes(absl::StrCat("--max_moves=", input.max_moves, " reached"));
  if (hit_bytes) plan.add_notes(absl::StrCat("--max_bytes=", input.max_bytes, " reached"));
  if (!own_slot_tables.empty()) {
    plan.add_notes(absl::StrCat("tables with slot owners of their own are not moved: ",
                                absl::StrJoin(own_slot_tables, ", ")));
  }
  if (plan.moves_size() == 0) plan.add_notes("balanced: nothing to move");
  return plan;
}

absl::StatusOr<v1::ShardMap> ApplyMovesToMap(const v1::ShardMap& map,
                                             const std::vector<v1::SlotMove>& moves,
                                             uint64_t epoch) {
  ASSIGN_OR_RETURN(const ShardMap parsed, ShardMap::FromProto(map));
  v1::ShardMap out = map;
  out.set_epoch(epoch);
  for (const v1::SlotMove& m : moves) {
    const int source = parsed.IndexOf(m.source());
    if (source < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "move: source '", m.source().substr(0, 128), "' is not a server of shard map epoch ",
          map.epoch()));
    }
    if (m.source() == m.target()) {
      return absl::InvalidArgumentError(
          absl::StrCat("move: source and target are both ", m.source()));
    }
    if (m.target().empty()) return absl::InvalidArgumentError("move: no target");
    int target = -1;
    for (int i = 0; i < out.servers_size(); ++i) {
      if (out.servers(i) == m.target()) target = i;
    }
    if (target < 0) {
      out.add_servers(m.target());
      target = out.servers_size() - 1;
    }
    for (uint32_t slot : m.slots()) {
      if (slot >= map.num_slots()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "move: slot ", slot, " is out of range (the cluster has ", map.num_slots(),
            " slots, 0..", map.num_slots() - 1, ")"));
      }
      if (map.slot_owner(static_cast<int>(slot)) != static_cast<uint32_t>(source)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "move: slot ", slot, " belongs to ",
            map.servers(static_cast<int>(map.slot_owner(static_cast<int>(slot)))), ", not ",
            m.source(), " (shard map epoch ", map.epoch(), ")"));
      }
      out.set_slot_owner(static_cast<int>(slot), static_cast<uint32_t>(target));
    }
    for (const std::string& name : m.tables()) {
      bool found = false;
      for (v1::TableRouting& t : *out.mutable_tables()) {
        if (t.column_groups_size() > 0) {
          for (v1::ColumnGroupRouting& g : *t.mutable_column_groups()) {
            if (ColumnGroupTableName(t.table(), static_cast<int>(g.column_begin()),
                                     static_cast<int>(g.column_end())) != name) {
              continue;
            }
            if (g.owner() != static_cast<uint32_t>(source)) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "move: column group ", name, " belongs to ", map.servers(g.owner()),
                  ", not ", m.source()));
            }
            g.set_owner(static_cast<uint32_t>(target));
            found = true;
          }
        } else if (t.slot_owner_size() == 0 && t.table() == name) {
          if (t.owner() != static_cast<uint32_t>(source)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "move: table ", name, " belongs to ", map.servers(t.owner()), ", not ",
                m.source()));
          }
          t.set_owner(static_cast<uint32_t>(target));
          found = true;
        }
      }
      if (!found) {
        return absl::InvalidArgumentError(absl::StrCat(
            "move: '", name.substr(0, 128),
            "' is not a table-wise table or column group of shard map epoch ", map.epoch()));
      }
    }
  }
  RETURN_IF_ERROR(ShardMap::FromProto(out).status());
  return out;
}

absl::Status CheckPlan(const v1::RebalancePlan& plan, const v1::ShardMap& map,
                       const std::vector<std::string>& new_servers) {
  if (plan.base_epoch() != map.epoch()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rebalance: the plan was made for shard map epoch ", plan.base_epoch(),
        ", the map is now epoch ", map.epoch(), "; plan again (`recpsctl rebalance`)"));
  }
  if (plan.moves_size() == 0) {
    return absl::InvalidArgumentError("rebalance: the plan moves nothing");
  }
  std::set<std::string> servers(map.servers().begin(), map.servers().end());
  std::set<uint32_t> slots;
  std::set<std::string> tables;
  for (const v1::SlotMove& m : plan.moves()) {
    if (servers.count(m.target()) == 0 &&
        std::find(new_servers.begin(), new_servers.end(), m.target()) == new_servers.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rebalance: target '", m.target().substr(0, 128),
          "' is neither a server of shard map epoch ", map.epoch(),
          " nor an alive registered shard server (`recpsctl status` lists them)"));
    }
    if (m.slots_size() == 0 && m.tables_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rebalance: the move ", m.source(), " -> ", m.target(), " names no slot or table"));
    }
    for (uint32_t s : m.slots()) {
      if (!slots.insert(s).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("rebalance: slot ", s, " moves twice in the plan"));
      }
    }
    for (const std::string& t : m.tables()) {
      if (!tables.insert(t).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("rebalance: table ", t.substr(0, 128), " moves twice in the plan"));
      }
    }
  }
  return ApplyMovesToMap(map, {plan.moves().begin(), plan.moves().end()}, map.epoch() + 1)
      .status();
}

}  // namespace recps::server
