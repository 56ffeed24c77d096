// Checkpoint chains (format library): an incremental checkpoint holds only
// the rows changed since the checkpoint at its base_step, so restoring it
// needs its chain: the full checkpoint at its full_step, then every
// increment after it, up to itself, oldest first (later ones override).
#ifndef RECPS_SERVER_CHECKPOINT_CHAIN_H_
#define RECPS_SERVER_CHECKPOINT_CHAIN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_system.h"
#include "server/checkpoint/manifest.h"

namespace recps::server::checkpoint {

// A checkpoint as the user names it: "ROOT" (the newest complete one) or
// "ROOT@STEP".
struct CheckpointRef {
  std::string root;
  std::optional<uint64_t> step;
};

// Parses "ROOT[@STEP]" (the last '@' followed only by digits splits it).
// INVALID_ARGUMENT for an empty root or a non-numeric step after '@'.
absl::StatusOr<CheckpointRef> ParseCheckpointRef(absl::string_view ref);

// The chain of the checkpoint at `step` among `complete` (ListCheckpoints'
// result, oldest first): oldest first, ending with that checkpoint.
// NOT_FOUND when no complete checkpoint has that step (the message lists
// the steps there are); FAILED_PRECONDITION naming the directories for a
// missing base ("incremental checkpoint DIR needs step B, which is not a
// complete checkpoint under ROOT"), or a broken link (a base whose
// full_step differs, a base not older than its increment, a chain that
// does not end at a full checkpoint at full_step).
absl::StatusOr<std::vector<CheckpointInfo>> ChainOf(
    const std::vector<CheckpointInfo>& complete, uint64_t step,
    absl::string_view root);

// Lists `root` (ListCheckpoints, through `fs`) and resolves the chain of
// `step`, or of the newest complete checkpoint when unset (NOT_FOUND naming
// root when there is none).
absl::StatusOr<std::vector<CheckpointInfo>> ResolveChain(
    const std::string& root, std::optional<uint64_t> step = std::nullopt,
    FileSystem* fs = FileSystem::Default());
absl::StatusOr<std::vector<CheckpointInfo>> ResolveChain(
    const CheckpointRef& ref, FileSystem* fs = FileSystem::Default());

// The checkpoint directories of a chain, oldest first (what
// RestoreRowsRequest.checkpoint_dirs takes).
std::vector<std::string> ChainDirs(const std::vector<CheckpointInfo>& chain);

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_CHAIN_H_
