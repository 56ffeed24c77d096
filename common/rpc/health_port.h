// A plaintext gRPC port that serves only grpc.health.v1.Health, for probes
// that cannot present a client certificate (the kubelet's gRPC probe). It
// tells whether the process is ready and nothing else; every other RPC is
// on the main, mutually authenticated port. docs/security.md.
#ifndef RECPS_COMMON_RPC_HEALTH_PORT_H_
#define RECPS_COMMON_RPC_HEALTH_PORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"

namespace recps::rpc {

class HealthPort {
 public:
  // Listens on `listen` (host:port; port 0 picks one), NOT_SERVING until
  // SetServing(true). UNAVAILABLE naming the address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<HealthPort>> Start(
      const std::string& listen);
  ~HealthPort();

  void SetServing(bool serving);
  int port() const { return port_; }

 private:
  HealthPort() = default;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace recps::rpc

#endif  // RECPS_COMMON_RPC_HEALTH_PORT_H_
