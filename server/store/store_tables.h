// What the host store (host_embedding_store.cc) and the device store
// (device_store/device_store.cc) share, so that both answer the same
// requests with the same codes and messages: the table spec checks, the
// table registry (index and name lookup), the checks of request arguments,
// and the bookkeeping of snapshot cuts and generation marks.
#ifndef RECPS_SERVER_STORE_STORE_TABLES_H_
#define RECPS_SERVER_STORE_STORE_TABLES_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/config/table_spec.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "server/store/embedding_store.h"

namespace recps::server {

// ---- Creating a store ----

// INVALID_ARGUMENT naming the field when spec `index` cannot be stored:
// name (1 to 64 characters of [A-Za-z0-9_.-]), dim (1..4096), num_rows,
// optimizer parameters, precision, init.
absl::Status ValidateTableSpec(const config::TableSpec& spec, int index);

// The checks of a store's creation: `options` (num_slots, max_rows_per_table),
// then per table ValidateTableSpec and a unique name.
absl::Status ValidateStoreTables(const std::vector<config::TableSpec>& tables,
                                 const StoreOptions& options);

// Rows a table may hold: num_rows, or max_rows_per_table for a dynamic one.
inline int64_t TableCapacity(const config::TableSpec& spec,
                             const StoreOptions& options) {
  return spec.num_rows > 0 ? spec.num_rows : options.max_rows_per_table;
}

// ---- Request checks ----

// The first repeated id of `ids`, as the positions of its first two
// occurrences. Open addressing over positions (ids compared in place):
// ~3x faster than a hash map of ids for a push's tens of thousands.
std::optional<std::pair<size_t, size_t>> FindRepeatedId(
    absl::Span<const int64_t> ids);
// INVALID_ARGUMENT naming the first id that `ids` holds twice; `what` is
// the request ("one gradient push", "one import").
absl::Status CheckNoRepeatedId(const std::string& table,
                               absl::Span<const int64_t> ids,
                               absl::string_view what);
// INVALID_ARGUMENT naming the first non-finite value of `grads` (ids.size()
// rows of `dim`) at a row >= `from`.
absl::Status CheckFiniteGradients(const std::string& table,
                                  absl::Span<const int64_t> ids,
                                  const float* grads, int dim, int64_t from = 0);
// The whole check of a gradient push (ValidateGradients of every store),
// each with its message: ids inside a fixed table, gradients given, every
// value finite, ids distinct. The finite test passes over every gradient
// byte, so large pushes split it over `pool` (may be null); the error names
// the lowest bad position whatever the split.
absl::Status CheckGradientPush(const config::TableSpec& spec,
                               absl::Span<const int64_t> ids,
                               const float* grads, ThreadPool* pool);
// The checks of ImportRows before anything changes (INVALID_ARGUMENT naming
// the table, the id, its position and what is wrong): ids inside a fixed
// table, each in `slot` (slot_of(id)), rows given and valid
// (ValidateImportedRow: finite, second moments >= 0), ids distinct.
absl::Status CheckImport(const config::TableSpec& spec, uint32_t slot,
                         absl::Span<const int64_t> ids, const float* rows,
                         int64_t stride,
                         absl::FunctionRef<uint32_t(int64_t)> slot_of);
// RESOURCE_EXHAUSTED: `fresh` new rows of an import into `slot` do not fit
// in the `free` rows left of a table of `capacity`.
absl::Status ImportFullError(const config::TableSpec& spec, int64_t capacity,
                             int64_t fresh, int64_t free, uint32_t slot);
// INVALID_ARGUMENT unless slot < num_slots.
absl::Status CheckSlot(uint32_t slot, uint32_t num_slots);
// The argument checks of a slot export (`what`: the method's name).
absl::Status CheckExportArgs(absl::string_view what, const SlotCursor* cursor,
                             const SlotChunk* out, int64_t max_rows);
// NOT_FOUND: the table has no row for `id` (ReadRows).
absl::Status NoRowError(const std::string& table, int64_t id);
// INVALID_ARGUMENT when `ids` is not empty and `data` is null; `what`
// names the data ("gradients", "rows").
absl::Status CheckDataGiven(const std::string& table,
                            absl::Span<const int64_t> ids, const void* data,
                            absl::string_view what);

// A chunk of a slot export: keeps the `max_rows` smallest ids of `found`
// ((id, where the row is) pairs), sorted. Returns whether nothing was left
// out (the export is done).
inline bool KeepSmallestIds(std::vector<std::pair<int64_t, int64_t>>& found,
                            int64_t max_rows) {
  bool done = true;
  if (static_cast<int64_t>(found.size()) > max_rows) {
    done = false;
    std::nth_element(found.begin(), found.begin() + max_rows, found.end());
    found.resize(max_rows);
  }
  std::sort(found.begin(), found.end());
  return done;
}
// After a chunk: the cursor moves past every id looked at, kept or not.
inline void AdvanceCursor(
    const std::vector<std::pair<int64_t, int64_t>>& found, bool done,
    SlotCursor* cursor) {
  if (!found.empty()) {
    cursor->started = true;
    cursor->last_id = found.back().first;
  }
  cursor->done = done;
}

// ---- The table registry ----

// NOT_FOUND errors of a registry lookup, the same in both stores.
absl::Status NoTableIndexError(int table, size_t num_tables);
absl::Status UnknownTableError(absl::string_view name,
                               const std::vector<absl::string_view>& names);

// A store's tables by index and name. T has a `config::TableSpec spec`.
// Immutable after construction, so thread-safe.
template <typename T>
class TableRegistry {
 public:
  explicit TableRegistry(std::vector<std::unique_ptr<T>> tables)
      : tables_(std::move(tables)) {
    for (size_t i = 0; i < tables_.size(); ++i) {
      by_name_.emplace(tables_[i]->spec.name, static_cast<int>(i));
    }
  }

