#include "server/store/layered_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace recps::server {

LayeredStore::LayeredStore(std::unique_ptr<EmbeddingStore> base)
    : base_(std::move(base)),
      num_base_(base_->num_tables()),
      capacity_(std::max(kMaxTables, num_base_)),
      entries_(new Entry[capacity_]),
      num_tables_(num_base_) {
  for (int t = 0; t < num_base_; ++t) {
    entries_[t] = Entry{base_.get(), t};
    base_names_.emplace(base_->spec(t).name, t);
  }
}

absl::Status LayeredStore::Add(std::unique_ptr<EmbeddingStore> store) {
  if (store == nullptr) return absl::InvalidArgumentError("Add: store is null");
  absl::MutexLock lock(&mu_);
  const int first = num_tables_.load(std::memory_order_relaxed);
  const int n = store->num_tables();
  if (first + n > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adding ", n, " table(s) to ", first, " would pass the limit of ",
        capacity_));
  }
  for (int t = 0; t < n; ++t) {
    const std::string& name = store->spec(t).name;
    if (added_names_.contains(name) || base_names_.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", name, "' already exists on this server"));
    }
  }
  // A store added after snapshots continues their generations: its rows
  // are all newer than the last cut (and absent from an open snapshot).
  if (last_cut_ > 0) {
    RETURN_IF_ERROR(store->BeginSnapshot(last_cut_));
    if (!snapshot_open_) store->EndSnapshot();
  }
  if (last_mark_ > last_cut_) RETURN_IF_ERROR(store->MarkGeneration(last_mark_));
  for (int t = 0; t < n; ++t) {
    entries_[first + t] = Entry{store.get(), t};
    added_names_.emplace(store->spec(t).name, first + t);
  }
  added_.push_back(std::move(store));
  num_tables_.store(first + n, std::memory_order_release);
  return absl::OkStatus();
}

const LayeredStore::Entry* LayeredStore::Get(int table) const {
  if (table < 0 || table >= num_tables_.load(std::memory_order_acquire)) {
    return nullptr;
  }
  return &entries_[table];
}

absl::Status LayeredStore::NoTable(int table) const {
  return absl::NotFoundError(absl::StrCat("no table with index ", table,
                                          " (the store has ", num_tables(),
                                          " tables)"));
}

int LayeredStore::num_tables() const {
  return num_tables_.load(std::memory_order_acquire);
}

const config::TableSpec& LayeredStore::spec(int table) const {
  const Entry* e = Get(table);
  return e == nullptr ? base_->spec(-1) : e->store->spec(e->local);
}

absl::StatusOr<int> LayeredStore::FindTable(absl::string_view name) const {
  if (auto it = base_names_.find(name); it != base_names_.end()) {
    return it->second;
  }
  if (num_tables() == num_base_) return base_->FindTable(name);  // its error
  absl::ReaderMutexLock lock(&mu_);
  if (auto it = added_names_.find(name); it != added_names_.end()) {
    return it->second;
  }
  std::vector<absl::string_view> names;
  for (int t = 0; t < num_tables(); ++t) names.push_back(spec(t).name);
  return absl::NotFoundError(absl::StrCat("unknown table '", name,
                                          "'; this store has ",
                                          absl::StrJoin(names, ", ")));
}

absl::Status LayeredStore::Lookup(int table, absl::Span<const int64_t> ids,
                                  float* out) {
  const Entry* e = Get(table);
  return e == nullptr ? NoTable(table) : e->store->Lookup(e->local, ids, out);
}

absl::Status LayeredStore::ValidateGradients(int table,
                                             absl::Span<const int64_t> ids,
                                             const float* grads) const {
  const Entry* e = Get(table);
  return e == nullptr ? NoTable(table)
                      : e->store->ValidateGradients(e->local, ids, grads);
}

absl::Status LayeredStore::ApplyGradients(int table,
                                          absl::Span<const int64_t> ids,
                                          const float* grads) {
  const Entry* e = Get(table);
  return e == nullptr ? NoTable(table)
                      : e->store->ApplyGradients(e->local, ids, grads);
}

absl::Status LayeredStore::ReadRows(int table, absl::Span<const int64_t> ids,
                                    float* out) const {
  const Entry* e = Get(table);
  return e == nullptr ? NoTable(table) : e->store->ReadRows(e->local, ids, out);
}

TableInfo LayeredStore::Info(int table) const {
  const Entry* e = Get(table);
  return e == nullptr ? TableInfo() : e->store->Info(e->local);
}

std::vector<int64_t> LayeredStore::RowsPerSlot() const {
  std::vector<int64_t> out = base_->RowsPerSlot();
  absl::ReaderMutexLock lock(&mu_);
  for (const std::unique_ptr<EmbeddingStore>& s : added_) {
    const std::vector<int64_t> more = s->RowsPerSlot();
    if (more.size() > out.size()) out.resize(more.size(), 0);
    for (size_t i = 0; i < more.size(); ++i) out[i] += more[i];
  }
  return out;
}

