#include "server/shard/in_process_shard.h"

#include <memory>
#include <utility>

#include "absl/time/clock.h"
#include "server/shard/lookup_response.h"
#include "server/shard/shard_service.h"

namespace recps::server {
namespace {

void Record(ShardMetrics* metrics, const char* rpc, const absl::Status& s,
            absl::Time start) {
  if (metrics == nullptr) return;
  metrics->RecordRequest(rpc, s.code(),
                         absl::ToDoubleSeconds(absl::Now() - start));
}

// A lookup parked for its step is dropped (CANCELLED) once its deadline
// passes, as a gRPC lookup whose client gave up: the caller sees what a
// gRPC client would.
absl::Status AsGrpcWouldSee(absl::Status s, absl::Time deadline) {
  if (absl::IsCancelled(s) && absl::Now() >= deadline) {
    return absl::DeadlineExceededError(
        "the in-process lookup's deadline passed while it waited for its step");
  }
  return s;
}

}  // namespace

void ShardServerEndpoint::Lookup(const v1::LookupRequest* request,
                                 grpc::ByteBuffer* response,
                                 absl::Time deadline, Done done) {
  const absl::Time start = absl::Now();
  // The response is written where the store puts the rows and handed over
  // as slices of that buffer, as the gRPC service sends it.
  auto built = std::make_unique<SerializedLookupResponse>();
  SerializedLookupResponse* out = built.get();
  server_->Lookup(
      request, out,
      [this, response, deadline, start, built = std::move(built),
       done = std::move(done)](absl::Status s) mutable {
        if (s.ok()) *response = LookupResponseToByteBuffer(*built);
        s = AsGrpcWouldSee(std::move(s), deadline);
        Record(metrics_, "Lookup", s, start);
        std::move(done)(std::move(s));
      },
      // A lookup parked for its step is dropped once the deadline passes,
      // as a gRPC lookup whose client gave up.
      [deadline] { return absl::Now() >= deadline; });
}

void ShardServerEndpoint::LookupInto(const v1::LookupRequest* request,
                                     absl::Span<float* const> rows,
                                     uint64_t* incarnation, int64_t* applied_step,
                                     absl::Time deadline, Done done) {
  const absl::Time start = absl::Now();
  server_->LookupInto(
      request, rows,
      [this, incarnation, deadline, start, done = std::move(done)](absl::Status s) mutable {
        if (s.ok()) *incarnation = server_->incarnation();
        s = AsGrpcWouldSee(std::move(s), deadline);
        Record(metrics_, "Lookup", s, start);
        std::move(done)(std::move(s));
      },
      [deadline] { return absl::Now() >= deadline; }, applied_step);
}

void ShardServerEndpoint::PushGradients(const v1::PushGradientsRequest* request,
                                        v1::PushGradientsResponse* response,
                                        Done done) {
  PushGradientsFrom(request, {}, response, std::move(done));
}

void ShardServerEndpoint::PushGradientsFrom(const v1::PushGradientsRequest* request,
                                            absl::Span<const float* const> grads,
                                            v1::PushGradientsResponse* response,
                                            Done done) {
  const absl::Time start = absl::Now();
  server_->PushGradients(
      request, response,
      [this, start, done = std::move(done)](absl::Status s) mutable {
        Record(metrics_, "PushGradients", s, start);
        std::move(done)(std::move(s));
      },
      grads);
}

}  // namespace recps::server
