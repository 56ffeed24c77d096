#include "common/aligned_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace recps {

AlignedBuffer::~AlignedBuffer() {
  if (map_base_ != nullptr) munmap(map_base_, mapped_);
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    if (map_base_ != nullptr) munmap(map_base_, mapped_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    map_base_ = std::exchange(other.map_base_, nullptr);
  }
  return *this;
}

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(size_t bytes, Pages pages) {
  AlignedBuffer buf;
  if (bytes == 0) return buf;
  const size_t rounded = MappedSize(bytes);
  const size_t mapped = rounded + kHugePage;  // slack to align the start
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot map ", bytes, " bytes: ", std::strerror(errno)));
  }
  const uintptr_t start =
      (reinterpret_cast<uintptr_t>(base) + kHugePage - 1) / kHugePage * kHugePage;
  // Best effort: without THP the buffer still works with 4 KiB pages.
  madvise(reinterpret_cast<void*>(start), rounded,
          pages == Pages::kHuge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  buf.map_base_ = base;
  buf.mapped_ = mapped;
  buf.data_ = reinterpret_cast<void*>(start);
  buf.size_ = bytes;
  return buf;
}

}  // namespace recps
