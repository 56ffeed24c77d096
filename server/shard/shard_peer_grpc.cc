#include "server/shard/shard_peer_grpc.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/rpc/status_conversion.h"
#include "common/wire/same_host_buffers.h"
#include "common/wire/same_host_memory.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"

namespace recps::server {
namespace {

class GrpcShardPeer final : public ShardPeer {
 public:
  GrpcShardPeer(std::string address, const rpc::TransportSecurity& security,
                bool same_host_rows)
      : address_(std::move(address)),
        channel_(rpc::MakeChannel(address_, rpc::ChannelKind::kData, security)),
        stub_(v1::ShardAdmin::NewStub(channel_)),
        data_stub_(v1::EmbeddingShard::NewStub(channel_)),
        same_host_(same_host_rows && IsLoopbackAddress(address_)
                       ? std::make_unique<SameHostBuffers>()
                       : nullptr) {}

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
    auto call = std::make_shared<ForwardCall>();
    call->request = std::move(request);
    call->deadline = absl::Now() + timeout;
    call->done = std::move(done);
    SendForward(std::move(call));
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
  // A forwarded push, alive until its answer: the request, the same-host
  // memory it went in (if any), its context and its response.
  struct ForwardCall {
    v1::ReplicatePushRequest request;
    v1::ReplicatePushRequest shared_form;  // naming `shared`
    std::unique_ptr<SharedMemory> shared;
    std::unique_ptr<grpc::ClientContext> context;
    v1::PushGradientsResponse response;
    absl::Time deadline;
    std::function<void(absl::Status)> done;
  };

  // Sends the push in shared memory while the peer takes it there, else
  // as bytes; a refusal of the memory (another host after all, a peer run
  // with --same_host_rows=false) sends the bytes and stops using it.
  void SendForward(std::shared_ptr<ForwardCall> call) {
    const v1::ReplicatePushRequest* send = &call->request;
    if (same_host_ != nullptr && shared_forwards_.load(std::memory_order_relaxed)) {
      const size_t size = call->request.push().ByteSizeLong();
      absl::StatusOr<std::unique_ptr<SharedMemory>> memory = same_host_->Acquire(size);
      if (memory.ok()) {
        call->request.push().SerializeWithCachedSizesToArray(
            reinterpret_cast<uint8_t*>((*memory)->data()));
        call->shared = *std::move(memory);
        call->shared_form.set_primary(call->request.primary());
        *call->shared_form.mutable_push_buffer() = call->shared->Describe(0, size);
        send = &call->shared_form;
      }
    }
    call->context = std::make_unique<grpc::ClientContext>();
    rpc::SetDeadline(call->deadline, call->context.get());
    if (!Register(call->context.get())) {
      call->done(Stopped());
      return;
    }
    data_stub_->async()->ReplicatePush(
        call->context.get(), send, &call->response, [this, call](grpc::Status s) {
          const bool shared = call->shared != nullptr;
          if (shared) {
            if (rpc::ServerIsDone(s)) same_host_->Release(std::move(call->shared));
            call->shared.reset();
          }
          if (shared && rpc::RefusedSameHost(s)) {
            shared_forwards_.store(false, std::memory_order_relaxed);
            LogWarning("pushes forwarded to ", address_, " go as bytes: ", s.error_message());
            Unregister(call->context.get());
            SendForward(call);
            return;
          }
          absl::Status status = rpc::FromGrpcStatus(s, address_, "ReplicatePush");
          // A backup with a newer map: the worker refreshes (kShardMapEpochKey).
          if (std::optional<uint64_t> epoch = rpc::ShardMapEpochOf(*call->context)) {
            status.SetPayload(kShardMapEpochKey, absl::Cord(absl::StrCat(*epoch)));
          }
          Unregister(call->context.get());  // `this` may go from here on
          call->done(status);
        });
  }

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
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::ShardAdmin::Stub> stub_;
  const std::unique_ptr<v1::EmbeddingShard::Stub> data_stub_;
  const std::unique_ptr<SameHostBuffers> same_host_;  // null: bytes only
  std::atomic<bool> shared_forwards_{true};
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> active_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ShardPeer> ConnectGrpcShardPeer(
    const std::string& address, const rpc::TransportSecurity& security,
    bool same_host_rows) {
  return std::make_unique<GrpcShardPeer>(address, security, same_host_rows);
}

}  // namespace recps::server
