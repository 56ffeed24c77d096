// The coordinator's calls to shard servers (ShardAdmin) for checkpoints
// (ShardCheckpointRpc) and slot moves (ShardMoveRpc): one gRPC adapter over
// ShardAdminCaller, which owns the stubs, deadlines and cancellation.
#include <memory>
#include <string>

#include "recps/v1/shard_admin.grpc.pb.h"
#include "server/coordinator/checkpoint_orchestrator.h"
#include "server/coordinator/move_orchestrator.h"
#include "server/coordinator/shard_admin_caller.h"

namespace recps::server {
namespace {

using Stub = v1::ShardAdmin::Stub;

class GrpcShardAdmin final : public ShardCheckpointRpc, public ShardMoveRpc {
 public:
  // --- checkpoints ---
  absl::StatusOr<v1::SaveRowsResponse> SaveRows(const std::string& address,
                                                const v1::SaveRowsRequest& request,
                                                absl::Duration timeout) override {
    return caller_.Call<v1::SaveRowsResponse>(address, "SaveRows", &Stub::SaveRows, request,
                                              timeout);
  }
  absl::StatusOr<v1::SaveRowsStatusResponse> SaveRowsStatus(
      const std::string& address, const v1::SaveRowsStatusRequest& request,
      absl::Duration timeout) override {
    return caller_.Call<v1::SaveRowsStatusResponse>(address, "SaveRowsStatus",
                                                    &Stub::SaveRowsStatus, request, timeout);
  }
  absl::StatusOr<v1::RestoreRowsResponse> RestoreRows(
      const std::string& address, const v1::RestoreRowsRequest& request,
      absl::Duration timeout) override {
    return caller_.Call<v1::RestoreRowsResponse>(address, "RestoreRows", &Stub::RestoreRows,
                                                 request, timeout);
  }
  absl::StatusOr<uint64_t> ShardMapEpoch(const std::string& address,
                                         absl::Duration timeout) override {
    absl::StatusOr<v1::ShardMap> map = GetShardMap(address, timeout);
    if (!map.ok()) return map.status();
    return map->epoch();
  }

  // --- slot moves ---
  absl::StatusOr<v1::StatsResponse> Stats(const std::string& address,
                                          absl::Duration timeout) override {
    v1::StatsRequest request;
    request.set_include_slots(true);
    return caller_.Call<v1::StatsResponse>(address, "Stats", &Stub::Stats, request, timeout);
  }
  absl::StatusOr<v1::MigrateInResponse> MigrateIn(const std::string& address,
                                                  const v1::MigrateInRequest& request,
                                                  absl::Duration timeout) override {
    return caller_.Call<v1::MigrateInResponse>(address, "MigrateIn", &Stub::MigrateIn, request,
                                               timeout);
  }
  absl::StatusOr<v1::AllowExportResponse> AllowExport(const std::string& address,
                                                      const v1::AllowExportRequest& request,
                                                      absl::Duration timeout) override {
    return caller_.Call<v1::AllowExportResponse>(address, "AllowExport", &Stub::AllowExport,
                                                 request, timeout);
  }
  absl::StatusOr<v1::HandOverResponse> HandOver(const std::string& address,
                                                const v1::HandOverRequest& request,
                                                absl::Duration timeout) override {
    return caller_.Call<v1::HandOverResponse>(address, "HandOver", &Stub::HandOver, request,
                                              timeout);
  }
  absl::StatusOr<v1::AbortMoveResponse> AbortMove(const std::string& address,
                                                  const v1::AbortMoveRequest& request,
                                                  absl::Duration timeout) override {
    return caller_.Call<v1::AbortMoveResponse>(address, "AbortMove", &Stub::AbortMove, request,
                                               timeout);
  }
  absl::StatusOr<v1::ListMovesResponse> ListMoves(const std::string& address,
                                                  absl::Duration timeout) override {
    return caller_.Call<v1::ListMovesResponse>(address, "ListMoves", &Stub::ListMoves,
                                               v1::ListMovesRequest(), timeout);
  }
  absl::StatusOr<v1::ShardMap> GetShardMap(const std::string& address,
                                           absl::Duration timeout) override {
    return caller_.Call<v1::ShardMap>(address, "GetShardMap", &Stub::GetShardMap,
                                      v1::GetShardMapRequest(), timeout);
  }

  void CancelAll() override { caller_.CancelAll(); }

 private:
  ShardAdminCaller caller_;
};

}  // namespace

std::unique_ptr<ShardCheckpointRpc> MakeGrpcShardCheckpointRpc() {
  return std::make_unique<GrpcShardAdmin>();
}

std::unique_ptr<ShardMoveRpc> MakeGrpcShardMoveRpc() { return std::make_unique<GrpcShardAdmin>(); }

}  // namespace recps::server
