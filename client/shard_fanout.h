// The RPC plumbing of the embedding client: waiting for a round of
// concurrent callback calls, and the retry policy between rounds. The calls
// themselves go through each server's transport (shard_transport.h).
#ifndef RECPS_CLIENT_SHARD_FANOUT_H_
#define RECPS_CLIENT_SHARD_FANOUT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/embedding_client.h"
#include "common/rpc/retry.h"
#include "grpcpp/support/status.h"

namespace recps::client::internal {

// Collects the completions of a round of `n` callback calls, so the calling
// thread handles them one by one as they arrive while the rest are in
// flight. The callback records the status and queues the call.
class DoneQueue {
 public:
  explicit DoneQueue(int n) : n_(n) {}
  // The completion callback of call `index`: stores its status in `*status`
  // (which must outlive the call) and queues the index.
  std::function<void(grpc::Status)> Callback(int index, grpc::Status* status);
  // Queues call `index` as done, for a call that records its own result.
  void Push(int index);
  static constexpr int kAllReturned = -1;
  static constexpr int kTimedOut = -2;

  // Blocks until some call not yet returned is done and returns its index;
  // kAllReturned once all n were returned (after which no callback touches
  // this object), kTimedOut when `deadline` passes first.
  int Next(absl::Time deadline = absl::InfiniteFuture());

 private:
  const int n_;
  int returned_ = 0;  // only touched by the Next() caller
  absl::Mutex mu_;
  std::deque<int> done_ ABSL_GUARDED_BY(mu_);
};

// What the round loop does with one call's result.
enum class CallVerdict { kOk, kRetry, kFail };

// Attempts, backoff and map refreshes of one Lookup / PushGradients.
class RetryState {
 public:
  RetryState(const EmbeddingClientOptions& options, const char* rpc);

  // Classifies a finished call to `address`; the one place that decides
  // which codes are retried. UNAVAILABLE asks for a backoff; CANCELLED that
  // this client did not cause (before the call's `deadline`: the server
  // dropped the call, e.g. while stopping after a drain) for a backoff and a
  // refresh to any newer map; ABORTED with the server's epoch (sent with a
  // stale-map refusal) for a map refresh. All three are retried. Any other
  // error is returned by error(), prefixed with the address.
  CallVerdict Judge(const std::string& address, const grpc::Status& status,
                    std::optional<uint64_t> server_epoch, absl::Time deadline);
  // A replicated map's owner at `address` answered as a restarted process
  // (DATA_LOSS naming another incarnation): it was failed over, or is
  // about to be (the coordinator does so when the new process registers),
  // and its backups own its rows in a newer map. Retried with a backoff
  // and a refresh to a newer map, until failover_wait ends it (kRetry).
  CallVerdict AwaitFailover(const std::string& address, const grpc::Status& status);
  // The error of the last kFail verdict (or a response the caller rejected).
  absl::Status error() const { return error_; }
  // Marks the call to `address` as failed with a malformed response.
  void FailResponse(const std::string& address, const absl::Status& status);

  // Between rounds: counts the attempt, refreshes the map once if a server
  // asked for it, or asked for one newer than `routed_epoch` (the round's)
  // after a server-side CANCELLED (through `refresh`, which returns the
  // epoch routed by afterwards or an error), and sleeps when servers were
  // unavailable or the source had no newer map yet. Returns the last
  // failure, with the attempt count, when max_attempts rounds are used up
  // (and, for a `replicated` map, failover_wait has passed since the first
  // retry).
  absl::Status BeforeNextRound(
      uint64_t routed_epoch, bool replicated,
      absl::FunctionRef<absl::StatusOr<uint64_t>(uint64_t)> refresh);

 private:
  void Remember(const std::string& address, const grpc::Status& status);

  const EmbeddingClientOptions& options_;
  const char* const rpc_;
  int attempts_ = 1;
  absl::Time first_retry_ = absl::InfiniteFuture();
  rpc::Backoff backoff_;
  bool want_backoff_ = false;
  std::optional<uint64_t> wanted_epoch_;  // newest epoch a server reported
  bool want_newer_map_ = false;  // a server dropped a call: it may be leaving
  absl::Status last_retryable_;           // for the "gave up" message
  absl::Status error_;
};

}  // namespace recps::client::internal

#endif  // RECPS_CLIENT_SHARD_FANOUT_H_
