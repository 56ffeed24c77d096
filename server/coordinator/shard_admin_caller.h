// The coordinator's ShardAdmin calls to its shard servers: one control
// channel per server, made once and kept (channels reconnect on their own),
// and every call in flight cancellable at once when the coordinator stops.
// The checkpoint and move orchestrators' gRPC adapters share it.
#ifndef RECPS_SERVER_COORDINATOR_SHARD_ADMIN_CALLER_H_
#define RECPS_SERVER_COORDINATOR_SHARD_ADMIN_CALLER_H_

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/channels.h"
#include "common/rpc/status_conversion.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard_admin.grpc.pb.h"

namespace recps::server {

class ShardAdminCaller {
 public:
  // Calls `method` on the server at `address`; CANCELLED once CancelAll ran.
  // No lock is held across the RPC.
  template <typename Response, typename Request, typename Method>
  absl::StatusOr<Response> Call(const std::string& address, const char* name,
                                Method method, const Request& request,
                                absl::Duration timeout) {
    v1::ShardAdmin::Stub* stub = StubFor(address);
    grpc::ClientContext context;
    rpc::SetTimeout(timeout, &context);
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return absl::CancelledError("the coordinator is stopping");
      in_flight_.insert(&context);
    }
    Response response;
    const grpc::Status s = (stub->*method)(&context, request, &response);
    {
      absl::MutexLock lock(&mu_);
      in_flight_.erase(&context);
    }
    if (!s.ok()) return rpc::FromGrpcStatus(s, address, name);
    return response;
  }

  // Cancels the calls in flight and refuses later ones.
  void CancelAll() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* context : in_flight_) context->TryCancel();
  }

 private:
  v1::ShardAdmin::Stub* StubFor(const std::string& address) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<v1::ShardAdmin::Stub>& stub = stubs_[address];
    if (stub == nullptr) {
      stub = v1::ShardAdmin::NewStub(rpc::MakeChannel(address, rpc::ChannelKind::kControl));
    }
    return stub.get();
  }

  absl::Mutex mu_;
  // Only the servers of a shard map and new ones: stays small.
  std::map<std::string, std::unique_ptr<v1::ShardAdmin::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_SHARD_ADMIN_CALLER_H_
