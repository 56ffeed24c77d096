#include "server/shard/shard_service.h"

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/rpc/status_conversion.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace recps::server {
namespace {

// Bad requests are logged, at most 10 lines per 10 s: a flood of them must
// not flood the log.
LogLimiter& BadRequestLog() {
  static LogLimiter* const limiter = new LogLimiter(10, absl::Seconds(10));
  return *limiter;
}

// Counts and logs (rate-limited) a request refused as bad; `reason` as in
// ShardMetrics::AddBadRequest, empty: judge by the code.
void NoteBadRequest(const char* rpc, grpc::CallbackServerContext* context,
                    const absl::Status& status, const char* reason,
                    ShardMetrics* metrics) {
  if (reason == nullptr) {
    if (absl::IsInvalidArgument(status)) {
      reason = "invalid_argument";
    } else if (absl::IsResourceExhausted(status)) {
      reason = "over_limit";
    } else {
      return;
    }
  }
  if (metrics != nullptr) metrics->AddBadRequest(rpc, reason);
  int64_t suppressed = 0;
  if (!BadRequestLog().Allow(&suppressed)) return;
  constexpr size_t kMaxMessage = 300;
  const absl::string_view message = status.message();
  LogWarning("bad ", rpc, " request (", reason, ") from ", context->peer(),
             ": ", message.substr(0, kMaxMessage),
             message.size() > kMaxMessage ? "..." : "",
             suppressed > 0 ? absl::StrCat(" [", suppressed,
                                           " bad-request lines suppressed "
                                           "before this one]")
                            : "");
}

// Finishes one RPC: trailing metadata for a stale epoch, metrics, status.
void Finish(const char* rpc, grpc::CallbackServerContext* context,
            grpc::ServerUnaryReactor* reactor, const absl::Status& status,
            absl::Time start, ShardMetrics* metrics,
            const char* bad_reason = nullptr) {
  if (metrics != nullptr) {
    metrics->RecordRequest(rpc, status.code(),
                           absl::ToDoubleSeconds(absl::Now() - start));
  }
  NoteBadRequest(rpc, context, status, bad_reason, metrics);
  reactor->Finish(rpc::ToGrpcStatus(status, context));
}

// A lookup in flight: the parsed request and the response being built.
struct LookupCall {
  rpc::Admission admission;
  v1::LookupRequest request;
  SerializedLookupResponse response;
  // The caller's memory the response may be written to (same-host rows).
  SharedMemoryMapper::Region shared;
};

// Same-host requests that could not be served so (logged at most 5 lines
// per minute: the caller falls back to bytes and carries on).
LogLimiter& SameHostLog() {
  static LogLimiter* const limiter = new LogLimiter(5, absl::Minutes(1));
  return *limiter;
}

// The caller's admission (role and per-client limits); an empty one when
// there is no gate. On refusal: finishes the call and returns nullopt.
std::optional<rpc::Admission> AdmitOrFinish(rpc::CallGate* gate, const char* rpc,
                                            const char* method,
                                            grpc::CallbackServerContext* context,
                                            grpc::ServerUnaryReactor* reactor,
                                            absl::Time start, ShardMetrics* metrics) {
  if (gate == nullptr) return rpc::Admission();
  absl::StatusOr<rpc::Admission> admission = gate->Admit(*context, method);
  if (admission.ok()) return *std::move(admission);
  Finish(rpc, context, reactor, admission.status(), start, metrics);
  return std::nullopt;
}

// Whether the lookup names a dynamic table (one whose rows a lookup creates).
bool CreatesRows(const ShardServer& server, const v1::LookupRequest& request) {
  for (const v1::TableIds& t : request.tables()) {
    absl::StatusOr<int> index = server.store().FindTable(t.table());
    if (index.ok() && server.store().spec(*index).num_rows == 0) return true;
  }
  return false;
}

}  // namespace

// A push in flight: the parsed request and its answer.
struct EmbeddingShardService::PushCall {
  rpc::Admission admission;
  v1::PushGradientsRequest request;
  v1::PushGradientsResponse response;
};

absl::StatusOr<SharedMemoryMapper::Region> EmbeddingShardService::MapSameHost(
    grpc::CallbackServerContext* context, const v1::SharedBuffer& buffer) {
  absl::Status refused;
  if (same_host_ == nullptr) {
    // Configured so: the caller logs the refusal once, the server not at all.
    return absl::FailedPreconditionError(
        absl::StrCat(kSameHostRefusal, "this server runs with --same_host_rows=false"));
  }
  if (!IsLoopbackPeer(context->peer())) {
    refused = absl::FailedPreconditionError(
        absl::StrCat("the caller ", context->peer(), " is not on this host's loopback"));
  } else {
    absl::StatusOr<SharedMemoryMapper::Region> region = same_host_->Map(buffer);
    if (region.ok()) {
      if (region->newly_mapped && metrics_ != nullptr) metrics_->AddSameHostMapping();
      return region;
    }
    refused = region.status();
  }
  refused = absl::FailedPreconditionError(absl::StrCat(kSameHostRefusal, refused.message()));
  int64_t suppressed = 0;
  if (SameHostLog().Allow(&suppressed)) {
    LogInfo("a request from ", context->peer(), " goes as bytes: ", refused.message(),
            suppressed > 0 ? absl::StrCat(" [", suppressed, " such lines suppressed]") : "");
  }
  return refused;
}

grpc::ByteBuffer LookupResponseToByteBuffer(SerializedLookupResponse& response) {
  auto* buffer = new PooledBuffer(response.TakeBuffer());
  const grpc::Slice whole(
      buffer->data(), buffer->size(),
      [](void* b) { delete static_cast<PooledBuffer*>(b); }, buffer);
  std::vector<grpc::Slice> slices;
  slices.reserve(response.segments().size());
  for (const SerializedLookupResponse::Segment& s : response.segments()) {
    slices.push_back(whole.sub(s.offset, s.offset + s.length));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ServerUnaryReactor* EmbeddingShardService::Lookup(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  std::optional<rpc::Admission> admission = AdmitOrFinish(
      gate_, "Lookup", "EmbeddingShard.Lookup", context, reactor, start, metrics_);
  if (!admission.has_value()) return reactor;
  auto call = std::make_unique<LookupCall>();
  call->admission = *std::move(admission);
  // Parsed as the generated handler would, with the same error. The copy
  // shares the slices; Deserialize clears the buffer it reads.
  grpc::ByteBuffer bytes(*request);
  const grpc::Status parsed =
      grpc::SerializationTraits<v1::LookupRequest>::Deserialize(&bytes,
                                                                &call->request);
  if (!parsed.ok()) {
    Finish("Lookup", context, reactor,
           absl::InvalidArgumentError(absl::StrCat(
               "the request does not parse as a recps.v1.LookupRequest (",
               request->Length(), " bytes): ", parsed.error_message())),
           start, metrics_, "malformed");
    call->admission.NoteBadRequest();
    return reactor;
  }
  // A worker certificate bound to a rank looks up as that rank only.
  if (absl::Status s = call->admission.CheckRank(call->request.header().worker_rank(),
                                                 "look up");
      !s.ok()) {
    Finish("Lookup", context, reactor, s, start, metrics_);
    return reactor;
  }
  // Rows of dynamic tables are created by lookups: a write.
  if (CreatesRows(*server_, call->request)) {
    if (absl::Status s = call->admission.Require(
            rpc::RoleBit(rpc::Role::kWorker),
            "look up a dynamic table (it creates rows)");
        !s.ok()) {
      Finish("Lookup", context, reactor, s, start, metrics_);
      return reactor;
    }
  }
  if (call->request.has_response_buffer()) {
    // Same-host rows: the answer goes to the caller's memory when it can.
    absl::StatusOr<SharedMemoryMapper::Region> shared =
        MapSameHost(context, call->request.response_buffer());
    if (shared.ok()) {
      call->shared = *std::move(shared);
      call->response.WriteInto(call->shared.data, call->shared.length);
    }
  }
  LookupCall* c = call.get();
  server_->Lookup(&c->request, &c->response,
                  [this, context, reactor, start, response,
                   call = std::move(call)](absl::Status s) {
                    if (s.ok() && call->response.in_external_memory()) {
                      v1::LookupResponse answer;
                      answer.set_shared_length(call->response.message_bytes());
                      bool own_buffer = false;
                      const grpc::Status serialized =
                          grpc::SerializationTraits<v1::LookupResponse>::Serialize(
                              answer, response, &own_buffer);
                      if (!serialized.ok()) s = absl::InternalError(serialized.error_message());
                      if (metrics_ != nullptr) {
                        metrics_->AddSameHostBytes(
                            "Lookup", static_cast<int64_t>(call->response.message_bytes()));
                      }
                    } else if (s.ok()) {
                      *response = LookupResponseToByteBuffer(call->response);
                    }
                    if (absl::IsInvalidArgument(s)) call->admission.NoteBadRequest();
                    Finish("Lookup", context, reactor, s, start, metrics_);
                  },
                  // The context lives until Finish: a parked lookup whose
                  // client gave up is dropped, freeing its request.
                  [context] { return context->IsCancelled(); });
  return reactor;
}

grpc::ServerUnaryReactor* EmbeddingShardService::PushGradients(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  std::optional<rpc::Admission> admission =
      AdmitOrFinish(gate_, "PushGradients", "EmbeddingShard.PushGradients", context,
                    reactor, start, metrics_);
  if (!admission.has_value()) return reactor;
  auto call = std::make_unique<PushCall>();
  call->admission = *std::move(admission);
  grpc::ByteBuffer bytes(*request);  // shares the slices
  const grpc::Status parsed =
      grpc::SerializationTraits<v1::PushGradientsRequest>::Deserialize(&bytes,
                                                                       &call->request);
  if (!parsed.ok()) {
    Finish("PushGradients", context, reactor,
           absl::InvalidArgumentError(absl::StrCat(
               "the request does not parse as a recps.v1.PushGradientsRequest (",
               request->Length(), " bytes): ", parsed.error_message())),
           start, metrics_, "malformed");
    call->admission.NoteBadRequest();
    return reactor;
  }
  Push(std::move(call), context, reactor, response, start, "PushGradients");
  return reactor;
}

grpc::ServerUnaryReactor* EmbeddingShardService::ReplicatePush(
    grpc::CallbackServerContext* context, const v1::ReplicatePushRequest* request,
    v1::PushGradientsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  std::optional<rpc::Admission> admission = AdmitOrFinish(
      gate_, "ReplicatePush", "EmbeddingShard.ReplicatePush", context, reactor, start, metrics_);
  if (!admission.has_value()) return reactor;
  // Same-host rows: the push is parsed out of the primary's memory into a
  // request of our own (the primary may reuse its memory once answered).
  std::unique_ptr<v1::ReplicatePushRequest> parsed;
  if (request->has_push_buffer()) {
    absl::StatusOr<SharedMemoryMapper::Region> region =
        MapSameHost(context, request->push_buffer());
    if (!region.ok()) {
      Finish("ReplicatePush", context, reactor, region.status(), start, metrics_);
      return reactor;
    }
    parsed = std::make_unique<v1::ReplicatePushRequest>();
    parsed->set_primary(request->primary());
    if (region->length > static_cast<size_t>(std::numeric_limits<int>::max()) ||
        !parsed->mutable_push()->ParseFromArray(region->data,
                                                static_cast<int>(region->length))) {
      Finish("ReplicatePush", context, reactor,
             absl::InvalidArgumentError(absl::StrCat(
                 "the shared push does not parse as a recps.v1.PushGradientsRequest (",
                 region->length, " bytes)")),
             start, metrics_, "malformed");
      admission->NoteBadRequest();
      return reactor;
    }
    if (metrics_ != nullptr) {
      metrics_->AddSameHostBytes("ReplicatePush", static_cast<int64_t>(region->length));
    }
  }
  const v1::ReplicatePushRequest* push = parsed != nullptr ? parsed.get() : request;
  server_->ReplicatePush(push, response,
                         [this, context, reactor, start, parsed = std::move(parsed),
                          admission = *std::move(admission)](absl::Status s) mutable {
                           if (absl::IsInvalidArgument(s)) admission.NoteBadRequest();
                           Finish("ReplicatePush", context, reactor, s, start, metrics_);
                         });
  return reactor;
}

grpc::ServerUnaryReactor* EmbeddingShardService::PushGradientsShared(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  // Counted and limited as PushGradients, of which it is another form.
  std::optional<rpc::Admission> admission =
      AdmitOrFinish(gate_, "PushGradients", "EmbeddingShard.PushGradientsShared", context,
                    reactor, start, metrics_);
  if (!admission.has_value()) return reactor;
  auto call = std::make_unique<PushCall>();
  call->admission = *std::move(admission);
  grpc::ByteBuffer bytes(*request);  // shares the slices
  v1::SharedPushRequest shared;
  if (!grpc::SerializationTraits<v1::SharedPushRequest>::Deserialize(&bytes, &shared).ok()) {
    Finish("PushGradients", context, reactor,
           absl::InvalidArgumentError("the request does not parse as a "
                                      "recps.v1.SharedPushRequest"),
           start, metrics_, "malformed");
    call->admission.NoteBadRequest();
    return reactor;
  }
  absl::StatusOr<SharedMemoryMapper::Region> region = MapSameHost(context, shared.request());
  if (!region.ok()) {
    Finish("PushGradients", context, reactor, region.status(), start, metrics_);
    return reactor;
  }
  // Parsed out of the caller's memory: the message owns its copy after
  // this, whatever the caller does to that memory.
  if (region->length > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !call->request.ParseFromArray(region->data, static_cast<int>(region->length))) {
    Finish("PushGradients", context, reactor,
           absl::InvalidArgumentError(absl::StrCat(
               "the shared request does not parse as a recps.v1.PushGradientsRequest (",
               region->length, " bytes)")),
           start, metrics_, "malformed");
    call->admission.NoteBadRequest();
    return reactor;
  }
  if (metrics_ != nullptr) {
    metrics_->AddSameHostBytes("PushGradients", static_cast<int64_t>(region->length));
  }
  Push(std::move(call), context, reactor, response, start, "PushGradients");
  return reactor;
}

void EmbeddingShardService::Push(std::unique_ptr<PushCall> call,
                                 grpc::CallbackServerContext* context,
                                 grpc::ServerUnaryReactor* reactor,
                                 grpc::ByteBuffer* response, absl::Time start,
                                 const char* rpc) {
  // A worker certificate bound to a rank pushes as that rank only: another
  // rank's part would be taken as that rank's push of the step.
  if (absl::Status s = call->admission.CheckRank(call->request.header().worker_rank(),
                                                 "push gradients");
      !s.ok()) {
    Finish(rpc, context, reactor, s, start, metrics_);
    return;
  }
  PushCall* c = call.get();
  server_->PushGradients(
      &c->request, &c->response,
      [this, context, reactor, start, response, rpc, call = std::move(call)](absl::Status s) {
        if (s.ok()) {
          bool own_buffer = false;
          const grpc::Status serialized =
              grpc::SerializationTraits<v1::PushGradientsResponse>::Serialize(
                  call->response, response, &own_buffer);
          if (!serialized.ok()) s = absl::InternalError(serialized.error_message());
        }
        if (absl::IsInvalidArgument(s)) call->admission.NoteBadRequest();
        Finish(rpc, context, reactor, s, start, metrics_);
      });
}

grpc::ServerUnaryReactor* ShardAdminService::Stats(
    grpc::CallbackServerContext* context, const v1::StatsRequest* request,
    v1::StatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  std::optional<rpc::Admission> admission = AdmitOrFinish(
      gate_, "Stats", "ShardAdmin.Stats", context, reactor, start, metrics_);
  if (!admission.has_value()) return reactor;
  Finish("Stats", context, reactor, server_->Stats(*request, response), start,
         metrics_);
  return reactor;
}

grpc::ServerUnaryReactor* ShardAdminService::GetShardMap(
    grpc::CallbackServerContext* context, const v1::GetShardMapRequest*,
    v1::ShardMap* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  std::optional<rpc::Admission> admission = AdmitOrFinish(
      gate_, "GetShardMap", "ShardAdmin.GetShardMap", context, reactor, start, metrics_);
  if (!admission.has_value()) return reactor;
  *response = server_->GetShardMap();
  Finish("GetShardMap", context, reactor, absl::OkStatus(), start, metrics_);
  return reactor;
}

grpc::ServerUnaryReactor* ShardAdminService::SetShardMap(
    grpc::CallbackServerContext* context, const v1::SetShardMapRequest* request,
    v1::SetShardMapResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  std::optional<rpc::Admission> admission = AdmitOrFinish(
      gate_, "SetShardMap", "ShardAdmin.SetShardMap", context, reactor, start, metrics_);
  if (!admission.has_value()) return reactor;
  Finish("SetShardMap", context, reactor, server_->SetShardMap(*request), start,
         metrics_);
  return reactor;
}

grpc::ServerUnaryReactor* ShardAdminService::SaveRows(
    grpc::CallbackServerContext* context, const v1::SaveRowsRequest* request,
    v1::SaveRowsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  std::optional<rpc::Admission> admission = AdmitOrFinish(
      gate_, "SaveRows", "ShardAdmin.SaveRows", context, reactor, start, metrics_);
  if (!admission.has_value()) return reactor;
  server_->snapshots().SaveRows(request, response,
                    [this, context, reactor, start,
                     admission = *std::move(admission)](absl::Status s) mutable {
                      if (absl::IsInvalidArgument(s)) admission.NoteBadRequest();
                      Finish("SaveRows", context, reactor, s, start, metrics_);
                    });
  return reactor;
}

grpc::ServerUnaryReactor* ShardAdminService::SaveRowsStatus(
    grpc::CallbackServerContext* context,
    const v1::SaveRowsStatusRequest* request,
    v1::SaveRowsStatusResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  std::optional<rpc::Admission> admission =
      AdmitOrFinish(gate_, "SaveRowsStatus", "ShardAdmin.SaveRowsStatus", context,
                    reactor, start, metrics_);
  if (!admission.has_value()) return reactor;
  const absl::Status s = server_->snapshots().SaveRowsStatus(*request, response);
  if (absl::IsInvalidArgument(s)) admission->NoteBadRequest();
  Finish("SaveRowsStatus", context, reactor, s, start, metrics_);
  return reactor;
}

grpc::ServerUnaryReactor* ShardAdminService::RestoreRows(
    grpc::CallbackServerContext* context,
    const v1::RestoreRowsRequest* request, v1::RestoreRowsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  std::optional<rpc::Admission> admission =
      AdmitOrFinish(gate_, "RestoreRows", "ShardAdmin.RestoreRows", context, reactor,
                    start, metrics_);
  if (!admission.has_value()) return reactor;
  server_->snapshots().RestoreRows(request, response,
                       [this, context, reactor, start,
                        admission = *std::move(admission)](absl::Status s) mutable {
                         if (absl::IsInvalidArgument(s)) admission.NoteBadRequest();
                         Finish("RestoreRows", context, reactor, s, start,
                                metrics_);
                       });
  return reactor;
}

#define RECPS_ADMIN_ASYNC(Method, Request, Response)                        \
  grpc::ServerUnaryReactor* ShardAdminService::Method(                    \
      grpc::CallbackServerContext* context, const v1::Request* request,    \
      v1::Response* response) {                                            \
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();         \
    const absl::Time start = absl::Now();                                  \
    std::optional<rpc::Admission> admission =                              \
        AdmitOrFinish(gate_, #Method, "ShardAdmin." #Method, context,      \
                      reactor, start, metrics_);                           \
    if (!admission.has_value()) return reactor;                            \
    server_->moves().Method(                                               \
        request, response,                                                 \
        [this, context, reactor, start,                                    \
         admission = *std::move(admission)](absl::Status s) mutable {      \
          if (absl::IsInvalidArgument(s)) admission.NoteBadRequest();      \
          Finish(#Method, context, reactor, s, start, metrics_);           \
        });                                                                \
    return reactor;                                                        \
  }

RECPS_ADMIN_ASYNC(MigrateIn, MigrateInRequest, MigrateInResponse)
RECPS_ADMIN_ASYNC(HandOver, HandOverRequest, HandOverResponse)
RECPS_ADMIN_ASYNC(AbortMove, AbortMoveRequest, AbortMoveResponse)
RECPS_ADMIN_ASYNC(FinishMove, FinishMoveRequest, FinishMoveResponse)
#undef RECPS_ADMIN_ASYNC

grpc::ServerUnaryReactor* ShardAdminService::AllowExport(
    grpc::CallbackServerContext* context, const v1::AllowExportRequest* request,
    v1::AllowExportResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  std::optional<rpc::Admission> admission = AdmitOrFinish(
      gate_, "AllowExport", "ShardAdmin.AllowExport", context, reactor, start, metrics_);
  if (!admission.has_value()) return reactor;
  const absl::Status s = server_->moves().AllowExport(*request);
  if (absl::IsInvalidArgument(s)) admission->NoteBadRequest();
  Finish("AllowExport", context, reactor, s, start, metrics_);
  return reactor;
}

grpc::ServerUnaryReactor* ShardAdminService::ListMoves(
    grpc::CallbackServerContext* context, const v1::ListMovesRequest* request,
    v1::ListMovesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  std::optional<rpc::Admission> admission = AdmitOrFinish(
      gate_, "ListMoves", "ShardAdmin.ListMoves", context, reactor, start, metrics_);
  if (!admission.has_value()) return reactor;
  const absl::Status s = server_->moves().ListMoves(*request, response);
  if (absl::IsInvalidArgument(s)) admission->NoteBadRequest();
  Finish("ListMoves", context, reactor, s, start, metrics_);
  return reactor;
}

namespace {

// One ExportRows stream: reads a chunk on the work queue, writes it, and
// reads the next once gRPC took it (OnWriteDone).
class ExportRowsReactor final
    : public grpc::ServerWriteReactor<v1::ExportRowsChunk> {
 public:
  ExportRowsReactor(ShardServer* server, ShardMetrics* metrics,
                    const v1::ExportRowsRequest* request, rpc::CallGate* gate,
                    grpc::CallbackServerContext* context)
      : server_(server), metrics_(metrics), start_(absl::Now()) {
    if (gate != nullptr) {
      absl::StatusOr<rpc::Admission> admission =
          gate->Admit(*context, "ShardAdmin.ExportRows");
      if (!admission.ok()) {
        End(admission.status());
        return;
      }
      admission_ = *std::move(admission);
    }
    absl::StatusOr<std::unique_ptr<SlotMoves::RowExport>> exp =
        server_->moves().StartExport(*request);
    if (!exp.ok()) {
      End(exp.status());
      return;
    }
    export_ = *std::move(exp);
    ReadNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(absl::CancelledError("the target stopped reading the export"));
      return;
    }
    ReadNext();
  }
  void OnDone() override { delete this; }

 private:
  void ReadNext() {
    server_->Schedule([this] {
      absl::StatusOr<bool> more = server_->moves().NextExportChunk(*export_, &chunk_);
      if (!more.ok()) {
        End(more.status());
      } else if (!*more) {
        End(absl::OkStatus());
      } else {
        StartWrite(&chunk_);
      }
    });
  }
  void End(const absl::Status& status) {
    if (metrics_ != nullptr) {
      metrics_->RecordRequest("ExportRows", status.code(),
                              absl::ToDoubleSeconds(absl::Now() - start_));
    }
    Finish(rpc::ToGrpcStatus(status));
  }

  ShardServer* const server_;
  ShardMetrics* const metrics_;
  const absl::Time start_;
  // Held for the whole stream: it counts as a call in flight.
  rpc::Admission admission_;
  std::unique_ptr<SlotMoves::RowExport> export_;
  v1::ExportRowsChunk chunk_;
};

}  // namespace

grpc::ServerWriteReactor<v1::ExportRowsChunk>* ShardAdminService::ExportRows(
    grpc::CallbackServerContext* context, const v1::ExportRowsRequest* request) {
  return new ExportRowsReactor(server_, metrics_, request, gate_, context);
}

}  // namespace recps::server
