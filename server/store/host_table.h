// Internals of the host-memory EmbeddingStore (host_embedding_store.cc),
// shared with host_table.cc: a table's arena and per-slot index (Table),
// its lock stripes and how batches are grouped and run over them, and the
// row-level helpers of lookups, pushes and slot transfer. Only those two
// files include it.
#ifndef RECPS_SERVER_STORE_HOST_TABLE_H_
#define RECPS_SERVER_STORE_HOST_TABLE_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/numeric/bits.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/aligned_buffer.h"
#include "common/config/table_spec.h"
#include "common/hashing.h"
#include "common/row_init.h"
#include "common/thread_pool.h"
#include "common/wire/wire_format.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/id_index.h"
#include "server/store/store_footprint.h"
#include "server/store/stored_row.h"
#include "server/store/table_checks.h"

namespace recps::server::host_store {

constexpr int kStripes = 64;
// Successive calls start this many stripes apart (odd: every stripe is a
// start in turn).
constexpr uint32_t kStripeStep = 23;
// Below this many ids a batch runs on the calling thread: waking the pool
// costs more than it saves.
constexpr int64_t kParallelMinIds = 4096;
// Lookup's pipeline depths (ids): index buckets are prefetched kProbeAhead
// ids before they are probed, rows kRowAhead ids before they are copied, so
// that many misses of each kind are in flight at once.
constexpr int64_t kProbeAhead = 16;
// Lookup prefetches each slot's index header this many ids before its entry.
constexpr int64_t kHeaderAhead = 8;
constexpr int64_t kRowAhead = 16;

// The row format (stride, row_words, state_offset, precision and the row
// conversions) comes from StoredRowFormat, shared with the device store.
struct Table : StoredRowFormat {
  config::TableSpec spec;
  uint64_t key = 0;   // StableNameKey(spec.name)
  uint64_t seed = 0;  // StoreOptions::seed
  uint32_t num_slots = 0;
  int64_t capacity = 0;  // rows the arena can hold
  AlignedBuffer arena;
  // The id of each row (capacity int64s, committed as rows appear): written
  // once when a row is created, read when DropSlot moves the row.
  AlignedBuffer row_ids;
  // Rows handed out == rows stored (rows [0, next_row) are all in use).
  std::atomic<int64_t> next_row{0};
  // Rows whose memory CommitRows committed ahead (fixed tables only).
  mutable std::atomic<int64_t> committed_rows{0};
  std::atomic<int64_t> lookup_ids{0};
  std::atomic<int64_t> update_ids{0};
  // index[slot] and slot_rows[slot] are guarded by stripes[slot % kStripes].
  mutable std::array<absl::Mutex, kStripes> stripes;
  // Where the next ForEachStripe starts (mod kStripes).
  mutable std::atomic<uint32_t> next_first_stripe{0};
  std::vector<IdIndex> index;
  std::vector<int64_t> slot_rows;
  // Fixed tables of at most kHostDenseIndexMaxRows rows: row + 1 of every
  // id that has a row (uint32 per id of [0, num_rows), 0: none), kept in
  // step with `index`, which the hot paths read instead. One load of a
  // 4-byte word (8 tables of 100k rows: 3 MiB, cache-resident) where a
  // slot's index needs its header and a 16-byte entry out of tens of MiB:
  // that probe was a third of a push's server time. The slot indexes stay
  // the list of each slot's rows (moves, snapshots, checkpoints). An entry
  // is read and written under its id's slot stripe, like index[slot].
  AlignedBuffer dense_rows;
  uint32_t* DenseRows() const { return dense_rows.as<uint32_t>(); }

  // ---- Snapshots (EmbeddingStore::BeginSnapshot) ----
  // The generation of each row's last change (capacity uint64s, committed
  // as rows appear), written under the row's stripe like the row.
  AlignedBuffer row_gens;
  // The generation stamped on changes now, and the open snapshot's cut (0:
  // none). Written with every stripe held (AllStripesLock), so a reader
  // holding any one stripe sees a consistent pair.
  std::atomic<uint64_t> write_gen{1};
  std::atomic<uint64_t> snapshot_cut{0};
  // Rows as they were at the cut, copied aside just before their first
  // change after it; one per stripe, guarded by that stripe.
  struct PreImages {
    // Rows per block of `blocks`.
    static constexpr int64_t kBlockRows = 1024;
    // Pre-image k is row k % kBlockRows of blocks[k / kBlockRows]: fixed
    // blocks, so a push that copies a row aside never reallocates (and
    // copies) every row copied before it under the stripe lock.
    std::vector<std::unique_ptr<float[]>> blocks;
    std::vector<uint64_t> gens;  // the row's generation at the cut

