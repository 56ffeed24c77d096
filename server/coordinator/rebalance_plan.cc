#include "server/coordinator/rebalance_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
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
  // A column group: shard servers cannot move one yet (MigrateIn refuses
  // it), so it counts on its owner and is never planned to move.
  bool fixed = false;
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

// The servers a plan may use: the map's, then alive ones not in it, and
// which of them drain.
struct ServerSet {
  std::vector<std::string> addresses;
  std::vector<bool> draining;
  int old_n = 0;   // servers of the map (the first addresses)
  int in_use = 0;  // servers not draining
};

absl::StatusOr<ServerSet> ResolveServers(const RebalanceInput& input,
                                         const ShardMap& parsed) {
  ServerSet set;
  set.old_n = parsed.num_servers();
  if (static_cast<int>(input.stats.size()) != set.old_n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rebalance: ", input.stats.size(), " stats for ", set.old_n, " servers"));
  }
  set.addresses = parsed.servers();
  for (const std::string& s : input.new_servers) {
    if (parsed.IndexOf(s) >= 0) continue;
    set.addresses.push_back(s);
  }
  set.draining.assign(set.addresses.size(), false);
  for (const std::string& d : input.drain) {
    const int i = parsed.IndexOf(d);
    if (i < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "drain: '", d.substr(0, 128), "' is not a server of shard map epoch ",
          input.map.epoch(), " (servers: ", absl::StrJoin(parsed.servers(), ", "), ")"));
    }
    set.draining[i] = true;
  }
  set.in_use = static_cast<int>(std::count(set.draining.begin(), set.draining.end(), false));
  if (set.in_use == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "drain: cannot drain every server (", absl::StrJoin(input.drain, ", "),
        "): their slots would have nowhere to go; start another shard server "
        "first (it registers with the coordinator and can take them)"));
  }
  return set;
}

// The whole tables as items, with their rows and bytes added to
// `whole_rows` and `whole_bytes` of their owners.
void AddWholeTableItems(const RebalanceInput& input,
                        const std::vector<std::pair<std::string, int>>& whole,
                        std::vector<Item>* items, std::vector<int64_t>* whole_rows,
                        std::vector<int64_t>* whole_bytes) {
  absl::flat_hash_set<std::string> column_groups;
  for (const v1::TableRouting& t : input.map.tables()) {
    for (const v1::ColumnGroupRouting& g : t.column_groups()) {
      column_groups.insert(ColumnGroupTableName(t.table(), static_cast<int>(g.column_begin()),
                                                static_cast<int>(g.column_end())));
    }
  }
  for (const auto& [name, owner] : whole) {
    Item item;
    item.table = name;
    item.owner = owner;
    item.fixed = column_groups.contains(name);
    const v1::StatsResponse& st = input.stats[owner];
    for (const v1::TableStats& t : st.tables()) {
      if (t.name() != name) continue;
      item.rows = t.rows();
      item.bytes = t.bytes();
      if (st.uptime_seconds() > 0) {
        item.load = static_cast<double>(t.lookup_ids() + t.update_ids()) / st.uptime_seconds();
      }
    }
    (*whole_rows)[owner] += item.rows;
    (*whole_bytes)[owner] += item.bytes;
    items->push_back(std::move(item));
  }
}

// Server `s`'s slots as items, from its per-slot counts less what its
// whole tables hold (`whole_rows`, `whole_bytes`).
void AddSlotItems(const v1::StatsResponse& st, const ShardMap& parsed, int s,
                  int64_t whole_rows, int64_t whole_bytes, std::vector<Item>* items) {
  int64_t slot_rows = 0, slot_bytes = 0;
  for (const v1::SlotStats& ss : st.slots()) {
    slot_rows += ss.rows();
    slot_bytes += ss.bytes();
  }
  // Per-slot counts may include the whole tables' rows (they hash into
  // slots too): scale them to what moves with the slots.
  const double row_scale =
      slot_rows > 0 ? std::max<double>(0, slot_rows - whole_rows) / slot_rows : 0;
  const double byte_scale =
      slot_bytes > 0 ? std::max<double>(0, slot_bytes - whole_bytes) / slot_bytes : 0;
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
    items->push_back(std::move(item));
  }
}

