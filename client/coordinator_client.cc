#include "client/coordinator_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/rpc/channels.h"
#include "common/rpc/retry.h"
#include "common/rpc/status_conversion.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace recps::client {
namespace {

int64_t Millis(absl::Duration d) {
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(d));
}

}  // namespace

CoordinatorClient::CoordinatorClient(std::string address,
                                     CoordinatorClientOptions options)
    : address_(std::move(address)),
      options_(options),
      stub_(v1::Coordinator::NewStub(
          rpc::MakeChannel(address_, rpc::ChannelKind::kControl, options.security))),
      large_stub_(v1::Coordinator::NewStub(
          rpc::MakeChannel(address_, rpc::ChannelKind::kData, options.security))) {}

absl::Status CoordinatorClient::ToStatus(const char* rpc_name, const grpc::Status& s) const {
  return rpc::FromGrpcStatus(s, absl::StrCat("coordinator ", address_), rpc_name);
}

absl::StatusOr<v1::RegisterResponse> CoordinatorClient::Register(
    const v1::RegisterRequest& request) {
  v1::RegisterResponse response;
  RETURN_IF_ERROR(CallWithRetry("Register", &v1::Coordinator::Stub::Register,
                                request, &response));
  return response;
}

absl::StatusOr<v1::RegisterResponse> CoordinatorClient::RegisterOnce(
    const v1::RegisterRequest& request) {
  v1::RegisterResponse response;
  RETURN_IF_ERROR(CallOnce("Register", &v1::Coordinator::Stub::Register,
                           request, &response));
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> CoordinatorClient::HeartbeatOnce(
    const std::string& member_id, v1::HeartbeatRequest request) {
  request.set_member_id(member_id);
  v1::HeartbeatResponse response;
  RETURN_IF_ERROR(CallOnce("Heartbeat", &v1::Coordinator::Stub::Heartbeat,
                           request, &response));
  return response;
}

absl::Status CoordinatorClient::LeaveOnce(const std::string& member_id) {
  v1::LeaveRequest request;
  request.set_member_id(member_id);
  v1::LeaveResponse response;
  return CallOnce("Leave", &v1::Coordinator::Stub::Leave, request, &response);
}

template <typename Request, typename Response, typename Method>
absl::Status CoordinatorClient::CallOnce(const char* rpc_name, Method method,
                                         const Request& request,
                                         Response* response) {
  grpc::ClientContext context;
  rpc::SetDeadline(absl::Now() + options_.call_timeout, &context);
  return ToStatus(rpc_name, (stub_.get()->*method)(&context, request, response));
}

template <typename Request, typename Response, typename Method>
absl::Status CoordinatorClient::CallWithRetry(const char* rpc_name, Method method,
                                              const Request& request,
                                              Response* response) {
  return ToStatus(rpc_name, rpc::RetryUnavailable(absl::Now() + options_.retry_for, rpc::BackoffPolicy(), [&] {
                    grpc::ClientContext context;
                    rpc::SetDeadline(absl::Now() + options_.call_timeout, &context);
                    return (stub_.get()->*method)(&context, request, response);
                  }));
}

absl::StatusOr<v1::JobConfig> CoordinatorClient::GetJob() {
  v1::GetJobResponse response;
  RETURN_IF_ERROR(CallWithRetry("GetJob", &v1::Coordinator::Stub::GetJob,
                                v1::GetJobRequest(), &response));
  return std::move(*response.mutable_job());
}

absl::StatusOr<v1::ShardMap> CoordinatorClient::GetShardMap() {
  v1::GetCoordinatorShardMapResponse response;
  RETURN_IF_ERROR(CallWithRetry("GetShardMap", &v1::Coordinator::Stub::GetShardMap,
                                v1::GetCoordinatorShardMapRequest(), &response));
  return std::move(*response.mutable_shard_map());
}

absl::StatusOr<v1::ListMembersResponse> CoordinatorClient::ListMembers() {
  v1::ListMembersResponse response;
  RETURN_IF_ERROR(CallWithRetry("ListMembers", &v1::Coordinator::Stub::ListMembers,
                                v1::ListMembersRequest(), &response));
  return response;
}

absl::Status CoordinatorClient::WatchShardMap(
    uint64_t after_epoch, grpc::ClientContext* context,
    const std::function<void(v1::ShardMap)>& fn) {
  v1::WatchShardMapRequest request;
  request.set_after_epoch(after_epoch);
  std::unique_ptr<grpc::ClientReader<v1::ShardMap>> reader =
      stub_->WatchShardMap(context, request);
  v1::ShardMap map;
  while (reader->Read(&map)) fn(std::move(map));
  return ToStatus("WatchShardMap", reader->Finish());
}

absl::Status CoordinatorClient::KvSet(const std::string& key, const std::string& value) {
  v1::KvSetRequest request;
  request.set_key(key);
  request.set_value(value);
  v1::KvSetResponse response;
  return CallWithRetry("KvSet", &v1::Coordinator::Stub::KvSet, request, &response);
}

absl::StatusOr<std::string> CoordinatorClient::KvGet(const std::string& key,
                                                     absl::Duration wait) {
  // The wait is the caller's; a restart in the middle may stretch it to
  // `retry_for`, since waiting for the coordinator is not the key's fault.
  const absl::Time start = absl::Now();
  const absl::Time wait_end = start + wait;
  v1::KvGetRequest request;
  request.set_key(key);
  v1::KvGetResponse response;
  grpc::Status s = rpc::RetryUnavailable(start + std::max(wait, options_.retry_for), rpc::BackoffPolicy(), [&] {
    const absl::Duration left = std::max(absl::ZeroDuration(), wait_end - absl::Now());
    request.set_wait_ms(Millis(left));
    grpc::ClientContext context;
    rpc::SetDeadline(absl::Now() + left + options_.call_timeout, &context);
    return stub_->KvGet(&context, request, &response);
  });
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    return absl::DeadlineExceededError(absl::StrCat(
        "coordinator ", address_, ": key '", key, "' not set within ",
        absl::FormatDuration(wait)));
  }
  if (!s.ok()) return ToStatus("KvGet", s);
  return std::move(*response.mutable_value());
}

