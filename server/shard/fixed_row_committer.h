// Commits, on a thread of its own, the memory of the fixed tables' rows
// that a shard map gives this server (EmbeddingStore::CommitFixedRows). A
// planned map gives servers uneven shares of a table (all of one, none of
// another), so an expected share committed at start (1/servers) fell short
// on some tables, whose rows then faulted their pages in inside the step
// (U-var, service form: 12% of the job's CPU), and was waste on others.
// Installed maps ask (Want); the thread catches up with the latest ask,
// table by table, and never gives memory back.
#ifndef RECPS_SERVER_SHARD_FIXED_ROW_COMMITTER_H_
#define RECPS_SERVER_SHARD_FIXED_ROW_COMMITTER_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace recps::server {

class FixedRowCommitter {
 public:
  // commit(table, rows) commits the memory of the table's first `rows`
  // rows; `committed` is what the store committed at creation, per table.
  FixedRowCommitter(std::function<void(int, int64_t)> commit,
                    std::vector<int64_t> committed);
  ~FixedRowCommitter();  // stops between tables and joins

  // Asks for at least rows[t] rows of each table t.
  void Want(std::vector<int64_t> rows);
  // Rows per table committed so far.
  std::vector<int64_t> committed() const;
  // Blocks until everything asked so far is committed.
  void WaitIdle() const;

 private:
  void Loop();
  // The first table with rows wanted and not committed, or -1.
  int PendingTable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::function<void(int, int64_t)> commit_;
  mutable absl::Mutex mu_;
  std::vector<int64_t> wanted_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> committed_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_FIXED_ROW_COMMITTER_H_
