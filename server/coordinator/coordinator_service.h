// gRPC side of the coordinator: thin callback-API adapters over Coordinator
// (coordinator.h), the thread that pushes new shard maps to shard servers,
// and the timer thread that drives Coordinator::Tick().
//
// Waiting RPCs (KvGet with a wait, KvWait, Barrier, WatchShardMap) hold no
// gRPC thread: their reactors stay pending until the coordinator calls back.
#ifndef RECPS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define RECPS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/rpc/call_gate.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/coordinator.grpc.pb.h"
#include "server/coordinator/coordinator.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace recps::server {

class WatchReactor;

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  // `coordinator` is not owned; `registry` may be null (no RPC metrics).
  CoordinatorService(Coordinator* coordinator, prometheus::Registry* registry);
  ~CoordinatorService() override;

  // Ends every Watch stream and pending wait with UNAVAILABLE and refuses
  // new ones; call before grpc::Server::Shutdown so it need not wait for
  // streams that would never end.
  void Stop();

  // Roles and per-client limits (not owned; null: every call allowed).
  void set_gate(rpc::CallGate* gate) { gate_ = gate; }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;
  grpc::ServerUnaryReactor* GetShardMap(
      grpc::CallbackServerContext* context,
      const v1::GetCoordinatorShardMapRequest* request,
      v1::GetCoordinatorShardMapResponse* response) override;
  grpc::ServerWriteReactor<v1::ShardMap>* WatchShardMap(
      grpc::CallbackServerContext* context,
      const v1::WatchShardMapRequest* request) override;
  grpc::ServerUnaryReactor* KvSet(grpc::CallbackServerContext* context,
                                  const v1::KvSetRequest* request,
                                  v1::KvSetResponse* response) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* context,
                                  const v1::KvGetRequest* request,
                                  v1::KvGetResponse* response) override;
  grpc::ServerUnaryReactor* KvWait(grpc::CallbackServerContext* context,
                                   const v1::KvWaitRequest* request,
                                   v1::KvWaitResponse* response) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const v1::BarrierRequest* request,
                                    v1::BarrierResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::GetJobResponse* response) override;
  grpc::ServerUnaryReactor* ListMembers(grpc::CallbackServerContext* context,
                                        const v1::ListMembersRequest* request,
                                        v1::ListMembersResponse* response) override;
  grpc::ServerUnaryReactor* ForgetMember(grpc::CallbackServerContext* context,
                                         const v1::ForgetMemberRequest* request,
                                         v1::ForgetMemberResponse* response) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* context,
                                    const v1::GetPlanRequest* request,
                                    v1::GetPlanResponse* response) override;
  // Checkpoints: adapters over Coordinator::checkpoints().
  grpc::ServerUnaryReactor* CheckpointCut(grpc::CallbackServerContext* context,
                                          const v1::CheckpointCutRequest* request,
                                          v1::CheckpointCutResponse* response) override;
  grpc::ServerUnaryReactor* RequestCheckpoint(
      grpc::CallbackServerContext* context, const v1::RequestCheckpointRequest* request,
      v1::RequestCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(
      grpc::CallbackServerContext* context, const v1::ListCheckpointsRequest* request,
      v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* GetResumeState(
      grpc::CallbackServerContext* context, const v1::GetResumeStateRequest* request,
      v1::GetResumeStateResponse* response) override;
  // Rebalancing: adapters over Coordinator::moves().
  grpc::ServerUnaryReactor* PlanRebalance(grpc::CallbackServerContext* context,
                                          const v1::PlanRebalanceRequest* request,
                                          v1::PlanRebalanceResponse* response) override;
  grpc::ServerUnaryReactor* ApplyRebalance(grpc::CallbackServerContext* context,
                                           const v1::ApplyRebalanceRequest* request,
                                           v1::ApplyRebalanceResponse* response) override;
  grpc::ServerUnaryReactor* ListMoves(grpc::CallbackServerContext* context,
                                      const v1::ListRebalanceMovesRequest* request,
                                      v1::ListRebalanceMovesResponse* response) override;

 private:
  friend class WatchReactor;
  struct Metrics;
  // Finishes a unary RPC: records it and converts the status.
  // INVALID_ARGUMENT counts as a bad request of the admitted caller.
  void Finish(const char* rpc, grpc::ServerUnaryReactor* reactor,
              const absl::Status& status, rpc::Admission* admission = nullptr);
  void Forget(WatchReactor* reactor);
  // The caller's admission ("Coordinator.<rpc>"), held until the call ends;
  // null after finishing the call refused.
  std::shared_ptr<rpc::Admission> Admit(grpc::CallbackServerContext* context,
                                        grpc::ServerUnaryReactor* reactor, const char* rpc);
  // A worker acts for `rank` and `member_id` only when its certificate
  // binds it to that rank (rpc::Admission::CheckRank) and, for unbound
  // certificates, the coordinator registered them to it (CheckClaim).
  absl::Status ClaimRank(const rpc::Admission& admission, const Caller& caller,
                         int32_t rank, const std::string& member_id,
                         absl::string_view what) const;

  Coordinator* const coordinator_;
  rpc::CallGate* gate_ = nullptr;
  std::unique_ptr<Metrics> metrics_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<WatchReactor*> watchers_ ABSL_GUARDED_BY(mu_);
};

// Delivers shard maps to shard servers (ShardAdmin.SetShardMap) on its own
// thread, retrying while a server is unreachable. A newer map for the same
// server replaces one not yet delivered.
class ShardMapPusher {
 public:
  // Told, from the pusher's thread, what became of each push that ended:
  // OK when delivered (or the server had that epoch already), the server's
  // refusal otherwise.
  using ResultFn = std::function<void(const std::string& address, uint64_t epoch,
                                      const absl::Status& outcome)>;
  explicit ShardMapPusher(ResultFn on_result = nullptr);
  ~ShardMapPusher();  // stops; undelivered maps are dropped

  // Never blocks; usable as a Coordinator::MapPusher.
  void Push(const std::string& address, const v1::ShardMap& map);

 private:
  void Loop();
  // Whether the server at `address` routes by `epoch` or a newer map.
  static bool HasEpoch(const std::string& address, uint64_t epoch);

  const ResultFn on_result_;
  absl::Mutex mu_;
  std::map<std::string, v1::ShardMap> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Calls coordinator->Tick() every `interval` until destroyed.
class CoordinatorTicker {
 public:
  CoordinatorTicker(Coordinator* coordinator, absl::Duration interval);
  ~CoordinatorTicker();

 private:
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