absl::Status CoordinatorClient::KvWait(const std::vector<std::string>& keys,
                                       absl::Duration timeout) {
  const absl::Time start = absl::Now();
  const absl::Time wait_end = start + timeout;
  v1::KvWaitRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  v1::KvWaitResponse response;
  grpc::Status s = rpc::RetryUnavailable(start + std::max(timeout, options_.retry_for), rpc::BackoffPolicy(), [&] {
    // At least 1 ms: 0 would mean the server's default wait.
    const absl::Duration left =
        std::max(absl::Milliseconds(1), wait_end - absl::Now());
    request.set_timeout_ms(Millis(left));
    grpc::ClientContext context;
    rpc::SetDeadline(absl::Now() + left + options_.call_timeout, &context);
    return stub_->KvWait(&context, request, &response);
  });
  return ToStatus("KvWait", s);
}

absl::Status CoordinatorClient::Barrier(const std::string& name, int count, int rank,
                                        absl::Duration timeout) {
  const absl::Time start = absl::Now();
  const absl::Time wait_end = start + timeout;
  v1::BarrierRequest request;
  request.set_name(name);
  request.set_count(count);
  request.set_rank(rank);
  v1::BarrierResponse response;
  grpc::Status s = rpc::RetryUnavailable(start + std::max(timeout, options_.retry_for), rpc::BackoffPolicy(), [&] {
    const absl::Duration left =
        std::max(absl::Milliseconds(1), wait_end - absl::Now());
    request.set_timeout_ms(Millis(left));
    grpc::ClientContext context;
    rpc::SetDeadline(absl::Now() + left + options_.call_timeout, &context);
    return stub_->Barrier(&context, request, &response);
  });
  return ToStatus("Barrier", s);
}

absl::StatusOr<v1::CheckpointCutResponse> CoordinatorClient::CheckpointCut(
    const v1::CheckpointCutRequest& request, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  v1::CheckpointCutResponse response;
  grpc::Status s = rpc::RetryUnavailable(end, rpc::BackoffPolicy(), [&] {
    grpc::ClientContext context;
    rpc::SetDeadline(std::max(end, absl::Now() + options_.call_timeout), &context);
    return stub_->CheckpointCut(&context, request, &response);
  });
  if (!s.ok()) return ToStatus("CheckpointCut", s);
  return response;
}

absl::StatusOr<v1::RequestCheckpointResponse> CoordinatorClient::RequestCheckpoint(
    const std::string& reason) {
  v1::RequestCheckpointRequest request;
  request.set_reason(reason);
  v1::RequestCheckpointResponse response;
  RETURN_IF_ERROR(CallWithRetry("RequestCheckpoint",
                                &v1::Coordinator::Stub::RequestCheckpoint, request,
                                &response));
  return response;
}

absl::StatusOr<v1::ListCheckpointsResponse> CoordinatorClient::ListCheckpoints() {
  v1::ListCheckpointsResponse response;
  RETURN_IF_ERROR(CallWithRetry("ListCheckpoints", &v1::Coordinator::Stub::ListCheckpoints,
                                v1::ListCheckpointsRequest(), &response));
  return response;
}

