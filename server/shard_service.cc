#include "server/shard_service.h"

#include <string>

#include "absl/time/clock.h"

namespace recps::server {
namespace {

// Finishes one RPC: trailing metadata for a stale epoch, metrics, status.
void Finish(const char* rpc, grpc::CallbackServerContext* context,
            grpc::ServerUnaryReactor* reactor, const absl::Status& status,
            absl::Time start, ShardMetrics* metrics) {
  if (absl::optional<absl::Cord> epoch = status.GetPayload(kShardMapEpochKey)) {
    context->AddTrailingMetadata(kShardMapEpochKey, std::string(*epoch));
  }
  if (metrics != nullptr) {
    metrics->RecordRequest(rpc, status.code(),
                           absl::ToDoubleSeconds(absl::Now() - start));
  }
  reactor->Finish(ToGrpcStatus(status));
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::ServerUnaryReactor* EmbeddingShardService::Lookup(
    grpc::CallbackServerContext* context, const v1::LookupRequest* request,
    v1::LookupResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  server_->Lookup(request, response,
                  [this, context, reactor, start](absl::Status s) {
                    Finish("Lookup", context, reactor, s, start, metrics_);
                  });
  return reactor;
}

grpc::ServerUnaryReactor* EmbeddingShardService::PushGradients(
    grpc::CallbackServerContext* context,
    const v1::PushGradientsRequest* request,
    v1::PushGradientsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  server_->PushGradients(request, response,
                         [this, context, reactor, start](absl::Status s) {
                           Finish("PushGradients", context, reactor, s, start,
                                  metrics_);
                         });
  return reactor;
}

grpc::ServerUnaryReactor* ShardAdminService::Stats(
    grpc::CallbackServerContext* context, const v1::StatsRequest* request,
    v1::StatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  Finish("Stats", context, reactor, server_->Stats(*request, response), start,
         metrics_);
  return reactor;
}

grpc::ServerUnaryReactor* ShardAdminService::GetShardMap(
    grpc::CallbackServerContext* context, const v1::GetShardMapRequest*,
    v1::ShardMap* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  *response = server_->GetShardMap();
  Finish("GetShardMap", context, reactor, absl::OkStatus(), start, metrics_);
  return reactor;
}

grpc::ServerUnaryReactor* ShardAdminService::SetShardMap(
    grpc::CallbackServerContext* context, const v1::SetShardMapRequest* request,
    v1::SetShardMapResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  Finish("SetShardMap", context, reactor, server_->SetShardMap(*request), start,
         metrics_);
  return reactor;
}

}  // namespace recps::server
