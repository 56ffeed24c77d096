// PlanSharding: runs the proposers, keeps the best plan that fits, or
// explains why nothing fits. PlannerInputFromJob: defaults from a job.
#include "server/planner/planner.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/wire/shard_map.h"
#include "common/status_macros.h"
#include "server/planner/cost_model.h"
#include "server/planner/proposer.h"
#include "server/planner/table_model.h"

namespace recps::planner {
namespace {

// The error when table `t` fits nowhere after the tables of `failed` were
// placed: how much is missing where, and what would make it fit.
absl::Status NothingFits(const Model& m, const Proposal& failed) {
  const int t = failed.failed_table;
  const TableModel& tm = m.tables[t];
  Partition partition(m);
  for (const Placement& p : failed.placements) {
    if (p.table >= 0) partition.Apply(p);
  }
  const Placement best = LeastShortPlacement(m, t, partition, kAllTypes);
  if (best.parts.empty()) {
    // Only a pinned column-wise table can have no placement at all.
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", tm.name, "' is pinned column-wise but cannot be split: dim ",
        tm.dim, " over ", tm.allowed_servers.size(),
        " allowed server(s) gives no 2 or more groups of at least 4 columns; "
        "pin it table-wise or row-wise"));
  }
  const auto [short_bytes, server] = partition.Shortfall(best);
  const Load whole = WholeUnitLoad(tm, 0, tm.dim);
  const int64_t row_bytes = StoredRowBytes(tm.optimizer, tm.dim, tm.precision);

  std::string msg = absl::StrCat(
      "table '", tm.name, "' does not fit: it needs ",
      HumanBytes(whole.bytes_stored()), " (", tm.rows, " rows of ", row_bytes,
      " B, ", HumanBytes(whole.index_bytes), " of index)");
  if (tm.pinned_type != v1::SHARDING_TYPE_UNSPECIFIED) {
    absl::StrAppend(&msg, ", pinned ", ShardingTypeName(tm.pinned_type));
  }
  if (tm.servers_pinned) {
    std::vector<std::string> names;
    for (int s : tm.allowed_servers) names.push_back(m.servers[s].address);
    absl::StrAppend(&msg, " on ", absl::StrJoin(names, ", "));
  }
  if (short_bytes <= 0 && !partition.RowsFit(best)) {
    // Memory would do; the servers' row cap for dynamic tables does not.
    int64_t cap = 0;
    for (const ServerModel& s : m.servers)
      cap = std::max(cap, s.max_rows_per_table);
    return absl::ResourceExhaustedError(absl::StrCat(
        msg, "; its best placement (", ShardingTypeName(best.type),
        ") puts more rows on a server than its max_rows_per_table (", cap,
        ") allows. To fit: raise recps-shard --max_rows_per_table (and the "
        "topology's max_rows_per_table), spread it row-wise over more servers, "
        "or "
        "drop its pinned type or servers"));
  }
  const ServerModel& sm = m.servers[server];
  absl::StrAppend(&msg, "; its best placement (", ShardingTypeName(best.type),
                  ") leaves server ", sm.address, " short by ",
                  HumanBytes(short_bytes), " (",
                  HumanBytes(static_cast<double>(sm.usable_bytes)), " usable, ",
                  HumanBytes(partition.loads()[server].bytes_stored()),
                  " taken by other tables)");

  // Everything the job needs against everything the servers have.
  double need = 0, have = 0, largest = 0;
  for (const TableModel& other : m.tables) {
    need += WholeUnitLoad(other, 0, other.dim).bytes_stored();
  }
  need += FixedBytesPerServer(m) * m.servers.size();
  for (const ServerModel& s : m.servers) {
    have += static_cast<double>(s.usable_bytes);
    largest = std::max(largest, static_cast<double>(s.usable_bytes));
  }
  std::vector<std::string> fixes;
  const int more =
      std::max(1, static_cast<int>(std::ceil((need - have) / largest)));
  fixes.push_back(absl::StrCat(
      "add ", need > have ? "at least " : "", more, " more server(s) of ",
      HumanBytes(largest), " usable (the job needs ", HumanBytes(need),
      ", the ", m.servers.size(), " servers have ", HumanBytes(have), ")"));
  if ((tm.pinned_type != v1::SHARDING_TYPE_UNSPECIFIED &&
       tm.pinned_type != v1::ROW_WISE) ||
      tm.servers_pinned) {
    fixes.push_back(
        absl::StrCat("let it go row-wise over all servers (drop its pinned ",
                     tm.servers_pinned ? "servers" : "type", ")"));
  }
  const double saved =
      static_cast<double>(tm.rows) *
      (row_bytes - StoredRowBytes(tm.optimizer, tm.dim, v1::FP16));
  // (Narrow rows may save nothing: rows pad to 16 bytes.)
  if (tm.precision != v1::FP16 && tm.precision != v1::BF16 && saved > 0) {
    fixes.push_back(absl::StrCat(
        "store it as FP16 or BF16 (`precision: FP16` in its table config; "
        "saves ", HumanBytes(saved), ")"));
  }
  if (m.memory_reserve_fraction > 0) {
    fixes.push_back(absl::StrCat("lower memory_reserve_fraction (",
                                 m.memory_reserve_fraction, ")"));
  }
  absl::StrAppend(&msg, ". To fit: ", absl::StrJoin(fixes, "; or "));
  return absl::ResourceExhaustedError(msg);
}

