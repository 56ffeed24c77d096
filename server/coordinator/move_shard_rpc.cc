// ShardMoveRpc over gRPC: ShardAdmin on each server through ShardAdminCaller.
#include <memory>
#include <string>

#include "recps/v1/shard_admin.grpc.pb.h"
#include "server/coordinator/move_orchestrator.h"
#include "server/coordinator/shard_admin_caller.h"

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
  absl::StatusOr<v1::AllowExportResponse> AllowExport(const std::string& address,
                                                      const v1::AllowExportRequest& request,
                                                      absl::Duration timeout) override {
    return Call<v1::AllowExportResponse>(address, "AllowExport",
                                         &v1::ShardAdmin::Stub::AllowExport, request, timeout);
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

std::unique_ptr<ShardMoveRpc> MakeGrpcShardMoveRpc() {
  return std::make_unique<GrpcShardMoveRpc>();
}

}  // namespace recps::server
