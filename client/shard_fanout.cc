#include "client/shard_fanout.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/rpc/status_conversion.h"

namespace recps::client::internal {
namespace {

absl::Status ServerError(const std::string& address, const char* rpc_name,
                         const grpc::Status& status) {
  return rpc::FromGrpcStatus(status, absl::StrCat("shard server ", address),
                             rpc_name);
}

}  // namespace

std::function<void(grpc::Status)> DoneQueue::Callback(int index,
                                                      grpc::Status* status) {
  return [this, index, status](grpc::Status s) {
    *status = std::move(s);
    Push(index);
  };
}

void DoneQueue::Push(int index) {
  absl::MutexLock lock(&mu_);
  done_.push_back(index);
}

int DoneQueue::Next(absl::Time deadline) {
  if (returned_ == n_) return kAllReturned;
  if (!mu_.LockWhenWithDeadline(
          absl::Condition(
              +[](std::deque<int>* done) { return !done->empty(); }, &done_),
          deadline)) {
    mu_.Unlock();
    return kTimedOut;
  }
  const int index = done_.front();
  done_.pop_front();
  mu_.Unlock();
  ++returned_;
  return index;
}

RetryState::RetryState(const EmbeddingClientOptions& options, const char* rpc)
    : options_(options),
      rpc_(rpc),
      backoff_({options.initial_backoff, options.max_backoff, 0.2}) {}

void RetryState::Remember(const std::string& address,
                          const grpc::Status& status) {
  last_retryable_ = ServerError(address, rpc_, status);
}

CallVerdict RetryState::Judge(const std::string& address,
                              const grpc::Status& status,
                              std::optional<uint64_t> server_epoch,
                              absl::Time deadline) {
  if (status.ok()) return CallVerdict::kOk;
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    // Starting, behind our map, or unreachable: the same request may work
    // a little later.
    Remember(address, status);
    want_backoff_ = true;
    return CallVerdict::kRetry;
  }
  // The client cancels calls only after a failure, and never judges them;
  // a CANCELLED before our deadline is the server's doing: it stopped (after
  // a drain, or shutting down) with the call in flight. Like UNAVAILABLE,
  // its outcome is unknown (the caller keeps a push's part id); the server
  // is likely gone from a newer map, so look for one too.
  if (status.error_code() == grpc::StatusCode::CANCELLED &&
      absl::Now() < deadline) {
    Remember(address, status);
    want_backoff_ = true;
    want_newer_map_ = true;
    return CallVerdict::kRetry;
  }
  if (status.error_code() == grpc::StatusCode::ABORTED) {
    if (std::optional<uint64_t> epoch = server_epoch) {
      // Our map is stale: refresh once for the round, then re-route.
      wanted_epoch_ = std::max(wanted_epoch_.value_or(0), *epoch);
      Remember(address, status);
      return CallVerdict::kRetry;
    }
  }
  error_ = ServerError(address, rpc_, status);
  return CallVerdict::kFail;
}

CallVerdict RetryState::AwaitFailover(const std::string& address,
                                      const grpc::Status& status) {
  Remember(address, status);
  want_backoff_ = true;
  want_newer_map_ = true;
  return CallVerdict::kRetry;
}

void RetryState::FailResponse(const std::string& address,
                              const absl::Status& status) {
  error_ =
      absl::Status(status.code(), absl::StrCat("shard server ", address, ": ",
                                               rpc_, ": ", status.message()));
}

absl::Status RetryState::BeforeNextRound(
    uint64_t routed_epoch, bool replicated,
    absl::FunctionRef<absl::StatusOr<uint64_t>(uint64_t)> refresh) {
  const absl::Time now = absl::Now();
  first_retry_ = std::min(first_retry_, now);
  if (attempts_ >= options_.max_attempts &&
      !(replicated && now - first_retry_ < options_.failover_wait)) {
    return absl::Status(
        last_retryable_.code(),
        absl::StrCat(last_retryable_.message(), " (gave up after ", attempts_,
                     " attempts)"));
  }
  ++attempts_;
  // A server of a replicated map that did not answer may have been failed
  // over: its backups own its rows in a newer map.
  if (replicated && want_backoff_) want_newer_map_ = true;
  if (want_newer_map_) {
    want_newer_map_ = false;
    wanted_epoch_ = std::max(wanted_epoch_.value_or(0), routed_epoch + 1);
  }
  if (wanted_epoch_.has_value()) {
    const uint64_t wanted = *wanted_epoch_;
    wanted_epoch_.reset();
    absl::StatusOr<uint64_t> epoch = refresh(wanted);
    if (!epoch.ok()) {
      last_retryable_ =
          absl::Status(epoch.status().code(),
                       absl::StrCat("refreshing the shard map for epoch ",
                                    wanted, ": ", epoch.status().message()));
      want_backoff_ = true;
    } else if (*epoch < wanted) {
      // The source has not caught up with the servers yet.
      want_backoff_ = true;
    }
  }
  if (want_backoff_) {
    want_backoff_ = false;
    // A replicated map: the failover's map comes within a lease, look for
    // it often (a call to a dead server is refused at once, cheap).
    constexpr absl::Duration kFailoverPoll = absl::Milliseconds(200);
    const absl::Duration wait = backoff_.Next();
    absl::SleepFor(replicated ? std::min(wait, kFailoverPoll) : wait);
  }
  return absl::OkStatus();
}

}  // namespace recps::client::internal
