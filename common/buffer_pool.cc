#include "common/buffer_pool.h"

#include <algorithm>
#include <utility>

namespace recps {

PooledBuffer::~PooledBuffer() {
  if (pool_ != nullptr && buffer_.data() != nullptr) {
    pool_->Give(std::move(buffer_));
  }
}

PooledBuffer& PooledBuffer::operator=(PooledBuffer&& other) noexcept {
  if (this != &other) {
    if (pool_ != nullptr && buffer_.data() != nullptr) {
      pool_->Give(std::move(buffer_));
    }
    pool_ = std::move(other.pool_);
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

std::shared_ptr<BufferPool> BufferPool::Create(size_t max_free_bytes) {
  return std::shared_ptr<BufferPool>(new BufferPool(max_free_bytes));
}

absl::StatusOr<PooledBuffer> BufferPool::Take(size_t bytes) {
  // Whole huge pages, which the buffer maps anyway: requests of nearly the
  // same size (a lookup's response varies by a few bytes from step to step)
  // then reuse one buffer instead of each mapping and faulting in a new one.
  bytes = AlignedBuffer::MappedSize(bytes);
  {
    absl::MutexLock lock(&mu_);
    auto it = std::lower_bound(
        free_.begin(), free_.end(), bytes,
        [](const AlignedBuffer& b, size_t n) { return b.size() < n; });
    if (it != free_.end()) {
      AlignedBuffer buffer = std::move(*it);
      free_.erase(it);
      free_bytes_ -= buffer.size();
      return PooledBuffer(shared_from_this(), std::move(buffer));
    }
  }
  absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(bytes);
  if (!buffer.ok()) return buffer.status();
  return PooledBuffer(shared_from_this(), *std::move(buffer));
}

size_t BufferPool::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return free_bytes_;
}

void BufferPool::Give(AlignedBuffer buffer) {
  std::vector<AlignedBuffer> dropped;  // unmapped after the lock is released
  absl::MutexLock lock(&mu_);
  if (buffer.size() > max_free_bytes_) return;
  free_bytes_ += buffer.size();
  auto it = std::lower_bound(
      free_.begin(), free_.end(), buffer.size(),
      [](const AlignedBuffer& b, size_t n) { return b.size() < n; });
  free_.insert(it, std::move(buffer));
  while (free_bytes_ > max_free_bytes_) {
    free_bytes_ -= free_.front().size();
    dropped.push_back(std::move(free_.front()));
    free_.erase(free_.begin());
  }
}

}  // namespace recps
