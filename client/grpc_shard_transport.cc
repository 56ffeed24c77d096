#include "client/grpc_shard_transport.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/routed_batch.h"
#include "common/log.h"
#include "common/rpc/status_conversion.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/slice.h"

namespace recps::client::internal {
namespace {

// What both RPCs share: the context, and the epoch of a stale-map refusal,
// which gRPC brings as a trailer.
template <typename Request, typename Response>
class GrpcCall : public ShardCall {
 public:
  v1::RequestHeader& header() override { return *request_.mutable_header(); }
  void Cancel() override { ctx_.TryCancel(); }

 protected:
  void FinishGrpc(grpc::Status status) {
    // The trailers are read only for a refusal that may carry an epoch.
    if (status.error_code() == grpc::StatusCode::ABORTED) {
      result_.server_epoch = rpc::ShardMapEpochOf(ctx_);
    }
    Finish(std::move(status));
  }

  grpc::ClientContext ctx_;
  Request request_;
  Response response_;
};


class GrpcLookup final
    : public GrpcCall<v1::LookupRequest, grpc::ByteBuffer> {
 public:
  GrpcLookup(RawLookupStub* stub, GrpcShardTransport* transport)
      : stub_(stub), transport_(*transport), same_host_(transport->same_host()) {}

 private:
  void BuildRequest() override {
    request_.set_row_encoding(encoding_);
    batch_->BuildLookup(part_.server, part_.begin, part_.end, &request_);
    if (same_host_ == nullptr || !transport_.shared_lookups()) return;
    // Memory the server may write its answer to (same-host rows); without
    // it, the answer comes as bytes.
    absl::StatusOr<std::unique_ptr<SharedMemory>> memory = same_host_->Acquire(
        batch_->LookupResponseBound(part_.server, part_.begin, part_.end, encoding_));
    if (!memory.ok()) return;
    shared_ = *std::move(memory);
    *request_.mutable_response_buffer() = shared_->Describe(0, shared_->size());
  }
  void Send(absl::Time deadline) override {
    rpc::SetDeadline(deadline, &ctx_);
    // An OK response is consumed (rows copied out) on the gRPC thread that
    // received it, while its bytes are still in that core's cache and
    // while other responses are in flight, not after a hop to the client's
    // thread. Shard bench, 16k ids, 17 interleaved pairs: median +10% ids/s
    // (-18% to +33%), client CPU per call 0-16% lower.
    stub_->UnaryCall(&ctx_, LookupMethodName(), grpc::StubOptions(),
                     &request_, &response_, [this](grpc::Status status) {
                       if (status.ok()) Consume();
                       if (shared_ != nullptr && rpc::ServerIsDone(status)) {
                         same_host_->Release(std::move(shared_));
                       }
                       shared_.reset();  // the server may still write: dropped
                       FinishGrpc(std::move(status));
                     });
  }
  void Consume() {
    if (shared_ != nullptr) {
      // An answer in the shared memory comes as a LookupResponse with only
      // shared_length: a few bytes, where rows take at least a row's.
      constexpr size_t kMaxSharedAnswer = 16;
      v1::LookupResponse answer;
      grpc::ByteBuffer small(response_);  // shares the slices; read up by parsing
      if (response_.Length() <= kMaxSharedAnswer &&
          grpc::SerializationTraits<v1::LookupResponse>::Deserialize(&small, &answer).ok() &&
          answer.shared_length() > 0) {
        if (answer.shared_length() > shared_->size()) {
          result_.consumed = absl::InternalError(absl::StrCat(
              "the server says its answer takes ", answer.shared_length(),
              " bytes of a ", shared_->size(), "-byte shared buffer"));
          return;
        }
        grpc::Slice slice(shared_->data(), answer.shared_length(), grpc::Slice::STATIC_SLICE);
        grpc::ByteBuffer rows(&slice, 1);
        ConsumeLookup(&rows);
        return;
      }
      // Memory offered, bytes answered: the server cannot or may not map
      // it (its log says why), so it is offered no more.
      transport_.StopSharedLookups();
    }
    ConsumeLookup(&response_);
  }

  RawLookupStub* const stub_;
  GrpcShardTransport& transport_;
  SameHostBuffers* const same_host_;  // null: no same-host rows
  std::unique_ptr<SharedMemory> shared_;
};

class GrpcPush final
    : public GrpcCall<v1::PushGradientsRequest, v1::PushGradientsResponse> {
 public:
  GrpcPush(RawPushStub* stub, GrpcShardTransport* transport)
      : stub_(stub), transport_(*transport) {}

  void Cancel() override {
    absl::MutexLock lock(&cancel_mu_);
    cancelled_ = true;
    ctx_.TryCancel();
    if (bytes_ctx_ != nullptr) bytes_ctx_->TryCancel();
  }

 private:
  void BuildRequest() override {
    if (transport_.same_host() != nullptr && transport_.shared_pushes() && BuildShared()) {
      return;
    }
    BuildBytes();
  }
  // The request serialized by the batch (request_ holds the header only),
  // handed to gRPC as one slice that owns the bytes: the gradient rows are
  // copied once, from the caller's rows into it.
  void BuildBytes() {
    auto* bytes = new std::string;
    batch_->SerializePush(part_.server, encoding_, request_.header(), bytes);
    const grpc::Slice slice(
        bytes->data(), bytes->size(), [](void* b) { delete static_cast<std::string*>(b); },
        bytes);
    raw_request_ = grpc::ByteBuffer(&slice, 1);
  }
  // The same bytes, written to shared memory (same-host rows), and a
  // SharedPushRequest naming them; false when there is no memory for them.
  bool BuildShared() {
    const size_t size = batch_->PushBytes(part_.server, encoding_, request_.header());
    absl::StatusOr<std::unique_ptr<SharedMemory>> memory = transport_.same_host()->Acquire(size);
    if (!memory.ok() || !batch_->SerializePush(part_.server, encoding_, request_.header(),
                                               (*memory)->data(), size).ok()) {
      return false;
    }
    shared_ = *std::move(memory);
    v1::SharedPushRequest request;
    *request.mutable_request() = shared_->Describe(0, size);
    bool own_buffer = false;
    return grpc::SerializationTraits<v1::SharedPushRequest>::Serialize(request, &raw_request_,
                                                                       &own_buffer)
        .ok();
  }
  void Send(absl::Time deadline) override {
    deadline_ = deadline;
    rpc::SetDeadline(deadline, &ctx_);
    const bool shared = shared_ != nullptr;
    stub_->UnaryCall(&ctx_, shared ? PushSharedMethodName() : PushMethodName(),
                     grpc::StubOptions(), &raw_request_, &response_,
                     [this, shared](grpc::Status status) {
                       if (shared) {
                         if (status.ok()) transport_.NoteSharedPush();
                         if (rpc::ServerIsDone(status)) transport_.same_host()->Release(std::move(shared_));
                         shared_.reset();
                         if (rpc::RefusedSameHost(status)) {
                           transport_.StopSharedPushes(status.error_message());
                           SendBytes();
                           return;
                         }
                       }
                       Done(std::move(status));
                     });
  }
  // The refused push again, as bytes, on a context of its own (a gRPC
  // context serves one call).
  void SendBytes() {
    BuildBytes();
    grpc::ClientContext* context = nullptr;
    {
      absl::MutexLock lock(&cancel_mu_);
      if (!cancelled_) {
        bytes_ctx_ = std::make_unique<grpc::ClientContext>();
        context = bytes_ctx_.get();
        rpc::SetDeadline(deadline_, context);
      }
    }
    if (context == nullptr) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the push was cancelled"));
      return;
    }
    stub_->UnaryCall(context, PushMethodName(), grpc::StubOptions(), &raw_request_,
                     &response_, [this, context](grpc::Status status) {
                       if (status.error_code() == grpc::StatusCode::ABORTED) {
                         result_.server_epoch = rpc::ShardMapEpochOf(*context);
                       }
                       if (status.ok()) result_.incarnation = response_.incarnation();
                       Finish(std::move(status));
                     });
  }
  void Done(grpc::Status status) {
    if (status.ok()) result_.incarnation = response_.incarnation();
    FinishGrpc(std::move(status));
  }