    // Stored rows (row_words each), not fp32 fused rows.
    const float* Row(int64_t k, int64_t row_words) const {
      return blocks[k / kBlockRows].get() + (k % kBlockRows) * row_words;
    }
  };
  mutable std::array<PreImages, kStripes> pre_images;
  std::atomic<int64_t> pre_image_bytes{0};
  // Which pre-image row r has: k + 1 into the PreImages of its slot's
  // stripe, 0 for none; entry r is guarded by that stripe. Indexed by row,
  // for the rows that existed at the cut ([0, pre_image_rows): later rows
  // have no cut value), so that copying a row aside never rehashes: a hash
  // map per stripe grew on every stripe alike, and the push that crossed a
  // doubling paid all 64 rehashes (recps_checkpoint_bench: 226 ms, 300x a
  // push's p50). Zero pages until touched; made at the cut, freed at the
  // end of the snapshot.
  AlignedBuffer pre_image_of_row;
  int64_t pre_image_rows = 0;

  // Row r as stored (row_words 4-byte words; see precision).
  float* Row(int64_t r) const { return arena.as<float>() + r * row_words; }
  // A new row's initial value (StoredRowFormat::InitStoredRow).
  void InitStoredRow(int64_t id, float* row) const {
    StoredRowFormat::InitStoredRow(spec.init, seed, key, id, row);
  }
  int64_t* RowIds() const { return row_ids.as<int64_t>(); }
  uint64_t* RowGens() const { return row_gens.as<uint64_t>(); }

  // Call before row r (in slot) changes, with slot's stripe held as a
  // writer: keeps the row's cut value when a snapshot needs it (its first
  // change since the cut), then stamps the row with the current generation.
  void Touch(uint32_t slot, int64_t r) {
    uint64_t& gen = RowGens()[r];
    const uint64_t cut = snapshot_cut.load(std::memory_order_relaxed);
    if (cut != 0 && gen <= cut) SavePreImage(slot, r, gen);
    gen = write_gen.load(std::memory_order_relaxed);
  }
  void SavePreImage(uint32_t slot, int64_t r, uint64_t gen) {
    // gen <= cut: the row existed at the cut (compaction only moves rows
    // down), so r < pre_image_rows.
    int64_t& entry = pre_image_of_row.as<int64_t>()[r];
    if (entry != 0) return;
    PreImages& p = pre_images[slot % kStripes];
    const int64_t k = static_cast<int64_t>(p.gens.size());
    entry = k + 1;
    p.gens.push_back(gen);
    if (k % PreImages::kBlockRows == 0) {
      p.blocks.emplace_back(new float[PreImages::kBlockRows * row_words]);
    }
    std::memcpy(
        p.blocks.back().get() + (k % PreImages::kBlockRows) * row_words,
        Row(r), RowBytes());
    pre_image_bytes.fetch_add(RowBytes(), std::memory_order_relaxed);
  }
  // The pre-image of row r (an index into its stripe's PreImages), or -1.
  // REQUIRES: the row's stripe held.
  int64_t PreImageOf(int64_t r) const {
    return r < pre_image_rows ? pre_image_of_row.as<int64_t>()[r] - 1 : -1;
  }

  bool InRange(int64_t id) const {
    return spec.num_rows == 0 || (id >= 0 && id < spec.num_rows);
  }

  // Starts loading the index entry of `id`, for a Find or FindOrCreate a
  // little later. REQUIRES: slot's stripe held (it reads the index header).
  void PrefetchIndex(uint32_t slot, int64_t id) const {
    if (const uint32_t* dense = DenseRows()) {
      __builtin_prefetch(dense + id);
    } else {
      index[slot].Prefetch(id);
    }
  }
  // Starts loading the slot's index header, which PrefetchIndex reads: with
  // thousands of slots it is rarely in L1 or L2.
  void PrefetchIndexHeader(uint32_t slot) const {
    if (DenseRows() == nullptr) __builtin_prefetch(&index[slot]);
  }

