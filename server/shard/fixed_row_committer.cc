#include "server/shard/fixed_row_committer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/log.h"

namespace recps::server {

FixedRowCommitter::FixedRowCommitter(std::function<void(int, int64_t)> commit,
                                     std::vector<int64_t> committed)
    : commit_(std::move(commit)), wanted_(committed), committed_(std::move(committed)) {
  thread_ = std::thread([this] { Loop(); });
}

FixedRowCommitter::~FixedRowCommitter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void FixedRowCommitter::Want(std::vector<int64_t> rows) {
  absl::MutexLock lock(&mu_);
  if (rows.size() > wanted_.size()) wanted_.resize(rows.size(), 0);
  if (rows.size() > committed_.size()) committed_.resize(rows.size(), 0);
  for (size_t t = 0; t < rows.size(); ++t) wanted_[t] = std::max(wanted_[t], rows[t]);
}

std::vector<int64_t> FixedRowCommitter::committed() const {
  absl::MutexLock lock(&mu_);
  return committed_;
}

void FixedRowCommitter::WaitIdle() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](FixedRowCommitter* c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return c->stop_ || (!c->busy_ && c->PendingTable() < 0);
      },
      const_cast<FixedRowCommitter*>(this)));
}

int FixedRowCommitter::PendingTable() const {
  for (size_t t = 0; t < wanted_.size(); ++t) {
    if (wanted_[t] > committed_[t]) return static_cast<int>(t);
  }
  return -1;
}

void FixedRowCommitter::Loop() {
  int64_t rows_done = 0;
  absl::Time started;
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(
        +[](FixedRowCommitter* c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return c->stop_ || c->PendingTable() >= 0;
        },
        this));
    if (stop_) return;
    const int t = PendingTable();
    const int64_t rows = wanted_[t];
    if (!busy_) {
      busy_ = true;
      rows_done = 0;
      started = absl::Now();
    }
    mu_.Unlock();
    commit_(t, rows);
    mu_.Lock();
    rows_done += rows - committed_[t];
    committed_[t] = std::max(committed_[t], rows);
    if (PendingTable() < 0) {
      busy_ = false;
      LogInfo(absl::StrFormat(
          "committed the memory of %d rows of the fixed tables (the share of their rows the "
          "shard map gives this server) in %.1f s: a first touch inside a training step "
          "costs more",
          rows_done, absl::ToDoubleSeconds(absl::Now() - started)));
    }
  }
}

}  // namespace recps::server
