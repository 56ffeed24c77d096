#include "common/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace recps {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.num_threads(), 4);
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    for (int64_t grain : {1, 3, 64, 1 << 20}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, grain, [&](int64_t lo, int64_t hi) {
        EXPECT_LE(hi - lo, grain);
        for (int64_t i = lo; i < hi; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
    }
  }
}

TEST(ThreadPool, UsesMoreThanOneThread) {
  ThreadPool pool(2);
  // Each of the two tasks stays inside until it has seen the other inside
  // too (or 30 s pass): two at once because the pool runs two, not because
  // a sleep made an overlap likely. Run one after the other, the first
  // waits out its 30 s and the check fails.
  std::atomic<int> inside{0}, max_inside{0};
  pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
    const int now = inside.fetch_add(1) + 1;
    int seen = max_inside.load();
    while (now > seen && !max_inside.compare_exchange_weak(seen, now)) {
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (max_inside.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    inside.fetch_sub(1);
  });
  EXPECT_EQ(max_inside.load(), 2);
}

TEST(ThreadPool, ConcurrentCallersEachFinishTheirOwnWork) {
  ThreadPool pool(3);
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        pool.ParallelFor(1000, 10, [&](int64_t lo, int64_t hi) {
          total.fetch_add(hi - lo);
        });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 1000);
}

TEST(ThreadPool, OrInlineRunsOnTheCallerWhileThePoolIsBusy) {
  ThreadPool pool(2);
  absl::Notification busy, release;
  std::thread holder([&] {
    pool.ParallelFor(2, 1, [&](int64_t lo, int64_t) {
      if (lo == 0) {
        busy.Notify();
        release.WaitForNotification();
      }
    });
  });
  busy.WaitForNotification();
  // The pool is held: the whole range runs here, at once, in one chunk.
  const std::thread::id me = std::this_thread::get_id();
  std::vector<std::pair<int64_t, int64_t>> chunks;
  pool.ParallelForOrInline(100, 10, [&](int64_t lo, int64_t hi) {
    EXPECT_EQ(std::this_thread::get_id(), me);
    chunks.emplace_back(lo, hi);
  });
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 100}}));
  release.Notify();
  holder.join();
  // Free again: split into grains over the pool.
  std::atomic<int> calls{0};
  std::atomic<int64_t> covered{0};
  pool.ParallelForOrInline(100, 10, [&](int64_t lo, int64_t hi) {
    calls.fetch_add(1);
    covered.fetch_add(hi - lo);
  });
  EXPECT_EQ(calls.load(), 10);
  EXPECT_EQ(covered.load(), 100);
}

TEST(ThreadPool, NullPoolRunsInline) {
  int64_t covered = 0;
  ParallelFor(nullptr, 10, 1, [&](int64_t lo, int64_t hi) { covered += hi - lo; });
  EXPECT_EQ(covered, 10);
}

}  // namespace
}  // namespace recps
