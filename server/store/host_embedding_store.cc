// The host-memory EmbeddingStore (see embedding_store.h for the contract).
//
// Per table: one arena of fused rows handed out by a bump counter (no
// allocation per row), and one id -> row index per slot (server/store/id_index.h).
// Slots are grouped into kStripes lock stripes; a batch is bucketed by stripe
// so each call takes every stripe lock at most once, and stripes run in
// parallel on the pool. A row is only read or written under its stripe lock,
// and a row number is only used under the lock it was found under: DropSlot
// frees rows by compacting the arena (the last rows move into the freed
// places, their index entries are repointed through the table's row -> id
// array, the freed tail pages go back to the system), with every stripe of
// the table held as a writer.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "absl/container/flat_hash_map.h"
#include "absl/numeric/bits.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/aligned_buffer.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "kernels/dispatch.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/embedding_store.h"
#include "server/store/host_table.h"
#include "server/store/id_index.h"
#include "server/store/store_footprint.h"
#include "server/store/store_tables.h"

namespace recps::server {
namespace {

using host_store::AllStripesLock;
using host_store::CopyExistingRows;
using host_store::FirstError;
using host_store::ForEachStripe;
using host_store::kHeaderAhead;
using host_store::kParallelMinIds;
using host_store::kProbeAhead;
using host_store::kStripes;
using host_store::MissingRows;
using host_store::PrefetchRow;
using host_store::CommitRows;
using host_store::CommitBytes;
using host_store::ReleaseBytes;
using host_store::StripeBuckets;
using host_store::StripeReaderLocks;
using host_store::Table;

// ApplyGradients updates probed rows in blocks of kUpdateBlock, the newest
// kUpdateLag probed rows held back so that their prefetches have landed.
constexpr int64_t kUpdateBlock = 64;
constexpr int64_t kUpdateLag = 16;

// mmap cannot give more than the 47-bit user address space anyway.
constexpr uint64_t kMaxArenaBytes = uint64_t{1} << 47;

class HostEmbeddingStore final : public TableStoreBase<Table> {
 public:
  HostEmbeddingStore(const StoreOptions& options,
                     std::vector<std::unique_ptr<Table>> tables)
      : TableStoreBase(std::move(tables), options.num_slots, options.pool), options_(options) {}

