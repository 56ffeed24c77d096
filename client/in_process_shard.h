// A shard server that lives in the caller's process (recps-worker
// --embedded_shard): the embedding client hands it the requests for the ids
// it owns as objects, with no serialization, socket or thread hop, and
// everything else (other servers, retries, stale epochs, incarnations)
// goes through the client's usual logic. The implementation is the shard
// server's own (server/shard/in_process_shard.h); this interface keeps
// client/ free of server code.
#ifndef RECPS_CLIENT_IN_PROCESS_SHARD_H_
#define RECPS_CLIENT_IN_PROCESS_SHARD_H_

#include <cstdint>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/support/byte_buffer.h"
#include "recps/v1/shard.pb.h"

namespace recps::client {

class InProcessShard {
 public:
  using Done = absl::AnyInvocable<void(absl::Status) &&>;
  virtual ~InProcessShard() = default;

  // The server's address in shard maps: requests routed to it are handed
  // over here instead of being sent over gRPC.
  virtual const std::string& address() const = 0;

  // As EmbeddingShard.Lookup: `response` receives the serialized
  // v1::LookupResponse, the bytes a gRPC call would have received. A
  // lookup still waiting for its step when `deadline` passes fails with
  // DEADLINE_EXCEEDED. `done` runs exactly once, possibly on the calling
  // thread before Lookup returns; `request` and `response` must live until
  // then. A refusal for a stale shard map carries the server's epoch as
  // the kShardMapEpochKey payload (common/wire/wire_format.h).
  virtual void Lookup(const v1::LookupRequest* request,
                      grpc::ByteBuffer* response, absl::Time deadline,
                      Done done) = 0;
  // As EmbeddingShard.PushGradients, with the same contract as Lookup.
  virtual void PushGradients(const v1::PushGradientsRequest* request,
                             v1::PushGradientsResponse* response,
                             Done done) = 0;

  // The caller's memory in place of the message's row bytes, for fp32 rows:
  // the rows a worker reads and the gradients it pushes are then copied
  // once (by the store), not into a message and out of it again.
  //
  // As Lookup for a request without updated_only whose rows are fp32:
  // the rows of request table i land in rows[i] (its ids x dim floats,
  // contiguous, in request order) and no response is built; `incarnation`
  // and `applied_step` receive what LookupResponse.incarnation and
  // .applied_step would carry, before done(OK).
  virtual void LookupInto(const v1::LookupRequest* request,
                          absl::Span<float* const> rows, uint64_t* incarnation,
                          int64_t* applied_step, absl::Time deadline, Done done) = 0;
  // As PushGradients, where grads[i], if not null, holds the fp32
  // gradients of request table i (its ids x dim values, contiguous) and
  // that table's `grads` bytes are empty. They are read until done runs.
  virtual void PushGradientsFrom(const v1::PushGradientsRequest* request,
                                 absl::Span<const float* const> grads,
                                 v1::PushGradientsResponse* response,
                                 Done done) = 0;
};

}  // namespace recps::client

#endif  // RECPS_CLIENT_IN_PROCESS_SHARD_H_
