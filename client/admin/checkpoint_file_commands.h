// recpsctl's offline checkpoint commands (no cluster: they read and write
// checkpoint files with the format library, server/checkpoint/):
//   recpsctl checkpoint compact --dir=ROOT [--step=N] [--json]
//   recpsctl export OUT_DIR --table=T --dir=ROOT[@STEP] [--json]
#ifndef RECPS_CLIENT_ADMIN_CHECKPOINT_FILE_COMMANDS_H_
#define RECPS_CLIENT_ADMIN_CHECKPOINT_FILE_COMMANDS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace recps::client::admin {

struct OfflineResult {
  std::string text;  // for people
  std::string json;  // one JSON object, for --json
};

// Folds the chain of ROOT's checkpoint at `step` (newest when unset) into
// a full checkpoint in place; progress lines go to stderr.
absl::StatusOr<OfflineResult> CompactCheckpoint(const std::string& root,
                                                std::optional<uint64_t> step);

// Writes table `table`'s weights at `ref` ("ROOT" or "ROOT@STEP") to
// out_dir in the export format (server/checkpoint/export.h).
absl::StatusOr<OfflineResult> ExportCheckpointTable(const std::string& ref,
                                                    const std::string& table,
                                                    const std::string& out_dir);

}  // namespace recps::client::admin

#endif  // RECPS_CLIENT_ADMIN_CHECKPOINT_FILE_COMMANDS_H_
