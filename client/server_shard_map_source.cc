// MakeServerShardMapSource: the shard map as the servers themselves see it,
// until the coordinator serves maps.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/embedding_client.h"
#include "client/shard_fanout.h"
#include "recps/v1/shard_admin.grpc.pb.h"

namespace recps::client {
namespace {

// Servers answer from memory; a longer wait only means the server is stuck.
constexpr absl::Duration kGetShardMapTimeout = absl::Seconds(10);
// Once one server answered, how long the others get: a dead or reconnecting
// server must not hold up every map refresh.
constexpr absl::Duration kStragglerGrace = absl::Milliseconds(100);

class ServerShardMapSource final : public ShardMapSource {
 public:
  ServerShardMapSource(std::vector<std::string> servers,
                       const rpc::TransportSecurity& security)
      : servers_(std::move(servers)) {
    for (const std::string& address : servers_) {
      stubs_.push_back(
          v1::ShardAdmin::NewStub(rpc::MakeChannel(address, rpc::ChannelKind::kControl, security)));
    }
  }

  // Asks every server at once and keeps the newest valid map: during a
  // rebalance servers install a new map one by one.
  absl::StatusOr<ShardMap> Fetch() override {
    struct Call {
      grpc::ClientContext ctx;
      v1::GetShardMapRequest request;
      v1::ShardMap response;
      grpc::Status status;
    };
    std::vector<Call> calls(servers_.size());
    internal::DoneQueue done(static_cast<int>(calls.size()));
    for (size_t i = 0; i < calls.size(); ++i) {
      rpc::SetTimeout(kGetShardMapTimeout, &calls[i].ctx);
      stubs_[i]->async()->GetShardMap(
          &calls[i].ctx, &calls[i].request, &calls[i].response,
          done.Callback(static_cast<int>(i), &calls[i].status));
    }
    std::optional<ShardMap> best;
    std::vector<std::string> errors;
    absl::Time give_up = absl::InfiniteFuture();
    for (;;) {
      const int i = done.Next(give_up);
      if (i == internal::DoneQueue::kAllReturned) break;
      if (i == internal::DoneQueue::kTimedOut) {
        // Cancel the stragglers, then drain them (they own their buffers).
        for (Call& call : calls) call.ctx.TryCancel();
        give_up = absl::InfiniteFuture();
        continue;
      }
      const Call& call = calls[i];
      if (!call.status.ok()) {
        errors.push_back(
            absl::StrCat(servers_[i], ": ", call.status.error_message()));
        continue;
      }
      // A starting server has no map yet; that is not an answer.
      absl::StatusOr<ShardMap> map = ShardMap::FromProto(call.response);
      if (!map.ok()) {
        errors.push_back(
            absl::StrCat(servers_[i], ": ", map.status().message()));
      } else {
        if (!best.has_value()) give_up = absl::Now() + kStragglerGrace;
        if (!best.has_value() || map->epoch() > best->epoch()) {
          best = *std::move(map);
        }
      }
    }
    if (best.has_value()) return *std::move(best);
    return absl::UnavailableError(absl::StrCat(
        "no shard server returned a shard map: ",
        servers_.empty() ? "no servers given" : absl::StrJoin(errors, "; ")));
  }

 private:
  const std::vector<std::string> servers_;
  std::vector<std::unique_ptr<v1::ShardAdmin::Stub>> stubs_;
};

}  // namespace

std::unique_ptr<ShardMapSource> MakeServerShardMapSource(
    std::vector<std::string> servers,
    rpc::TransportSecurity security) {
  return std::make_unique<ServerShardMapSource>(std::move(servers), security);
}

}  // namespace recps::client
