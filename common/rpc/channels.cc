#include "common/rpc/channels.h"

#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace recps::rpc {

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(
    const TransportSecurity& /*security*/) {
  return grpc::InsecureChannelCredentials();
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const TransportSecurity& /*security*/) {
  return grpc::InsecureServerCredentials();
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           ChannelKind kind,
                                           const TransportSecurity& security) {
  grpc::ChannelArguments args;
  switch (kind) {
    case ChannelKind::kControl:
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      break;
    case ChannelKind::kData:
      args.SetMaxReceiveMessageSize(-1);
      args.SetMaxSendMessageSize(-1);
      break;
  }
  return grpc::CreateCustomChannel(address, ChannelCredentials(security), args);
}

void SetTimeout(absl::Duration timeout, grpc::ClientContext* context) {
  SetDeadline(absl::Now() + timeout, context);
}

void SetDeadline(absl::Time deadline, grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(deadline));
}

}  // namespace recps::rpc
