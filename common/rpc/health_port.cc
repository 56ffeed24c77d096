#include "common/rpc/health_port.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/rpc/channels.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"

namespace recps::rpc {

absl::StatusOr<std::unique_ptr<HealthPort>> HealthPort::Start(
    const std::string& listen) {
  std::unique_ptr<HealthPort> port(new HealthPort());
  // The default health service is per server: this one has only it.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(
      listen, ServerCredentials(TransportSecurity::Insecure()), &port->port_);
  builder.SetMaxReceiveMessageSize(4096);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // see recps-shard
  port->server_ = builder.BuildAndStart();
  if (port->server_ == nullptr || port->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--health_listen=", listen, ": cannot listen"));
  }
  port->SetServing(false);
  return port;
}

HealthPort::~HealthPort() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
  }
}

void HealthPort::SetServing(bool serving) {
  if (grpc::HealthCheckServiceInterface* h = server_->GetHealthCheckService()) {
    h->SetServingStatus(serving);
  }
}

}  // namespace recps::rpc