absl::StatusOr<v1::PlanRebalanceResponse> CoordinatorClient::PlanRebalance(
    const v1::PlanRebalanceRequest& request) {
  v1::PlanRebalanceResponse response;
  RETURN_IF_ERROR(CallWithRetry("PlanRebalance", &v1::Coordinator::Stub::PlanRebalance,
                                request, &response));
  return response;
}

absl::StatusOr<v1::ApplyRebalanceResponse> CoordinatorClient::ApplyRebalance(
    const v1::ApplyRebalanceRequest& request) {
  v1::ApplyRebalanceResponse response;
  RETURN_IF_ERROR(CallOnce("ApplyRebalance", &v1::Coordinator::Stub::ApplyRebalance,
                           request, &response));
  return response;
}

absl::StatusOr<v1::ListRebalanceMovesResponse> CoordinatorClient::ListMoves() {
  v1::ListRebalanceMovesResponse response;
  RETURN_IF_ERROR(CallWithRetry("ListMoves", &v1::Coordinator::Stub::ListMoves,
                                v1::ListRebalanceMovesRequest(), &response));
  return response;
}

absl::StatusOr<v1::GetResumeStateResponse> CoordinatorClient::GetResumeState(
    int32_t rank, absl::Duration wait) {
  v1::GetResumeStateRequest request;
  request.set_rank(rank);
  v1::GetResumeStateResponse response;
  // UNAVAILABLE is also the answer while the servers restore: keep asking.
  grpc::Status s = rpc::RetryUnavailable(
      absl::Now() + std::max(wait, options_.retry_for), rpc::BackoffPolicy(), [&] {
        grpc::ClientContext context;
        rpc::SetDeadline(absl::Now() + options_.call_timeout, &context);
        return large_stub_->GetResumeState(&context, request, &response);
      });
  if (!s.ok()) return ToStatus("GetResumeState", s);
  return response;
}

std::string CoordinatorClient::DescribeSilentWorkers(absl::Time since) {
  grpc::ClientContext context;
  rpc::SetDeadline(absl::Now() + absl::Seconds(2), &context);
  v1::ListMembersResponse members;
  if (!stub_->ListMembers(&context, v1::ListMembersRequest(), &members).ok()) return "";
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  std::vector<std::string> lines;
  for (const v1::Member& m : members.members()) {
    if (m.role() != v1::WORKER) continue;
    if (m.state() == v1::ALIVE && m.last_heartbeat_unix_ms() >= absl::ToUnixMillis(since)) {
      continue;
    }
    const double ago = (now_ms - m.last_heartbeat_unix_ms()) / 1e3;
    lines.push_back(absl::StrFormat(
        "rank %d (%s): lease %s, last heartbeat %.1fs ago", m.rank(), m.member_id(),
        m.state() == v1::ALIVE ? "alive" : "EXPIRED", ago));
  }
  return absl::StrJoin(lines, "; ");
}

// -------------------------------------------------------------------- lease

CoordinatorLease::CoordinatorLease(CoordinatorClient* client,
                                   v1::RegisterRequest request,
                                   const v1::RegisterResponse* registered,
                                   RefusedFn on_refused, RenewedFn on_renewed,
                                   DescribeFn describe)
    : client_(client),
      request_(std::move(request)),
      on_refused_(std::move(on_refused)),
      on_renewed_(std::move(on_renewed)),
      describe_(std::move(describe)) {
  if (registered != nullptr) {
    member_id_ = registered->member_id();
    epoch_ = registered->shard_map_epoch();
    interval_ = std::clamp(absl::Milliseconds(registered->lease_ms()) / 3,
                           absl::Milliseconds(50), absl::Seconds(5));
  }
  thread_ = std::thread([this] { Loop(); });
}

CoordinatorLease::~CoordinatorLease() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void CoordinatorLease::Leave() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
  const std::string id = member_id();
  if (id.empty()) return;  // never registered: nothing to end
  if (absl::Status s = client_->LeaveOnce(id); !s.ok()) {
    LogWarning("could not tell the coordinator that ", id, " leaves: ", s.message());
  }
}

std::string CoordinatorLease::member_id() const {
  absl::MutexLock lock(&mu_);
  return member_id_;
}

uint64_t CoordinatorLease::shard_map_epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

uint64_t CoordinatorLease::checkpoint_request_id() const {
  absl::MutexLock lock(&mu_);
  return checkpoint_request_id_;
}

