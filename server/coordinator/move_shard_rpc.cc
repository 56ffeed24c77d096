// ShardMoveRpc over gRPC: ShardAdmin on a control channel per server, made
// once and kept (channels reconnect on their own).
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/channels.h"
#include "common/rpc/status_conversion.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "server/coordinator/move_orchestrator.h"

namespace recps::server {
namespace {

class GrpcShardMoveRpc final : public ShardMoveRpc {
 public:
  absl::StatusOr<v1::StatsResponse> Stats(const std::string& address,
                                          absl::Duration timeout) override {
    v1::StatsRequest request;
    request.set_include_slots(true);
    return Call<v1::StatsResponse>(address, "Stats", &v1::ShardAdmin::Stub::Stats, request,
                                   timeout);
  }
  absl::StatusOr<v1::MigrateInResponse> MigrateIn(const std::string& address,
                                                  const v1::MigrateInRequest& request,
                                                  absl::Duration timeout) override {
    return Call<v1::MigrateInResponse>(address, "MigrateIn",
                                       &v1::ShardAdmin::Stub::MigrateIn, request, timeout);
  }
  absl::StatusOr<v1::HandOverResponse> HandOver(const std::string& address,
                                                const v1::HandOverRequest& request,
                                                absl::Duration timeout) override {
    return Call<v1::HandOverResponse>(address, "HandOver", &v1::ShardAdmin::Stub::HandOver,
                                      request, timeout);
  }
  absl::StatusOr<v1::AbortMoveResponse> AbortMove(const std::string& address,
                                                  const v1::AbortMoveRequest& request,
                                                  absl::Duration timeout) override {
    return Call<v1::AbortMoveResponse>(address, "AbortMove",
                                       &v1::ShardAdmin::Stub::AbortMove, request, timeout);
  }
  absl::StatusOr<v1::ListMovesResponse> ListMoves(const std::string& address,
                                                  absl::Duration timeout) override {
    return Call<v1::ListMovesResponse>(address, "ListMoves",
                                       &v1::ShardAdmin::Stub::ListMoves,
                                       v1::ListMovesRequest(), timeout);
  }
  absl::StatusOr<v1::ShardMap> GetShardMap(const std::string& address,
                                           absl::Duration timeout) override {
    return Call<v1::ShardMap>(address, "GetShardMap", &v1::ShardAdmin::Stub::GetShardMap,
                              v1::GetShardMapRequest(), timeout);
  }
  void CancelAll() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* context : in_flight_) context->TryCancel();
  }

 private:
  v1::ShardAdmin::Stub* StubFor(const std::string& address) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<v1::ShardAdmin::Stub>& stub = stubs_[address];
    if (stub == nullptr) {
      stub = v1::ShardAdmin::NewStub(rpc::MakeChannel(address, rpc::ChannelKind::kControl));
    }
    return stub.get();
  }

  template <typename Response, typename Request, typename Method>
  absl::StatusOr<Response> Call(const std::string& address, const char* name, Method method,
                                const Request& request, absl::Duration timeout) {
    v1::ShardAdmin::Stub* stub = StubFor(address);
    grpc::ClientContext context;
    rpc::SetTimeout(timeout, &context);
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return absl::CancelledError("the coordinator is stopping");
      in_flight_.insert(&context);
    }
    Response response;
    const grpc::Status s = (stub->*method)(&context, request, &response);
    {
      absl::MutexLock lock(&mu_);
      in_flight_.erase(&context);
    }
    if (!s.ok()) return rpc::FromGrpcStatus(s, address, name);
    return response;
  }

  absl::Mutex mu_;
  // Only the servers of a shard map and new ones: stays small.
  std::map<std::string, std::unique_ptr<v1::ShardAdmin::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<ShardMoveRpc> MakeGrpcShardMoveRpc() {
  return std::make_unique<GrpcShardMoveRpc>();
}

}  // namespace recps::server