v1::ShardingPlan ToPlan(const Model& m, const Proposal& best) {
  v1::ShardingPlan plan;
  plan.set_format_version(kPlanFormatVersion);
  plan.set_num_slots(m.num_slots);
  for (const ServerModel& s : m.servers) plan.add_servers(s.address);
  const std::vector<uint32_t> global = GlobalSlotOwner(m);
  plan.mutable_slot_owner()->Add(global.begin(), global.end());
  std::vector<Load> loads(m.servers.size());
  for (Load& l : loads)
    l.index_bytes = FixedBytesPerServer(m);
  int64_t total_rows = 0;
  for (const Placement& p : best.placements) {
    const TableModel& tm = m.tables[p.table];
    v1::TablePlan* tp = plan.add_tables();
    tp->set_table(tm.name);
    tp->set_dim(tm.dim);
    tp->set_type(p.type);
    tp->set_precision(tm.precision);
    if (p.type == v1::TABLE_WISE)
      tp->set_server(static_cast<uint32_t>(p.server));
    tp->mutable_slot_owner()->Add(p.slot_owner.begin(), p.slot_owner.end());
    for (const Placement::Group& g : p.groups) {
      v1::ColumnGroupPlan* gp = tp->add_column_groups();
      gp->set_column_begin(g.column_begin);
      gp->set_column_end(g.column_end);
      gp->set_server(static_cast<uint32_t>(g.server));
      *gp->mutable_estimate() = ToEstimate(g.load);
    }
    *tp->mutable_estimate() = ToEstimate(p.total);
    tp->set_reason(p.reason);
    for (const auto& [s, l] : p.parts) loads[s] += l;
    total_rows += tm.rows;
  }
  int64_t usable = 0;
  double max_step = 0;
  for (size_t s = 0; s < m.servers.size(); ++s) {
    const ServerModel& sm = m.servers[s];
    v1::ServerEstimate* se = plan.add_server_estimates();
    se->set_address(sm.address);
    se->set_usable_bytes(sm.usable_bytes);
    *se->mutable_load() = ToEstimate(loads[s]);
    se->set_rows_touched_per_step(loads[s].rows_touched);
    const StepTime st = StepTimeOf(loads[s], sm);
    se->set_network_seconds(st.network_seconds);
    se->set_compute_seconds(st.compute_seconds);
    se->set_step_seconds(st.step_seconds);
    max_step = std::max(max_step, st.step_seconds);
    usable += sm.usable_bytes;
  }
  plan.set_predicted_step_seconds(max_step);
  plan.set_proposer(best.proposer);
  v1::PlanInputs* in = plan.mutable_inputs();
  in->set_num_tables(static_cast<int>(m.tables.size()));
  in->set_num_servers(static_cast<int>(m.servers.size()));
  in->set_num_workers(m.num_workers);
  in->set_batch_size(m.batch_size);
  in->set_total_rows(total_rows);
  in->set_total_usable_bytes(usable);
  in->set_memory_reserve_fraction(m.memory_reserve_fraction);
  return plan;
}

}  // namespace

absl::StatusOr<v1::ShardingPlan> PlanSharding(const PlannerInput& input) {
  ASSIGN_OR_RETURN(const Model model, BuildModel(input));
  std::vector<Proposal> proposals;
  const int n = static_cast<int>(model.tables.size());
  proposals.push_back(ProposeGreedy(model, GreedyOrder::kBytes, kAllTypes, n,
                                    "greedy-by-bytes"));
  proposals.push_back(ProposeGreedy(model, GreedyOrder::kTraffic, kAllTypes, n,
                                    "greedy-by-traffic"));
  proposals.push_back(ProposeGreedy(model, GreedyOrder::kBytes,
                                    1u << v1::ROW_WISE, n,
                                    "row-wise-everywhere"));
  // The k busiest tables choose freely, the rest stay whole where they fit.
  for (int k = 0; k < n; k = k == 0 ? 1 : k * 2) {
    proposals.push_back(ProposeGreedy(model, GreedyOrder::kTraffic, kAllTypes,
                                      k, absl::StrCat("table-wise-after-", k)));
  }
  const Proposal* best = nullptr;
  for (const Proposal& p : proposals) {
    if (p.failed_table >= 0) continue;
    if (best == nullptr || p.max_step < best->max_step ||
        (p.max_step == best->max_step &&
         p.max_memory_use < best->max_memory_use)) {
      best = &p;
    }
  }
  if (best == nullptr) return NothingFits(model, proposals.front());
  return ToPlan(model, *best);
}

