// The host store's id -> row index of one slot: open addressing with linear
// probing over one flat array of 16-byte {id, row} entries, power-of-two
// capacity, at most 7/10 full. Built for the store's batched lookups: one
// prefetch of the id's home entry brings in the whole probe sequence in the
// usual case (4 entries per cache line), where abseil's map needed the
// header, a control group and a slot (3 lines). No erase: a slot's rows go
// all at once (the store replaces the whole index, which frees its array);
// SetRow repoints an id when the store compacts its arena. Not thread-safe:
// the store calls it under the slot's stripe lock.
#ifndef RECPS_SERVER_STORE_ID_INDEX_H_
#define RECPS_SERVER_STORE_ID_INDEX_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "common/aligned_buffer.h"
#include "common/hashing.h"

namespace recps::server {

class IdIndex {
 public:
  struct Entry {
    int64_t id;
    int64_t row_plus_one;  // 0: empty (zero-filled memory is an empty index)
  };
  // The first allocation; a slot without rows allocates nothing.
  static constexpr int64_t kMinCapacity = 16;
  // Arrays of at least this many bytes come from AlignedBuffer (2 MiB
  // aligned, huge pages); smaller ones from the heap, so that thousands of
  // slots do not cost thousands of mappings.
  static constexpr int64_t kAlignedBufferBytes = int64_t{2} << 20;

  // Whether `rows` entries fit in `capacity` (load <= 7/10).
  static constexpr bool Fits(int64_t rows, int64_t capacity) {
    return rows * 10 <= capacity * 7;
  }
  // The capacity an index holding `rows` rows has: every insert keeps it at
  // this, so the planner can predict index memory from row counts.
  static int64_t CapacityForRows(int64_t rows) {
    if (rows <= 0) return 0;
    int64_t capacity = kMinCapacity;
    while (!Fits(rows, capacity)) capacity *= 2;
    return capacity;
  }
  static int64_t AllocBytes(int64_t capacity) {
    return capacity * static_cast<int64_t>(sizeof(Entry));
  }

  IdIndex() = default;
  IdIndex(IdIndex&& other) noexcept { *this = std::move(other); }
  IdIndex& operator=(IdIndex&& other) noexcept {
    entries_ = std::exchange(other.entries_, nullptr);
    mask_ = std::exchange(other.mask_, 0);
    size_ = std::exchange(other.size_, 0);
    heap_ = std::move(other.heap_);
    mapped_ = std::move(other.mapped_);
    return *this;
  }

  int64_t size() const { return size_; }
  int64_t capacity() const { return entries_ == nullptr ? 0 : mask_ + 1; }

  // Starts loading the home entry of `id` for a Find or FindOrInsert soon.
  // Branch-free: an empty index prefetches address 0, which cannot fault.
  void Prefetch(int64_t id) const {
    __builtin_prefetch(reinterpret_cast<const char*>(entries_) +
                       Home(id) * sizeof(Entry));
  }

  // Row of `id`, or -1.
  int64_t Find(int64_t id) const {
    if (entries_ == nullptr) return -1;
    for (uint64_t i = Home(id);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.row_plus_one == 0) return -1;
      if (e.id == id) return e.row_plus_one - 1;
    }
  }

  // Row of `id`; when missing, make_row() gives it one (a row >= 0, complete
  // before it returns) or refuses with -1, and then nothing is inserted and
  // -1 is returned.
  template <typename MakeRow>
  int64_t FindOrInsert(int64_t id, MakeRow&& make_row) {
    uint64_t i = 0;
    if (entries_ != nullptr) {
      for (i = Home(id);; i = (i + 1) & mask_) {
        const Entry& e = entries_[i];
        if (e.row_plus_one == 0) break;
        if (e.id == id) return e.row_plus_one - 1;
      }
    }
    const int64_t row = make_row();
    if (row < 0) return -1;
    if (entries_ == nullptr || !Fits(size_ + 1, capacity())) {
      Rehash(entries_ == nullptr ? kMinCapacity : 2 * capacity());
      i = Home(id);
      while (entries_[i].row_plus_one != 0) i = (i + 1) & mask_;
    }
    entries_[i] = {id, row + 1};
    ++size_;
    return row;
  }

  // Grows the array once so that `rows` entries fit (a bulk import's
  // FindOrInsert calls then never rehash); the capacity is what inserting
  // them one by one would reach.
  void Reserve(int64_t rows) {
    const int64_t c = CapacityForRows(rows);
    if (c > capacity()) Rehash(c);
  }

  // Points the entry of `id` at `row`; false (nothing changed) when `id`
  // has no entry.
  bool SetRow(int64_t id, int64_t row) {
    if (entries_ == nullptr) return false;
    for (uint64_t i = Home(id);; i = (i + 1) & mask_) {
      Entry& e = entries_[i];
      if (e.row_plus_one == 0) return false;
      if (e.id == id) {
        e.row_plus_one = row + 1;
        return true;
      }
    }
  }

  // Calls fn(id, row) for every entry, in no particular order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (int64_t k = 0; k < capacity(); ++k) {
      const Entry& e = entries_[k];
      if (e.row_plus_one != 0) fn(e.id, e.row_plus_one - 1);
    }
  }

 private:
  struct HeapDelete {
    void operator()(Entry* p) const;
  };

  uint64_t Home(int64_t id) const {
    return Mix64(static_cast<uint64_t>(id)) & mask_;
  }

  // Moves every entry into a zeroed array of `capacity` (a power of two).
  // Aborts when the memory cannot be had, as a full heap would.
  void Rehash(int64_t capacity);

  Entry* entries_ = nullptr;
  uint64_t mask_ = 0;  // capacity - 1
  int64_t size_ = 0;
  // Owns entries_: one of the two.
  std::unique_ptr<Entry[], HeapDelete> heap_;
  std::unique_ptr<AlignedBuffer> mapped_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_STORE_ID_INDEX_H_