  RawPushStub* const stub_;
  GrpcShardTransport& transport_;
  grpc::ByteBuffer raw_request_;
  std::unique_ptr<SharedMemory> shared_;  // the request's bytes (same-host rows)
  absl::Time deadline_;
  absl::Mutex cancel_mu_;
  bool cancelled_ ABSL_GUARDED_BY(cancel_mu_) = false;
  std::unique_ptr<grpc::ClientContext> bytes_ctx_ ABSL_GUARDED_BY(cancel_mu_);
};

}  // namespace

const std::string& LookupMethodName() {
  static const std::string* const kName = new std::string(
      absl::StrCat("/", v1::EmbeddingShard::service_full_name(), "/Lookup"));
  return *kName;
}

const std::string& PushMethodName() {
  static const std::string* const kName = new std::string(
      absl::StrCat("/", v1::EmbeddingShard::service_full_name(), "/PushGradients"));
  return *kName;
}

const std::string& PushSharedMethodName() {
  static const std::string* const kName = new std::string(
      absl::StrCat("/", v1::EmbeddingShard::service_full_name(), "/PushGradientsShared"));
  return *kName;
}

GrpcShardTransport::GrpcShardTransport(const std::string& address,
                                       const rpc::TransportSecurity& security,
                                       bool same_host_rows)
    : address_(address),
      same_host_(same_host_rows && IsLoopbackAddress(address)
                     ? std::make_unique<SameHostBuffers>()
                     : nullptr),
      shared_lookups_(same_host_ != nullptr),
      shared_pushes_(same_host_ != nullptr) {
  std::shared_ptr<grpc::Channel> channel =
      rpc::MakeChannel(address, rpc::ChannelKind::kData, security);
  raw_push_ = std::make_unique<RawPushStub>(channel);
  raw_lookup_ = std::make_unique<RawLookupStub>(std::move(channel));
}

std::unique_ptr<ShardCall> GrpcShardTransport::NewLookup() {
  return std::make_unique<GrpcLookup>(raw_lookup_.get(), this);
}

std::unique_ptr<ShardCall> GrpcShardTransport::NewPush() {
  return std::make_unique<GrpcPush>(raw_push_.get(), this);
}

void GrpcShardTransport::NoteSharedPush() {
  if (!shared_push_seen_.exchange(true)) {
    LogInfo("pushes to ", address_, " go through shared memory (same-host rows)");
  }
}

void GrpcShardTransport::StopSharedLookups() {
  if (shared_lookups_.exchange(false)) {
    LogInfo("lookups from ", address_,
            " come as bytes: the server answered one in bytes where memory was offered");
  }
}

void GrpcShardTransport::StopSharedPushes(absl::string_view why) {
  if (shared_pushes_.exchange(false)) {
    LogInfo("pushes to ", address_, " go as bytes: the server refused same-host rows (",
            why, ")");
  }
}

}  // namespace recps::client::internal