  absl::Status Lookup(int table, absl::Span<const int64_t> ids,
                      float* out) override {
    ASSIGN_OR_RETURN(Table * t, Get(table));
    // Range first: a refused batch creates no row.
    RETURN_IF_ERROR(t->CheckRange(ids));
    if (ids.empty()) return absl::OkStatus();
    if (out == nullptr) return absl::InvalidArgumentError("Lookup: out is null");
    const auto n = static_cast<int64_t>(ids.size());
    // Existing rows are copied in request order, so that the output is
    // written sequentially (in stripe order its random row writes cost as
    // much as the reads), under the reader side of the stripes: concurrent
    // lookups share them and pushes wait. Ids without a row are created
    // afterwards, one stripe at a time under its writer lock.
    std::vector<uint32_t> slots(n);
    MissingRows missing;
    ThreadPool* pool = n >= kParallelMinIds ? options_.pool : nullptr;
    const int64_t parts = pool == nullptr ? 1 : pool->num_threads();
    // The server calls Lookup on gRPC's threads: when a push or another
    // lookup holds the pool, this one runs on its own thread rather than
    // waiting for that request's work.
    ParallelForOrInline(pool, n, (n + parts - 1) / parts,
                        [&](int64_t lo, int64_t hi) {
                          CopyExistingRows(*t, ids, lo, hi, slots.data(), out,
                                           missing);
                        });
    if (!missing.empty()) {
      RETURN_IF_ERROR(CreateMissingRows(*t, ids, std::move(slots),
                                        missing.Sorted(), out));
    }
    t->lookup_ids.fetch_add(n, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  absl::Status ApplyGradients(int table, absl::Span<const int64_t> ids,
                              const float* grads) override {
    ASSIGN_OR_RETURN(Table * t, Get(table));
    // Cheap, and keeps a caller's bug from creating rows outside the table.
    RETURN_IF_ERROR(t->CheckRange(ids));
    if (ids.empty()) return absl::OkStatus();
    if (grads == nullptr) {
      return absl::InvalidArgumentError("ApplyGradients: grads is null");
    }
    const auto n = static_cast<int64_t>(ids.size());
    // A dynamic table near capacity creates every missing row first, so
    // that a full table refuses the push before any gradient is applied. A
    // fixed table cannot fill: its rows hold distinct ids of [0, num_rows)
    // (every row creation checks the range, an id has one row) and it has
    // room for num_rows. (Once populated it is always "near capacity": the
    // extra pass over the ids cost 5% of an S-p20 step.)
    if (t->spec.num_rows == 0 &&
        t->capacity - t->next_row.load(std::memory_order_relaxed) < n) {
      RETURN_IF_ERROR(CreateRows(*t, ids));
    }
    const StripeBuckets b(*t, ids);
    std::vector<int64_t> rows(n);
    FirstError error;
    ForEachStripe(*t, b, options_.pool, [&](int64_t begin, int64_t end) {
      kernels::FusedUpdateArgs args;
      args.rows = t->arena.as<float>();
      args.precision = t->precision;
      args.stochastic_rounding = t->spec.stochastic_rounding;
      args.num_rows = t->capacity;
      args.row_stride = t->row_words;
      args.dim = t->spec.dim;
      args.grads = grads;
      args.optimizer = t->spec.optimizer;
      // Already inside a parallel task: the update runs on this thread.
      kernels::ExecContext ctx;
      ctx.pool = nullptr;
      // Rows [done, k] are probed and not yet updated. They are updated
      // kUpdateBlock at a time while their prefetched rows and gradients
      // are still in L1/L2: one update after the whole stripe read them
      // all from memory a second time (a stripe of a 64k-id push is ~1k
      // rows, 0.75 MiB with gradients).
      int64_t done = begin;
      auto update_probed = [&](int64_t upto) {
        args.row_indices = rows.data() + done;
        args.num_updates = upto - done;
        args.grad_indices = b.order.data() + done;
        if (absl::Status st = kernels::FusedOptimizerUpdate(args, ctx);
            !st.ok()) {
          error.Set(std::move(st));
        }
        done = upto;
      };
      // As in Lookup: slot headers are prefetched kHeaderAhead ids before
      // the index entries, those kProbeAhead ids before the probe; each
      // probed row and its gradient are prefetched for the update.
      const int64_t warm = std::min(end, begin + kProbeAhead);
      for (int64_t k = begin; k < std::min(end, warm + kHeaderAhead); ++k) {
        t->PrefetchIndexHeader(b.slot[b.order[k]]);
      }
      for (int64_t k = begin; k < warm; ++k) {
        t->PrefetchIndex(b.slot[b.order[k]], ids[b.order[k]]);
      }
      for (int64_t k = begin; k < end; ++k) {
        if (k + kProbeAhead + kHeaderAhead < end) {
          t->PrefetchIndexHeader(b.slot[b.order[k + kProbeAhead + kHeaderAhead]]);
        }
        if (k + kProbeAhead < end) {
          const int64_t q = b.order[k + kProbeAhead];
          t->PrefetchIndex(b.slot[q], ids[q]);
        }
        const int64_t p = b.order[k];
        rows[k] = t->FindOrCreate(b.slot[p], ids[p]);
        // Only when another caller filled the table since CreateRows.
        if (rows[k] < 0) {
          error.Set(t->FullError());
          return;
        }
        t->Touch(b.slot[p], rows[k]);
        PrefetchRow(t->Row(rows[k]), static_cast<int>(t->row_words));
        PrefetchRow(grads + p * t->spec.dim, t->spec.dim);
        if (k + 1 - done >= kUpdateBlock + kUpdateLag) {
          update_probed(k + 1 - kUpdateLag);
        }
      }
      if (done < end) update_probed(end);
    });
    RETURN_IF_ERROR(error.Get());
    t->update_ids.fetch_add(n, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  absl::Status ReadRows(int table, absl::Span<const int64_t> ids,
                        float* out) const override {
    ASSIGN_OR_RETURN(const Table* t, Get(table));
    if (!ids.empty() && out == nullptr) {
      return absl::InvalidArgumentError("ReadRows: out is null");
    }
    for (size_t p = 0; p < ids.size(); ++p) {
      const uint32_t slot = SlotOf(t->key, ids[p], t->num_slots);
      absl::MutexLock lock(&t->stripes[slot % kStripes]);
      const int64_t r = t->Find(slot, ids[p]);
      if (r < 0) return NoRowError(t->spec.name, ids[p]);
      t->ExportRow(t->Row(r), out + p * t->stride);
    }
    return absl::OkStatus();
  }

  TableInfo Info(int table) const override {
    TableInfo info;
    if (!tables_.Valid(table)) return info;
    const Table& t = tables_[table];
    info.name = t.spec.name;
    info.dim = t.spec.dim;
    info.rows = t.next_row.load(std::memory_order_relaxed);
    info.row_bytes = t.RowBytes();  // == HostRowBytes(kind, dim, precision)
    info.index_bytes =
        static_cast<int64_t>(t.index.size()) * HostIndexBytesPerSlot() +
        HostRowIdBytes(info.rows) + HostDenseIndexBytes(t.spec.num_rows);
    for (int s = 0; s < kStripes; ++s) {
      absl::MutexLock lock(&t.stripes[s]);
      for (size_t slot = s; slot < t.index.size(); slot += kStripes) {
        info.index_bytes += HostIndexAllocBytes(
            static_cast<int64_t>(t.index[slot].capacity()));
      }
    }
    info.lookup_ids = t.lookup_ids.load(std::memory_order_relaxed);
    info.update_ids = t.update_ids.load(std::memory_order_relaxed);
    info.committed_bytes = t.committed_rows.load(std::memory_order_relaxed) * info.row_bytes;
    return info;
  }

  absl::Status ExportSlot(int table, uint32_t slot, SlotCursor* cursor,
                          int64_t max_rows, SlotChunk* out) const override {
    return ExportChangedSlot(table, slot, 0, cursor, max_rows, out);
  }

  absl::Status MarkGeneration(uint64_t mark) override {
    return cuts_.Mark(mark, [&] {
      for (const auto& t : tables_) {
        const AllStripesLock stripes(*t);
        t->write_gen.store(mark + 1, std::memory_order_relaxed);
      }
    });
  }

  absl::Status ExportChangedSlot(int table, uint32_t slot, uint64_t since,
                                 SlotCursor* cursor, int64_t max_rows,
                                 SlotChunk* out) const override {
    ASSIGN_OR_RETURN(const Table* t, Get(table));
    RETURN_IF_ERROR(CheckSlot(slot, t->num_slots));
    RETURN_IF_ERROR(CheckExportArgs("ExportSlot", cursor, out, max_rows));
    out->row_stride = t->stride;
    out->ids.clear();
    out->rows.clear();
    if (cursor->done) return absl::OkStatus();
    // (id, row) of the slot's ids past the cursor; the row numbers are only
    // used under this lock.
    std::vector<std::pair<int64_t, int64_t>> found;
    bool done = true;
    {
      absl::ReaderMutexLock lock(&t->stripes[slot % kStripes]);
      const IdIndex& index = t->index[slot];
      const uint64_t* gens = t->RowGens();
      found.reserve(index.size());
      index.ForEach([&](int64_t id, int64_t row) {
        if ((!cursor->started || id > cursor->last_id) && gens[row] > since) {
          found.emplace_back(id, row);
        }
      });
      done = KeepSmallestIds(found, max_rows);
      out->ids.resize(found.size());
      out->rows.resize(found.size() * t->stride);
      for (size_t k = 0; k < found.size(); ++k) {
        out->ids[k] = found[k].first;
        t->ExportRow(t->Row(found[k].second),
                     out->rows.data() + k * t->stride);
      }
    }
    AdvanceCursor(found, done, cursor);
    return absl::OkStatus();
  }

  absl::Status ImportRows(int table, uint32_t slot,
                          absl::Span<const int64_t> ids,
                          const float* rows) override {
    ASSIGN_OR_RETURN(Table * t, Get(table));
    RETURN_IF_ERROR(CheckSlot(slot, t->num_slots));
    if (ids.empty()) return absl::OkStatus();
    // Everything is checked before the lock: a refused import changes
    // nothing.
    RETURN_IF_ERROR(CheckImport(t->spec, slot, ids, rows, t->stride, [t](int64_t id) {
      return SlotOf(t->key, id, t->num_slots);
    }));
    absl::MutexLock lock(&t->stripes[slot % kStripes]);
    IdIndex& index = t->index[slot];
    int64_t fresh = 0;
    for (int64_t id : ids) fresh += index.Find(id) < 0 ? 1 : 0;
    // Reserve the new rows in one step, so that a full table refuses the
    // whole import before any row changes.
    int64_t next = t->next_row.load(std::memory_order_relaxed);
    do {
      if (fresh > t->capacity - next) {
        return ImportFullError(t->spec, t->capacity, fresh, t->capacity - next, slot);
      }
    } while (!t->next_row.compare_exchange_weak(next, next + fresh,
                                                std::memory_order_relaxed));
    // One rehash at most for the whole batch, not one per doubling.
    if (fresh > 0) index.Reserve(index.size() + fresh);
    // Rows are written under the lock, before anyone can find them.
    const uint64_t gen = t->write_gen.load(std::memory_order_relaxed);
    for (size_t p = 0; p < ids.size(); ++p) {
      const float* src = rows + p * t->stride;
      bool created_now = false;
      const int64_t r = index.FindOrInsert(ids[p], [&]() -> int64_t {
        const int64_t created = next++;
        t->RowIds()[created] = ids[p];
        t->RowGens()[created] = gen;
        ++t->slot_rows[slot];
        created_now = true;
        return created;
      });
      if (created_now) t->SetDenseRow(ids[p], r);
      if (!created_now) t->Touch(slot, r);
      t->ImportRow(src, t->Row(r));
    }
    return absl::OkStatus();
  }

  void CommitFixedRows(int table, int64_t rows) override {
    absl::StatusOr<Table*> t = Get(table);
    if (t.ok() && (*t)->spec.num_rows > 0) CommitRows(**t, rows, /*pool=*/nullptr);
  }

  absl::StatusOr<int64_t> DropSlot(int table, uint32_t slot) override {
    RETURN_IF_ERROR(CheckSlot(slot, options_.num_slots));
    if (table == kAllTables) {
      int64_t dropped = 0;
      for (const auto& t : tables_) dropped += DropSlotOf(*t, slot);
      return dropped;
    }
    ASSIGN_OR_RETURN(Table * t, Get(table));
    return DropSlotOf(*t, slot);
  }

  // The index of the rows a snapshot copies aside (Table::pre_image_of_row)
  // for about `rows` rows, zeroed. Small pages: the pushes that copy rows
  // aside touch it a page at a time, under a stripe lock, and a huge page's
  // first touch there (zero 2 MiB, compact memory first) made one push per
  // checkpoint wait 60-300 ms. Committed here, outside the stripe locks,
  // up to kCommittedPreImageIndexBytes: the first push after the cut then
  // takes no page fault for it (6546 faults, ~47 ms, for 4096 rows of a
  // 4M-row table before); beyond that the pages come as rows are copied.
  static constexpr int64_t kCommittedPreImageIndexBytes = int64_t{256} << 20;
  static AlignedBuffer NewPreImageIndex(const Table& t, int64_t rows) {
    const int64_t bytes = rows * static_cast<int64_t>(sizeof(int64_t));
    auto index = AlignedBuffer::Allocate(static_cast<size_t>(bytes), AlignedBuffer::Pages::kSmall);
    if (!index.ok()) {
      std::fprintf(stderr, "store: table '%s': %s\n", t.spec.name.c_str(),
                   index.status().ToString().c_str());
      std::abort();  // as a full heap would (IdIndex::Rehash)
    }
    if (bytes <= kCommittedPreImageIndexBytes) CommitBytes(*index, bytes, /*pool=*/nullptr);
    return *std::move(index);
  }

  absl::Status BeginSnapshot(uint64_t cut) override {
    return cuts_.Begin(cut, [&] {
      for (const auto& t : tables_) {
        // Made before the stripes are taken, with room for the rows that
        // appear meanwhile; made again under them in the rare case more did.
        const int64_t expected = t->next_row.load(std::memory_order_relaxed);
        AlignedBuffer index;
        if (expected > 0) index = NewPreImageIndex(*t, expected + expected / 64 + 1024);
        // Every stripe: no row of the table changes while the generation
        // moves, so each row is either before the cut or after it.
        const AllStripesLock stripes(*t);
        t->snapshot_cut.store(cut, std::memory_order_relaxed);
        t->write_gen.store(cut + 1, std::memory_order_relaxed);
        const int64_t rows = t->next_row.load(std::memory_order_relaxed);
        if (rows > 0) {
          if (static_cast<int64_t>(index.size()) < rows * static_cast<int64_t>(sizeof(int64_t))) {
            index = NewPreImageIndex(*t, rows);
          }
          t->pre_image_of_row = std::move(index);
          t->pre_image_rows = rows;
        }
      }
    });
  }

  absl::Status ExportSnapshotSlot(int table, uint32_t slot, uint64_t since,
                                  SlotCursor* cursor, int64_t max_rows,
                                  SlotChunk* out) const override {
    ASSIGN_OR_RETURN(const Table* t, Get(table));
    RETURN_IF_ERROR(CheckSlot(slot, t->num_slots));
    RETURN_IF_ERROR(
        CheckExportArgs("ExportSnapshotSlot", cursor, out, max_rows));
    out->row_stride = t->stride;
    out->ids.clear();
    out->rows.clear();
    if (cursor->done) return absl::OkStatus();
    // (id, source): source >= 0 is a row of the arena, < 0 the pre-image
    // -1 - source; only used under this lock.
    std::vector<std::pair<int64_t, int64_t>> found;
    bool done = true;
    {
      absl::ReaderMutexLock lock(&t->stripes[slot % kStripes]);
      const uint64_t cut = t->snapshot_cut.load(std::memory_order_relaxed);
      if (cut == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "table '", t->spec.name, "': no snapshot is open"));
      }
      const IdIndex& index = t->index[slot];
      const uint64_t* gens = t->RowGens();
      const Table::PreImages& pre = t->pre_images[slot % kStripes];
      found.reserve(index.size());
      index.ForEach([&](int64_t id, int64_t row) {
        if (cursor->started && id <= cursor->last_id) return;
        const uint64_t gen = gens[row];
        if (gen <= cut) {
          if (gen > since) found.emplace_back(id, row);
          return;
        }
        // Changed since the cut, or created after it (no pre-image).
        const int64_t k = t->PreImageOf(row);
        if (k >= 0 && pre.gens[k] > since) found.emplace_back(id, -1 - k);
      });
      done = KeepSmallestIds(found, max_rows);
      out->ids.resize(found.size());
      out->rows.resize(found.size() * t->stride);
      for (size_t k = 0; k < found.size(); ++k) {
        out->ids[k] = found[k].first;
        const float* src =
            found[k].second >= 0
                ? t->Row(found[k].second)
                : pre.Row(-1 - found[k].second, t->row_words);
        t->ExportRow(src, out->rows.data() + k * t->stride);
      }
    }
    AdvanceCursor(found, done, cursor);
    return absl::OkStatus();
  }

  void EndSnapshot() override {
    cuts_.End([&] {
      for (const auto& t : tables_) {
        std::array<Table::PreImages, kStripes> dropped;
        AlignedBuffer dropped_index;
        {
          const AllStripesLock stripes(*t);
          t->snapshot_cut.store(0, std::memory_order_relaxed);
          dropped.swap(t->pre_images);
          dropped_index = std::move(t->pre_image_of_row);
          t->pre_image_rows = 0;
          t->pre_image_bytes.store(0, std::memory_order_relaxed);
        }
        // `dropped` frees its memory here, with no table lock held.
      }
    });
  }

  int64_t SnapshotBytes() const override {
    int64_t bytes = 0;
    for (const auto& t : tables_) {
      bytes += t->pre_image_bytes.load(std::memory_order_relaxed);
    }
    return bytes;
  }

  std::vector<int64_t> BytesPerSlot() const override {
    std::vector<int64_t> out(options_.num_slots, 0);
    for (const auto& t : tables_) {
      const int64_t row_bytes = t->RowBytes();
      for (int s = 0; s < kStripes; ++s) {
        absl::MutexLock lock(&t->stripes[s]);
        for (uint32_t slot = s; slot < options_.num_slots; slot += kStripes) {
          out[slot] += t->slot_rows[slot] * row_bytes;
        }
      }
    }
    return out;
  }

  std::vector<int64_t> RowsPerSlot() const override {
    std::vector<int64_t> out(options_.num_slots, 0);
    for (const auto& t : tables_) {
      for (int s = 0; s < kStripes; ++s) {
        absl::MutexLock lock(&t->stripes[s]);
        for (uint32_t slot = s; slot < options_.num_slots; slot += kStripes) {
          out[slot] += t->slot_rows[slot];
        }
      }
    }
    return out;
  }

 private:

  // Removes the rows of `slot` from t and compacts t's arena: the live rows
  // at its end move into the freed places, so rows stay packed in
  // [0, next_row) and the tail pages can go back to the system.
  static int64_t DropSlotOf(Table& t, uint32_t slot) {
    {
      // Nothing to drop: no need to stop the whole table.
      absl::ReaderMutexLock lock(&t.stripes[slot % kStripes]);
      if (t.index[slot].size() == 0) return 0;
    }
    const AllStripesLock lock(t);
    IdIndex& index = t.index[slot];
    const int64_t n = index.size();
    std::vector<int64_t> holes;
    holes.reserve(n);
    index.ForEach([&](int64_t id, int64_t row) {
      holes.push_back(row);
      t.SetDenseRow(id, -1);  // no row
    });
    std::sort(holes.begin(), holes.end());
    index = IdIndex();  // frees its array
    t.slot_rows[slot] = 0;
    const int64_t end = t.next_row.load(std::memory_order_relaxed);
    const int64_t new_end = end - n;
    const size_t row_bytes = static_cast<size_t>(t.RowBytes());
    int64_t* const row_ids = t.RowIds();
    uint64_t* const row_gens = t.RowGens();
    // Holes below new_end are exactly as many as live rows at or above it:
    // fill them with those, taken from the end.
    int64_t tail = end - 1;
    size_t top = holes.size();  // holes[top - 1]: the largest not passed
    for (size_t h = 0; h < holes.size() && holes[h] < new_end; ++h) {
      while (top > 0 && holes[top - 1] == tail) {
        --top;
        --tail;
      }
      const int64_t to = holes[h];
      const int64_t id = row_ids[tail];
      std::memcpy(t.Row(to), t.Row(tail), row_bytes);
      row_ids[to] = id;
      row_gens[to] = row_gens[tail];
      // A pre-image follows its row (to < tail, so to < pre_image_rows
      // whenever tail is).
      if (to < t.pre_image_rows) {
        int64_t* pre = t.pre_image_of_row.as<int64_t>();
        pre[to] = tail < t.pre_image_rows ? pre[tail] : 0;
      }
      const bool moved =
          t.index[SlotOf(t.key, id, t.num_slots)].SetRow(id, to);
      t.SetDenseRow(id, to);
      if (!moved) {
        // The row -> id array and the index disagree: a bug, and rows
        // would be lost silently if it went on.
        std::fprintf(stderr, "store: table '%s': row %lld (id %lld) is not "
                     "in its slot's index\n", t.spec.name.c_str(),
                     static_cast<long long>(tail), static_cast<long long>(id));
        std::abort();
      }
      --tail;
    }
    t.next_row.store(new_end, std::memory_order_relaxed);
    ReleaseBytes(t.arena, new_end * static_cast<int64_t>(row_bytes),
                 end * static_cast<int64_t>(row_bytes));
    ReleaseBytes(t.row_ids, new_end * static_cast<int64_t>(sizeof(int64_t)),
                 end * static_cast<int64_t>(sizeof(int64_t)));
    ReleaseBytes(t.row_gens, new_end * static_cast<int64_t>(sizeof(uint64_t)),
                 end * static_cast<int64_t>(sizeof(uint64_t)));
    // Rows made there later are new since the cut: no pre-image.
    ReleaseBytes(t.pre_image_of_row, new_end * static_cast<int64_t>(sizeof(int64_t)),
                 std::min(end, t.pre_image_rows) * static_cast<int64_t>(sizeof(int64_t)));
    return n;
  }

  // Lookup's second phase: creates the rows of ids[positions] that nobody
  // created since the first phase and copies them to out.
  absl::Status CreateMissingRows(Table& t, absl::Span<const int64_t> ids,
                                 std::vector<uint32_t> slots,
                                 absl::Span<const int64_t> positions,
                                 float* out) {
    const StripeBuckets b(std::move(slots), positions);
    const int dim = t.spec.dim;
    std::atomic<bool> full{false};
    ForEachStripe(t, b, options_.pool, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const int64_t p = b.order[k];
        const int64_t r = t.FindOrCreate(b.slot[p], ids[p]);
        if (r < 0) {
          full.store(true, std::memory_order_relaxed);
          return;
        }
        t.ReadWeights(t.Row(r), out + p * dim);
      }
    });
    return full.load() ? t.FullError() : absl::OkStatus();
  }

