#include "client/admin/checkpoint_file_commands.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/checkpoint/chain.h"
#include "server/checkpoint/compact.h"
#include "server/checkpoint/export.h"

namespace recps::client::admin {
namespace {

namespace ck = server::checkpoint;

// A progress line on stderr at most once a second.
class Progress {
 public:
  explicit Progress(std::string what) : what_(std::move(what)) {}
  void Report(int64_t done, int64_t total) {
    const absl::Time now = absl::Now();
    if (now - last_ < absl::Seconds(1)) return;
    last_ = now;
    if (total > 0) {
      std::fprintf(stderr, "%s: %lld of at most %lld rows\n", what_.c_str(),
                   static_cast<long long>(done), static_cast<long long>(total));
    } else {
      std::fprintf(stderr, "%s: %lld rows\n", what_.c_str(),
                   static_cast<long long>(done));
    }
  }

 private:
  std::string what_;
  absl::Time last_ = absl::Now();
};

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<OfflineResult> CompactCheckpoint(const std::string& root,
                                                std::optional<uint64_t> step) {
  Progress progress("compacting");
  ck::CompactOptions options;
  options.progress = [&](int64_t written, int64_t total) {
    progress.Report(written, total);
  };
  ASSIGN_OR_RETURN(const ck::CompactResult r,
                   ck::CompactChain(root, step, options));
  OfflineResult out;
  const ck::CheckpointInfo& c = r.checkpoint;
  if (r.chain_length == 1) {
    out.text = absl::StrCat("checkpoint ", c.dir, " (step ", c.step,
                            ") is already full: nothing to do\n");
  } else {
    out.text = absl::StrCat(
        "compacted ", r.chain_length, " checkpoints into ", c.dir, " (step ",
        c.step, ", full): ", r.rows, " rows, ", r.bytes, " bytes in ",
        c.manifest.files_size(), " files; removed ", r.removed_files.size(),
        " superseded files\n",
        "older checkpoints of the chain stay until pruned\n");
  }
  out.json = absl::StrCat(
      "{\"dir\": ", JsonString(c.dir), ", \"step\": ", c.step,
      ", \"chain_length\": ", r.chain_length, ", \"rows\": ", r.rows,
      ", \"bytes\": ", r.bytes, ", \"files\": ", c.manifest.files_size(),
      ", \"removed_files\": ", r.removed_files.size(), "}\n");
  return out;
}

absl::StatusOr<OfflineResult> ExportCheckpointTable(
    const std::string& ref, const std::string& table,
    const std::string& out_dir) {
  ASSIGN_OR_RETURN(const ck::CheckpointRef parsed, ck::ParseCheckpointRef(ref));
  ASSIGN_OR_RETURN(const std::vector<ck::CheckpointInfo> chain,
                   ck::ResolveChain(parsed));
  Progress progress(absl::StrCat("exporting ", table));
  ck::ExportOptions options;
  options.progress = [&](int64_t rows) { progress.Report(rows, 0); };
  ASSIGN_OR_RETURN(const ck::ExportResult r,
                   ck::ExportTable(chain, table, out_dir, options));
  OfflineResult out;
  out.text = absl::StrCat("exported table '", table, "' at step ", r.step,
                          " (", chain.size(), " checkpoint(s), last ",
                          chain.back().dir, "): ", r.rows, " rows of dim ",
                          r.dim, "\n  ", r.ids_path, "\n  ", r.weights_path,
                          "\n  ", r.meta_path, "\n");
  out.json = absl::StrCat(
      "{\"table\": ", JsonString(table), ", \"step\": ", r.step,
      ", \"rows\": ", r.rows, ", \"dim\": ", r.dim,
      ", \"ids\": ", JsonString(r.ids_path),
      ", \"weights\": ", JsonString(r.weights_path),
      ", \"meta\": ", JsonString(r.meta_path), "}\n");
  return out;
}

}  // namespace recps::client::admin
