#include "common/rpc/retry.h"

namespace recps::rpc {

Backoff::Backoff(const BackoffPolicy& policy)
    : policy_(policy), next_(policy.initial) {}

absl::Duration Backoff::Next() {
  const absl::Duration wait =
      policy_.jitter > 0
          ? next_ * absl::Uniform(rng_, 1.0 - policy_.jitter, 1.0 + policy_.jitter)
          : next_;
  next_ = std::min(next_ * 2, policy_.max);
  return wait;
}

}  // namespace recps::rpc
