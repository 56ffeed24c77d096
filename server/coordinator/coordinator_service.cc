#include "server/coordinator/coordinator_service.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/rpc/channels.h"
#include "common/rpc/status_conversion.h"
#include "common/status_macros.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "recps/v1/shard_admin.grpc.pb.h"

namespace recps::server {
namespace {

absl::Duration Ms(int64_t ms) { return absl::Milliseconds(std::max<int64_t>(ms, 0)); }

// Who calls, for the coordinator's claim checks: nothing is checked with
// plaintext or for an admin (who may act for anyone).
Caller CallerOf(const rpc::Admission& admission) {
  Caller caller;
  if (!admission.enforced() || admission.peer().role == rpc::Role::kAdmin) return caller;
  caller.uri = admission.peer().uri;
  caller.client = admission.client_key();
  return caller;
}

// A unary call that parks a wait (KvGet, KvWait, Barrier): when its client
// cancels or its deadline passes, the wait is released at once rather than
// holding a slot, a quota and a barrier arrival until it times out.
class ParkedCallReactor final : public grpc::ServerUnaryReactor {
 public:
  ParkedCallReactor(Coordinator* coordinator, int64_t wait_id)
      : coordinator_(coordinator), wait_id_(wait_id) {}
  void OnCancel() override { coordinator_->CancelWait(wait_id_); }
  void OnDone() override { delete this; }

 private:
  Coordinator* const coordinator_;
  const int64_t wait_id_;
};

}  // namespace

struct CoordinatorService::Metrics {
  explicit Metrics(prometheus::Registry& registry)
      : requests(prometheus::BuildCounter()
                     .Name("recps_coordinator_requests_total")
                     .Help("Coordinator RPCs by method and status code")
                     .Register(registry)) {}
  prometheus::Family<prometheus::Counter>& requests;
};

// One WatchShardMap stream: writes each newer map, one write at a time,
// skipping maps superseded while a write was in flight.
class WatchReactor final : public grpc::ServerWriteReactor<v1::ShardMap> {
 public:
  WatchReactor(CoordinatorService* service, uint64_t after_epoch)
      : service_(service) {
    watch_id_ = service_->coordinator_->Watch(
        after_epoch, [this](const v1::ShardMap& map) { Offer(map); });
  }

  void Offer(const v1::ShardMap& map) {
    absl::MutexLock lock(&mu_);
    if (finished_ || map.epoch() <= offered_epoch_) return;
    offered_epoch_ = map.epoch();
    next_ = map;
    has_next_ = true;
    if (!writing_) WriteNextLocked();
  }

  // Ends the stream with `status` once the write in flight is done.
  void Stop(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    stop_status_ = status;
    stop_ = true;
    if (!writing_) FinishLocked(status);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "watch stream broken"));
    } else if (stop_) {
      FinishLocked(stop_status_);
    } else if (has_next_) {
      WriteNextLocked();
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status::CANCELLED);
  }

  // Keeps the caller's admission (its per-client slot) for the stream's life.
  void Hold(std::shared_ptr<rpc::Admission> admission) { admission_ = std::move(admission); }

  void OnDone() override {
    // After Unwatch no Offer runs, so `this` may go.
    service_->coordinator_->Unwatch(watch_id_);
    service_->Forget(this);
    delete this;
  }

 private:
  // gRPC runs user reactions on its own threads, never inline from
  // StartWrite/Finish, so calling them under mu_ cannot deadlock.
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    current_ = std::move(next_);
    has_next_ = false;
    writing_ = true;
    StartWrite(&current_);
  }
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  CoordinatorService* const service_;
  std::shared_ptr<rpc::Admission> admission_;
  int64_t watch_id_ = 0;
  absl::Mutex mu_;
  uint64_t offered_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  v1::ShardMap current_ ABSL_GUARDED_BY(mu_);  // the write in flight
  v1::ShardMap next_ ABSL_GUARDED_BY(mu_);
  bool has_next_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status stop_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// A stream refused before it started (role or per-client limit).
