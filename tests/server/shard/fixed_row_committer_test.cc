// The shard process's committer of fixed-table memory
// (server/shard/fixed_row_committer.h): it catches up with the latest
// ask, table by table, never asks a table for less than it has, and stops.
#include "server/shard/fixed_row_committer.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace recps::server {
namespace {

struct Calls {
  absl::Mutex mu;
  std::vector<std::pair<int, int64_t>> seen ABSL_GUARDED_BY(mu);
};

TEST(FixedRowCommitter, CommitsWhatIsAskedBeyondTheStartOnly) {
  Calls calls;
  FixedRowCommitter c(
      [&](int t, int64_t rows) {
        absl::MutexLock lock(&calls.mu);
        calls.seen.emplace_back(t, rows);
      },
      {100, 0, 50});
  c.Want({100, 0, 40});  // nothing beyond the start
  c.WaitIdle();
  {
    absl::MutexLock lock(&calls.mu);
    EXPECT_TRUE(calls.seen.empty());
  }
  c.Want({300, 0, 50, 7});  // more of table 0, a table the start had not
  c.WaitIdle();
  EXPECT_EQ(c.committed(), (std::vector<int64_t>{300, 0, 50, 7}));
  c.Want({200, 0, 60, 7});  // less of table 0: kept; more of table 2
  c.WaitIdle();
  EXPECT_EQ(c.committed(), (std::vector<int64_t>{300, 0, 60, 7}));
  absl::MutexLock lock(&calls.mu);
  EXPECT_EQ(calls.seen, (std::vector<std::pair<int, int64_t>>{{0, 300}, {3, 7}, {2, 60}}));
}

TEST(FixedRowCommitter, StopsBetweenTablesWhenDestroyed) {
  absl::Mutex mu;
  bool release = false;
  int started = 0;
  {
    FixedRowCommitter c(
        [&](int, int64_t) {
          absl::MutexLock lock(&mu);
          ++started;
          mu.Await(absl::Condition(&release));
        },
        {0, 0, 0});
    c.Want({1, 1, 1});
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(+[](int* n) { return *n > 0; }, &started));
      release = true;
    }
  }  // joins after the table in progress
  absl::MutexLock lock(&mu);
  EXPECT_GE(started, 1);
}

}  // namespace
}  // namespace recps::server
