#include "client/in_process_shard_transport.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "client/routed_batch.h"
#include "common/rpc/status_conversion.h"
#include "common/wire/wire_format.h"

namespace recps::client::internal {
namespace {

// What both RPCs share. A call cannot be cancelled: it ends by its deadline.
template <typename Request, typename Response>
class InProcessCall : public ShardCall {
 public:
  explicit InProcessCall(InProcessShard* shard) : shard_(*shard) {}
  v1::RequestHeader& header() override { return *request_.mutable_header(); }

 protected:
  // The same status the gRPC path would see (codes and messages), and the
  // epoch of a stale-map refusal, which gRPC sends as a trailer.
  void FinishInProcess(const absl::Status& status) {
    if (!status.ok()) {
      if (auto epoch = status.GetPayload(kShardMapEpochKey)) {
        result_.server_epoch = rpc::ParseShardMapEpoch(std::string(*epoch));
      }
    }
    Finish(rpc::ToGrpcStatus(status));
  }

  InProcessShard& shard_;
  Request request_;
  Response response_;
};

class InProcessLookup final
    : public InProcessCall<v1::LookupRequest, grpc::ByteBuffer> {
 public:
  using InProcessCall::InProcessCall;

 private:
  void BuildRequest() override {
    request_.set_row_encoding(encoding_);
    batch_->BuildLookup(part_.server, part_.begin, part_.end, &request_);
    in_place_ = encoding_ == v1::ROW_ENCODING_FLOAT32 &&
                batch_->DirectLookupRows(part_.server, part_.begin, part_.end,
                                         &rows_);
  }
  void Send(absl::Time deadline) override {
    if (in_place_) {
      // Rows written in place leave no response to consume.
      shard_.LookupInto(&request_, rows_, &result_.incarnation, &applied_step_, deadline,
                        [this](absl::Status s) {
                          if (s.ok()) result_.applied_step = applied_step_;
                          FinishInProcess(s);
                        });
      return;
    }
    shard_.Lookup(&request_, &response_, deadline, [this](absl::Status s) {
      if (s.ok()) ConsumeLookup(&response_);
      FinishInProcess(s);
    });
  }

  bool in_place_ = false;  // the lookup's rows go to `rows_`, one per table
  std::vector<float*> rows_;
  int64_t applied_step_ = -1;  // in place: the server's, before done(OK)
};

class InProcessPush final
    : public InProcessCall<v1::PushGradientsRequest, v1::PushGradientsResponse> {
 public:
  using InProcessCall::InProcessCall;

 private:
  void BuildRequest() override {
    batch_->BuildPush(part_.server, encoding_, &request_, &grads_);
  }
  // Accepted pushes return at once; no deadline to pass.
  void Send(absl::Time) override {
    auto done = [this](absl::Status s) {
      if (s.ok()) result_.incarnation = response_.incarnation();
      FinishInProcess(s);
    };
    if (std::any_of(grads_.begin(), grads_.end(),
                    [](const float* g) { return g != nullptr; })) {
      shard_.PushGradientsFrom(&request_, grads_, &response_, std::move(done));
    } else {
      shard_.PushGradients(&request_, &response_, std::move(done));
    }
  }

  std::vector<const float*> grads_;  // per table; null: in the request's bytes
};

}  // namespace

std::unique_ptr<ShardCall> InProcessShardTransport::NewLookup() {
  return std::make_unique<InProcessLookup>(shard_);
}

std::unique_ptr<ShardCall> InProcessShardTransport::NewPush() {
  return std::make_unique<InProcessPush>(shard_);
}

}  // namespace recps::client::internal
