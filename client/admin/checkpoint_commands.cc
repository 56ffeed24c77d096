#include "client/admin/checkpoint_commands.h"

#include <algorithm>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/admin/report_text.h"
#include "client/coordinator_client.h"
#include "common/human_bytes.h"

namespace recps::client::admin {
namespace {

std::string Age(int64_t created_ms, absl::Time now) {
  if (created_ms <= 0) return "-";
  const int64_t s = std::max<int64_t>(
      0, absl::ToInt64Seconds(now - absl::FromUnixMillis(created_ms)));
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  if (s < 172800) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

const char* KindName(v1::CheckpointKind kind) {
  switch (kind) {
    case v1::CHECKPOINT_KIND_FULL: return "full";
    case v1::CHECKPOINT_KIND_INCREMENTAL: return "incremental";
    default: return "?";
  }
}

}  // namespace

std::string FormatCheckpoints(const v1::ListCheckpointsResponse& list, absl::Time now) {
  if (list.root().empty()) {
    return "checkpoints are off (the job has no training.checkpoint.dir)\n";
  }
  std::string out = absl::StrCat("checkpoints in ", list.root(), "\n");
  if (list.checkpoints().empty()) {
    out += "no complete checkpoint yet\n";
  } else {
    TextTable table({"STEP", "KIND", "BASE", "SIZE", "ROWS", "AGE", "REASON"});
    for (const v1::CheckpointSummary& c : list.checkpoints()) {
      table.AddRow({absl::StrCat(c.step()), KindName(c.kind()),
                    c.kind() == v1::CHECKPOINT_KIND_INCREMENTAL
                        ? absl::StrCat(c.base_step())
                        : "-",
                    HumanBytes(c.size_bytes()), absl::StrCat(c.rows()),
                    Age(c.created_unix_ms(), now), c.reason().empty() ? "-" : c.reason()});
    }
    out += table.Render();
  }
  if (list.has_in_progress() && list.in_progress().step() > 0) {
    const v1::CheckpointProgress& p = list.in_progress();
    out += absl::StrFormat(
        "writing step %d: %d of %d row files, %d of %d rows, for %s\n", p.step(),
        p.files_done(), p.files_total(), p.rows_written(), p.rows_total(),
        Age(p.started_unix_ms(), now));
  }
  if (list.restored_step() > 0) {
    out += absl::StrCat("this run was restored from step ", list.restored_step(), "\n");
  }
  if (!list.last_error().empty()) out += absl::StrCat("last error: ", list.last_error(), "\n");
  return out;
}

int RunCheckpointList(const CheckpointCommandOptions& options, std::ostream& out,
                      std::ostream& err) {
  CoordinatorClient client(options.coordinator, CommandOptions(options.rpc_timeout));
  absl::StatusOr<v1::ListCheckpointsResponse> list = client.ListCheckpoints();
  if (!list.ok()) {
    err << "recpsctl: " << list.status().message() << "\n";
    return 1;
  }
  if (options.json) return PrintJson(*list, out, err);
  out << FormatCheckpoints(*list, absl::Now());
  return 0;
}

int RunCheckpointNow(const CheckpointCommandOptions& options, std::ostream& out,
                     std::ostream& err) {
  CoordinatorClient client(options.coordinator, CommandOptions(options.rpc_timeout));
  uint64_t newest_before = 0;
  std::string error_before;
  if (options.wait) {
    absl::StatusOr<v1::ListCheckpointsResponse> list = client.ListCheckpoints();
    if (!list.ok()) {
      err << "recpsctl: " << list.status().message() << "\n";
      return 1;
    }
    error_before = list->last_error();
    if (!list->checkpoints().empty()) {
      newest_before = list->checkpoints(list->checkpoints_size() - 1).step();
    }
  }
  absl::StatusOr<v1::RequestCheckpointResponse> request =
      client.RequestCheckpoint(options.reason);
  if (!request.ok()) {
    err << "recpsctl: " << request.status().message() << "\n";
    return 1;
  }
  if (!options.wait) {
    if (options.json) return PrintJson(*request, out, err);
    out << "checkpoint requested (request " << request->request_id()
        << "): the workers take it at their next step boundary\n";
    return 0;
  }
  // Any checkpoint completed after the request answers it (a periodic one
  // at the same boundary included).
  const absl::Time deadline = absl::Now() + options.wait_timeout;
  std::string last_error;
  while (true) {
    absl::StatusOr<v1::ListCheckpointsResponse> list = client.ListCheckpoints();
    if (list.ok()) {
      last_error = list->last_error();
      if (!last_error.empty() && last_error != error_before) {
        err << "recpsctl: " << last_error << "\n";
        return 1;
      }
      for (const v1::CheckpointSummary& c : list->checkpoints()) {
        if (c.step() <= newest_before) continue;
        if (options.json) return PrintJson(c, out, err);
        out << "checkpoint at step " << c.step() << " complete: " << c.dir() << " ("
            << HumanBytes(c.size_bytes()) << ", " << c.rows() << " rows)\n";
        return 0;
      }
    } else if (absl::Now() > deadline) {
      err << "recpsctl: " << list.status().message() << "\n";
      return 1;
    }
    if (absl::Now() > deadline) {
      err << "recpsctl: no checkpoint completed within "
          << absl::FormatDuration(options.wait_timeout) << " (--timeout)"
          << (last_error.empty() ? "" : absl::StrCat("; the coordinator's last error: ",
                                                     last_error))
          << "\n";
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

}  // namespace recps::client::admin