void CoordinatorLease::Loop() {
  bool warned = false;  // one warning per outage, not one per attempt
  absl::Duration wait = absl::ZeroDuration();
  while (!stop_.WaitForNotificationWithTimeout(wait)) {
    std::string member_id;
    {
      absl::MutexLock lock(&mu_);
      member_id = member_id_;
      wait = member_id.empty() ? absl::Seconds(1) : interval_;
    }
    absl::Status status;
    const absl::Time sent = absl::Now();
    if (member_id.empty()) {
      // One attempt per round: the loop is the retry, and stop_ stays
      // responsive.
      absl::StatusOr<v1::RegisterResponse> r = client_->RegisterOnce(request_);
      status = r.status();
      if (on_refused_ != nullptr &&
          (absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status))) {
        // Asking again would get the same answer: the caller decides.
        on_refused_(status);
        return;
      }
      if (r.ok()) {
        absl::MutexLock lock(&mu_);
        member_id_ = r->member_id();
        epoch_ = r->shard_map_epoch();
        interval_ = std::clamp(absl::Milliseconds(r->lease_ms()) / 3,
                               absl::Milliseconds(50), absl::Seconds(5));
        wait = interval_;
        LogInfo("registered with coordinator ", client_->address(), " as ",
                r->member_id());
      }
      if (r.ok() && on_renewed_) on_renewed_(sent + absl::Milliseconds(r->lease_ms()));
    } else {
      v1::HeartbeatRequest beat;
      if (describe_) describe_(&beat);
      absl::StatusOr<v1::HeartbeatResponse> r = client_->HeartbeatOnce(member_id, std::move(beat));
      status = r.status();
      if (r.ok()) {
        absl::MutexLock lock(&mu_);
        epoch_ = r->shard_map_epoch();
        checkpoint_request_id_ = r->checkpoint_request_id();
      }
      if (r.ok()) {
        if (on_renewed_) on_renewed_(sent + absl::Milliseconds(r->lease_ms()));
      } else if (absl::IsFailedPrecondition(status) || absl::IsNotFound(status)) {
        // Expired while we were slow, or a coordinator without our record.
        LogWarning(status.message(), "; registering again");
        absl::MutexLock lock(&mu_);
        member_id_.clear();
        wait = absl::ZeroDuration();
        continue;
      }
    }
    if (!status.ok() && !warned) LogWarning(status.message(), "; retrying");
    if (status.ok() && warned) LogInfo("coordinator ", client_->address(), " is back");
    warned = !status.ok();
  }
}

// ------------------------------------------------------------ shard map watch

ShardMapWatcher::ShardMapWatcher(CoordinatorClient* client,
                                 uint64_t after_epoch,
                                 std::function<void(ShardMap)> on_map)
    : client_(client), on_map_(std::move(on_map)), epoch_(after_epoch) {
  thread_ = std::thread([this] { Loop(); });
}

ShardMapWatcher::~ShardMapWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  stop_.Notify();
  thread_.join();
}

uint64_t ShardMapWatcher::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

void ShardMapWatcher::Loop() {
  rpc::Backoff backoff({absl::Milliseconds(100), absl::Seconds(5), 0.2});
  bool warned = false;
  for (;;) {
    grpc::ClientContext context;
    uint64_t after;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      context_ = &context;
      after = epoch_;
    }
    bool got_map = false;
    const absl::Status s =
        client_->WatchShardMap(after, &context, [&](v1::ShardMap proto) {
          absl::StatusOr<ShardMap> map = ShardMap::FromProto(proto);
          if (!map.ok()) {
            LogWarning("ignoring shard map epoch ", proto.epoch(),
                       " from the coordinator: ", map.status().message());
            return;
          }
          {
            absl::MutexLock lock(&mu_);
            if (map->epoch() <= epoch_) return;  // receivers drop old epochs
            epoch_ = map->epoch();
          }
          got_map = true;
          on_map_(*std::move(map));
        });
    {
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
      if (stopping_) return;
    }
    // The stream ended: the coordinator stopped or restarted. Re-open it
    // (the next one starts after the newest epoch seen).
    if (got_map) {
      backoff.Reset();
      warned = false;
    }
    if (!warned) {  // once per outage
      LogWarning("shard map watch ended (", s.ToString(), "); re-opening it");
      warned = true;
    }
    if (stop_.WaitForNotificationWithTimeout(backoff.Next())) return;
  }
}

// ------------------------------------------------------------ shard map source

namespace {

class CoordinatorShardMapSource final : public ShardMapSource {
 public:
  explicit CoordinatorShardMapSource(CoordinatorClient* client) : client_(client) {}

  absl::StatusOr<ShardMap> Fetch() override {
    absl::StatusOr<v1::ShardMap> map = client_->GetShardMap();
    if (!map.ok()) return map.status();
    return ShardMap::FromProto(*map);
  }

 private:
  CoordinatorClient* const client_;
};

}  // namespace

std::unique_ptr<ShardMapSource> MakeCoordinatorShardMapSource(
    CoordinatorClient* client) {
  return std::make_unique<CoordinatorShardMapSource>(client);
}

}  // namespace recps::client
