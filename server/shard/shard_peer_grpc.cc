#include "server/shard/shard_peer_grpc.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/status_conversion.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard_admin.grpc.pb.h"

namespace recps::server {
namespace {

class GrpcShardPeer final : public ShardPeer {
 public:
  GrpcShardPeer(std::string address, const rpc::TransportSecurity& security)
      : address_(std::move(address)),
        stub_(v1::ShardAdmin::NewStub(
            rpc::MakeChannel(address_, rpc::ChannelKind::kData, security))) {}

  absl::Status ExportRows(
      const v1::ExportRowsRequest& request, absl::Duration timeout,
      absl::FunctionRef<absl::Status(v1::ExportRowsChunk&)> on_chunk) override {
    grpc::ClientContext context;
    rpc::SetTimeout(timeout, &context);
    if (!Register(&context)) return Stopped();
    std::unique_ptr<grpc::ClientReader<v1::ExportRowsChunk>> reader =
        stub_->ExportRows(&context, request);
    v1::ExportRowsChunk chunk;
    absl::Status mine;
    while (reader->Read(&chunk)) {
      mine = on_chunk(chunk);
      if (!mine.ok()) {
        context.TryCancel();
        while (reader->Read(&chunk)) {
        }
        break;
      }
    }
    const grpc::Status status = reader->Finish();
    Unregister(&context);
    if (!mine.ok()) return mine;
    return rpc::FromGrpcStatus(status, address_, "ExportRows");
  }

  absl::StatusOr<v1::FinishMoveResponse> FinishMove(
      const v1::FinishMoveRequest& request, absl::Duration timeout) override {
    v1::FinishMoveResponse response;
    grpc::ClientContext context;
    rpc::SetTimeout(timeout, &context);
    if (!Register(&context)) return Stopped();
    const grpc::Status s = stub_->FinishMove(&context, request, &response);
    Unregister(&context);
    if (!s.ok()) return rpc::FromGrpcStatus(s, address_, "FinishMove");
    return response;
  }

  absl::StatusOr<v1::AbortMoveResponse> AbortMove(
      const v1::AbortMoveRequest& request, absl::Duration timeout) override {
    v1::AbortMoveResponse response;
    grpc::ClientContext context;
    rpc::SetTimeout(timeout, &context);
    if (!Register(&context)) return Stopped();
    const grpc::Status s = stub_->AbortMove(&context, request, &response);
    Unregister(&context);
    if (!s.ok()) return rpc::FromGrpcStatus(s, address_, "AbortMove");
    return response;
  }

  void ReplicatePush(v1::ReplicatePushRequest request, absl::Duration timeout,
                     std::function<void(absl::Status)> done) override {
    // Alive until the answer: the request, its context and its response.
    struct Call {
      v1::ReplicatePushRequest request;
      grpc::ClientContext context;
      v1::PushGradientsResponse response;
    };
    auto call = std::make_shared<Call>();
    call->request = std::move(request);
    rpc::SetTimeout(timeout, &call->context);
    if (!Register(&call->context)) {
      done(Stopped());
      return;
    }
    stub_->async()->ReplicatePush(
        &call->context, &call->request, &call->response,
        [this, call, done = std::move(done)](grpc::Status s) {
          const absl::Status status = rpc::FromGrpcStatus(s, address_, "ReplicatePush");
          Unregister(&call->context);  // `this` may go from here on
          done(status);
        });
  }

  // Waits for the calls in flight (an asynchronous one answers on a gRPC
  // thread), after cancelling them.
  ~GrpcShardPeer() override {
    Shutdown();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](absl::flat_hash_set<grpc::ClientContext*>* active) { return active->empty(); },
        &active_));
  }

  void Shutdown() override {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (grpc::ClientContext* c : active_) c->TryCancel();
  }

 private:
  bool Register(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    if (stopped_) return false;
    active_.insert(context);
    return true;
  }
  void Unregister(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    active_.erase(context);
  }
  absl::Status Stopped() const {
    return absl::CancelledError(
        absl::StrCat("calls to shard server ", address_, " were stopped"));
  }

  const std::string address_;
  const std::unique_ptr<v1::ShardAdmin::Stub> stub_;
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> active_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ShardPeer> ConnectGrpcShardPeer(
    const std::string& address, const rpc::TransportSecurity& security) {
  return std::make_unique<GrpcShardPeer>(address, security);
}

}  // namespace recps::server
