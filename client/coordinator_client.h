// A member's side of the coordinator (docs/coordinator.md): typed calls with
// deadlines that ride out a coordinator restart, the lease kept by a
// background heartbeat, and the coordinator as a worker's shard map source.
#ifndef RECPS_CLIENT_COORDINATOR_CLIENT_H_
#define RECPS_CLIENT_COORDINATOR_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/embedding_client.h"
#include "common/rpc/channels.h"
#include "recps/v1/coordinator.grpc.pb.h"

namespace recps::client {

struct CoordinatorClientOptions {
  // Deadline of one attempt of a call that does not wait (default 10 s).
  absl::Duration call_timeout = absl::Seconds(10);
  // How long a call keeps retrying while the coordinator is unreachable
  // (UNAVAILABLE: down, restarting, not yet started). Default 2 min: enough
  // for a restart on the same state dir, short enough that a coordinator
  // that is gone for good fails the call with a clear error.
  absl::Duration retry_for = absl::Minutes(2);
  // How the channel authenticates (default: the process's). A worker's
  // embedded shard server registers with its shard certificate, not the
  // worker's.
  rpc::TransportSecurity security;
};

// For one command of a person's (recpsctl): each call answers within
// `timeout`, retries included, rather than after minutes of retries.
inline CoordinatorClientOptions CommandOptions(absl::Duration timeout) {
  CoordinatorClientOptions options;
  options.call_timeout = timeout;
  options.retry_for = timeout;
  return options;
}

// Thread-safe. Every call retries UNAVAILABLE with a capped backoff until
// `retry_for` has passed since it began, then returns the last error
// (prefixed with the coordinator's address). The channel reconnects within
// about a second of the coordinator coming back. Calls are safe to repeat:
// KvSet overwrites with the same value, Register keeps the member id of the
// same rank or address, a repeated barrier arrival counts once.
class CoordinatorClient {
 public:
  explicit CoordinatorClient(std::string address,
                             CoordinatorClientOptions options = {});

  const std::string& address() const { return address_; }

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  // One attempt each, no retry: the lease loop decides what a failure
  // means and when to try again.
  absl::StatusOr<v1::RegisterResponse> RegisterOnce(const v1::RegisterRequest& request);
  // `request`'s member_id is set to `member_id`.
  absl::StatusOr<v1::HeartbeatResponse> HeartbeatOnce(const std::string& member_id,
                                                      v1::HeartbeatRequest request = {});
  absl::Status LeaveOnce(const std::string& member_id);
  // FAILED_PRECONDITION when the coordinator has no job.
  absl::StatusOr<v1::JobConfig> GetJob();
  // Also retries while the coordinator has no map yet (it answers
  // UNAVAILABLE until enough shard servers registered).
  absl::StatusOr<v1::ShardMap> GetShardMap();
  absl::StatusOr<v1::ListMembersResponse> ListMembers();
  // Streams the maps newer than `after_epoch` (the current one first, then
  // each new epoch) to `fn` until the stream ends: the coordinator stops or
  // restarts (UNAVAILABLE) or `context` is cancelled (CANCELLED). One
  // attempt, no deadline; ShardMapWatcher re-opens it.
  absl::Status WatchShardMap(uint64_t after_epoch, grpc::ClientContext* context,
                             const std::function<void(v1::ShardMap)>& fn);

  absl::Status KvSet(const std::string& key, const std::string& value);
  // Waits up to `wait` in all (also across a restart) for `key`;
  // DEADLINE_EXCEEDED naming the key when it does not appear.
  absl::StatusOr<std::string> KvGet(const std::string& key, absl::Duration wait);
  // Waits up to `timeout` in all until every key exists.
  absl::Status KvWait(const std::vector<std::string>& keys, absl::Duration timeout);
  // Returns once `count` ranks arrived at barrier `name`; DEADLINE_EXCEEDED
  // naming the missing ranks after `timeout`.
  absl::Status Barrier(const std::string& name, int count, int rank,
                       absl::Duration timeout);

  // ---- Checkpoints (docs/operations.md) ----
  // A worker at a checkpoint cut: returns once every worker arrived and
  // every shard server took its snapshot (with request.wait_complete: once
  // the manifest is written). Waits up to `timeout` in all, retrying
  // UNAVAILABLE (a coordinator restart: the arrival is sent again and the
  // new coordinator gathers the cut anew).
  absl::StatusOr<v1::CheckpointCutResponse> CheckpointCut(
      const v1::CheckpointCutRequest& request, absl::Duration timeout);
  // Admin: asks the workers for a checkpoint at their next step boundary.
  absl::StatusOr<v1::RequestCheckpointResponse> RequestCheckpoint(
      const std::string& reason);
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints();
  // Admin, rebalancing: a plan from the servers' live load; carrying one
  // out (sent once: a retry could start it twice); the moves.
  absl::StatusOr<v1::PlanRebalanceResponse> PlanRebalance(
      const v1::PlanRebalanceRequest& request);
  absl::StatusOr<v1::ApplyRebalanceResponse> ApplyRebalance(
      const v1::ApplyRebalanceRequest& request);
  absl::StatusOr<v1::ListRebalanceMovesResponse> ListMoves();
  // Where rank `rank` resumes (resume=false: a fresh run). Waits up to
  // `wait` while the shard servers are still restoring (UNAVAILABLE). The
  // dense state may be large: it comes over a channel without gRPC's 4 MiB
  // receive limit.
  absl::StatusOr<v1::GetResumeStateResponse> GetResumeState(int32_t rank,
                                                            absl::Duration wait);

