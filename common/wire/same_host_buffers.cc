#include "common/wire/same_host_buffers.h"

#include <algorithm>
#include <utility>

namespace recps {

absl::StatusOr<std::unique_ptr<SharedMemory>> SameHostBuffers::Acquire(size_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->memory->size() >= bytes &&
          (best == free_.end() || it->memory->size() < best->memory->size())) {
        best = it;
      }
    }
    if (best != free_.end()) {
      std::unique_ptr<SharedMemory> memory = std::move(best->memory);
      free_.erase(best);
      return memory;
    }
  }
  size_t size = kMinBytes;
  while (size < bytes) size *= 2;
  absl::StatusOr<std::unique_ptr<SharedMemory>> memory = SharedMemory::Create(size);
  if (memory.ok()) {
    absl::MutexLock lock(&mu_);
    ++created_;
  }
  return memory;
}

void SameHostBuffers::Release(std::unique_ptr<SharedMemory> memory) {
  if (memory == nullptr) return;
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  free_.erase(std::remove_if(free_.begin(), free_.end(),
                             [&](const Free& f) { return now - f.released > kIdle; }),
              free_.end());
  free_.push_back({std::move(memory), now});
  if (free_.size() > kMaxFree) {
    // The smallest goes: the large ones are what calls of this job need.
    free_.erase(std::min_element(free_.begin(), free_.end(), [](const Free& a, const Free& b) {
      return a.memory->size() < b.memory->size();
    }));
  }
}

size_t SameHostBuffers::free_count() const {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

size_t SameHostBuffers::created() const {
  absl::MutexLock lock(&mu_);
  return created_;
}

}  // namespace recps
