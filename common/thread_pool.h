// A small fixed-size thread pool for splitting a loop over all cores.
//
// Kernels take a `ThreadPool*`; nullptr means "run on the calling thread".
// The calling thread always takes part in the work, so a pool of N threads
// spawns N - 1 background workers.
#ifndef RECPS_COMMON_THREAD_POOL_H_
#define RECPS_COMMON_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace recps {

// Runs fn(0) .. fn(n - 1) each on a thread of its own, all at once, and
// returns when every one returned. For n calls that each wait on a remote
// server (a fan-out of blocking RPCs to every shard server), not for CPU
// work: that is ThreadPool::ParallelFor's.
void RunEachOnItsOwnThread(int n, absl::FunctionRef<void(int)> fn);

class ThreadPool {
 public:
  // `num_threads` < 1 means one thread per hardware thread.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Total threads that work on a ParallelFor, the caller included.
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n), each at most
  // `grain` long (grain < 1 counts as 1), and returns when all are done.
  // Thread-safe: concurrent calls run one after the other. `fn` must not call
  // ParallelFor on the same pool.
  void ParallelFor(int64_t n, int64_t grain,
                   absl::FunctionRef<void(int64_t, int64_t)> fn);

  // Like ParallelFor, but when another call holds the pool, runs fn(0, n)
  // on the calling thread instead of waiting for it: for callers that must
  // not wait on other requests' work (a gRPC callback thread).
  void ParallelForOrInline(int64_t n, int64_t grain,
                           absl::FunctionRef<void(int64_t, int64_t)> fn);

  // One thread per hardware thread (at least 1).
  static int HardwareThreads();

 private:
  struct Job {
    absl::FunctionRef<void(int64_t, int64_t)> fn;
    int64_t n;
    int64_t grain;
    std::atomic<int64_t> next{0};
  };

  void WorkerLoop();
  // Runs `job` on this thread and the workers. REQUIRES: submit_mu_ held.
  void RunJob(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  static void RunChunks(Job& job);

  absl::Mutex submit_mu_;  // serialises ParallelFor callers
  absl::Mutex mu_;
  Job* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // workers still inside the job
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// Runs fn over [0, n) on `pool`, or inline on the calling thread when pool is
// nullptr or the work is a single chunk.
void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain,
                 absl::FunctionRef<void(int64_t, int64_t)> fn);
// The same with ThreadPool::ParallelForOrInline.
void ParallelForOrInline(ThreadPool* pool, int64_t n, int64_t grain,
                         absl::FunctionRef<void(int64_t, int64_t)> fn);

}  // namespace recps

#endif  // RECPS_COMMON_THREAD_POOL_H_