// Every whole table and slot of the map as an item that can move.
std::vector<Item> CollectItems(const RebalanceInput& input, const ShardMap& parsed,
                               const std::vector<std::pair<std::string, int>>& whole) {
  const int old_n = parsed.num_servers();
  std::vector<Item> items;
  std::vector<int64_t> whole_rows(old_n, 0), whole_bytes(old_n, 0);
  AddWholeTableItems(input, whole, &items, &whole_rows, &whole_bytes);
  for (int s = 0; s < old_n; ++s) {
    AddSlotItems(input.stats[s], parsed, s, whole_rows[s], whole_bytes[s], &items);
  }
  return items;
}

std::vector<Totals> TotalsOf(const std::vector<Item>& items, int n) {
  std::vector<Totals> totals(n);
  for (const Item& item : items) {
    Totals& t = totals[item.owner];
    if (item.slot >= 0) {
      ++t.slots;
    } else {
      ++t.tables;
    }
    t.rows += item.rows;
    t.bytes += item.bytes;
    t.load += item.load;
  }
  return totals;
}

// The greedy moves: owns the items, each server's totals and cost after
// the moves so far, and the bounds' counters.
class Balancer {
 public:
  Balancer(const RebalanceInput& input, const ServerSet& servers,
           std::vector<Item> items)
      : input_(input),
        draining_(servers.draining),
        n_(static_cast<int>(servers.addresses.size())),
        items_(std::move(items)),
        before_(TotalsOf(items_, n_)),
        after_(before_),
        cost_(n_, 0),
        target_(items_.size(), -1) {
    // Weights: each dimension relative to its mean over the servers in use,
    // so bytes and load count alike. With no bytes and no load (nothing
    // trained yet), balance slot counts.
    double sum_bytes = 0, sum_load = 0, sum_items = 0;
    for (const Totals& t : before_) {
      sum_bytes += static_cast<double>(t.bytes);
      sum_load += t.load;
      sum_items += static_cast<double>(t.slots + t.tables);
    }
    const int in_use = servers.in_use;
    w_bytes_ = sum_bytes > 0 ? in_use / sum_bytes : 0;
    w_load_ = sum_load > 0 ? in_use / sum_load : 0;
    w_items_ = (w_bytes_ == 0 && w_load_ == 0 && sum_items > 0) ? in_use / sum_items : 0;
    for (const Item& item : items_) cost_[item.owner] += CostOf(item);
  }