class RefusedWriteReactor final : public grpc::ServerWriteReactor<v1::ShardMap> {
 public:
  explicit RefusedWriteReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

CoordinatorService::CoordinatorService(Coordinator* coordinator,
                                       prometheus::Registry* registry)
    : coordinator_(coordinator) {
  if (registry != nullptr) metrics_ = std::make_unique<Metrics>(*registry);
}

CoordinatorService::~CoordinatorService() { Stop(); }

void CoordinatorService::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      // Forget() waits on mu_, so no reactor is deleted during this loop.
      const grpc::Status stopping(grpc::StatusCode::UNAVAILABLE,
                                  "the coordinator is stopping");
      for (WatchReactor* r : watchers_) r->Stop(stopping);
    }
  }
  coordinator_->CancelWaits(absl::UnavailableError("the coordinator is stopping"));
}

void CoordinatorService::Forget(WatchReactor* reactor) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(reactor);
}

void CoordinatorService::Finish(const char* rpc, grpc::ServerUnaryReactor* reactor,
                                const absl::Status& status, rpc::Admission* admission) {
  if (admission != nullptr && absl::IsInvalidArgument(status)) admission->NoteBadRequest();
  if (metrics_ != nullptr) {
    metrics_->requests
        .Add({{"rpc", rpc}, {"code", absl::StatusCodeToString(status.code())}})
        .Increment();
  }
  reactor->Finish(rpc::ToGrpcStatus(status));
}

std::shared_ptr<rpc::Admission> CoordinatorService::Admit(
    grpc::CallbackServerContext* context, grpc::ServerUnaryReactor* reactor,
    const char* rpc) {
  if (gate_ == nullptr) return std::make_shared<rpc::Admission>();
  absl::StatusOr<rpc::Admission> admission =
      gate_->Admit(*context, absl::StrCat("Coordinator.", rpc));
  if (admission.ok()) return std::make_shared<rpc::Admission>(*std::move(admission));
  Finish(rpc, reactor, admission.status());
  return nullptr;
}

absl::Status CoordinatorService::ClaimRank(const rpc::Admission& admission,
                                           const Caller& caller, int32_t rank,
                                           const std::string& member_id,
                                           absl::string_view what) const {
  if (rank >= 0) RETURN_IF_ERROR(admission.CheckRank(rank, what));
  return coordinator_->CheckClaim(caller, rank, member_id, what);
}

