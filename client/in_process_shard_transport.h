// The shard transport to a shard server in this process (InProcessShard,
// recps-worker --embedded_shard): requests are handed over as objects, with
// no serialization, socket or thread hop, and fp32 rows are read and
// written in the caller's buffers where they lie contiguous.
#ifndef RECPS_CLIENT_IN_PROCESS_SHARD_TRANSPORT_H_
#define RECPS_CLIENT_IN_PROCESS_SHARD_TRANSPORT_H_

#include <memory>

#include "client/in_process_shard.h"
#include "client/shard_transport.h"

namespace recps::client::internal {

class InProcessShardTransport final : public ShardTransport {
 public:
  // `shard` is not owned and must outlive the transport.
  explicit InProcessShardTransport(InProcessShard* shard) : shard_(shard) {}

  std::unique_ptr<ShardCall> NewLookup() override;
  std::unique_ptr<ShardCall> NewPush() override;
  // A call may run to completion inside Start.
  bool works_on_caller_thread() const override { return true; }

 private:
  InProcessShard* const shard_;
};

}  // namespace recps::client::internal

#endif  // RECPS_CLIENT_IN_PROCESS_SHARD_TRANSPORT_H_