  // Row of `id`, or -1 when it has none. REQUIRES: slot's stripe held.
  int64_t Find(uint32_t slot, int64_t id) const {
    if (const uint32_t* dense = DenseRows()) {
      // (ReadRows asks for any id: one outside the table has no row.)
      return InRange(id) ? static_cast<int64_t>(dense[id]) - 1 : -1;
    }
    return index[slot].Find(id);
  }

  // Row of `id`, created with its initial value when missing; -1 when the
  // arena is full. REQUIRES: InRange(id) (CheckRange), and slot's stripe
  // held, so the row is complete before anyone else can find it.
  int64_t FindOrCreate(uint32_t slot, int64_t id) {
    uint32_t* const dense = DenseRows();
    if (dense != nullptr && dense[id] != 0) return dense[id] - int64_t{1};
    const int64_t r = FindOrCreateInIndex(slot, id);
    if (dense != nullptr && r >= 0) dense[id] = static_cast<uint32_t>(r + 1);
    return r;
  }
  // Records that `id` (in `slot`) now has row `r` in the dense map, for
  // callers that insert into index[slot] themselves. REQUIRES: slot's
  // stripe held as a writer.
  void SetDenseRow(int64_t id, int64_t r) {
    if (uint32_t* dense = DenseRows()) dense[id] = static_cast<uint32_t>(r + 1);
  }

 private:
  int64_t FindOrCreateInIndex(uint32_t slot, int64_t id) {
    return index[slot].FindOrInsert(id, [&]() -> int64_t {
      int64_t r = next_row.load(std::memory_order_relaxed);
      do {
        if (r >= capacity) return -1;
      } while (
          !next_row.compare_exchange_weak(r, r + 1, std::memory_order_relaxed));
      InitStoredRow(id, Row(r));
      RowIds()[r] = id;
      RowGens()[r] = write_gen.load(std::memory_order_relaxed);
      ++slot_rows[slot];
      return r;
    });
  }

 public:

  absl::Status CheckRange(absl::Span<const int64_t> ids) const {
    return CheckIdsInRange(spec, ids);
  }

  absl::Status FullError() const { return TableFullError(spec, capacity); }
};

// A batch's positions grouped by lock stripe with a counting sort: O(n),
// stable (positions ascend within a stripe).
struct StripeBuckets {
  std::vector<uint32_t> slot;   // slot of ids[p]
  std::vector<int64_t> order;   // positions, stripe after stripe
  std::array<int64_t, kStripes + 1> begin{};

  StripeBuckets(const Table& t, absl::Span<const int64_t> ids)
      : slot(ids.size()) {
    for (size_t p = 0; p < ids.size(); ++p) {
      slot[p] = SlotOf(t.key, ids[p], t.num_slots);
    }
    Group(ids.size(), [](size_t k) { return static_cast<int64_t>(k); });
  }
  // Only `positions` (ascending) of a batch whose slots are known.
  StripeBuckets(std::vector<uint32_t> slots, absl::Span<const int64_t> positions)
      : slot(std::move(slots)) {
    Group(positions.size(), [&](size_t k) { return positions[k]; });
  }

 private:
  // Groups the n positions position(0..n-1).
  template <typename Position>
  void Group(size_t n, Position position) {
    order.resize(n);
    std::array<int64_t, kStripes> fill{};
    for (size_t k = 0; k < n; ++k) ++fill[slot[position(k)] % kStripes];
    for (int s = 0; s < kStripes; ++s) {
      begin[s + 1] = begin[s] + fill[s];
      fill[s] = begin[s];
    }
    for (size_t k = 0; k < n; ++k) {
      const int64_t p = position(k);
      order[fill[slot[p] % kStripes]++] = p;
    }
  }
};

// Calls fn(begin, end) for the order range of each non-empty stripe with its
// lock held, in parallel on `pool` for large batches.
template <typename Fn>
void ForEachStripe(const Table& t, const StripeBuckets& b, ThreadPool* pool,
                   Fn&& fn) {
  if (static_cast<int64_t>(b.order.size()) < kParallelMinIds) pool = nullptr;
  // Concurrent calls (the chunks of one large lookup, say) start at
  // different stripes: walking the stripes in the same order, they would
  // queue behind each other's lock at every stripe.
  const uint32_t first = t.next_first_stripe.fetch_add(
      kStripeStep, std::memory_order_relaxed);
  ParallelFor(pool, kStripes, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t s = (k + first) % kStripes;
      if (b.begin[s] == b.begin[s + 1]) continue;
      absl::MutexLock lock(&t.stripes[s]);
      fn(b.begin[s], b.begin[s + 1]);
    }
  });
}

