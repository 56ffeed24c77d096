// How the embedding client reaches one shard server: over gRPC
// (grpc_shard_transport.h) or handed to a server in this process
// (in_process_shard_transport.h); a device transport would be a third.
//
// A transport only carries one request to its server and brings the answer
// back. Everything else lives once above it, in EmbeddingClient: routing,
// rounds, retries, stale epochs, incarnations and push part ids. The client
// picks each server's transport when it installs a shard map (Transports).
//
// To add a transport: implement ShardTransport and its two kinds of call
// (ShardCall: header, BuildRequest, Send, and Cancel where the server can
// drop a call); each call reports the status a gRPC client would have seen
// (rpc::ToGrpcStatus from an absl::Status), with the server's epoch of a
// stale-map refusal, and consumes an OK answer itself (lookup rows into the
// caller's buffers, RoutedBatch::ConsumeLookup) before reporting done.
#ifndef RECPS_CLIENT_SHARD_TRANSPORT_H_
#define RECPS_CLIENT_SHARD_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/channels.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "recps/v1/shard.pb.h"

namespace recps::client {

class InProcessShard;

namespace internal {

struct RoutedBatch;

// The ids a call carries: positions [begin, end) of `server`'s ids of the
// round (RoutedBatch; `server` indexes the routed map).
struct CallPart {
  int server = -1;
  int32_t begin = 0;
  int32_t end = 0;
};

// What came back from a call.
struct CallResult {
  // As a gRPC client would see it, codes and messages.
  grpc::Status status;
  // The server's epoch sent with a stale-map refusal (ABORTED), if any.
  std::optional<uint64_t> server_epoch;
  // The call's deadline: a CANCELLED before it is the server's doing.
  absl::Time deadline;
  // Of the server that answered OK (0: unknown).
  uint64_t incarnation = 0;
  // A lookup's LookupResponse.applied_step (none: an older server).
  std::optional<int64_t> applied_step;
  // Not OK when an OK answer could not be consumed (a malformed response).
  absl::Status consumed;
};

// One request (Lookup or PushGradients) to one server, made by its
// transport. The client fills the header, calls Build, then Start once, and
// reads result() after done ran. Not thread-safe, except that Cancel may run
// while the call is in flight.
class ShardCall {
 public:
  using Done = absl::AnyInvocable<void() &&>;
  virtual ~ShardCall() = default;

  // The request's header: the client fills it before Build and reads back
  // what the request carried (push part, incarnation) after done.
  virtual v1::RequestHeader& header() = 0;

  // Adds the tables of `part` of `batch` to the request, rows in `encoding`.
  // `batch` must outlive the call; the call reads (a lookup: writes the
  // caller's rows through) only what `part` names.
  void Build(RoutedBatch& batch, CallPart part, v1::RowEncoding encoding);
  // Sends the request. `done` runs exactly once, on any thread (possibly
  // this one before Start returns), after result() is filled and an OK
  // answer consumed.
  void Start(absl::Time deadline, Done done);
  // Asks the server to drop the call, which then ends CANCELLED; a no-op
  // for a call that has ended or cannot be dropped (it ends by its
  // deadline).
  virtual void Cancel() {}

  const CallPart& part() const { return part_; }
  const CallResult& result() const { return result_; }

 protected:
  virtual void BuildRequest() = 0;
  virtual void Send(absl::Time deadline) = 0;
  // Records `status` and runs done. Call once, last.
  void Finish(grpc::Status status);
  // Writes the rows of an OK lookup's serialized response to the caller's
  // buffers and records its incarnation and applied step.
  void ConsumeLookup(grpc::ByteBuffer* response);

  RoutedBatch* batch_ = nullptr;
  CallPart part_;
  v1::RowEncoding encoding_ = v1::ROW_ENCODING_UNSPECIFIED;
  CallResult result_;

 private:
  Done done_;
};

// The way to one server. Thread-safe; lives as long as the client.
class ShardTransport {
 public:
  virtual ~ShardTransport() = default;
  // A new EmbeddingShard.Lookup / PushGradients call to the server.
  virtual std::unique_ptr<ShardCall> NewLookup() = 0;
  virtual std::unique_ptr<ShardCall> NewPush() = 0;
  // True when a call may do the server's work on the thread that starts
  // it: the client starts those last, so that the other servers work
  // meanwhile.
  virtual bool works_on_caller_thread() const = 0;
};

// The transport of every server address: `in_process`'s for its address
// (if not null; not owned), gRPC over `security` for any other, offering
// same-host rows to loopback servers when `same_host_rows`. Made on first
// use and kept, so channels outlive shard-map changes. Thread-safe.
class Transports {
 public:
  Transports(rpc::TransportSecurity security, InProcessShard* in_process,
             bool same_host_rows);
  ~Transports();
  // Lives as long as this object.
  ShardTransport* For(const std::string& address);

 private:
  const rpc::TransportSecurity security_;
  const bool same_host_rows_;
  std::unique_ptr<ShardTransport> in_process_;  // null: none
  const std::string* in_process_address_ = nullptr;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<ShardTransport>> grpc_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace internal
}  // namespace recps::client

#endif  // RECPS_CLIENT_SHARD_TRANSPORT_H_
