#include "common/work_queue.h"

#include <utility>

#include "common/thread_pool.h"

namespace recps {

WorkQueue::WorkQueue(int num_threads) {
  if (num_threads < 1) num_threads = ThreadPool::HardwareThreads();
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkQueue::~WorkQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkQueue::Schedule(absl::AnyInvocable<void() &&> task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_ || !tasks_.empty()) {
      tasks_.push_back(std::move(task));
      return;
    }
  }
  std::move(task)();
}

size_t WorkQueue::pending() const {
  absl::MutexLock lock(&mu_);
  return tasks_.size();
}

void WorkQueue::Loop() {
  for (;;) {
    absl::AnyInvocable<void() &&> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkQueue* q) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return q->stopping_ || !q->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace recps
