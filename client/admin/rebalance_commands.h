// recpsctl's rebalancing commands (docs/admin-cli.md): `rebalance` shows
// the coordinator's plan from the servers' live load and with --apply
// carries it out (a progress bar on stderr); `drain SERVER` is a plan that
// moves every slot off SERVER; `moves` lists the moves in flight and done.
// All ask the coordinator.
#ifndef RECPS_CLIENT_ADMIN_REBALANCE_COMMANDS_H_
#define RECPS_CLIENT_ADMIN_REBALANCE_COMMANDS_H_

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "recps/v1/coordinator.pb.h"

namespace recps::client::admin {

struct RebalanceCommandOptions {
  std::string coordinator;  // HOST:PORT
  // Deadline of each RPC (a plan asks every server for its stats).
  absl::Duration rpc_timeout = absl::Seconds(30);
  bool json = false;
  // Carry the plan out and wait until it finished, at most wait_timeout.
  bool apply = false;
  absl::Duration wait_timeout = absl::Hours(1);
  std::vector<std::string> drain;
  int64_t max_bytes = 0;
  int32_t max_moves = 0;
  // Bandwidth of the copies together (0: the coordinator's default).
  int64_t max_bytes_per_second = 0;
  // Progress bar on stderr while applying.
  bool progress = true;
};

std::string FormatPlan(const v1::RebalancePlan& plan);
std::string FormatMoves(const v1::ListRebalanceMovesResponse& moves, absl::Time now);

// Each returns the exit code (0 ok; 1 refused, unreachable, or (--apply) a
// move was rolled back) and prints to `out` / `err`.
int RunRebalance(const RebalanceCommandOptions& options, std::ostream& out,
                 std::ostream& err);
int RunMoves(const RebalanceCommandOptions& options, std::ostream& out, std::ostream& err);

}  // namespace recps::client::admin

#endif  // RECPS_CLIENT_ADMIN_REBALANCE_COMMANDS_H_
