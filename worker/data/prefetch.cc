#include "worker/data/prefetch.h"

#include <algorithm>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace recps::worker {
namespace {

class PrefetchingSource : public BatchSource {
 public:
  PrefetchingSource(std::unique_ptr<BatchSource> inner, int depth)
      : inner_(std::move(inner)), depth_(std::max(depth, 1)) {
    thread_ = std::thread([this] { Produce(); });
  }

  ~PrefetchingSource() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  absl::StatusOr<bool> Next(Batch* batch) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &PrefetchingSource::CanConsume));
    if (ready_.empty()) {
      // The producer is done and everything before its end was delivered.
      if (!final_status_.ok()) return final_status_;
      return false;
    }
    std::unique_ptr<Batch> ready = std::move(ready_.front());
    ready_.pop_front();
    // The consumer's old batch goes back to the producer with its capacity.
    std::swap(*ready, *batch);
    free_.push_back(std::move(ready));
    return true;
  }

 private:
  bool CanConsume() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !ready_.empty() || done_;
  }
  bool CanProduce() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || static_cast<int>(ready_.size()) < depth_;
  }

  void Produce() {
    while (true) {
      std::unique_ptr<Batch> batch;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &PrefetchingSource::CanProduce));
        if (stop_) return;
        if (free_.empty()) {
          batch = std::make_unique<Batch>();
        } else {
          batch = std::move(free_.back());
          free_.pop_back();
        }
      }
      // Outside the lock: this is the slow part the consumer must not wait on.
      const absl::StatusOr<bool> more = inner_->Next(batch.get());
      absl::MutexLock lock(&mu_);
      if (!more.ok() || !*more) {
        final_status_ = more.status();
        done_ = true;
        return;
      }
      ready_.push_back(std::move(batch));
    }
  }

  const std::unique_ptr<BatchSource> inner_;  // used only by the thread
  const int depth_;
  absl::Mutex mu_;
  std::deque<std::unique_ptr<Batch>> ready_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Batch>> free_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;  // the destructor asks to stop
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // inner reached its end or error
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace

std::unique_ptr<BatchSource> MakePrefetchingSource(
    std::unique_ptr<BatchSource> inner, int depth) {
  return std::make_unique<PrefetchingSource>(std::move(inner), depth);
}

}  // namespace recps::worker
