// Asking a real shard server for its Stats, in multi-process tests.
#ifndef RECPS_TESTS_SERVER_SHARD_SHARD_STATS_H_
#define RECPS_TESTS_SERVER_SHARD_SHARD_STATS_H_

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/channels.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard_admin.grpc.pb.h"

namespace recps::testing {

inline std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

// ShardAdmin.Stats of the server at `address` (10 s deadline); UNAVAILABLE
// with gRPC's message when the call fails.
inline absl::StatusOr<v1::StatsResponse> StatsOf(const std::string& address) {
  auto stub = v1::ShardAdmin::NewStub(
      rpc::MakeChannel(address, rpc::ChannelKind::kControl));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::StatsResponse stats;
  const grpc::Status s = stub->Stats(&ctx, v1::StatsRequest(), &stats);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return stats;
}

}  // namespace recps::testing

#endif  // RECPS_TESTS_SERVER_SHARD_SHARD_STATS_H_
