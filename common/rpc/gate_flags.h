// The per-client limit flags of the servers (recps-shard,
// recps-coordinator): --max_calls_per_client, --max_bad_requests_per_client,
// --bad_request_window, --bad_request_penalty. docs/limits.md.
#ifndef RECPS_COMMON_RPC_GATE_FLAGS_H_
#define RECPS_COMMON_RPC_GATE_FLAGS_H_

#include "absl/status/statusor.h"
#include "common/rpc/call_gate.h"

namespace recps::rpc {

// INVALID_ARGUMENT naming the flag, its value and its range.
absl::StatusOr<CallGateOptions> CallGateOptionsFromFlags();

}  // namespace recps::rpc

#endif  // RECPS_COMMON_RPC_GATE_FLAGS_H_