PlannerInput PlannerInputFromJob(const v1::JobConfig& job,
                                 const v1::PlanSpec& spec) {
  PlannerInput in;
  in.tables.assign(job.tables().begin(), job.tables().end());
  in.hints.assign(spec.hints().begin(), spec.hints().end());
  in.topology = spec.topology();
  if (spec.has_memory_reserve_fraction()) {
    in.memory_reserve_fraction = spec.memory_reserve_fraction();
  }
  // Ids per sample: each feature adds one bag; synthetic data says how big.
  absl::flat_hash_map<std::string, double> pooling;
  absl::flat_hash_map<std::string, int64_t> distinct;
  const bool synthetic = job.data().has_synthetic();
  for (int f = 0; f < job.features_size(); ++f) {
    const std::string& table = job.features(f).table();
    double bag = 1;
    if (synthetic && f < job.data().synthetic().features_size()) {
      const v1::SyntheticFeatureConfig& sf = job.data().synthetic().features(f);
      bag = std::max(1.0, (sf.min_ids_per_bag() + sf.max_ids_per_bag()) / 2.0);
      distinct[table] = std::max(distinct[table], sf.id_space());
    }
    if (job.data().has_criteo() &&
        f < job.data().criteo().hash_buckets_size()) {
      distinct[table] =
          std::max(distinct[table], job.data().criteo().hash_buckets(f));
    }
    pooling[table] += bag;
  }
  for (const v1::TableConfig& t : job.tables()) {
    if (auto it = pooling.find(t.name()); it != pooling.end()) {
      in.default_pooling.emplace_back(t.name(), it->second);
    }
    if (auto it = distinct.find(t.name());
        it != distinct.end() && it->second > 0) {
      in.default_distinct_ids.emplace_back(t.name(), it->second);
    }
  }
  return in;
}

absl::StatusOr<v1::ShardMap> PlanToShardMap(const v1::ShardingPlan& plan,
                                            uint64_t epoch) {
  if (plan.format_version() > kPlanFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("plan format_version ",
                                                   plan.format_version(),
                                                   " is newer than this "
                                                   "binary understands (",
                                                   kPlanFormatVersion, ")"));
  }
  v1::ShardMap map;
  map.set_epoch(epoch);
  map.set_num_slots(plan.num_slots());
  *map.mutable_servers() = plan.servers();
  *map.mutable_slot_owner() = plan.slot_owner();
  for (const v1::TablePlan& t : plan.tables()) {
    switch (t.type()) {
      case v1::TABLE_WISE: {
        v1::TableRouting* r = map.add_tables();
        r->set_table(t.table());
        r->set_owner(t.server());
        break;
      }
      case v1::ROW_WISE:
        if (t.slot_owner_size() > 0) {
          v1::TableRouting* r = map.add_tables();
          r->set_table(t.table());
          *r->mutable_slot_owner() = t.slot_owner();
        }
        break;
      case v1::COLUMN_WISE: {
        // Each group becomes a table of its own on its server
        // (ColumnGroupTableName); FromProto below checks the groups are
        // contiguous from column 0, here that they end at the dim.
        if (t.column_groups_size() == 0 ||
            t.column_groups(t.column_groups_size() - 1).column_end() !=
                t.dim()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "plan: the column groups of table '", t.table(),
              "' do not cover its dim ", t.dim()));
        }
        v1::TableRouting* r = map.add_tables();
        r->set_table(t.table());
        for (const v1::ColumnGroupPlan& g : t.column_groups()) {
          if (g.column_begin() < 0 || g.column_end() < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "plan: table '", t.table(), "' has a negative column"));
          }
          v1::ColumnGroupRouting* gr = r->add_column_groups();
          gr->set_column_begin(static_cast<uint32_t>(g.column_begin()));
          gr->set_column_end(static_cast<uint32_t>(g.column_end()));
          gr->set_owner(g.server());
        }
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("plan: table '", t.table(), "' has no sharding type"));
    }
  }
  if (absl::Status s = ShardMap::FromProto(map).status(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", s.message()));
  }
  return map;
}

}  // namespace recps::planner