// The first error reported by parallel tasks.
class FirstError {
 public:
  void Set(absl::Status s) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = std::move(s);
  }
  absl::Status Get() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

inline void PrefetchRow(const float* row, int dim) {
  // The first lines; the hardware prefetcher follows the rest of the row.
  const int64_t bytes = std::min<int64_t>(int64_t{dim} * 4, 256);
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
}

// The reader side of every stripe in a mask, taken in ascending order: the
// only way anyone holds more than one stripe, so holders never wait on each
// other in a cycle.
class StripeReaderLocks {
 public:
  static_assert(kStripes == 64, "one bit per stripe in a uint64_t");
  StripeReaderLocks(const Table& t, uint64_t mask) : t_(t), mask_(mask) {
    for (uint64_t m = mask_; m != 0; m &= m - 1) {
      t_.stripes[absl::countr_zero(m)].ReaderLock();
    }
  }
  ~StripeReaderLocks() {
    for (uint64_t m = mask_; m != 0; m &= m - 1) {
      t_.stripes[absl::countr_zero(m)].ReaderUnlock();
    }
  }
  StripeReaderLocks(const StripeReaderLocks&) = delete;
  StripeReaderLocks& operator=(const StripeReaderLocks&) = delete;

 private:
  const Table& t_;
  const uint64_t mask_;
};

// The writer side of every stripe of a table, in ascending order (as
// StripeReaderLocks): nobody else reads or writes any row of it meanwhile.
class AllStripesLock {
 public:
  explicit AllStripesLock(const Table& t) : t_(t) {
    for (absl::Mutex& m : t_.stripes) m.Lock();
  }
  ~AllStripesLock() {
    for (absl::Mutex& m : t_.stripes) m.Unlock();
  }
  AllStripesLock(const AllStripesLock&) = delete;
  AllStripesLock& operator=(const AllStripesLock&) = delete;

 private:
  const Table& t_;
};

// Positions of a lookup whose ids had no row yet, gathered from parallel
// tasks (rare once a table is warm).
class MissingRows {
 public:
  void Add(absl::Span<const int64_t> positions) {
    absl::MutexLock lock(&mu_);
    positions_.insert(positions_.end(), positions.begin(), positions.end());
  }
  bool empty() {
    absl::MutexLock lock(&mu_);
    return positions_.empty();
  }
  std::vector<int64_t> Sorted() {
    absl::MutexLock lock(&mu_);
    std::sort(positions_.begin(), positions_.end());
    return std::move(positions_);
  }

 private:
  absl::Mutex mu_;
  std::vector<int64_t> positions_ ABSL_GUARDED_BY(mu_);
};

// Lookup's first phase over positions [lo, hi): copies the rows that exist
// to out (in order), records the slot of every id in slots[] and the
// positions without a row in `missing`. A three-stage software pipeline,
// because each stage is a cache miss on a batch far larger than the caches:
// id k's index entry is prefetched, kProbeAhead ids later it is probed and
// its row prefetched, and kRowAhead ids after that the row is copied. Done
// one id at a time, the two dependent misses cost ~200 ns per id.
void CopyExistingRows(const Table& t, absl::Span<const int64_t> ids,
                      int64_t lo, int64_t hi, uint32_t* slots, float* out,
                      MissingRows& missing);

// Gives back the memory of bytes [from, to) of `buffer` that no longer
// holds anything: whole pages to the system (they read as zeros when
// touched again), the part of the first page before them zeroed, so a row
// created there later starts from zeroed padding as in a fresh arena.
void ReleaseBytes(const AlignedBuffer& buffer, int64_t from, int64_t to);
// The opposite: commits the memory of bytes [0, bytes) of `buffer` without
// changing what they hold (MADV_POPULATE_WRITE), split over `pool`. False
// when the kernel cannot (before Linux 5.14): rows then fault as they appear.
bool CommitBytes(const AlignedBuffer& buffer, int64_t bytes, ThreadPool* pool);
// Commits the memory of table t's first `rows` rows (arena, ids,
// generations) and of its id map, as if written; contents unchanged.
void CommitRows(const Table& t, int64_t rows, ThreadPool* pool);

}  // namespace recps::server::host_store

#endif  // RECPS_SERVER_STORE_HOST_TABLE_H_
