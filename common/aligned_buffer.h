// A large zero-filled buffer from mmap, 2 MiB aligned and backed by
// transparent huge pages where the kernel allows: random row access over
// gigabytes of rows then misses the TLB far less often. Move-only.
#ifndef RECPS_COMMON_ALIGNED_BUFFER_H_
#define RECPS_COMMON_ALIGNED_BUFFER_H_

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"

namespace recps {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        mapped_(std::exchange(other.mapped_, 0)),
        map_base_(std::exchange(other.map_base_, nullptr)) {}
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;

  // The alignment, and the granule in which memory is mapped: a buffer of
  // any size occupies a whole number of these.
  static constexpr size_t kHugePage = size_t{2} << 20;
  // `bytes` rounded up to whole huge pages: what a buffer of `bytes` maps.
  static constexpr size_t MappedSize(size_t bytes) {
    return (bytes + kHugePage - 1) / kHugePage * kHugePage;
  }

  // Pages of the buffer: huge (transparent, asked with MADV_HUGEPAGE: for
  // memory read and written throughout, like an arena) or small (for
  // memory touched sparsely, a page at a time, inside latency-bound
  // paths: a huge page's first touch zeroes 2 MiB and may compact memory
  // first, tens of milliseconds on a fragmented host).
  enum class Pages { kHuge, kSmall };
  // RESOURCE_EXHAUSTED when the memory cannot be mapped.
  static absl::StatusOr<AlignedBuffer> Allocate(size_t bytes, Pages pages = Pages::kHuge);

  void* data() const { return data_; }
  size_t size() const { return size_; }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // bytes mapped (size rounded up, plus alignment slack)
  void* map_base_ = nullptr;
};

}  // namespace recps

#endif  // RECPS_COMMON_ALIGNED_BUFFER_H_
