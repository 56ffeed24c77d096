// The device store (device_store.h) over a DeviceBackend.
//
// Snapshots are copy-on-write, as in the host store, not a copy of the
// table at BeginSnapshot: every change goes through a writer here, which
// knows the row's generation on the host, so the first change of a row
// after the cut reads that row back from the device (one batched read per
// push) into host memory first. BeginSnapshot then costs a generation bump,
// and a snapshot costs host memory only for the rows trained meanwhile,
// where a whole copy would cost the table's size in host memory and a
// stall of a full device-to-host copy at every checkpoint.
#include "server/store/device_store/device_store.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/hashing.h"
#include "common/human_bytes.h"
#include "common/row_init.h"
#include "common/status_macros.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/id_index.h"
#include "server/store/store_footprint.h"
#include "server/store/store_tables.h"
#include "server/store/stored_row.h"
#include "server/store/table_checks.h"

namespace recps::server {
namespace {

using device_store::DeviceBackend;
using device_store::DeviceTable;
using device_store::TableLayout;

// The row format (fp32 stride, stored row_words, precision and the row
// conversions) comes from StoredRowFormat, shared with the host store: the
// backend keeps stored rows, rows leave and enter the store as fp32 ones.
struct Table : StoredRowFormat {
  config::TableSpec spec;
  uint64_t key = 0;
  uint64_t seed = 0;
  uint32_t num_slots = 0;
  int64_t capacity = 0;
  int64_t index_capacity = 0;
  std::unique_ptr<DeviceTable> dev;
  std::atomic<int64_t> lookup_ids{0};
  std::atomic<int64_t> update_ids{0};

  // Readers: probes, gathers, exports. Writers: everything that changes a
  // row, the index or the bookkeeping below.
  mutable absl::Mutex mu;
  // Per row r < rows(): its id, generation, and position in its slot's list.
  std::vector<int64_t> row_ids ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> row_gens ABSL_GUARDED_BY(mu);
  std::vector<int64_t> row_pos ABSL_GUARDED_BY(mu);
  // The rows of each slot, in no order.
  std::vector<std::vector<int64_t>> slot_rows ABSL_GUARDED_BY(mu);
  uint64_t write_gen ABSL_GUARDED_BY(mu) = 1;
  uint64_t snapshot_cut ABSL_GUARDED_BY(mu) = 0;
  // Rows as they were at the cut, copied aside before their first change.
  absl::flat_hash_map<int64_t, int64_t> pre_at ABSL_GUARDED_BY(mu);  // id -> k
  std::vector<float> pre_rows ABSL_GUARDED_BY(mu);     // k x row_words
  std::vector<uint64_t> pre_gens ABSL_GUARDED_BY(mu);  // gen at the cut
  std::atomic<int64_t> rows{0};  // written under mu (writer)

  uint32_t Slot(int64_t id) const { return SlotOf(key, id, num_slots); }
  bool InRange(int64_t id) const {
    return spec.num_rows == 0 || (id >= 0 && id < spec.num_rows);
  }
  absl::Status CheckRange(absl::Span<const int64_t> ids) const {
    return CheckIdsInRange(spec, ids);
  }
  absl::Status FullError() const { return TableFullError(spec, capacity); }

  // Bookkeeping of a new row r holding id. REQUIRES: mu held as a writer.
  void AddRow(int64_t id, int64_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<int64_t>& list = slot_rows[Slot(id)];
    row_ids.push_back(id);
    row_gens.push_back(write_gen);
    row_pos.push_back(static_cast<int64_t>(list.size()));
    list.push_back(r);
    rows.store(r + 1, std::memory_order_relaxed);
  }

  // Before rows[k] change: copies aside those a snapshot still needs
  // (first change since the cut) and stamps them all with write_gen.
  absl::Status Touch(absl::Span<const int64_t> rs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (snapshot_cut != 0) {
      std::vector<int64_t> save;
      for (int64_t r : rs) {
        if (row_gens[r] <= snapshot_cut && !pre_at.contains(row_ids[r])) {
          save.push_back(r);
        }
      }
      if (!save.empty()) {
        const size_t first = pre_gens.size();
        pre_rows.resize((first + save.size()) * row_words);
        RETURN_IF_ERROR(dev->ReadRows(save, pre_rows.data() + first * row_words));
        for (size_t k = 0; k < save.size(); ++k) {
          pre_at.emplace(row_ids[save[k]], static_cast<int64_t>(first + k));
          pre_gens.push_back(row_gens[save[k]]);
        }
      }
    }
    for (int64_t r : rs) row_gens[r] = write_gen;
    return absl::OkStatus();
  }

