// ShardCheckpointRpc over gRPC: ShardAdmin on each server through ShardAdminCaller.
#include <memory>
#include <string>

#include "recps/v1/shard_admin.grpc.pb.h"
#include "server/coordinator/checkpoint_orchestrator.h"
#include "server/coordinator/shard_admin_caller.h"

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
  void CancelAll() override { caller_.CancelAll(); }

 private:
  template <typename Response, typename Request, typename Method>
  absl::StatusOr<Response> Call(const std::string& address, const char* name,
                                Method method, const Request& request,
                                absl::Duration timeout) {
    return caller_.Call<Response>(address, name, method, request, timeout);
  }

  ShardAdminCaller caller_;
};

}  // namespace

std::unique_ptr<ShardCheckpointRpc> MakeGrpcShardCheckpointRpc() {
  return std::make_unique<GrpcShardCheckpointRpc>();
}

}  // namespace recps::server
