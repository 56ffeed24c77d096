#include "common/thread_pool.h"

#include <algorithm>

namespace recps {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads < 1) num_threads = HardwareThreads();
  workers_.reserve(num_threads - 1);
  for (int i = 0; i + 1 < num_threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

int ThreadPool::HardwareThreads() {
  return std::max(1u, std::thread::hardware_concurrency());
}

void ThreadPool::RunChunks(Job& job) {
  for (;;) {
    const int64_t begin = job.next.fetch_add(job.grain, std::memory_order_relaxed);
    if (begin >= job.n) return;
    job.fn(begin, std::min(job.n, begin + job.grain));
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (workers_.empty() || grain >= n) {
    fn(0, n);
    return;
  }
  absl::MutexLock submit(&submit_mu_);
  Job job{fn, n, grain};
  RunJob(job);
}

void ThreadPool::ParallelForOrInline(
    int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (workers_.empty() || grain >= n || !submit_mu_.TryLock()) {
    fn(0, n);
    return;
  }
  Job job{fn, n, grain};
  RunJob(job);
  submit_mu_.Unlock();
}

void ThreadPool::RunJob(Job& job) {
  {
    absl::MutexLock lock(&mu_);
    job_ = &job;
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  RunChunks(job);
  // Wait until every worker has left the job: `job` lives on the caller's
  // stack.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* active) { return *active == 0; }, &active_));
  job_ = nullptr;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    Job* job;
    {
      absl::MutexLock lock(&mu_);
      struct Wake {
        ThreadPool* pool;
        uint64_t seen;
      } wake{this, seen};
      mu_.Await(absl::Condition(
          +[](Wake* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return w->pool->stop_ || w->pool->generation_ != w->seen;
          },
          &wake));
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    RunChunks(*job);
    absl::MutexLock lock(&mu_);
    --active_;
  }
}

void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain,
                 absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  if (pool == nullptr) {
    fn(0, n);
    return;
  }
  pool->ParallelFor(n, grain, fn);
}

void ParallelForOrInline(ThreadPool* pool, int64_t n, int64_t grain,
                         absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  if (pool == nullptr) {
    fn(0, n);
    return;
  }
  pool->ParallelForOrInline(n, grain, fn);
}

void RunEachOnItsOwnThread(int n, absl::FunctionRef<void(int)> fn) {
  std::vector<std::thread> threads;
  threads.reserve(n > 0 ? n : 0);
  for (int i = 0; i < n; ++i) threads.emplace_back([fn, i] { fn(i); });
  for (std::thread& t : threads) t.join();
}

}  // namespace recps