  int size() const { return static_cast<int>(tables_.size()); }
  bool Valid(int table) const { return table >= 0 && table < size(); }
  // NOT_FOUND for an index outside [0, size()).
  absl::StatusOr<T*> Get(int table) const {
    if (!Valid(table)) return NoTableIndexError(table, tables_.size());
    return tables_[table].get();
  }
  // An empty spec for an index outside [0, size()).
  const config::TableSpec& spec(int table) const {
    static const config::TableSpec* const kNone = new config::TableSpec();
    return Valid(table) ? tables_[table]->spec : *kNone;
  }
  // NOT_FOUND listing the tables when none is called `name`.
  absl::StatusOr<int> Find(absl::string_view name) const {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) return it->second;
    std::vector<absl::string_view> names;
    for (const auto& t : tables_) names.push_back(t->spec.name);
    return UnknownTableError(name, names);
  }
  T& operator[](int table) const { return *tables_[table]; }
  auto begin() const { return tables_.begin(); }
  auto end() const { return tables_.end(); }

 private:
  const std::vector<std::unique_ptr<T>> tables_;
  absl::flat_hash_map<std::string, int> by_name_;
};

// ---- Snapshot cuts and generation marks ----

// The store-wide part of BeginSnapshot / EndSnapshot / MarkGeneration: at
// most one open snapshot, cuts and marks strictly increasing. Each call
// checks, runs `apply` (the per-table change) and records the result under
// one lock, so the calls are serialised. Thread-safe.
class SnapshotCuts {
 public:
  // FAILED_PRECONDITION while a snapshot is open, INVALID_ARGUMENT unless
  // cut > 0 and above the last cut or mark; else apply() and opens `cut`.
  absl::Status Begin(uint64_t cut, absl::FunctionRef<void()> apply);
  // INVALID_ARGUMENT unless mark > 0 and above the last cut or mark; else
  // apply() and records `mark`.
  absl::Status Mark(uint64_t mark, absl::FunctionRef<void()> apply);
  // apply() and closes the open snapshot; nothing when none is open.
  void End(absl::FunctionRef<void()> apply);

 private:
  absl::Mutex mu_;
  uint64_t open_cut_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_cut_ ABSL_GUARDED_BY(mu_) = 0;
};

// ---- The base of both stores ----

// The EmbeddingStore methods that the registry answers alone, and what
// both stores keep: their tables (T as for TableRegistry) and snapshot cuts.
template <typename T>
class TableStoreBase : public EmbeddingStore {
 public:
  int num_tables() const override { return tables_.size(); }
  const config::TableSpec& spec(int table) const override {
    return tables_.spec(table);
  }
  absl::StatusOr<int> FindTable(absl::string_view name) const override {
    return tables_.Find(name);
  }
  uint32_t num_slots() const override { return num_slots_; }
  absl::Status ValidateGradients(int table, absl::Span<const int64_t> ids,
                                 const float* grads) const override {
    ASSIGN_OR_RETURN(const T* t, Get(table));
    return CheckGradientPush(t->spec, ids, grads, pool_);
  }

 protected:
  // `pool` (may be null) splits the checks of large pushes.
  TableStoreBase(std::vector<std::unique_ptr<T>> tables, uint32_t num_slots,
                 ThreadPool* pool)
      : tables_(std::move(tables)), num_slots_(num_slots), pool_(pool) {}
  absl::StatusOr<T*> Get(int table) const { return tables_.Get(table); }

  const TableRegistry<T> tables_;
  const uint32_t num_slots_;
  ThreadPool* const pool_;
  SnapshotCuts cuts_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_STORE_STORE_TABLES_H_