  // Creates the missing rows of `ids` without touching existing ones.
  absl::Status CreateRows(Table& t, absl::Span<const int64_t> ids) {
    const StripeBuckets b(t, ids);
    std::atomic<bool> full{false};
    ForEachStripe(t, b, options_.pool, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const int64_t p = b.order[k];
        if (t.FindOrCreate(b.slot[p], ids[p]) < 0) {
          full.store(true, std::memory_order_relaxed);
          return;
        }
      }
    });
    return full.load() ? t.FullError() : absl::OkStatus();
  }

  const StoreOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateHostEmbeddingStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options) {
  RETURN_IF_ERROR(ValidateStoreTables(tables, options));
  std::vector<std::unique_ptr<Table>> built;
  built.reserve(tables.size());
  for (config::TableSpec& spec : tables) {
    auto t = std::make_unique<Table>();
    t->key = StableNameKey(spec.name);
    t->seed = options.seed;
    t->num_slots = options.num_slots;
    static_cast<StoredRowFormat&>(*t) = StoredRowFormat::For(spec);
    t->capacity = TableCapacity(spec, options);
    const uint64_t row_bytes =
        static_cast<uint64_t>(t->row_words) * sizeof(float);
    if (static_cast<uint64_t>(t->capacity) > kMaxArenaBytes / row_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", spec.name, "': ", t->capacity, " rows of ", row_bytes,
          " bytes exceed the address space; lower ",
          spec.num_rows > 0 ? "num_rows" : "max_rows_per_table"));
    }
    auto arena = AlignedBuffer::Allocate(t->capacity * row_bytes);
    if (!arena.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "table '", spec.name, "': reserving ", t->capacity, " rows: ",
          arena.status().message()));
    }
    t->arena = *std::move(arena);
    auto row_ids = AlignedBuffer::Allocate(
        static_cast<size_t>(t->capacity) * sizeof(int64_t));
    if (!row_ids.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "table '", spec.name, "': reserving the ids of ", t->capacity,
          " rows: ", row_ids.status().message()));
    }
    t->row_ids = *std::move(row_ids);
    auto row_gens = AlignedBuffer::Allocate(
        static_cast<size_t>(t->capacity) * sizeof(uint64_t));
    if (!row_gens.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "table '", spec.name, "': reserving the generations of ",
          t->capacity, " rows: ", row_gens.status().message()));
    }
    t->row_gens = *std::move(row_gens);
    if (const int64_t dense = HostDenseIndexBytes(spec.num_rows); dense > 0) {
      // Zero-filled pages on first touch: no id has a row yet.
      auto dense_rows = AlignedBuffer::Allocate(static_cast<size_t>(dense));
      if (!dense_rows.ok()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "table '", spec.name, "': reserving the id -> row map of ",
            spec.num_rows, " ids: ", dense_rows.status().message()));
      }
      t->dense_rows = *std::move(dense_rows);
    }
    if (options.prefault_fixed_share > 0 && spec.num_rows > 0) {
      // Rows are packed from the arena's start: this share's rows are the
      // first ones.
      CommitRows(*t, ExpectedFixedRows(spec.num_rows, options.prefault_fixed_share),
                 options.pool);

    }
    t->index.resize(options.num_slots);
    t->slot_rows.assign(options.num_slots, 0);
    t->spec = std::move(spec);
    built.push_back(std::move(t));
  }
  return std::unique_ptr<EmbeddingStore>(
      new HostEmbeddingStore(options, std::move(built)));
}

}  // namespace recps::server
