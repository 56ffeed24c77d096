// A fixed set of threads running queued tasks in FIFO order. Request
// handlers hand their work here so gRPC's own threads never block.
#ifndef RECPS_COMMON_WORK_QUEUE_H_
#define RECPS_COMMON_WORK_QUEUE_H_

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace recps {

class WorkQueue {
 public:
  // `num_threads` < 1 means one per hardware thread.
  explicit WorkQueue(int num_threads);
  // Runs every task already queued, then joins the threads.
  ~WorkQueue();

  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `task`; thread-safe. After shutdown began, runs it inline.
  void Schedule(absl::AnyInvocable<void() &&> task);

  // Tasks queued and not yet started.
  size_t pending() const;

 private:
  void Loop();

  mutable absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace recps

#endif  // RECPS_COMMON_WORK_QUEUE_H_
