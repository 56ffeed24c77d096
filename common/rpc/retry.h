// The retry pacing every client uses: capped exponential backoff with
// jitter, and a loop that retries UNAVAILABLE until a deadline. Which codes
// a caller retries is its own choice (e.g. the embedding client also
// re-routes on a stale map); how long it waits between tries is decided here.
#ifndef RECPS_COMMON_RPC_RETRY_H_
#define RECPS_COMMON_RPC_RETRY_H_

#include <algorithm>

#include "absl/random/random.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace recps::rpc {

struct BackoffPolicy {
  absl::Duration initial = absl::Milliseconds(50);
  absl::Duration max = absl::Seconds(1);
  // Each wait is scaled by a uniform factor in [1 - jitter, 1 + jitter], so
  // that many clients retrying together spread out.
  double jitter = 0.2;
};

// Not thread-safe: one per retry loop.
class Backoff {
 public:
  explicit Backoff(const BackoffPolicy& policy = BackoffPolicy());
  // The wait before the next try; doubles each time up to policy.max.
  absl::Duration Next();
  // Back to policy.initial (after a success).
  void Reset() { next_ = policy_.initial; }

 private:
  BackoffPolicy policy_;
  absl::Duration next_;
  absl::BitGen rng_;
};

// Calls attempt() until it returns anything but UNAVAILABLE or `give_up`
// passes, sleeping Backoff waits (never past give_up) in between. Returns the
// last attempt's status.
template <typename Attempt>
grpc::Status RetryUnavailable(absl::Time give_up, const BackoffPolicy& policy,
                              Attempt&& attempt) {
  Backoff backoff(policy);
  for (;;) {
    grpc::Status s = attempt();
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() >= give_up) {
      return s;
    }
    absl::SleepFor(std::min(backoff.Next(),
                            std::max(absl::ZeroDuration(), give_up - absl::Now())));
  }
}

}  // namespace recps::rpc

#endif  // RECPS_COMMON_RPC_RETRY_H_
