// The shard transport over gRPC (shard_transport.h): one channel per server,
// callback calls with a deadline, rows of a lookup copied from gRPC's
// buffers straight to the caller's on the thread that received them.
#ifndef RECPS_CLIENT_GRPC_SHARD_TRANSPORT_H_
#define RECPS_CLIENT_GRPC_SHARD_TRANSPORT_H_

#include <memory>
#include <string>

#include "client/shard_transport.h"
#include "common/rpc/channels.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "recps/v1/shard.grpc.pb.h"

namespace recps::client::internal {

// A stub for EmbeddingShard.Lookup that hands back the serialized response,
// which the client parses itself (RoutedBatch::ConsumeLookup) so that rows are
// copied once, from gRPC's buffers to the caller's.
using RawLookupStub =
    grpc::TemplatedGenericStub<v1::LookupRequest, grpc::ByteBuffer>;
// The full method name RawLookupStub calls.
const std::string& LookupMethodName();
// A stub for EmbeddingShard.PushGradients that sends a request serialized
// by RoutedBatch::SerializePush (gradient rows copied once, into it).
using RawPushStub =
    grpc::TemplatedGenericStub<grpc::ByteBuffer, v1::PushGradientsResponse>;
const std::string& PushMethodName();

class GrpcShardTransport final : public ShardTransport {
 public:
  // Makes the channel to `address` (it connects on the first call).
  GrpcShardTransport(const std::string& address,
                     const rpc::TransportSecurity& security);

  std::unique_ptr<ShardCall> NewLookup() override;
  std::unique_ptr<ShardCall> NewPush() override;
  bool works_on_caller_thread() const override { return false; }

 private:
  std::unique_ptr<RawPushStub> raw_push_;
  std::unique_ptr<RawLookupStub> raw_lookup_;
};

}  // namespace recps::client::internal

#endif  // RECPS_CLIENT_GRPC_SHARD_TRANSPORT_H_
