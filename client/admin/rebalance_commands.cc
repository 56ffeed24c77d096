#include "client/admin/rebalance_commands.h"

#include <algorithm>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/admin/report_text.h"
#include "client/coordinator_client.h"
#include "common/human_bytes.h"

namespace recps::client::admin {
namespace {

// "0-3,7,9-10".
std::string SlotRanges(const google::protobuf::RepeatedField<uint32_t>& slots) {
  std::vector<std::string> parts;
  for (int i = 0; i < slots.size();) {
    int j = i;
    while (j + 1 < slots.size() && slots[j + 1] == slots[j] + 1) ++j;
    parts.push_back(i == j ? absl::StrCat(slots[i]) : absl::StrCat(slots[i], "-", slots[j]));
    i = j + 1;
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ",");
}

std::string What(const google::protobuf::RepeatedField<uint32_t>& slots,
                 const google::protobuf::RepeatedPtrField<std::string>& tables) {
  std::string out;
  if (!slots.empty()) out = absl::StrCat(slots.size(), " slots (", SlotRanges(slots), ")");
  if (!tables.empty()) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", "tables ", absl::StrJoin(tables, ","));
  }
  if (out.size() > 60) out = absl::StrCat(out.substr(0, 57), "...");
  return out;
}

const char* StateName(v1::MoveRecord::State s) {
  switch (s) {
    case v1::MoveRecord::PENDING: return "pending";
    case v1::MoveRecord::COPYING: return "copying";
    case v1::MoveRecord::COPIED: return "copied";
    case v1::MoveRecord::HANDING_OVER: return "handing over";
    case v1::MoveRecord::DONE: return "done";
    case v1::MoveRecord::ABORTED: return "aborted";
    case v1::MoveRecord::FAILED: return "failed";
    default: return "?";
  }
}

void Progress(const v1::ListRebalanceMovesResponse& list, std::ostream& err) {
  const int width = 30;
  const double fraction =
      list.bytes_total() > 0
          ? static_cast<double>(list.bytes_done()) / static_cast<double>(list.bytes_total())
      : list.moves_total() > 0 ? static_cast<double>(list.moves_done()) / list.moves_total()
                               : 1.0;
  const int filled = std::clamp(static_cast<int>(fraction * width), 0, width);
  err << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] "
      << list.moves_done() << "/" << list.moves_total() << " moves, "
      << HumanBytes(list.bytes_done()) << " / " << HumanBytes(list.bytes_total())
      << " copied   " << std::flush;
}

}  // namespace

std::string FormatPlan(const v1::RebalancePlan& plan) {
  std::string out = absl::StrCat("rebalance plan for shard map epoch ", plan.base_epoch());
  if (!plan.drain().empty()) absl::StrAppend(&out, ", draining ", absl::StrJoin(plan.drain(), ", "));
  out += "\n";
  TextTable servers({"SERVER", "SLOTS", "TABLES", "ROWS", "BYTES", "LOAD/S", "->", "SLOTS",
                     "TABLES", "ROWS", "BYTES", "LOAD/S"});
  for (int i = 0; i < plan.servers_after_size(); ++i) {
    const v1::ServerLoad& a = plan.servers_after(i);
    const v1::ServerLoad b = i < plan.servers_before_size() ? plan.servers_before(i) : a;
    servers.AddRow({absl::StrCat(a.address(), a.new_server() ? " (new)" : "",
                                 a.draining() ? " (drain)" : ""),
                    absl::StrCat(b.slots()), absl::StrCat(b.tables()), absl::StrCat(b.rows()),
                    HumanBytes(b.bytes()), absl::StrFormat("%.0f", b.load()), "->",
                    absl::StrCat(a.slots()), absl::StrCat(a.tables()), absl::StrCat(a.rows()),
                    HumanBytes(a.bytes()), absl::StrFormat("%.0f", a.load())});
  }
  out += servers.Render();
  absl::StrAppend(
      &out,
      absl::StrFormat("imbalance (max/mean): rows %.2f -> %.2f, bytes %.2f -> %.2f, "
                      "load %.2f -> %.2f\n",
                      plan.before().rows(), plan.after().rows(), plan.before().bytes(),
                      plan.after().bytes(), plan.before().load(), plan.after().load()));
  if (plan.moves_size() > 0) {
    TextTable moves({"SOURCE", "TARGET", "MOVES", "ROWS", "BYTES"});
    for (const v1::SlotMove& m : plan.moves()) {
      moves.AddRow({m.source(), m.target(), What(m.slots(), m.tables()),
                    absl::StrCat(m.rows()), HumanBytes(m.bytes())});
    }
    out += moves.Render();
    absl::StrAppend(
        &out,
        absl::StrFormat("to move: %d slots, %d tables, %d rows, %s; estimated %.1fs at %s/s (%s)\n",
                        plan.slots_to_move(), plan.tables_to_move(), plan.rows_to_move(),
                        HumanBytes(plan.bytes_to_move()), plan.estimated_seconds(),
                        HumanBytes(static_cast<int64_t>(plan.move_bytes_per_second())),
                        plan.move_rate_measured() ? "measured" : "assumed, --move_rate_estimate"));
  }
  for (const std::string& note : plan.notes()) absl::StrAppend(&out, "note: ", note, "\n");
  return out;
}

