// Large byte buffers kept for reuse. A server answering lookups of
// megabytes would otherwise map, fault in (the kernel zeroes every page) and
// unmap a fresh buffer per request, since glibc hands allocations this large
// to mmap and back: in profiles that cost more than writing the rows.
#ifndef RECPS_COMMON_BUFFER_POOL_H_
#define RECPS_COMMON_BUFFER_POOL_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/aligned_buffer.h"

namespace recps {

class BufferPool;

// A buffer taken from a BufferPool; goes back to the pool when destroyed,
// from any thread, even after everyone else dropped the pool. Move-only.
class PooledBuffer {
 public:
  PooledBuffer() = default;
  ~PooledBuffer();
  PooledBuffer(PooledBuffer&&) = default;
  PooledBuffer& operator=(PooledBuffer&& other) noexcept;

  char* data() const { return buffer_.as<char>(); }
  // At least the size asked for; 2 MiB aligned.
  size_t size() const { return buffer_.size(); }

 private:
  friend class BufferPool;
  PooledBuffer(std::shared_ptr<BufferPool> pool, AlignedBuffer buffer)
      : pool_(std::move(pool)), buffer_(std::move(buffer)) {}

  std::shared_ptr<BufferPool> pool_;
  AlignedBuffer buffer_;
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // Keeps at most `max_free_bytes` of buffers nobody uses.
  static std::shared_ptr<BufferPool> Create(size_t max_free_bytes);

  // The smallest free buffer of at least `bytes` bytes, or a new one of
  // `bytes` rounded up to whole huge pages (RESOURCE_EXHAUSTED when it
  // cannot be mapped). Its contents are whatever its last user left.
  // Thread-safe.
  absl::StatusOr<PooledBuffer> Take(size_t bytes);

  size_t free_bytes() const;

 private:
  friend class PooledBuffer;
  explicit BufferPool(size_t max_free_bytes) : max_free_bytes_(max_free_bytes) {}
  // Keeps `buffer` unless that would exceed max_free_bytes; the smallest
  // buffers go first, the large ones are the expensive ones to fault in.
  void Give(AlignedBuffer buffer);

  const size_t max_free_bytes_;
  mutable absl::Mutex mu_;
  std::vector<AlignedBuffer> free_ ABSL_GUARDED_BY(mu_);  // by size, ascending
  size_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace recps

#endif  // RECPS_COMMON_BUFFER_POOL_H_