grpc::ServerUnaryReactor* CoordinatorService::Register(
    grpc::CallbackServerContext* context, const v1::RegisterRequest* request,
    v1::RegisterResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "Register");
  if (admission == nullptr) return reactor;
  // A certificate registers as what it is: a worker's cannot become a
  // shard server (and so get slots and everyone's rows), nor another rank.
  if (request->role() == v1::SHARD_SERVER || request->role() == v1::WORKER) {
    const rpc::Role needed =
        request->role() == v1::SHARD_SERVER ? rpc::Role::kShard : rpc::Role::kWorker;
    absl::Status claim = admission->Require(
        rpc::RoleBit(needed),
        absl::StrCat("register as ", v1::MemberRole_Name(request->role())));
    if (claim.ok() && request->role() == v1::WORKER && request->rank() >= 0) {
      claim = admission->CheckRank(request->rank(), "register");
    }
    if (!claim.ok()) {
      Finish("Register", reactor, claim, admission.get());
      return reactor;
    }
  }
  absl::StatusOr<v1::RegisterResponse> r =
      coordinator_->Register(*request, CallerOf(*admission));
  if (r.ok()) *response = *std::move(r);
  Finish("Register", reactor, r.status(), admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(
    grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "Heartbeat");
  if (admission == nullptr) return reactor;
  absl::StatusOr<v1::HeartbeatResponse> r =
      coordinator_->Heartbeat(*request, CallerOf(*admission));
  if (r.ok()) *response = *std::move(r);
  Finish("Heartbeat", reactor, r.status(), admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Leave(grpc::CallbackServerContext* context,
                                                    const v1::LeaveRequest* request,
                                                    v1::LeaveResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "Leave");
  if (admission == nullptr) return reactor;
  Finish("Leave", reactor, coordinator_->Leave(*request, CallerOf(*admission)),
         admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetShardMap(
    grpc::CallbackServerContext* context, const v1::GetCoordinatorShardMapRequest*,
    v1::GetCoordinatorShardMapResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "GetShardMap");
  if (admission == nullptr) return reactor;
  absl::StatusOr<v1::ShardMap> map = coordinator_->GetShardMap();
  if (map.ok()) *response->mutable_shard_map() = *std::move(map);
  Finish("GetShardMap", reactor, map.status(), admission.get());
  return reactor;
}

grpc::ServerWriteReactor<v1::ShardMap>* CoordinatorService::WatchShardMap(
    grpc::CallbackServerContext* context, const v1::WatchShardMapRequest* request) {
  std::shared_ptr<rpc::Admission> admission = std::make_shared<rpc::Admission>();
  if (gate_ != nullptr) {
    absl::StatusOr<rpc::Admission> a = gate_->Admit(*context, "Coordinator.WatchShardMap");
    if (!a.ok()) return new RefusedWriteReactor(rpc::ToGrpcStatus(a.status()));
    *admission = *std::move(a);
  }
  auto* reactor = new WatchReactor(this, request->after_epoch());
  reactor->Hold(std::move(admission));
  absl::MutexLock lock(&mu_);
  watchers_.insert(reactor);
  if (stopping_) {
    reactor->Stop(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "the coordinator is stopping"));
  }
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::KvSet(
    grpc::CallbackServerContext* context, const v1::KvSetRequest* request,
    v1::KvSetResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "KvSet");
  if (admission == nullptr) return reactor;
  Finish("KvSet", reactor,
         coordinator_->KvSet(request->key(), request->value(), CallerOf(*admission)),
         admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::KvGet(
    grpc::CallbackServerContext* context, const v1::KvGetRequest* request,
    v1::KvGetResponse* response) {
  const int64_t wait_id = coordinator_->NewWaitId();
  grpc::ServerUnaryReactor* reactor = new ParkedCallReactor(coordinator_, wait_id);
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "KvGet");
  if (admission == nullptr) return reactor;
  Caller caller = CallerOf(*admission);
  caller.wait_id = wait_id;
  coordinator_->KvGet(request->key(), Ms(request->wait_ms()),
                      [this, reactor, response, admission](absl::StatusOr<std::string> v) {
                        if (v.ok()) response->set_value(*std::move(v));
                        Finish("KvGet", reactor, v.status(), admission.get());
                      },
                      caller);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::KvWait(
    grpc::CallbackServerContext* context, const v1::KvWaitRequest* request,
    v1::KvWaitResponse*) {
  const int64_t wait_id = coordinator_->NewWaitId();
  grpc::ServerUnaryReactor* reactor = new ParkedCallReactor(coordinator_, wait_id);
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "KvWait");
  if (admission == nullptr) return reactor;
  Caller caller = CallerOf(*admission);
  caller.wait_id = wait_id;
  coordinator_->KvWait({request->keys().begin(), request->keys().end()},
                       Ms(request->timeout_ms()),
                       [this, reactor, admission](absl::Status s) {
                         Finish("KvWait", reactor, s, admission.get());
                       },
                       caller);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Barrier(
    grpc::CallbackServerContext* context, const v1::BarrierRequest* request,
    v1::BarrierResponse*) {
  const int64_t wait_id = coordinator_->NewWaitId();
  grpc::ServerUnaryReactor* reactor = new ParkedCallReactor(coordinator_, wait_id);
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "Barrier");
  if (admission == nullptr) return reactor;
  Caller caller = CallerOf(*admission);
  caller.wait_id = wait_id;
  if (absl::Status claim = ClaimRank(*admission, caller, request->rank(),
                                     request->member_id(), "barrier");
      !claim.ok()) {
    Finish("Barrier", reactor, claim, admission.get());
    return reactor;
  }
  coordinator_->Barrier(
      *request,
      [this, reactor, admission](absl::Status s) {
        Finish("Barrier", reactor, s, admission.get());
      },
      caller);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(
    grpc::CallbackServerContext* context, const v1::GetJobRequest*,
    v1::GetJobResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "GetJob");
  if (admission == nullptr) return reactor;
  absl::StatusOr<v1::JobConfig> job = coordinator_->GetJob();
  if (job.ok()) *response->mutable_job() = *std::move(job);
  Finish("GetJob", reactor, job.status(), admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListMembers(
    grpc::CallbackServerContext* context, const v1::ListMembersRequest*,
    v1::ListMembersResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "ListMembers");
  if (admission == nullptr) return reactor;
  *response = coordinator_->ListMembers();
  Finish("ListMembers", reactor, absl::OkStatus(), admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ForgetMember(
    grpc::CallbackServerContext* context, const v1::ForgetMemberRequest* request,
    v1::ForgetMemberResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "ForgetMember");
  if (admission == nullptr) return reactor;
  absl::StatusOr<v1::Member> member = coordinator_->ForgetMember(request->member_id());
  if (member.ok()) *response->mutable_member() = *std::move(member);
  Finish("ForgetMember", reactor, member.status(), admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetPlan(
    grpc::CallbackServerContext* context, const v1::GetPlanRequest*,
    v1::GetPlanResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "GetPlan");
  if (admission == nullptr) return reactor;
  absl::StatusOr<v1::ShardingPlan> plan = coordinator_->GetPlan();
  if (plan.ok()) *response->mutable_plan() = *std::move(plan);
  Finish("GetPlan", reactor, plan.status(), admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::CheckpointCut(
    grpc::CallbackServerContext* context, const v1::CheckpointCutRequest* request,
    v1::CheckpointCutResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "CheckpointCut");
  if (admission == nullptr) return reactor;
  if (absl::Status claim = ClaimRank(*admission, CallerOf(*admission), request->rank(),
                                     request->member_id(), "checkpoint cut");
      !claim.ok()) {
    Finish("CheckpointCut", reactor, claim, admission.get());
    return reactor;
  }
  // The admission is held until the cut answers: the call is in flight.
  coordinator_->checkpoints().Cut(
      *request, [this, reactor, response,
                 admission](absl::StatusOr<v1::CheckpointCutResponse> r) {
        if (r.ok()) *response = *std::move(r);
        Finish("CheckpointCut", reactor, r.status(), admission.get());
      });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::RequestCheckpoint(
    grpc::CallbackServerContext* context, const v1::RequestCheckpointRequest* request,
    v1::RequestCheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "RequestCheckpoint");
  if (admission == nullptr) return reactor;
  absl::StatusOr<v1::RequestCheckpointResponse> r =
      coordinator_->checkpoints().Request(request->reason());
  if (r.ok()) *response = *std::move(r);
  Finish("RequestCheckpoint", reactor, r.status(), admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListCheckpoints(
    grpc::CallbackServerContext* context, const v1::ListCheckpointsRequest*,
    v1::ListCheckpointsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "ListCheckpoints");
  if (admission == nullptr) return reactor;
  absl::StatusOr<v1::ListCheckpointsResponse> r = coordinator_->checkpoints().List();
  if (r.ok()) *response = *std::move(r);
  Finish("ListCheckpoints", reactor, r.status(), admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetResumeState(
    grpc::CallbackServerContext* context, const v1::GetResumeStateRequest* request,
    v1::GetResumeStateResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "GetResumeState");
  if (admission == nullptr) return reactor;
  if (absl::Status claim =
          ClaimRank(*admission, CallerOf(*admission), request->rank(), "", "resume state");
      !claim.ok()) {
    Finish("GetResumeState", reactor, claim, admission.get());
    return reactor;
  }
  absl::StatusOr<v1::GetResumeStateResponse> r =
      coordinator_->checkpoints().ResumeState(request->rank());
  if (r.ok()) *response = *std::move(r);
  Finish("GetResumeState", reactor, r.status(), admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::PlanRebalance(
    grpc::CallbackServerContext* context, const v1::PlanRebalanceRequest* request,
    v1::PlanRebalanceResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "PlanRebalance");
  if (admission == nullptr) return reactor;
  // A rare call: it waits here for the servers' stats (bounded by
  // the move RPC timeout), in parallel.
  absl::StatusOr<v1::PlanRebalanceResponse> r = coordinator_->moves().Plan(*request);
  if (r.ok()) *response = *std::move(r);
  Finish("PlanRebalance", reactor, r.status(), admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ApplyRebalance(
    grpc::CallbackServerContext* context, const v1::ApplyRebalanceRequest* request,
    v1::ApplyRebalanceResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "ApplyRebalance");
  if (admission == nullptr) return reactor;
  absl::StatusOr<v1::ApplyRebalanceResponse> r = coordinator_->moves().Apply(*request);
  if (r.ok()) *response = *std::move(r);
  Finish("ApplyRebalance", reactor, r.status(), admission.get());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListMoves(
    grpc::CallbackServerContext* context, const v1::ListRebalanceMovesRequest*,
    v1::ListRebalanceMovesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<rpc::Admission> admission = Admit(context, reactor, "ListMoves");
  if (admission == nullptr) return reactor;
  *response = coordinator_->moves().List();
  Finish("ListMoves", reactor, absl::OkStatus(), admission.get());
  return reactor;
}

// --- ShardMapPusher ---------------------------------------------------------

ShardMapPusher::ShardMapPusher(ResultFn on_result)
    : on_result_(std::move(on_result)), thread_([this] { Loop(); }) {}

bool ShardMapPusher::HasEpoch(const std::string& address, uint64_t epoch) {
  auto stub = v1::ShardAdmin::NewStub(
      rpc::MakeChannel(address, rpc::ChannelKind::kControl));
  grpc::ClientContext context;
  rpc::SetTimeout(absl::Seconds(5), &context);
  v1::ShardMap current;
  return stub->GetShardMap(&context, v1::GetShardMapRequest(), &current).ok() &&
         current.epoch() >= epoch;
}

ShardMapPusher::~ShardMapPusher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void ShardMapPusher::Push(const std::string& address, const v1::ShardMap& map) {
  absl::MutexLock lock(&mu_);
  v1::ShardMap& slot = pending_[address];
  if (map.epoch() >= slot.epoch()) slot = map;
}

void ShardMapPusher::Loop() {
  // A server that cannot be reached is retried with a growing delay, up to
  // about a minute; meanwhile other servers are served.
  std::map<std::string, std::pair<int, absl::Time>> retries;  // attempts, next
  constexpr int kMaxAttempts = 30;
  while (true) {
    std::string address;
    v1::ShardMap map;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](ShardMapPusher* p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                 return p->stop_ || !p->pending_.empty();
                               },
                               this),
                           absl::Milliseconds(100));
      if (stop_) return;
      const absl::Time now = absl::Now();
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        auto r = retries.find(it->first);
        if (r == retries.end() || r->second.second <= now) {
          address = it->first;
          map = std::move(it->second);
          pending_.erase(it);
          break;
        }
      }
    }
    if (address.empty()) continue;
    auto stub = v1::ShardAdmin::NewStub(
        rpc::MakeChannel(address, rpc::ChannelKind::kControl));
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(5), &context);
    v1::SetShardMapRequest request;
    *request.mutable_shard_map() = map;
    request.set_self(address);
    v1::SetShardMapResponse response;
    const grpc::Status s = stub->SetShardMap(&context, request, &response);
    // ALREADY_EXISTS: it has this epoch or a newer one. FAILED_PRECONDITION
    // means the same from an older server, or a refusal (the map would take
    // away slots that hold rows): its current epoch tells them apart.
    bool delivered = s.ok() || s.error_code() == grpc::StatusCode::ALREADY_EXISTS;
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      delivered = HasEpoch(address, map.epoch());
      if (!delivered) {
        LogError("shard server ", address, " refused shard map epoch ", map.epoch(),
                 ": ", s.error_message());
        if (on_result_) {
          on_result_(address, map.epoch(),
                     absl::FailedPreconditionError(s.error_message()));
        }
        retries.erase(address);
        continue;
      }
    }
    if (delivered) {
      LogInfo("shard map epoch ", map.epoch(), " is on ", address,
              s.ok() ? "" : " (it had it already)");
      if (on_result_) on_result_(address, map.epoch(), absl::OkStatus());
      retries.erase(address);
      continue;
    }
    int& attempts = retries[address].first;
    if (++attempts >= kMaxAttempts || s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      LogError("giving up pushing shard map epoch ", map.epoch(), " to ", address,
               ": ", s.error_message());
      retries.erase(address);
      continue;
    }
    LogWarning("pushing shard map epoch ", map.epoch(), " to ", address, " failed (",
               s.error_message(), "); retrying");
    retries[address].second =
        absl::Now() + std::min(absl::Milliseconds(100) * (1 << std::min(attempts, 5)),
                               absl::Seconds(2));
    absl::MutexLock lock(&mu_);
    pending_.emplace(address, std::move(map));  // unless a newer one came
  }
}

// --- CoordinatorTicker ------------------------------------------------------

CoordinatorTicker::CoordinatorTicker(Coordinator* coordinator, absl::Duration interval)
    : thread_([this, coordinator, interval] {
        while (!stop_.WaitForNotificationWithTimeout(interval)) coordinator->Tick();
      }) {}

CoordinatorTicker::~CoordinatorTicker() {
  stop_.Notify();
  thread_.join();
}

}  // namespace recps::server