std::string FormatMoves(const v1::ListRebalanceMovesResponse& list, absl::Time now) {
  (void)now;
  std::string out;
  if (list.moves().empty()) {
    out = "no moves yet\n";
  } else {
    // KIND: "move" changes owners; "backup" (re-replication) makes the
    // target a new backup of units the source keeps owning.
    TextTable table(
        {"MOVE", "KIND", "STATE", "SOURCE", "TARGET", "WHAT", "BYTES", "EPOCH", "NOTE"});
    for (const v1::MoveRecord& r : list.moves()) {
      std::string note = !r.error().empty() ? r.error() : r.resolved();
      if (note.empty() && r.state() == v1::MoveRecord::DONE) {
        note = absl::StrFormat("copy %.2fs, %d rows at hand-over, held %.3fs", r.copy_seconds(),
                               r.delta_rows(), r.hold_seconds());
      }
      if (note.size() > 100) note = absl::StrCat(note.substr(0, 97), "...");
      table.AddRow({r.move_id(), r.add_backup() ? "backup" : "move", StateName(r.state()),
                    r.source(), r.target(),
                    What(r.slots(), r.tables()),
                    HumanBytes(r.copied_bytes() > 0 ? r.copied_bytes() : r.bytes()),
                    r.epoch() > 0 ? absl::StrCat(r.epoch()) : "-", note.empty() ? "-" : note});
    }
    out = table.Render();
  }
  if (!list.running().empty()) {
    absl::StrAppend(&out, "running: ", list.running(), ", ", list.moves_done(), " of ",
                    list.moves_total(), " moves finished, ", HumanBytes(list.bytes_done()),
                    " of ", HumanBytes(list.bytes_total()), " copied\n");
  }
  if (!list.last_outcome().empty()) absl::StrAppend(&out, "last rebalance: ", list.last_outcome(), "\n");
  if (list.move_bytes_per_second() > 0) {
    absl::StrAppend(&out, "measured move rate: ",
                    HumanBytes(static_cast<int64_t>(list.move_bytes_per_second())), "/s\n");
  }
  return out;
}

