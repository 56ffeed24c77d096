#include "client/admin/report_text.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"

namespace recps::client::admin {
namespace {

// "12", "-3.5", "40.0%", "1.50 KiB", or "-" (nothing to show).
bool IsNumberCell(const std::string& cell) {
  if (cell == "-") return true;
  size_t i = cell.size() > 1 && cell[0] == '-' ? 1 : 0;
  const size_t first_digit = i;
  int dots = 0;
  for (; i < cell.size(); ++i) {
    if (cell[i] == '.') {
      ++dots;
    } else if (!absl::ascii_isdigit(cell[i])) {
      break;
    }
  }
  if (i == first_digit || dots > 1) return false;
  const std::string rest = cell.substr(i);
  if (rest.empty() || rest == "%") return true;
  // A unit: " KiB", " s".
  if (rest.size() < 2 || rest[0] != ' ') return false;
  for (size_t j = 1; j < rest.size(); ++j) {
    if (!absl::ascii_isalpha(rest[j])) return false;
  }
  return true;
}

std::string StateName(v1::MemberState state) {
  switch (state) {
    case v1::ALIVE:
      return "alive";
    case v1::EXPIRED:
      return "expired";
    case v1::LEFT:
      return "left";
    default:
      return "-";
  }
}

std::string RoleName(v1::MemberRole role) {
  switch (role) {
    case v1::SHARD_SERVER:
      return "shard";
    case v1::WORKER:
      return "worker";
    default:
      return "-";
  }
}

// ", 2 copies of each row" (", 3 under-replicated"), or "" for one copy.
std::string ReplicasText(uint32_t replication, int64_t under_replicated) {
  if (replication <= 1) return "";
  return absl::StrCat(", ", replication, " copies of each row",
                      under_replicated > 0
                          ? absl::StrCat(" (", under_replicated, " units under-replicated)")
                          : "");
}

std::string Fixed(double v, int digits) {
  return absl::StrFormat("%.*f", digits, v);
}

// A latency column: "-" when there were no requests to measure.
std::string Ms(const v1::LatencySummary& l, double ms) {
  return l.count() > 0 ? Fixed(ms, ms < 10 ? 2 : 1) : "-";
}

std::string Ago(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  const absl::Duration d = absl::Now() - absl::FromUnixMillis(unix_ms);
  return absl::StrCat(Fixed(absl::ToDoubleSeconds(d), 1), "s ago");
}

}  // namespace

TextTable::TextTable(std::vector<std::string> header) {
  rows_.push_back(std::move(header));
}

void TextTable::AddRow(std::vector<std::string> cells) {
  cells.resize(rows_[0].size());
  rows_.push_back(std::move(cells));
}

std::string TextTable::Render() const {
  const size_t columns = rows_[0].size();
  std::vector<size_t> width(columns, 0);
  std::vector<bool> right(columns, rows_.size() > 1);
  for (size_t r = 0; r < rows_.size(); ++r) {
    for (size_t c = 0; c < columns; ++c) {
      width[c] = std::max(width[c], rows_[r][c].size());
      if (r > 0 && !IsNumberCell(rows_[r][c])) right[c] = false;
    }
  }
  std::string out;
  for (const std::vector<std::string>& row : rows_) {
    std::string line;
    for (size_t c = 0; c < columns; ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      if (c > 0) line += "  ";
      line += right[c] ? pad + row[c] : row[c] + (c + 1 < columns ? pad : "");
    }
    out += line + "\n";
  }
  return out;
}

std::string FormatClusterStatus(const v1::ClusterStatus& status) {
  std::string out;
  int alive = 0, expired = 0, left = 0;
  for (const v1::Member& m : status.members()) {
    alive += m.state() == v1::ALIVE;
    expired += m.state() == v1::EXPIRED;
    left += m.state() == v1::LEFT;
  }
  int problems = status.problems_size();
  for (const v1::ServerStatus& s : status.servers())
    problems += s.problems_size();

  TextTable head({"", ""});
  if (!status.coordinator().empty()) {
    head.AddRow({"coordinator", status.coordinator()});
    head.AddRow(
        {"members", absl::StrCat(alive, " alive, ", expired, " expired, ", left,
                                 " left (",
                                 status.expected_shard_servers(),
                                 " shard servers expected)")});
  }
  head.AddRow(
      {"shard map", status.shard_map_epoch() == 0
                        ? std::string("none yet")
                        : absl::StrCat("epoch ", status.shard_map_epoch(), ", ",
                                       status.num_slots(), " slots",
                                       ReplicasText(status.replication(),
                                                    status.under_replicated_units()))});
  if (!status.sharding().empty()) head.AddRow({"sharding", status.sharding()});
  head.AddRow({"health", status.healthy()
                             ? std::string("healthy")
                             : absl::StrCat("UNHEALTHY (", problems, " problem",
                                            problems == 1 ? "" : "s", ")")});
  head.AddRow(
      {"rows", absl::StrCat(status.total_rows(), " (",
                            HumanBytes(status.total_row_bytes()), ")")});
  head.AddRow(
      {"imbalance",
       absl::StrCat("rows ", Fixed(status.rows_imbalance(), 2),
                    ", lookup ids/s ", Fixed(status.lookup_imbalance(), 2),
                    " (max/mean over servers)")});
  head.AddRow(
      {"rates",
       status.sample_seconds() > 0
           ? absl::StrCat("over ", Fixed(status.sample_seconds(), 2), " s")
           : std::string("averages since each server started")});
  // The header table has no header row of its own: drop its first line.
  const std::string rendered = head.Render();
  out += rendered.substr(rendered.find('\n') + 1);

  TextTable servers({"SERVER", "MEMBER", "STATE", "EPOCH", "SLOTS", "ROWS",
                     "ROW MEM", "RSS", "STEP", "LOOKUP IDS/S", "LOOKUPS/S",
                     "P50 MS", "P99 MS", "PUSHES/S", "PUSH P99 MS"});
  for (const v1::ServerStatus& s : status.servers()) {
    const std::string member = s.member_id().empty() ? "-" : s.member_id();
    if (!s.reachable()) {
      servers.AddRow({s.address(), member, "unreachable", "-",
                      absl::StrCat(s.slots()), "-", "-", "-", "-", "-", "-",
                      "-", "-", "-", "-"});
      continue;
    }
    const std::string state =
        s.member_id().empty() ? "up" : StateName(s.member_state());
    servers.AddRow(
        {s.address(), member, state, absl::StrCat(s.shard_map_epoch()),
         absl::StrCat(s.slots()), absl::StrCat(s.rows()),
         HumanBytes(s.row_bytes()), HumanBytes(s.resident_bytes()),
         absl::StrCat(s.applied_step()), Fixed(s.lookup_ids_per_second(), 1),
         Fixed(s.lookup().per_second(), 1), Ms(s.lookup(), s.lookup().p50_ms()),
         Ms(s.lookup(), s.lookup().p99_ms()), Fixed(s.push().per_second(), 1),
         Ms(s.push(), s.push().p99_ms())});
  }
  out += "\n" + servers.Render();

  if (status.members_size() > 0) {
    TextTable members(
        {"MEMBER", "ROLE", "ADDRESS", "RANK", "STATE", "LAST HEARTBEAT"});
    for (const v1::Member& m : status.members()) {
      members.AddRow({m.member_id(), RoleName(m.role()),
                      m.address().empty() ? "-" : m.address(),
                      m.rank() >= 0 ? absl::StrCat(m.rank()) : "-",
                      StateName(m.state()), Ago(m.last_heartbeat_unix_ms())});
    }
    out += "\n" + members.Render();
  }

  if (!status.moves_in_flight().empty() || !status.rebalance_running().empty()) {
    out += absl::StrCat("\nrebalance ",
                        status.rebalance_running().empty() ? "(none running)"
                                                           : status.rebalance_running(),
                        ": ", status.moves_in_flight_size(), " move(s) in flight\n");
    TextTable moves({"MOVE", "KIND", "STATE", "SOURCE", "TARGET", "SLOTS", "TABLES"});
    for (const v1::MoveRecord& r : status.moves_in_flight()) {
      moves.AddRow({r.move_id(), r.add_backup() ? "backup" : "move",
                    v1::MoveRecord::State_Name(r.state()), r.source(),
                    r.target(), absl::StrCat(r.slots_size()), absl::StrCat(r.tables_size())});
    }
    out += moves.Render();
  } else if (!status.last_rebalance().empty()) {
    out += absl::StrCat("\nlast rebalance: ", status.last_rebalance(), "\n");
  }

  if (problems > 0) {
    out += "\nproblems:\n";
    for (const std::string& p : status.problems())
      out += absl::StrCat("  ", p, "\n");
    for (const v1::ServerStatus& s : status.servers()) {
      for (const std::string& p : s.problems()) {
        out += absl::StrCat("  ", s.address(), ": ", p, "\n");
      }
    }
  }
  return out;
}

std::string FormatTablesReport(const v1::TablesReport& report) {
  std::string out =
      absl::StrCat("shard map epoch ", report.shard_map_epoch(), "\n\n");
  TextTable tables(
      {"TABLE", "DIM", "ROWS", "BYTES", "LOOKUP IDS", "UPDATE IDS", "SERVERS"});
  TextTable placement({"TABLE", "SERVER", "ROWS", "BYTES", "SHARE"});
  for (const v1::TableReport& t : report.tables()) {
    tables.AddRow({t.name(), absl::StrCat(t.dim()), absl::StrCat(t.rows()),
                   HumanBytes(t.bytes()), absl::StrCat(t.lookup_ids()),
                   absl::StrCat(t.update_ids()),
                   absl::StrCat(t.servers_size())});
    for (const v1::TablePlacement& p : t.servers()) {
      const double share = t.rows() > 0 ? 100.0 * p.rows() / t.rows() : 0;
      placement.AddRow({t.name(), p.server(), absl::StrCat(p.rows()),
                        HumanBytes(p.bytes()),
                        absl::StrCat(Fixed(share, 1), "%")});
    }
  }
  out += tables.Render() + "\n" + placement.Render();
  if (report.unreachable_size() > 0) {
    out += absl::StrCat("\nnot answering (their rows are missing above): ",
                        absl::StrJoin(report.unreachable(), ", "), "\n");
  }
  return out;
}

std::string FormatShardsReport(const v1::ShardsReport& report, bool per_slot) {
  std::string out =
      report.shard_map_epoch() == 0
          ? std::string("no shard map yet\n\n")
          : absl::StrCat("shard map epoch ", report.shard_map_epoch(), ", ",
                         report.num_slots(), " slots",
                         ReplicasText(report.replication(),
                                      report.under_replicated_units()),
                         "\n\n");
  const bool replicated = report.replication() > 1;
  std::vector<std::string> columns = {"INDEX", "SERVER", "SLOTS", "ROWS", "SLOT RANGES"};
  if (replicated) columns.push_back("BACKUP OF SLOTS");
  TextTable servers(columns);
  for (const v1::ServerShards& s : report.servers()) {
    std::vector<std::string> row = {
        s.index() >= 0 ? absl::StrCat(s.index()) : "-", s.address(),
        absl::StrCat(s.slot_count()), s.error().empty() ? absl::StrCat(s.rows()) : "-",
        s.slot_ranges().empty() ? "-" : s.slot_ranges()};
    if (replicated) {
      row.push_back(s.backup_slot_ranges().empty() ? "-" : s.backup_slot_ranges());
    }
    servers.AddRow(std::move(row));
  }
  out += servers.Render();
  if (report.routed_tables_size() > 0) {
    out +=
        "\ntables with their own routing (the slot ranges above route the "
        "others):\n";
    TextTable routed({"TABLE", "LAYOUT", "SERVERS"});
    for (const v1::RoutedTable& t : report.routed_tables()) {
      routed.AddRow({t.table(), t.layout(), absl::StrJoin(t.servers(), ",")});
    }
    out += routed.Render();
  }
  if (per_slot) {
    TextTable slots({"SLOT", "SERVER", "ROWS"});
    for (const v1::ServerShards& s : report.servers()) {
      for (const v1::SlotStats& slot : s.slots()) {
        slots.AddRow({absl::StrCat(slot.slot()), s.address(),
                      absl::StrCat(slot.rows())});
      }
    }
    out += "\n" + slots.Render();
  }
  bool header = false;
  for (const v1::ServerShards& s : report.servers()) {
    if (s.error().empty()) continue;
    if (!header) out += "\nnot answering:\n";
    header = true;
    out += absl::StrCat("  ", s.address(), ": ", s.error(), "\n");
  }
  return out;
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status =
      google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot print JSON: ", status.ToString()));
  }
  return json;
}

int PrintJson(const google::protobuf::Message& message, std::ostream& out,
              std::ostream& err) {
  absl::StatusOr<std::string> json = ToJson(message);
  if (!json.ok()) {
    err << "recpsctl: " << json.status().message() << "\n";
    return 1;
  }
  out << *json;
  if (json->empty() || json->back() != '\n') out << "\n";
  return 0;
}

}  // namespace recps::client::admin
