// Row-level helpers of the host store (declared in host_table.h).
#include "server/store/host_table.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>

namespace recps::server::host_store {

// Lookup's first phase over positions [lo, hi): copies the rows that exist
// to out (in order), records the slot of every id in slots[] and the
// positions without a row in `missing`. A three-stage software pipeline,
// because each stage is a cache miss on a batch far larger than the caches:
// id k's index entry is prefetched, kProbeAhead ids later it is probed and
// its row prefetched, and kRowAhead ids after that the row is copied. Done
// one id at a time, the two dependent misses cost ~200 ns per id.
void CopyExistingRows(const Table& t, absl::Span<const int64_t> ids,
                      int64_t lo, int64_t hi, uint32_t* slots, float* out,
                      MissingRows& missing) {
  uint64_t mask = 0;
  for (int64_t p = lo; p < hi; ++p) {
    slots[p] = SlotOf(t.key, ids[p], t.num_slots);
    mask |= uint64_t{1} << (slots[p] % kStripes);
  }
  const int dim = t.spec.dim;
  const size_t row_bytes = sizeof(float) * dim;
  const bool widen = t.Is16Bit();
  std::vector<int64_t> absent;
  {
    const StripeReaderLocks locks(t, mask);
    const float* src[kRowAhead];
    for (int64_t k = lo; k < hi + kHeaderAhead + kProbeAhead + kRowAhead; ++k) {
      // Stages from last to first: the copy frees the ring entry the probe
      // then fills.
      const int64_t entry = k - kHeaderAhead;
      const int64_t probe = entry - kProbeAhead;
      const int64_t copied = probe - kRowAhead;
      if (copied >= lo && copied < hi && src[copied % kRowAhead] != nullptr) {
        if (widen) {
          t.ReadWeights(src[copied % kRowAhead], out + copied * dim);
        } else {
          std::memcpy(out + copied * dim, src[copied % kRowAhead], row_bytes);
        }
      }
      if (probe >= lo && probe < hi) {
        const int64_t r = t.Find(slots[probe], ids[probe]);
        const float* row = nullptr;
        if (r >= 0) {
          row = t.Row(r);
          PrefetchRow(row, dim);
        } else {
          absent.push_back(probe);
        }
        src[probe % kRowAhead] = row;
      }
      if (entry >= lo && entry < hi) t.PrefetchIndex(slots[entry], ids[entry]);
      if (k < hi) t.PrefetchIndexHeader(slots[k]);
    }
  }
  if (!absent.empty()) missing.Add(absent);
}

// Gives back the memory of bytes [from, to) of `buffer` that no longer
// holds anything: whole pages to the system (they read as zeros when
// touched again), the part of the first page before them zeroed, so a row
// created there later starts from zeroed padding as in a fresh arena.
void ReleaseBytes(const AlignedBuffer& buffer, int64_t from, int64_t to) {
  if (to <= from) return;
  static const int64_t kPage = sysconf(_SC_PAGESIZE);
  char* base = buffer.as<char>();
  const int64_t first_page = (from + kPage - 1) / kPage * kPage;
  std::memset(base + from, 0, std::min(first_page, to) - from);
  // The page holding `to` past its end holds nothing either.
  const int64_t end_page = std::min<int64_t>(
      (to + kPage - 1) / kPage * kPage, static_cast<int64_t>(buffer.size()));
  if (end_page > first_page) {
    madvise(base + first_page, end_page - first_page, MADV_DONTNEED);
  }
}

bool CommitBytes(const AlignedBuffer& buffer, int64_t bytes, ThreadPool* pool) {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14; older headers lack it
#endif
  static const int64_t kPage = sysconf(_SC_PAGESIZE);
  bytes = std::min<int64_t>(bytes, static_cast<int64_t>(buffer.size()));
  if (bytes <= 0) return true;
  // 32 MiB pieces (whole huge pages) so that the cores share the faults.
  constexpr int64_t kPiece = int64_t{32} << 20;
  const int64_t pieces = (bytes + kPiece - 1) / kPiece;
  std::atomic<bool> ok{true};
  ParallelFor(pool, pieces, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi && ok.load(std::memory_order_relaxed); ++k) {
      const int64_t from = k * kPiece;
      const int64_t to = std::min(bytes, from + kPiece);
      const int64_t len = (to - from + kPage - 1) / kPage * kPage;
      if (madvise(buffer.as<char>() + from, len, MADV_POPULATE_WRITE) != 0) {
        ok.store(false, std::memory_order_relaxed);
      }
    }
  });
  return ok.load();
}

void CommitRows(const Table& t, int64_t rows, ThreadPool* pool) {
  rows = std::min(rows, t.capacity);
  if (rows <= 0) return;
  const auto row_bytes = static_cast<int64_t>(sizeof(float)) * t.row_words;
  // False on an old kernel: rows then fault as they appear, as without.
  const bool committed =
      CommitBytes(t.arena, rows * row_bytes, pool) &&
      CommitBytes(t.row_ids, rows * static_cast<int64_t>(sizeof(int64_t)), pool) &&
      CommitBytes(t.row_gens, rows * static_cast<int64_t>(sizeof(uint64_t)), pool) &&
      CommitBytes(t.dense_rows, static_cast<int64_t>(t.dense_rows.size()), pool);
  if (!committed) return;
  int64_t before = t.committed_rows.load(std::memory_order_relaxed);
  while (before < rows && !t.committed_rows.compare_exchange_weak(before, rows)) {
  }
}

}  // namespace recps::server::host_store
