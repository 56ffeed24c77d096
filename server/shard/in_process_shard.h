// The shard server as an in-process endpoint of the embedding client
// (client/in_process_shard.h): a worker that embeds a shard server
// (recps-worker --embedded_shard) reaches it through this adapter, with the
// same request handling, store, update and step clock as over gRPC.
// Calls are counted in the server's request metrics under the same names;
// the call gate (roles, per-client limits) is not consulted: the caller is
// this process.
#ifndef RECPS_SERVER_SHARD_IN_PROCESS_SHARD_H_
#define RECPS_SERVER_SHARD_IN_PROCESS_SHARD_H_

#include <string>

#include "client/in_process_shard.h"
#include "server/shard/shard_metrics.h"
#include "server/shard/shard_server.h"

namespace recps::server {

class ShardServerEndpoint final : public client::InProcessShard {
 public:
  // Neither pointer is owned; `metrics` may be null. `address` is the
  // server's address in shard maps.
  ShardServerEndpoint(ShardServer* server, ShardMetrics* metrics,
                      std::string address)
      : server_(server), metrics_(metrics), address_(std::move(address)) {}

  const std::string& address() const override { return address_; }
  void Lookup(const v1::LookupRequest* request, grpc::ByteBuffer* response,
              absl::Time deadline, Done done) override;
  void PushGradients(const v1::PushGradientsRequest* request,
                     v1::PushGradientsResponse* response, Done done) override;
  void LookupInto(const v1::LookupRequest* request, absl::Span<float* const> rows,
                  uint64_t* incarnation, int64_t* applied_step, absl::Time deadline,
                  Done done) override;
  void PushGradientsFrom(const v1::PushGradientsRequest* request,
                         absl::Span<const float* const> grads,
                         v1::PushGradientsResponse* response, Done done) override;

 private:
  ShardServer* const server_;
  ShardMetrics* const metrics_;
  const std::string address_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_IN_PROCESS_SHARD_H_