  // 1. Drains: every item of a drained server to the server in use with
  // the lowest cost, largest items first.
  void Drain() {
    std::vector<size_t> order(items_.size());
    for (size_t i = 0; i < items_.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return CostOf(items_[a]) > CostOf(items_[b]);
    });
    for (size_t i : order) {
      if (!draining_[items_[i].owner]) continue;
      if (items_[i].fixed) {
        fixed_on_drained_.push_back(items_[i].table);
        continue;
      }
      if (!Fits(items_[i])) {
        ++left_on_drained_;
        continue;
      }
      int best = -1;
      for (int s = 0; s < n_; ++s) {
        if (draining_[s]) continue;
        if (best < 0 || cost_[s] < cost_[best]) best = s;
      }
      Move(i, best);
    }
  }

  // 2. Even out: move from the costliest server to the cheapest the item
  // that brings them closest, while that lowers the costlier of the two.
  void EvenOut() {
    const size_t max_rounds = items_.size();
    for (size_t round = 0; round < max_rounds; ++round) {
      int src = -1, dst = -1;
      for (int s = 0; s < n_; ++s) {
        if (draining_[s]) continue;
        if (src < 0 || cost_[s] > cost_[src]) src = s;
        if (dst < 0 || cost_[s] < cost_[dst]) dst = s;
      }
      if (src < 0 || src == dst) break;
      const double gap = cost_[src] - cost_[dst];
      // Within 2% of the mean (1 per server): even enough.
      if (gap < 0.02) break;
      const size_t best = ClosestItem(src, gap);
      if (best == items_.size()) break;
      if (!Fits(items_[best])) break;
      Move(best, dst);
    }
  }

  const std::vector<Item>& items() const { return items_; }
  // The server item i moves to, or -1.
  int target(size_t i) const { return target_[i]; }
  const std::vector<Totals>& before() const { return before_; }
  const std::vector<Totals>& after() const { return after_; }
  int64_t left_on_drained() const { return left_on_drained_; }
  // Column groups on servers being drained (they cannot move).
  const std::vector<std::string>& fixed_on_drained() const { return fixed_on_drained_; }
  bool hit_moves() const { return hit_moves_; }
  bool hit_bytes() const { return hit_bytes_; }

 private:
  double CostOf(const Item& item) const {
    return w_bytes_ * static_cast<double>(item.bytes) + w_load_ * item.load + w_items_;
  }

  // Whether one more move of `item` stays within the bounds; records the
  // bound it would break.
  bool Fits(const Item& item) {
    if (input_.max_moves > 0 && moves_ + 1 > input_.max_moves) {
      hit_moves_ = true;
      return false;
    }
    if (input_.max_bytes > 0 && bytes_moved_ + item.bytes > input_.max_bytes) {
      hit_bytes_ = true;
      return false;
    }
    return true;
  }

  // The unmoved item of `src` whose cost is closest to half of `gap` (and
  // below it) within the byte bound; items_.size() when none.
  size_t ClosestItem(int src, double gap) {
    size_t best = items_.size();
    double best_distance = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < items_.size(); ++i) {
      const Item& item = items_[i];
      if (item.moved || item.fixed || item.owner != src) continue;
      const double c = CostOf(item);
      if (c <= 0 || c >= gap) continue;  // would not lower the max
      const double distance = std::abs(gap / 2 - c);
      if (distance < best_distance) {
        if (input_.max_bytes > 0 && bytes_moved_ + item.bytes > input_.max_bytes) {
          hit_bytes_ = true;
          continue;
        }
        best = i;
        best_distance = distance;
      }
    }
    return best;
  }

  void Move(size_t i, int to) {
    Item& item = items_[i];
    Totals& from_t = after_[item.owner];
    Totals& to_t = after_[to];
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
    const double c = CostOf(item);
    cost_[item.owner] -= c;
    cost_[to] += c;
    target_[i] = to;
    item.moved = true;
    ++moves_;
    bytes_moved_ += item.bytes;
  }

  const RebalanceInput& input_;
  const std::vector<bool> draining_;
  const int n_;
  std::vector<Item> items_;
  const std::vector<Totals> before_;
  std::vector<Totals> after_;
  std::vector<double> cost_;
  std::vector<int> target_;
  double w_bytes_ = 0, w_load_ = 0, w_items_ = 0;
  int64_t moves_ = 0, bytes_moved_ = 0;
  int64_t left_on_drained_ = 0;
  std::vector<std::string> fixed_on_drained_;
  bool hit_moves_ = false, hit_bytes_ = false;
};

// The balancer's moves, grouped by (source, target), into `plan`.
void AddMoves(const Balancer& b, const std::vector<std::string>& servers,
              v1::RebalancePlan* plan) {
  std::map<std::pair<int, int>, v1::SlotMove> groups;
  for (size_t i = 0; i < b.items().size(); ++i) {
    if (b.target(i) < 0) continue;
    const Item& item = b.items()[i];
    v1::SlotMove& m = groups[{item.owner, b.target(i)}];
    m.set_source(servers[item.owner]);
    m.set_target(servers[b.target(i)]);
    if (item.slot >= 0) {
      m.add_slots(static_cast<uint32_t>(item.slot));
      plan->set_slots_to_move(plan->slots_to_move() + 1);
    } else {
      m.add_tables(item.table);
      plan->set_tables_to_move(plan->tables_to_move() + 1);
    }
    m.set_rows(m.rows() + item.rows);
    m.set_bytes(m.bytes() + item.bytes);
    m.set_load(m.load() + item.load);
    plan->set_rows_to_move(plan->rows_to_move() + item.rows);
    plan->set_bytes_to_move(plan->bytes_to_move() + item.bytes);
  }
  for (auto& [key, m] : groups) {
    std::sort(m.mutable_slots()->begin(), m.mutable_slots()->end());
    std::sort(m.mutable_tables()->begin(), m.mutable_tables()->end());
    *plan->add_moves() = std::move(m);
  }
}

