#include "server/store/id_index.h"

#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

namespace recps::server {
namespace {

// Cache-line aligned, so a probe that starts at an entry's line never
// straddles two lines for one entry.
constexpr std::align_val_t kHeapAlign{64};

}  // namespace

void IdIndex::HeapDelete::operator()(Entry* p) const {
  ::operator delete[](p, kHeapAlign);
}

void IdIndex::Rehash(int64_t capacity) {
  Entry* fresh = nullptr;
  std::unique_ptr<Entry[], HeapDelete> heap;
  std::unique_ptr<AlignedBuffer> mapped;
  if (AllocBytes(capacity) >= kAlignedBufferBytes) {
    absl::StatusOr<AlignedBuffer> buffer =
        AlignedBuffer::Allocate(AllocBytes(capacity));
    if (!buffer.ok()) {
      // As abseil's map (and the heap) would: an index cannot half-grow.
      std::fprintf(stderr, "IdIndex: growing to %lld entries: %s\n",
                   static_cast<long long>(capacity),
                   std::string(buffer.status().message()).c_str());
      std::abort();
    }
    mapped = std::make_unique<AlignedBuffer>(*std::move(buffer));
    fresh = mapped->as<Entry>();  // zero-filled by mmap
  } else {
    heap.reset(new (kHeapAlign) Entry[capacity]());
    fresh = heap.get();
  }
  const uint64_t mask = static_cast<uint64_t>(capacity) - 1;
  for (int64_t k = 0; k < this->capacity(); ++k) {
    const Entry& e = entries_[k];
    if (e.row_plus_one == 0) continue;
    uint64_t i = Mix64(static_cast<uint64_t>(e.id)) & mask;
    while (fresh[i].row_plus_one != 0) i = (i + 1) & mask;
    fresh[i] = e;
  }
  entries_ = fresh;
  mask_ = mask;
  heap_ = std::move(heap);
  mapped_ = std::move(mapped);
}

}  // namespace recps::server