std::vector<int64_t> LayeredStore::BytesPerSlot() const {
  std::vector<int64_t> out = base_->BytesPerSlot();
  absl::ReaderMutexLock lock(&mu_);
  for (const std::unique_ptr<EmbeddingStore>& s : added_) {
    const std::vector<int64_t> more = s->BytesPerSlot();
    if (more.size() > out.size()) out.resize(more.size(), 0);
    for (size_t i = 0; i < more.size(); ++i) out[i] += more[i];
  }
  return out;
}

absl::Status LayeredStore::ExportSlot(int table, uint32_t slot,
                                      SlotCursor* cursor, int64_t max_rows,
                                      SlotChunk* out) const {
  const Entry* e = Get(table);
  return e == nullptr
             ? NoTable(table)
             : e->store->ExportSlot(e->local, slot, cursor, max_rows, out);
}

absl::Status LayeredStore::ImportRows(int table, uint32_t slot,
                                      absl::Span<const int64_t> ids,
                                      const float* rows) {
  const Entry* e = Get(table);
  return e == nullptr ? NoTable(table)
                      : e->store->ImportRows(e->local, slot, ids, rows);
}

void LayeredStore::CommitFixedRows(int table, int64_t rows) {
  if (const Entry* e = Get(table)) e->store->CommitFixedRows(e->local, rows);
}

absl::StatusOr<int64_t> LayeredStore::DropSlot(int table, uint32_t slot) {
  if (table != kAllTables) {
    const Entry* e = Get(table);
    if (e == nullptr) return NoTable(table);
    return e->store->DropSlot(e->local, slot);
  }
  // Stores are never removed: their pointers stay valid without mu_, which
  // is not held across the (long) drops.
  std::vector<EmbeddingStore*> stores = {base_.get()};
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const std::unique_ptr<EmbeddingStore>& s : added_) {
      stores.push_back(s.get());
    }
  }
  int64_t dropped = 0;
  for (EmbeddingStore* s : stores) {
    absl::StatusOr<int64_t> n = s->DropSlot(kAllTables, slot);
    if (!n.ok()) return n.status();
    dropped += *n;
  }
  return dropped;
}

std::vector<EmbeddingStore*> LayeredStore::Stores() const {
  std::vector<EmbeddingStore*> stores = {base_.get()};
  absl::ReaderMutexLock lock(&mu_);
  for (const std::unique_ptr<EmbeddingStore>& s : added_) {
    stores.push_back(s.get());
  }
  return stores;
}

absl::Status LayeredStore::BeginSnapshot(uint64_t cut) {
  // mu_ keeps Add out: every store takes the same cut.
  absl::MutexLock lock(&mu_);
  std::vector<EmbeddingStore*> stores = {base_.get()};
  for (const auto& s : added_) stores.push_back(s.get());
  for (size_t i = 0; i < stores.size(); ++i) {
    absl::Status st = stores[i]->BeginSnapshot(cut);
    if (!st.ok()) {
      for (size_t j = 0; j < i; ++j) stores[j]->EndSnapshot();
      return st;
    }
  }
  last_cut_ = cut;
  last_mark_ = 0;
  snapshot_open_ = true;
  return absl::OkStatus();
}

absl::Status LayeredStore::ExportSnapshotSlot(int table, uint32_t slot,
                                              uint64_t since,
                                              SlotCursor* cursor,
                                              int64_t max_rows,
                                              SlotChunk* out) const {
  const Entry* e = Get(table);
  if (e == nullptr) return NoTable(table);
  return e->store->ExportSnapshotSlot(e->local, slot, since, cursor, max_rows,
                                      out);
}

void LayeredStore::EndSnapshot() {
  absl::MutexLock lock(&mu_);
  base_->EndSnapshot();
  for (const auto& s : added_) s->EndSnapshot();
  snapshot_open_ = false;
}

int64_t LayeredStore::SnapshotBytes() const {
  int64_t bytes = 0;
  for (EmbeddingStore* s : Stores()) bytes += s->SnapshotBytes();
  return bytes;
}

absl::Status LayeredStore::MarkGeneration(uint64_t mark) {
  absl::MutexLock lock(&mu_);  // keeps Add out: every store takes the mark
  RETURN_IF_ERROR(base_->MarkGeneration(mark));
  for (const auto& s : added_) RETURN_IF_ERROR(s->MarkGeneration(mark));
  last_mark_ = mark;
  return absl::OkStatus();
}

absl::Status LayeredStore::ExportChangedSlot(int table, uint32_t slot,
                                             uint64_t since,
                                             SlotCursor* cursor,
                                             int64_t max_rows,
                                             SlotChunk* out) const {
  const Entry* e = Get(table);
  if (e == nullptr) return NoTable(table);
  return e->store->ExportChangedSlot(e->local, slot, since, cursor, max_rows,
                                     out);
}

}  // namespace recps::server
