#include "client/shard_transport.h"

#include <utility>

#include "client/grpc_shard_transport.h"
#include "client/in_process_shard.h"
#include "client/in_process_shard_transport.h"
#include "client/routed_batch.h"

namespace recps::client::internal {

void ShardCall::Build(RoutedBatch& batch, CallPart part,
                      v1::RowEncoding encoding) {
  batch_ = &batch;
  part_ = part;
  encoding_ = encoding;
  BuildRequest();
}

void ShardCall::Start(absl::Time deadline, Done done) {
  result_.deadline = deadline;
  done_ = std::move(done);
  Send(deadline);
}

void ShardCall::Finish(grpc::Status status) {
  result_.status = std::move(status);
  std::move(done_)();
}

void ShardCall::ConsumeLookup(grpc::ByteBuffer* response) {
  result_.consumed =
      batch_->ConsumeLookup(part_.server, part_.begin, part_.end, encoding_,
                            response, &result_.incarnation, &result_.applied_step);
}

Transports::Transports(rpc::TransportSecurity security,
                       InProcessShard* in_process, bool same_host_rows)
    : security_(std::move(security)), same_host_rows_(same_host_rows) {
  if (in_process != nullptr) {
    in_process_ = std::make_unique<InProcessShardTransport>(in_process);
    in_process_address_ = &in_process->address();
  }
}

Transports::~Transports() = default;

ShardTransport* Transports::For(const std::string& address) {
  if (in_process_ != nullptr && address == *in_process_address_) {
    return in_process_.get();
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<ShardTransport>& transport = grpc_[address];
  if (transport == nullptr) {
    transport = std::make_unique<GrpcShardTransport>(address, security_, same_host_rows_);
  }
  return transport.get();
}

}  // namespace recps::client::internal
