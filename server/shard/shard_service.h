// gRPC adapters of the shard server: read the request, call ShardServer,
// convert the status in one place (status_conversion), record metrics.
#ifndef RECPS_SERVER_SHARD_SHARD_SERVICE_H_
#define RECPS_SERVER_SHARD_SHARD_SERVICE_H_

#include <memory>

#include "common/rpc/call_gate.h"
#include "common/wire/same_host_memory.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "server/shard/shard_metrics.h"
#include "server/shard/shard_server.h"

namespace recps::server {

// The response's segments as slices of its buffer, without copying: the
// buffer goes back to its pool when the last slice is dropped. What gRPC
// sends, and what an in-process lookup hands over (in_process_shard.h).
grpc::ByteBuffer LookupResponseToByteBuffer(SerializedLookupResponse& response);

// Lookup is registered raw: its response is sent from the buffer the rows
// were written to (SerializedLookupResponse) instead of a protobuf
// message that gRPC would serialize, copying every row again. The wire
// format stays v1::LookupResponse.
//
// PushGradients is registered raw too, so that a request that does not
// parse is answered INVALID_ARGUMENT and counted against its client like
// any bad request (the generated handler answers it before our code runs).
//
// Same-host rows (common/wire/same_host_memory.h), once allowed: a lookup
// that names a response_buffer gets its answer written there, and
// PushGradientsShared reads the push from the caller's memory; both only
// for a caller on loopback.
class EmbeddingShardService final
    : public v1::EmbeddingShard::WithRawCallbackMethod_Lookup<
          v1::EmbeddingShard::WithRawCallbackMethod_PushGradients<
              v1::EmbeddingShard::WithRawCallbackMethod_PushGradientsShared<
                  v1::EmbeddingShard::WithCallbackMethod_ReplicatePush<
                      v1::EmbeddingShard::Service>>>> {
 public:
  // Neither pointer is owned; metrics may be null.
  EmbeddingShardService(ShardServer* server, ShardMetrics* metrics)
      : server_(server), metrics_(metrics) {}

  // Roles and per-client limits (not owned; null: every call allowed).
  void set_gate(rpc::CallGate* gate) { gate_ = gate; }

  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PushGradients(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PushGradientsShared(grpc::CallbackServerContext* context,
                                                const grpc::ByteBuffer* request,
                                                grpc::ByteBuffer* response) override;
  // Replication: a push forwarded by a primary (bytes, or same-host rows).
  grpc::ServerUnaryReactor* ReplicatePush(grpc::CallbackServerContext* context,
                                          const v1::ReplicatePushRequest* request,
                                          v1::PushGradientsResponse* response) override;

  // Serve same-host rows (off until called).
  void AllowSameHostRows() { same_host_ = std::make_unique<SharedMemoryMapper>(); }

 private:
  // The caller's memory a same-host request names: FAILED_PRECONDITION
  // starting with kSameHostRefusal when it may not or cannot be used.
  absl::StatusOr<SharedMemoryMapper::Region> MapSameHost(
      grpc::CallbackServerContext* context, const v1::SharedBuffer& buffer);
  // The parsed, admitted push (bytes or shared memory), to the server.
  struct PushCall;
  void Push(std::unique_ptr<PushCall> call, grpc::CallbackServerContext* context,
            grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* response,
            absl::Time start, const char* rpc);

  ShardServer* server_;
  ShardMetrics* metrics_;
  rpc::CallGate* gate_ = nullptr;
  std::unique_ptr<SharedMemoryMapper> same_host_;  // null: bytes only
};

class ShardAdminService final : public v1::ShardAdmin::CallbackService {
 public:
  ShardAdminService(ShardServer* server, ShardMetrics* metrics)
      : server_(server), metrics_(metrics) {}

  // Roles and per-client limits (not owned; null: every call allowed).
  void set_gate(rpc::CallGate* gate) { gate_ = gate; }

  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const v1::StatsRequest* request,
                                  v1::StatsResponse* response) override;
  grpc::ServerUnaryReactor* GetShardMap(grpc::CallbackServerContext* context,
                                        const v1::GetShardMapRequest* request,
                                        v1::ShardMap* response) override;
  grpc::ServerUnaryReactor* SetShardMap(
      grpc::CallbackServerContext* context,
      const v1::SetShardMapRequest* request,
      v1::SetShardMapResponse* response) override;
  grpc::ServerUnaryReactor* SaveRows(grpc::CallbackServerContext* context,
                                     const v1::SaveRowsRequest* request,
                                     v1::SaveRowsResponse* response) override;
  grpc::ServerUnaryReactor* SaveRowsStatus(
      grpc::CallbackServerContext* context,
      const v1::SaveRowsStatusRequest* request,
      v1::SaveRowsStatusResponse* response) override;
  grpc::ServerUnaryReactor* RestoreRows(
      grpc::CallbackServerContext* context,
      const v1::RestoreRowsRequest* request,
      v1::RestoreRowsResponse* response) override;
  grpc::ServerUnaryReactor* MigrateIn(grpc::CallbackServerContext* context,
                                      const v1::MigrateInRequest* request,
                                      v1::MigrateInResponse* response) override;
  grpc::ServerUnaryReactor* HandOver(grpc::CallbackServerContext* context,
                                     const v1::HandOverRequest* request,
                                     v1::HandOverResponse* response) override;
  grpc::ServerUnaryReactor* AllowExport(grpc::CallbackServerContext* context,
                                        const v1::AllowExportRequest* request,
                                        v1::AllowExportResponse* response) override;
  grpc::ServerUnaryReactor* AbortMove(grpc::CallbackServerContext* context,
                                      const v1::AbortMoveRequest* request,
                                      v1::AbortMoveResponse* response) override;
  grpc::ServerUnaryReactor* ListMoves(grpc::CallbackServerContext* context,
                                      const v1::ListMovesRequest* request,
                                      v1::ListMovesResponse* response) override;
  grpc::ServerUnaryReactor* FinishMove(
      grpc::CallbackServerContext* context, const v1::FinishMoveRequest* request,
      v1::FinishMoveResponse* response) override;
  // Chunks are read on the server's work queue, one at a time, each once
  // the previous one was written (flow control paces the stream).
  grpc::ServerWriteReactor<v1::ExportRowsChunk>* ExportRows(
      grpc::CallbackServerContext* context,
      const v1::ExportRowsRequest* request) override;

 private:
  ShardServer* server_;
  ShardMetrics* metrics_;
  rpc::CallGate* gate_ = nullptr;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SHARD_SERVICE_H_