int RunRebalance(const RebalanceCommandOptions& options, std::ostream& out,
                 std::ostream& err) {
  CoordinatorClient client(options.coordinator, CommandOptions(options.rpc_timeout));
  v1::PlanRebalanceRequest request;
  for (const std::string& d : options.drain) request.add_drain(d);
  request.set_max_bytes(options.max_bytes);
  request.set_max_moves(options.max_moves);
  absl::StatusOr<v1::PlanRebalanceResponse> plan = client.PlanRebalance(request);
  if (!plan.ok()) {
    err << "recpsctl: " << plan.status().message() << "\n";
    return 1;
  }
  if (!options.apply) {
    if (options.json) return PrintJson(plan->plan(), out, err);
    out << FormatPlan(plan->plan());
    if (plan->plan().moves_size() > 0) out << "(nothing moved: add --apply to carry it out)\n";
    return 0;
  }
  if (!options.json) out << FormatPlan(plan->plan());
  if (plan->plan().moves_size() == 0) {
    if (options.json) return PrintJson(v1::ListRebalanceMovesResponse(), out, err);
    return 0;
  }
  v1::ApplyRebalanceRequest apply;
  *apply.mutable_plan() = plan->plan();
  apply.set_max_bytes_per_second(options.max_bytes_per_second);
  absl::StatusOr<v1::ApplyRebalanceResponse> started = client.ApplyRebalance(apply);
  if (!started.ok()) {
    err << "recpsctl: " << started.status().message() << "\n";
    return 1;
  }
  const std::string id = started->rebalance_id();
  if (!options.json) out << "applying rebalance " << id << ": " << started->moves() << " move(s)\n" << std::flush;
  const absl::Time deadline = absl::Now() + options.wait_timeout;
  v1::ListRebalanceMovesResponse list;
  // A coordinator that stops answering is reported, not waited out: each
  // ListMoves already retries an unreachable coordinator for rpc_timeout
  // (30 s by default, enough for a restart on its state dir), so one that
  // has not answered for that long is lost. Before, failed polls were
  // skipped silently and the bar sat at 0% until --timeout (1 h).
  absl::Time last_answer = absl::Now();
  while (true) {
    absl::StatusOr<v1::ListRebalanceMovesResponse> l = client.ListMoves();
    if (l.ok()) {
      last_answer = absl::Now();
      list = *std::move(l);
      if (options.progress && list.running() == id) Progress(list, err);
      if (list.running() != id) break;
    } else if (absl::Now() - last_answer >= options.rpc_timeout) {
      if (options.progress) err << "\n";
      err << "recpsctl: lost the coordinator while rebalance " << id
          << " ran: " << l.status().message() << " (no answer for "
          << absl::FormatDuration(absl::Now() - last_answer)
          << "). A coordinator restarted on its state dir resolves the moves "
             "it finds in flight: `recpsctl moves` shows the outcome\n";
      return 1;
    }
    if (absl::Now() > deadline) {
      if (options.progress) err << "\n";
      err << "recpsctl: rebalance " << id << " still running after "
          << absl::FormatDuration(options.wait_timeout)
          << " (--timeout); it goes on: `recpsctl moves` shows it\n";
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  // This rebalance's moves only.
  v1::ListRebalanceMovesResponse mine;
  int done = 0, total = 0;
  for (const v1::MoveRecord& r : list.moves()) {
    if (r.rebalance_id() != id) continue;
    *mine.add_moves() = r;
    ++total;
    done += r.state() == v1::MoveRecord::DONE;
  }
  mine.set_last_outcome(list.last_outcome());
  mine.set_move_bytes_per_second(list.move_bytes_per_second());
  if (options.progress) {
    mine.set_moves_done(total);
    mine.set_moves_total(total);
    int64_t bytes = 0;
    for (const v1::MoveRecord& r : mine.moves()) bytes += r.bytes();
    mine.set_bytes_done(bytes);
    mine.set_bytes_total(bytes);
    Progress(mine, err);
    err << "\n";
    mine.set_moves_done(0);
    mine.set_moves_total(0);
    mine.set_bytes_done(0);
    mine.set_bytes_total(0);
  }
  const int code = done == total ? 0 : 1;
  if (options.json) {
    const int printed = PrintJson(mine, out, err);
    return printed != 0 ? printed : code;
  }
  out << FormatMoves(mine, absl::Now());
  return code;
}

int RunMoves(const RebalanceCommandOptions& options, std::ostream& out, std::ostream& err) {
  CoordinatorClient client(options.coordinator, CommandOptions(options.rpc_timeout));
  absl::StatusOr<v1::ListRebalanceMovesResponse> list = client.ListMoves();
  if (!list.ok()) {
    err << "recpsctl: " << list.status().message() << "\n";
    return 1;
  }
  if (options.json) return PrintJson(*list, out, err);
  out << FormatMoves(*list, absl::Now());
  return 0;
}

}  // namespace recps::client::admin