  // For an error report after a failed step: the workers whose lease ran
  // out or that sent no heartbeat since `since` (the moment the step
  // failed; ask a couple of heartbeat intervals later), one per entry:
  // "rank 1 (worker-1): lease EXPIRED, last heartbeat 12.0s ago". Asks once
  // (no long retry); empty when all are alive or the coordinator does not
  // answer.
  std::string DescribeSilentWorkers(absl::Time since);

 private:
  // One attempt of a unary rpc, with call_timeout.
  template <typename Request, typename Response, typename Method>
  absl::Status CallOnce(const char* rpc_name, Method method, const Request& request,
                        Response* response);
  // One unary rpc, each attempt with call_timeout, retried for retry_for.
  template <typename Request, typename Response, typename Method>
  absl::Status CallWithRetry(const char* rpc_name, Method method, const Request& request,
                             Response* response);
  absl::Status ToStatus(const char* rpc_name, const grpc::Status& s) const;

  const std::string address_;
  const CoordinatorClientOptions options_;
  const std::unique_ptr<v1::Coordinator::Stub> stub_;
  // For answers that may pass 4 MiB (GetResumeState's dense state).
  const std::unique_ptr<v1::Coordinator::Stub> large_stub_;
};

// Keeps a member's lease: heartbeats every third of the lease on a
// background thread, registers again (same role, address and rank, so the
// same member id) when the coordinator expired or forgot the member or
// restarted, and logs one warning per outage. Stops when destroyed.
class CoordinatorLease {
 public:
  // Called (once, from the lease thread) when the coordinator refuses the
  // registration for good: INVALID_ARGUMENT or FAILED_PRECONDITION, e.g. a
  // shard server whose slots or tables differ from the cluster's. The lease
  // then stops trying.
  using RefusedFn = std::function<void(const absl::Status&)>;
  // Called (from the lease thread) after each registration or heartbeat
  // the coordinator answered, with the time the lease surely holds until:
  // when the request was sent plus the lease. A replicated shard server
  // takes no writes past it (it may have been failed over).
  using RenewedFn = std::function<void(absl::Time held_until)>;
  // Called (from the lease thread) before each heartbeat: what the member
  // tells the coordinator besides being alive.
  using DescribeFn = std::function<void(v1::HeartbeatRequest*)>;

  // `client` must outlive the lease. When `registered` is given (the
  // caller registered already) the thread starts with heartbeats; else it
  // registers first, retrying until the coordinator answers. Without
  // `on_refused`, a refused registration is retried like any failure.
  CoordinatorLease(CoordinatorClient* client, v1::RegisterRequest request,
                   const v1::RegisterResponse* registered = nullptr,
                   RefusedFn on_refused = nullptr, RenewedFn on_renewed = nullptr,
                   DescribeFn describe = nullptr);
  ~CoordinatorLease();

  CoordinatorLease(const CoordinatorLease&) = delete;
  CoordinatorLease& operator=(const CoordinatorLease&) = delete;

  // A clean exit: stops the heartbeats and tells the coordinator, which then
  // lists the member as LEFT instead of letting its lease run out (EXPIRED,
  // a failure). One attempt; a failure is logged, not returned: the process
  // is leaving either way. Not called on error paths, on purpose.
  void Leave();

  // Empty until registered.
  std::string member_id() const;
  // The shard map epoch of the last register or heartbeat reply (0: none).
  uint64_t shard_map_epoch() const;
  // HeartbeatResponse.checkpoint_request_id of the last heartbeat (0: none
  // yet). A worker compares it with the value it saw before: larger means
  // `recpsctl checkpoint now` asked for a checkpoint. Cheap: no RPC.
  uint64_t checkpoint_request_id() const;

 private:
  void Loop();

  CoordinatorClient* const client_;
  const v1::RegisterRequest request_;
  const RefusedFn on_refused_;
  const RenewedFn on_renewed_;
  const DescribeFn describe_;
  mutable absl::Mutex mu_;
  std::string member_id_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t checkpoint_request_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  absl::Notification stop_;
  std::thread thread_;
};

// Follows the coordinator's shard map (WatchShardMap) on a background
// thread: calls `on_map` from that thread with each valid map whose epoch is
// newer than any seen before (starting after `after_epoch`), and re-opens
// the stream with a capped backoff whenever it ends, e.g. across a
// coordinator restart. A worker hands the maps to
// EmbeddingClient::OfferShardMap, so a new epoch reaches it at once rather
// than when a shard server refuses a stale one. Stops (and `on_map` no
// longer runs) when destroyed; `client` must outlive the watcher.
class ShardMapWatcher {
 public:
  ShardMapWatcher(CoordinatorClient* client, uint64_t after_epoch,
                  std::function<void(ShardMap)> on_map);
  ~ShardMapWatcher();

  ShardMapWatcher(const ShardMapWatcher&) = delete;
  ShardMapWatcher& operator=(const ShardMapWatcher&) = delete;

  // The newest epoch passed to on_map (or after_epoch).
  uint64_t epoch() const;

 private:
  void Loop();

  CoordinatorClient* const client_;
  const std::function<void(ShardMap)> on_map_;
  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_);
  // The open stream's context, cancelled by the destructor.
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stop_;
  std::thread thread_;
};

// The coordinator's current shard map (GetShardMap), for EmbeddingClient:
// it asks again whenever a shard server reports a newer epoch. `client`
// must outlive the source.
std::unique_ptr<ShardMapSource> MakeCoordinatorShardMapSource(
    CoordinatorClient* client);

}  // namespace recps::client

#endif  // RECPS_CLIENT_COORDINATOR_CLIENT_H_
