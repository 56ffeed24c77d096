#include "client/same_host_buffers.h"

#include <algorithm>
#include <utility>

namespace recps::client::internal {

absl::StatusOr<std::unique_ptr<SharedMemory>> SameHostBuffers::Acquire(size_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if ((*it)->size() >= bytes && (best == free_.end() || (*it)->size() < (*best)->size())) {
        best = it;
      }
    }
    if (best != free_.end()) {
      std::unique_ptr<SharedMemory> memory = std::move(*best);
      free_.erase(best);
      return memory;
    }
  }
  size_t size = kMinBytes;
  while (size < bytes) size *= 2;
  return SharedMemory::Create(size);
}

void SameHostBuffers::Release(std::unique_ptr<SharedMemory> memory) {
  if (memory == nullptr) return;
  absl::MutexLock lock(&mu_);
  free_.push_back(std::move(memory));
  if (free_.size() > kMaxFree) {
    // The smallest goes: the large ones are what calls of this job need.
    auto smallest = std::min_element(
        free_.begin(), free_.end(),
        [](const auto& a, const auto& b) { return a->size() < b->size(); });
    free_.erase(smallest);
  }
}

size_t SameHostBuffers::free_count() const {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

}  // namespace recps::client::internal
