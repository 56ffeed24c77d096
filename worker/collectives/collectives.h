// Collective operations that keep the workers' dense replicas in step (see
// the design notes, "Dense side is plain data parallel"): Gloo over TCP for CPU
// workers (gloo_collectives.h), NCCL for GPU workers (nccl_collectives.h).
#ifndef RECPS_WORKER_COLLECTIVES_COLLECTIVES_H_
#define RECPS_WORKER_COLLECTIVES_COLLECTIVES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace recps::worker {

// One rank's handle on a group of `world_size` ranks. Every rank must call
// the same operations in the same order with buffers of the same size; a
// mismatch is an error or a timeout, not a silent wrong answer only where
// the backend detects it. Not thread-safe: one caller at a time. After an
// error (a lost peer, a timeout) the group is broken: every later call
// fails and the job must rendezvous again.
class Collectives {
 public:
  virtual ~Collectives();

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place: afterwards every rank holds the element-wise sum.
  virtual absl::Status AllReduceSum(absl::Span<float> data) = 0;
  // In place: afterwards every rank holds `root`'s data.
  virtual absl::Status Broadcast(absl::Span<float> data, int root) = 0;
  // Returns once every rank has entered the barrier.
  virtual absl::Status Barrier() = 0;
};

// Allreduces `data` in consecutive buckets of at most `bucket_floats`, so a
// large flat gradient buffer never needs one huge transfer (and a trainer
// can later overlap buckets with backward). INVALID_ARGUMENT when
// bucket_floats < 1.
absl::Status AllReduceInBuckets(Collectives& collectives,
                                absl::Span<float> data, int64_t bucket_floats);

// world_size 1: every operation is the identity.
class LocalCollectives : public Collectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status Broadcast(absl::Span<float> data, int root) override;
  absl::Status Barrier() override;
};

}  // namespace recps::worker

#endif  // RECPS_WORKER_COLLECTIVES_COLLECTIVES_H_