  // rows_out[p] = the row of ids[p], creating (with the initial value) the
  // rows that do not exist; all or nothing: RESOURCE_EXHAUSTED before any
  // row is created when they do not fit. `probed` holds a probe of ids
  // (-1: missing) taken under this lock or is empty.
  absl::Status EnsureRows(absl::Span<const int64_t> ids, int64_t* rows_out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    RETURN_IF_ERROR(dev->ProbeGather(ids, rows_out, nullptr));
    std::vector<int64_t> fresh_ids;
    std::vector<size_t> fresh_pos;
    for (size_t p = 0; p < ids.size(); ++p) {
      if (rows_out[p] < 0) fresh_pos.push_back(p);
    }
    if (fresh_pos.empty()) return absl::OkStatus();
    // Duplicate ids of a lookup get one row.
    absl::flat_hash_map<int64_t, int64_t> made;
    made.reserve(fresh_pos.size());
    for (size_t p : fresh_pos) {
      if (made.try_emplace(ids[p], -1).second) fresh_ids.push_back(ids[p]);
    }
    const int64_t next = rows.load(std::memory_order_relaxed);
    if (static_cast<int64_t>(fresh_ids.size()) > capacity - next) {
      return FullError();
    }
    std::vector<float> init(fresh_ids.size() * row_words);
    std::vector<int64_t> new_rows(fresh_ids.size());
    for (size_t k = 0; k < fresh_ids.size(); ++k) {
      InitStoredRow(spec.init, seed, key, fresh_ids[k], init.data() + k * row_words);
      new_rows[k] = next + static_cast<int64_t>(k);
      made[fresh_ids[k]] = new_rows[k];
    }
    RETURN_IF_ERROR(dev->WriteRows(new_rows, init.data()));
    RETURN_IF_ERROR(dev->Insert(fresh_ids, new_rows));
    for (size_t k = 0; k < fresh_ids.size(); ++k) {
      AddRow(fresh_ids[k], new_rows[k]);
    }
    for (size_t p : fresh_pos) rows_out[p] = made[ids[p]];
    return absl::OkStatus();
  }
};

// The backend, in a base listed before the tables' so that it is destroyed
// after them: their device memory comes from it.
struct BackendHolder {
  explicit BackendHolder(std::unique_ptr<DeviceBackend> b)
      : backend(std::move(b)) {}
  const std::unique_ptr<DeviceBackend> backend;
};

class DeviceEmbeddingStore final : private BackendHolder,
                                   public TableStoreBase<Table> {
 public:
  DeviceEmbeddingStore(const StoreOptions& options,
                       std::unique_ptr<DeviceBackend> backend,
                       std::vector<std::unique_ptr<Table>> tables)
      : BackendHolder(std::move(backend)),
        TableStoreBase(std::move(tables), options.num_slots, options.pool),
        options_(options) {}

  absl::Status Lookup(int table, absl::Span<const int64_t> ids,
                      float* out) override {
    ASSIGN_OR_RETURN(Table * t, Get(table));
    RETURN_IF_ERROR(t->CheckRange(ids));
    if (ids.empty()) return absl::OkStatus();
    if (out == nullptr) return absl::InvalidArgumentError("Lookup: out is null");
    const auto n = static_cast<int64_t>(ids.size());
    std::vector<int64_t> rows(n);
    {
      absl::ReaderMutexLock lock(&t->mu);
      RETURN_IF_ERROR(t->dev->ProbeGather(ids, rows.data(), out));
    }
    std::vector<int64_t> missing;
    for (int64_t p = 0; p < n; ++p) {
      if (rows[p] < 0) missing.push_back(p);
    }
    if (!missing.empty()) {
      // Rare once a table is warm: create them (or find them created by
      // another caller meanwhile) under the writer lock, and read them back.
      std::vector<int64_t> sub_ids(missing.size());
      for (size_t k = 0; k < missing.size(); ++k) sub_ids[k] = ids[missing[k]];
      std::vector<int64_t> sub_rows(missing.size());
      std::vector<float> stored(missing.size() * t->row_words);
      absl::MutexLock lock(&t->mu);
      RETURN_IF_ERROR(t->EnsureRows(sub_ids, sub_rows.data()));
      RETURN_IF_ERROR(t->dev->ReadRows(sub_rows, stored.data()));
      for (size_t k = 0; k < missing.size(); ++k) {
        t->ReadWeights(stored.data() + k * t->row_words,
                       out + missing[k] * t->dim);
      }
    }
    t->lookup_ids.fetch_add(n, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  absl::Status ApplyGradients(int table, absl::Span<const int64_t> ids,
                              const float* grads) override {
    ASSIGN_OR_RETURN(Table * t, Get(table));
    RETURN_IF_ERROR(t->CheckRange(ids));
    if (ids.empty()) return absl::OkStatus();
    if (grads == nullptr) {
      return absl::InvalidArgumentError("ApplyGradients: grads is null");
    }
    std::vector<int64_t> rows(ids.size());
    absl::MutexLock lock(&t->mu);
    RETURN_IF_ERROR(t->EnsureRows(ids, rows.data()));
    RETURN_IF_ERROR(t->Touch(rows));
    RETURN_IF_ERROR(t->dev->Update(rows, grads, t->spec.optimizer));
    t->update_ids.fetch_add(static_cast<int64_t>(ids.size()),
                            std::memory_order_relaxed);
    return absl::OkStatus();
  }

  absl::Status ReadRows(int table, absl::Span<const int64_t> ids,
                        float* out) const override {
    ASSIGN_OR_RETURN(const Table* t, Get(table));
    if (ids.empty()) return absl::OkStatus();
    if (out == nullptr) {
      return absl::InvalidArgumentError("ReadRows: out is null");
    }
    std::vector<int64_t> rows(ids.size());
    absl::ReaderMutexLock lock(&t->mu);
    RETURN_IF_ERROR(t->dev->ProbeGather(ids, rows.data(), nullptr));
    for (size_t p = 0; p < ids.size(); ++p) {
      if (rows[p] < 0) return NoRowError(t->spec.name, ids[p]);
    }
    if (!t->Is16Bit()) return t->dev->ReadRows(rows, out);
    std::vector<float> stored(ids.size() * t->row_words);
    RETURN_IF_ERROR(t->dev->ReadRows(rows, stored.data()));
    for (size_t p = 0; p < ids.size(); ++p) {
      t->ExportRow(stored.data() + p * t->row_words, out + p * t->stride);
    }
    return absl::OkStatus();
  }

  TableInfo Info(int table) const override {
    TableInfo info;
    if (!tables_.Valid(table)) return info;
    const Table& t = tables_[table];
    info.name = t.spec.name;
    info.dim = t.spec.dim;
    info.rows = t.rows.load(std::memory_order_relaxed);
    info.row_bytes = t.RowBytes();
    // The device index is allocated whole; the host keeps each row's id.
    info.index_bytes = IdIndex::AllocBytes(t.index_capacity) +
                       HostRowIdBytes(info.rows);
    info.lookup_ids = t.lookup_ids.load(std::memory_order_relaxed);
    info.update_ids = t.update_ids.load(std::memory_order_relaxed);
    return info;
  }

  std::vector<int64_t> RowsPerSlot() const override {
    std::vector<int64_t> out(options_.num_slots, 0);
    for (const auto& t : tables_) {
      absl::ReaderMutexLock lock(&t->mu);
      for (uint32_t s = 0; s < options_.num_slots; ++s) {
        out[s] += static_cast<int64_t>(t->slot_rows[s].size());
      }
    }
    return out;
  }

  std::vector<int64_t> BytesPerSlot() const override {
    std::vector<int64_t> out(options_.num_slots, 0);
    for (const auto& t : tables_) {
      const int64_t row_bytes = t->RowBytes();
      absl::ReaderMutexLock lock(&t->mu);
      for (uint32_t s = 0; s < options_.num_slots; ++s) {
        out[s] += static_cast<int64_t>(t->slot_rows[s].size()) * row_bytes;
      }
    }
    return out;
  }

  absl::Status ExportSlot(int table, uint32_t slot, SlotCursor* cursor,
                          int64_t max_rows, SlotChunk* out) const override {
    return Export(table, slot, /*snapshot=*/false, 0, cursor, max_rows, out,
                  "ExportSlot");
  }

  absl::Status ExportChangedSlot(int table, uint32_t slot, uint64_t since,
                                 SlotCursor* cursor, int64_t max_rows,
                                 SlotChunk* out) const override {
    return Export(table, slot, /*snapshot=*/false, since, cursor, max_rows,
                  out, "ExportSlot");
  }

  absl::Status ExportSnapshotSlot(int table, uint32_t slot, uint64_t since,
                                  SlotCursor* cursor, int64_t max_rows,
                                  SlotChunk* out) const override {
    return Export(table, slot, /*snapshot=*/true, since, cursor, max_rows, out,
                  "ExportSnapshotSlot");
  }

  absl::Status ImportRows(int table, uint32_t slot,
                          absl::Span<const int64_t> ids,
                          const float* rows) override {
    ASSIGN_OR_RETURN(Table * t, Get(table));
    RETURN_IF_ERROR(CheckSlot(slot, options_.num_slots));
    if (ids.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(CheckImport(t->spec, slot, ids, rows, t->stride,
                                [t](int64_t id) { return t->Slot(id); }));
    const size_t n = ids.size();
    // Stored rows; padding is stored as 0, whatever the sender had there.
    std::vector<float> data(n * t->row_words);
    for (size_t p = 0; p < n; ++p) {
      t->ImportRow(rows + p * t->stride, data.data() + p * t->row_words);
    }
    std::vector<int64_t> at(n);
    absl::MutexLock lock(&t->mu);
    RETURN_IF_ERROR(t->dev->ProbeGather(ids, at.data(), nullptr));
    std::vector<int64_t> existing, fresh_ids, fresh_rows;
    for (size_t p = 0; p < n; ++p) {
      if (at[p] >= 0) existing.push_back(at[p]);
    }
    const int64_t fresh = static_cast<int64_t>(n - existing.size());
    const int64_t next = t->rows.load(std::memory_order_relaxed);
    if (fresh > t->capacity - next) {
      return ImportFullError(t->spec, t->capacity, fresh, t->capacity - next, slot);
    }
    RETURN_IF_ERROR(t->Touch(existing));
    int64_t r = next;
    for (size_t p = 0; p < n; ++p) {
      if (at[p] >= 0) continue;
      at[p] = r++;
      fresh_ids.push_back(ids[p]);
      fresh_rows.push_back(at[p]);
    }
    RETURN_IF_ERROR(t->dev->WriteRows(at, data.data()));
    RETURN_IF_ERROR(t->dev->Insert(fresh_ids, fresh_rows));
    for (size_t k = 0; k < fresh_ids.size(); ++k) {
      t->AddRow(fresh_ids[k], fresh_rows[k]);
    }
    return absl::OkStatus();
  }

  // Rows are allocated whole at creation (device memory is not paged in).
  void CommitFixedRows(int /*table*/, int64_t /*rows*/) override {}

  absl::StatusOr<int64_t> DropSlot(int table, uint32_t slot) override {
    RETURN_IF_ERROR(CheckSlot(slot, options_.num_slots));
    if (table == kAllTables) {
      int64_t dropped = 0;
      for (const auto& t : tables_) {
        ASSIGN_OR_RETURN(const int64_t n, DropSlotOf(*t, slot));
        dropped += n;
      }
      return dropped;
    }
    ASSIGN_OR_RETURN(Table * t, Get(table));
    return DropSlotOf(*t, slot);
  }

  absl::Status BeginSnapshot(uint64_t cut) override {
    return cuts_.Begin(cut, [&] {
      for (const auto& t : tables_) {
        absl::MutexLock table_lock(&t->mu);
        t->snapshot_cut = cut;
        t->write_gen = cut + 1;
      }
    });
  }

  void EndSnapshot() override {
    cuts_.End([&] {
      for (const auto& t : tables_) {
        absl::flat_hash_map<int64_t, int64_t> at;
        std::vector<float> rows;
        std::vector<uint64_t> gens;
        {
          absl::MutexLock table_lock(&t->mu);
          t->snapshot_cut = 0;
          at.swap(t->pre_at);
          rows.swap(t->pre_rows);
          gens.swap(t->pre_gens);
        }
        // Freed here, with no table lock held.
      }
    });
  }

  int64_t SnapshotBytes() const override {
    int64_t bytes = 0;
    for (const auto& t : tables_) {
      absl::ReaderMutexLock lock(&t->mu);
      bytes += static_cast<int64_t>(t->pre_gens.size()) * t->RowBytes();
    }
    return bytes;
  }

  absl::Status MarkGeneration(uint64_t mark) override {
    return cuts_.Mark(mark, [&] {
      for (const auto& t : tables_) {
        absl::MutexLock table_lock(&t->mu);
        t->write_gen = mark + 1;
      }
    });
  }

 private:

  // ExportSlot, ExportChangedSlot (snapshot false) and ExportSnapshotSlot.
  absl::Status Export(int table, uint32_t slot, bool snapshot, uint64_t since,
                      SlotCursor* cursor, int64_t max_rows, SlotChunk* out,
                      const char* what) const {
    ASSIGN_OR_RETURN(const Table* t, Get(table));
    RETURN_IF_ERROR(CheckSlot(slot, options_.num_slots));
    RETURN_IF_ERROR(CheckExportArgs(what, cursor, out, max_rows));
    out->row_stride = t->stride;
    out->ids.clear();
    out->rows.clear();
    if (cursor->done) return absl::OkStatus();
    // (id, source): source >= 0 a row of the arena, < 0 the pre-image
    // -1 - source; only used under this lock.
    std::vector<std::pair<int64_t, int64_t>> found;
    bool done = true;
    {
      absl::ReaderMutexLock lock(&t->mu);
      const uint64_t cut = t->snapshot_cut;
      if (snapshot && cut == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "table '", t->spec.name, "': no snapshot is open"));
      }
      const std::vector<int64_t>& list = t->slot_rows[slot];
      found.reserve(list.size());
      for (int64_t row : list) {
        const int64_t id = t->row_ids[row];
        if (cursor->started && id <= cursor->last_id) continue;
        const uint64_t gen = t->row_gens[row];
        if (!snapshot || gen <= cut) {
          if (gen > since) found.emplace_back(id, row);
          continue;
        }
        const auto it = t->pre_at.find(id);
        if (it != t->pre_at.end() && t->pre_gens[it->second] > since) {
          found.emplace_back(id, -1 - it->second);
        }
      }
      done = KeepSmallestIds(found, max_rows);
      out->ids.resize(found.size());
      out->rows.resize(found.size() * t->stride);
      std::vector<int64_t> live;
      std::vector<size_t> live_at;
      for (size_t k = 0; k < found.size(); ++k) {
        out->ids[k] = found[k].first;
        if (found[k].second >= 0) {
          live.push_back(found[k].second);
          live_at.push_back(k);
        } else {
          t->ExportRow(
              t->pre_rows.data() + (-1 - found[k].second) * t->row_words,
              out->rows.data() + k * t->stride);
        }
      }
      if (live.size() == found.size() && !t->Is16Bit()) {
        RETURN_IF_ERROR(t->dev->ReadRows(live, out->rows.data()));
      } else if (!live.empty()) {
        std::vector<float> buf(live.size() * t->row_words);
        RETURN_IF_ERROR(t->dev->ReadRows(live, buf.data()));
        for (size_t j = 0; j < live.size(); ++j) {
          t->ExportRow(buf.data() + j * t->row_words,
                       out->rows.data() + live_at[j] * t->stride);
        }
      }
    }
    AdvanceCursor(found, done, cursor);
    return absl::OkStatus();
  }

  // Removes the rows of `slot` and compacts the arena as the host store
  // does (the last rows move into the freed places), then rebuilds the
  // index from the row ids.
  static absl::StatusOr<int64_t> DropSlotOf(Table& t, uint32_t slot) {
    absl::MutexLock lock(&t.mu);
    std::vector<int64_t> holes = std::move(t.slot_rows[slot]);
    t.slot_rows[slot] = {};
    if (holes.empty()) return 0;
    const auto n = static_cast<int64_t>(holes.size());
    // The dropped rows leave an open snapshot too: an id made again later
    // is new since the cut, not its old pre-image (as in the host store).
    if (t.snapshot_cut != 0) {
      for (int64_t r : holes) t.pre_at.erase(t.row_ids[r]);
    }
    std::sort(holes.begin(), holes.end());
    const int64_t end = t.rows.load(std::memory_order_relaxed);
    const int64_t new_end = end - n;
    std::vector<int64_t> old_ids(t.row_ids.begin(), t.row_ids.end());
    std::vector<int64_t> from, to;
    int64_t tail = end - 1;
    size_t top = holes.size();
    for (size_t h = 0; h < holes.size() && holes[h] < new_end; ++h) {
      while (top > 0 && holes[top - 1] == tail) {
        --top;
        --tail;
      }
      const int64_t dst = holes[h];
      const int64_t id = t.row_ids[tail];
      t.row_ids[dst] = id;
      t.row_gens[dst] = t.row_gens[tail];
      t.row_pos[dst] = t.row_pos[tail];
      t.slot_rows[t.Slot(id)][t.row_pos[dst]] = dst;
      from.push_back(tail);
      to.push_back(dst);
      --tail;
    }
    RETURN_IF_ERROR(t.dev->MoveRows(from, to));
    t.row_ids.resize(new_end);
    t.row_gens.resize(new_end);
    t.row_pos.resize(new_end);
    t.rows.store(new_end, std::memory_order_relaxed);
    RETURN_IF_ERROR(t.dev->RebuildIndex(old_ids, t.row_ids));
    return n;
  }

  const StoreOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateDeviceEmbeddingStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options,
    std::unique_ptr<DeviceBackend> backend) {
  if (backend == nullptr) {
    return absl::InvalidArgumentError("device store: no backend");
  }
  RETURN_IF_ERROR(ValidateStoreTables(tables, options));
  std::vector<std::unique_ptr<Table>> built;
  for (config::TableSpec& spec : tables) {
    auto t = std::make_unique<Table>();
    t->key = StableNameKey(spec.name);
    t->seed = options.seed;
    t->num_slots = options.num_slots;
    static_cast<StoredRowFormat&>(*t) = StoredRowFormat::For(spec);
    t->capacity = TableCapacity(spec, options);
    t->index_capacity = IdIndex::CapacityForRows(t->capacity);
    TableLayout layout;
    layout.capacity = t->capacity;
    layout.stride = t->row_words;
    layout.dim = spec.dim;
    layout.index_capacity = t->index_capacity;
    layout.precision = spec.precision;
    layout.stochastic_rounding = spec.stochastic_rounding;
    auto dev = backend->CreateTable(layout);
    if (!dev.ok()) {
      return absl::Status(dev.status().code(),
                          absl::StrCat("table '", spec.name, "': ",
                                       dev.status().message()));
    }
    t->dev = *std::move(dev);
    {
      absl::MutexLock lock(&t->mu);
      t->slot_rows.resize(options.num_slots);
    }
    t->spec = std::move(spec);
    built.push_back(std::move(t));
  }
  return std::unique_ptr<EmbeddingStore>(new DeviceEmbeddingStore(
      options, std::move(backend), std::move(built)));
}

absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateCpuTwinEmbeddingStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options) {
  return CreateDeviceEmbeddingStore(std::move(tables), options,
                                    device_store::CreateCpuTwinBackend());
}

DeviceFootprint ComputeDeviceFootprint(
    const std::vector<config::TableSpec>& tables, const StoreOptions& options,
    int64_t scratch_bytes) {
  DeviceFootprint f;
  f.scratch_bytes = scratch_bytes;
  f.total_bytes = scratch_bytes;
  for (const config::TableSpec& spec : tables) {
    DeviceFootprint::Table t;
    t.name = spec.name;
    t.rows = TableCapacity(spec, options);
    t.row_bytes = StoredRowFormat::For(spec).RowBytes();
    t.index_bytes = HostIndexBytesForRows(t.rows);
    f.total_bytes += t.rows * t.row_bytes + t.index_bytes;
    f.tables.push_back(std::move(t));
  }
  return f;
}

absl::Status CheckDeviceFits(const DeviceFootprint& footprint,
                             const std::string& device, int64_t free_bytes,
                             int64_t total_bytes) {
  if (footprint.total_bytes <= free_bytes) return absl::OkStatus();
  const DeviceFootprint::Table* biggest = nullptr;
  for (const DeviceFootprint::Table& t : footprint.tables) {
    if (biggest == nullptr || t.rows * t.row_bytes + t.index_bytes >
                                  biggest->rows * biggest->row_bytes +
                                      biggest->index_bytes) {
      biggest = &t;
    }
  }
  std::string msg = absl::StrCat(
      "device ", device, ": the store does not fit: it needs ",
      HumanBytes(static_cast<double>(footprint.total_bytes)), " (",
      footprint.tables.size(), " table(s) and ",
      HumanBytes(static_cast<double>(footprint.scratch_bytes)),
      " of stream buffers), the GPU has ",
      HumanBytes(static_cast<double>(free_bytes)), " free of ",
      HumanBytes(static_cast<double>(total_bytes)));
  if (biggest != nullptr) {
    absl::StrAppend(
        &msg, "; the largest is table '", biggest->name, "': ", biggest->rows,
        " rows of ", biggest->row_bytes, " B, ",
        HumanBytes(static_cast<double>(biggest->index_bytes)),
        " of index (dynamic tables reserve --max_rows_per_table rows up "
        "front: lower it, or shard the table over more servers)");
  }
  return absl::ResourceExhaustedError(msg);
}

}  // namespace recps::server
