// FormatPlan: the plan as two tables for people.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/planner/cost_model.h"
#include "server/planner/planner.h"
#include "server/planner/proposer.h"

namespace recps::planner {
namespace {

std::string ServerName(const v1::ShardingPlan& plan, uint32_t index) {
  return index < static_cast<uint32_t>(plan.servers_size())
             ? plan.servers(index)
             : absl::StrCat("#", index);
}

}  // namespace

std::string FormatPlan(const v1::ShardingPlan& plan) {
  std::string out = absl::StrFormat(
      "plan %d (format %d, proposer %s): %d tables on %d servers, %d slots; "
      "predicted step %.3f ms\n",
      plan.plan_id(), plan.format_version(), plan.proposer(),
      plan.tables_size(), plan.servers_size(), plan.num_slots(),
      plan.predicted_step_seconds() * 1e3);
  absl::StrAppendFormat(&out, "%-24s %-12s %6s %5s %12s %11s %12s  %s\n",
                        "TABLE", "TYPE", "DIM", "PREC", "ROWS", "STORED",
                        "IDS/STEP", "PLACEMENT (reason)");
  for (const v1::TablePlan& t : plan.tables()) {
    std::string where;
    switch (t.type()) {
      case v1::TABLE_WISE:
        where = ServerName(plan, t.server());
        break;
      case v1::ROW_WISE:
        where = t.slot_owner_size() > 0 ? "own slot layout" : "all servers";
        break;
      case v1::COLUMN_WISE: {
        std::vector<std::string> groups;
        for (const v1::ColumnGroupPlan& g : t.column_groups()) {
          groups.push_back(absl::StrCat("[", g.column_begin(), ",",
                                        g.column_end(), ")@",
                                        ServerName(plan, g.server())));
        }
        where = absl::StrJoin(groups, " ");
        break;
      }
      default:
        where = "?";
    }
    absl::StrAppendFormat(
        &out, "%-24s %-12s %6d %5s %12d %11s %12.0f  %s (%s)\n", t.table(),
        ShardingTypeName(t.type()), t.dim(),
        RowPrecisionName(KernelPrecision(t.precision())),
        t.estimate().rows(),
        HumanBytes(static_cast<double>(t.estimate().bytes_stored())),
        t.estimate().lookup_ids_per_step(), where, t.reason());
  }
  absl::StrAppendFormat(&out, "%-24s %11s %11s %6s %12s %12s %10s\n", "SERVER",
                        "STORED", "USABLE", "USE", "NET/STEP", "ROWS/STEP",
                        "STEP ms");
  for (const v1::ServerEstimate& s : plan.server_estimates()) {
    const double stored = static_cast<double>(s.load().bytes_stored());
    absl::StrAppendFormat(
        &out, "%-24s %11s %11s %5.1f%% %12s %12.0f %10.3f\n", s.address(),
        HumanBytes(stored), HumanBytes(static_cast<double>(s.usable_bytes())),
        s.usable_bytes() > 0
            ? 100 * stored / static_cast<double>(s.usable_bytes())
            : 0,
        HumanBytes(s.load().lookup_bytes_per_step() +
                   s.load().update_bytes_per_step()),
        s.rows_touched_per_step(), s.step_seconds() * 1e3);
  }
  return out;
}

}  // namespace recps::planner
