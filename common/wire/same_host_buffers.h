// A caller's same-host memory (common/wire/same_host_memory.h) for one
// server (a worker's, a primary's forwards to a backup): sealed memfds handed to calls and taken back, so that a call's
// pages are warm from the calls before it and a server maps each memfd once.
#ifndef RECPS_COMMON_WIRE_SAME_HOST_BUFFERS_H_
#define RECPS_COMMON_WIRE_SAME_HOST_BUFFERS_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/wire/same_host_memory.h"

namespace recps {

class SameHostBuffers {
 public:
  // Memfds of at least 1 MiB, in powers of two.
  static constexpr size_t kMinBytes = size_t{1} << 20;
  // A free memfd is kept until it has not been taken for kIdle: a step's
  // calls take it again (its lookups come in parts of
  // max_ids_per_lookup_request ids, all in flight together, beside the
  // next step's prefetch and the push: tens of memfds). A fixed count of
  // 8 made new memfds every step, whose pages fault in zeroed (U-var
  // service form: ~60k page faults a second), and each server kept the
  // dropped ones mapped until its mapper let go (+4 GiB peak RSS).
  static constexpr absl::Duration kIdle = absl::Seconds(30);
  // More than any job's calls in flight to one server.
  static constexpr size_t kMaxFree = 256;

  // At least `bytes`: the smallest free memfd that is large enough, or a
  // new one.
  absl::StatusOr<std::unique_ptr<SharedMemory>> Acquire(size_t bytes);
  // Back for the next call: only once the server is done with it (it
  // answered). Memory of a call that ended without its answer (its
  // deadline, a cancel, a broken channel) is dropped instead, since the
  // server may still write to it.
  void Release(std::unique_ptr<SharedMemory> memory);

  size_t free_count() const;
  // Memfds made since the start: flat in a steady job.
  size_t created() const;

 private:
  mutable absl::Mutex mu_;
  struct Free {
    std::unique_ptr<SharedMemory> memory;
    absl::Time released;
  };
  std::vector<Free> free_ ABSL_GUARDED_BY(mu_);
  size_t created_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace recps

#endif  // RECPS_COMMON_WIRE_SAME_HOST_BUFFERS_H_