// Imbalance figures and each server's totals, before and after the moves.
void AddLoads(const Balancer& b, const ServerSet& set, v1::RebalancePlan* plan) {
  const int n = static_cast<int>(set.addresses.size());
  std::vector<bool> all(n, true), after_counted(n);
  for (int s = 0; s < n; ++s) after_counted[s] = !set.draining[s];
  *plan->mutable_before() = Figures(b.before(), all);
  *plan->mutable_after() = Figures(b.after(), after_counted);
  for (int s = 0; s < n; ++s) {
    for (int phase = 0; phase < 2; ++phase) {
      const Totals& t = phase == 0 ? b.before()[s] : b.after()[s];
      v1::ServerLoad* l = phase == 0 ? plan->add_servers_before() : plan->add_servers_after();
      l->set_address(set.addresses[s]);
      l->set_slots(t.slots);
      l->set_tables(t.tables);
      l->set_rows(t.rows);
      l->set_bytes(t.bytes);
      l->set_load(t.load);
      l->set_draining(set.draining[s]);
      l->set_new_server(s >= set.old_n);
    }
  }
}

// The move rate and time estimate, the drains and the notes.
void AddSummary(const RebalanceInput& input, const Balancer& b,
                const std::vector<std::string>& own_slot_tables, v1::RebalancePlan* plan) {
  plan->set_move_bytes_per_second(input.move_bytes_per_second);
  plan->set_move_rate_measured(input.move_rate_measured);
  if (input.move_bytes_per_second > 0) {
    plan->set_estimated_seconds(static_cast<double>(plan->bytes_to_move()) /
                                input.move_bytes_per_second);
  }
  for (const std::string& d : input.drain) plan->add_drain(d);
  if (b.left_on_drained() > 0) {
    plan->add_notes(absl::StrCat("partial drain: ", b.left_on_drained(),
                                 " slots/tables stay on the drained servers (bounds)"));
  }
  if (b.hit_moves()) plan->add_notes(absl::StrCat("--max_moves=", input.max_moves, " reached"));
  if (b.hit_bytes()) plan->add_notes(absl::StrCat("--max_bytes=", input.max_bytes, " reached"));
  if (!own_slot_tables.empty()) {
    plan->add_notes(absl::StrCat("tables with slot owners of their own are not moved: ",
                                 absl::StrJoin(own_slot_tables, ", ")));
  }
  std::vector<std::string> split;
  for (const v1::TableRouting& t : input.map.tables()) {
    if (t.column_groups_size() > 0) split.push_back(t.table());
  }
  if (!split.empty()) {
    plan->add_notes(absl::StrCat(
        "column groups are not moved (shard servers cannot move them yet): tables ",
        absl::StrJoin(split, ", ")));
  }
  if (plan->moves_size() == 0) plan->add_notes("balanced: nothing to move");
}

}  // namespace

absl::StatusOr<v1::RebalancePlan> PlanRebalance(const RebalanceInput& input) {
  ASSIGN_OR_RETURN(const ShardMap parsed, ShardMap::FromProto(input.map));
  if (parsed.replication() > 1) {
    // A move would have to carry the backups along (a backup is a move
    // target whose copy never ends): not built yet, so nothing is planned
    // rather than a map whose backups miss the moved rows.
    return absl::FailedPreconditionError(absl::StrCat(
        "shard map epoch ", parsed.epoch(), " keeps ", parsed.replication(),
        " copies of each row, and slot moves of a replicated map are not supported yet "
        "(docs/replication.md): rebalance, drain and joining servers need replication 1"));
  }
  ASSIGN_OR_RETURN(const ServerSet servers, ResolveServers(input, parsed));
  // Whole tables and their share of each server's per-slot counts.
  std::vector<std::string> own_slot_tables;
  const std::vector<std::pair<std::string, int>> whole = WholeTables(input.map, &own_slot_tables);
  Balancer balancer(input, servers, CollectItems(input, parsed, whole));
  balancer.Drain();
  if (!balancer.fixed_on_drained().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot drain: column group(s) ", absl::StrJoin(balancer.fixed_on_drained(), ", "),
        " would have to move, and shard servers cannot move column groups yet; "
        "re-plan those tables without a column split (recpsctl plan), or keep the "
        "server"));
  }
  balancer.EvenOut();

  v1::RebalancePlan plan;
  plan.set_base_epoch(input.map.epoch());
  AddMoves(balancer, servers.addresses, &plan);
  AddLoads(balancer, servers, &plan);
  AddSummary(input, balancer, own_slot_tables, &plan);
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
