// The worker's same-host memory (common/wire/same_host_memory.h) for one
// server: sealed memfds handed to calls and taken back, so that a call's
// pages are warm from the calls before it and a server maps each memfd once.
#ifndef RECPS_CLIENT_SAME_HOST_BUFFERS_H_
#define RECPS_CLIENT_SAME_HOST_BUFFERS_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/wire/same_host_memory.h"

namespace recps::client::internal {

class SameHostBuffers {
 public:
  // Memfds of at least 1 MiB, in powers of two; at most kMaxFree kept free.
  static constexpr size_t kMinBytes = size_t{1} << 20;
  static constexpr size_t kMaxFree = 8;

  // At least `bytes`: the smallest free memfd that is large enough, or a
  // new one.
  absl::StatusOr<std::unique_ptr<SharedMemory>> Acquire(size_t bytes);
  // Back for the next call: only once the server is done with it (it
  // answered). Memory of a call that ended without its answer (its
  // deadline, a cancel, a broken channel) is dropped instead, since the
  // server may still write to it.
  void Release(std::unique_ptr<SharedMemory> memory);

  size_t free_count() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<SharedMemory>> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recps::client::internal

#endif  // RECPS_CLIENT_SAME_HOST_BUFFERS_H_
