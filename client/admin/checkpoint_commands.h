// recpsctl's checkpoint commands (docs/admin-cli.md): `checkpoint now`
// asks the workers for a checkpoint at their next step boundary (and with
// --wait, waits until it is complete); `checkpoints` lists the complete
// ones and the one being written. Both ask the coordinator.
#ifndef RECPS_CLIENT_ADMIN_CHECKPOINT_COMMANDS_H_
#define RECPS_CLIENT_ADMIN_CHECKPOINT_COMMANDS_H_

#include <iosfwd>
#include <string>

#include "absl/time/time.h"
#include "recps/v1/coordinator.pb.h"

namespace recps::client::admin {

struct CheckpointCommandOptions {
  std::string coordinator;  // HOST:PORT
  // Deadline of each RPC.
  absl::Duration rpc_timeout = absl::Seconds(5);
  bool json = false;
  // checkpoint now: wait until the checkpoint is complete, at most
  // wait_timeout (exit 1 naming the coordinator's last error then).
  bool wait = false;
  absl::Duration wait_timeout = absl::Minutes(10);
  // Shown in the manifest ("requested" when empty).
  std::string reason;
};

// The table of `checkpoints`: step, kind, base, size, rows, age, reason;
// then the checkpoint in progress and the last error, if any.
std::string FormatCheckpoints(const v1::ListCheckpointsResponse& list, absl::Time now);

// Each returns the exit code (0 ok, 1 the coordinator refused or could not
// be reached) and prints to `out` / `err`.
int RunCheckpointNow(const CheckpointCommandOptions& options, std::ostream& out,
                     std::ostream& err);
int RunCheckpointList(const CheckpointCommandOptions& options, std::ostream& out,
                      std::ostream& err);

}  // namespace recps::client::admin

#endif  // RECPS_CLIENT_ADMIN_CHECKPOINT_COMMANDS_H_
