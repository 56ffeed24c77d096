// ShardCheckpointRpc over gRPC: ShardAdmin on a control channel per server,
// made once and kept (channels reconnect on their own).
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
#include "server/coordinator/checkpoint_orchestrator.h"

namespace recps::server {
namespace {

class GrpcShardCheckpointRpc final : public ShardCheckpointRpc {
 public:
  absl::StatusOr<v1::SaveRowsResponse> SaveRows(const std::string& address,
                                                const v1::SaveRowsRequest& request,
                                                absl::Duration timeout) override {
    return Call<v1::SaveRowsResponse>(address, "SaveRows", &v1::ShardAdmin::Stub::SaveRows, request, timeout);
  }
  absl::StatusOr<v1::SaveRowsStatusResponse> SaveRowsStatus(
      const std::string& address, const v1::SaveRowsStatusRequest& request,
      absl::Duration timeout) override {
    return Call<v1::SaveRowsStatusResponse>(address, "SaveRowsStatus", &v1::ShardAdmin::Stub::SaveRowsStatus,
                request, timeout);
  }
  absl::StatusOr<v1::RestoreRowsResponse> RestoreRows(
      const std::string& address, const v1::RestoreRowsRequest& request,
      absl::Duration timeout) override {
    return Call<v1::RestoreRowsResponse>(address, "RestoreRows", &v1::ShardAdmin::Stub::RestoreRows, request,
                timeout);
  }
  absl::StatusOr<uint64_t> ShardMapEpoch(const std::string& address,
                                         absl::Duration timeout) override {
    absl::StatusOr<v1::ShardMap> map =
        Call<v1::ShardMap>(address, "GetShardMap", &v1::ShardAdmin::Stub::GetShardMap,
             v1::GetShardMapRequest(), timeout);
    if (!map.ok()) return map.status();
    return map->epoch();
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
  absl::StatusOr<Response> Call(const std::string& address, const char* name,
                                Method method, const Request& request,
                                absl::Duration timeout) {
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
  // Only the servers of a shard map: stays small.
  std::map<std::string, std::unique_ptr<v1::ShardAdmin::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<ShardCheckpointRpc> MakeGrpcShardCheckpointRpc() {
  return std::make_unique<GrpcShardCheckpointRpc>();
}

}  // namespace recps::server
