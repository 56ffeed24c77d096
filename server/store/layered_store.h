// A store whose set of tables can grow while it serves: the tables the shard
// server starts with (a base store) plus stores added later, for tables the
// server gains from a shard map (the column groups of a column-wise table,
// common/wire/shard_map.h). Table indices of the base store are kept; added
// tables follow. Tables are never removed.
//
// Thread-safety: every method may be called concurrently, Add included.
// Index-based calls take no lock; FindTable of an added table takes a
// reader lock.
#ifndef RECPS_SERVER_STORE_LAYERED_STORE_H_
#define RECPS_SERVER_STORE_LAYERED_STORE_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/store/embedding_store.h"

namespace recps::server {

class LayeredStore final : public EmbeddingStore {
 public:
  // Most tables over all layers.
  static constexpr int kMaxTables = 1 << 14;

  explicit LayeredStore(std::unique_ptr<EmbeddingStore> base);

  // Adds the tables of `store` after the present ones. INVALID_ARGUMENT
  // (nothing added) when one of its names is taken or there would be more
  // than kMaxTables tables.
  absl::Status Add(std::unique_ptr<EmbeddingStore> store);
  // Tables of the base store: indices [0, num_base_tables()).
  int num_base_tables() const { return num_base_; }

  int num_tables() const override;
  const config::TableSpec& spec(int table) const override;
  absl::StatusOr<int> FindTable(absl::string_view name) const override;
  uint32_t num_slots() const override { return base_->num_slots(); }
  absl::Status Lookup(int table, absl::Span<const int64_t> ids,
                      float* out) override;
  absl::Status ValidateGradients(int table, absl::Span<const int64_t> ids,
                                 const float* grads) const override;
  absl::Status ApplyGradients(int table, absl::Span<const int64_t> ids,
                              const float* grads) override;
  absl::Status ReadRows(int table, absl::Span<const int64_t> ids,
                        float* out) const override;
  TableInfo Info(int table) const override;
  std::vector<int64_t> RowsPerSlot() const override;
  std::vector<int64_t> BytesPerSlot() const override;
  // The three below go to the store that holds the table; DropSlot of
  // kAllTables goes to every store.
  absl::Status ExportSlot(int table, uint32_t slot, SlotCursor* cursor,
                          int64_t max_rows, SlotChunk* out) const override;
  absl::Status ImportRows(int table, uint32_t slot,
                          absl::Span<const int64_t> ids,
                          const float* rows) override;
  absl::StatusOr<int64_t> DropSlot(int table, uint32_t slot) override;
  void CommitFixedRows(int table, int64_t rows) override;
  // Snapshots span every layer with the same cut; a store added later
  // starts at the last cut's generation.
  absl::Status BeginSnapshot(uint64_t cut) override;
  absl::Status ExportSnapshotSlot(int table, uint32_t slot, uint64_t since,
                                  SlotCursor* cursor, int64_t max_rows,
                                  SlotChunk* out) const override;
  void EndSnapshot() override;
  int64_t SnapshotBytes() const override;
  // Every layer takes the mark; a store added later starts above it.
  absl::Status MarkGeneration(uint64_t mark) override;
  absl::Status ExportChangedSlot(int table, uint32_t slot, uint64_t since,
                                 SlotCursor* cursor, int64_t max_rows,
                                 SlotChunk* out) const override;

 private:
  std::vector<EmbeddingStore*> Stores() const;
  struct Entry {
    EmbeddingStore* store = nullptr;
    int local = 0;  // the table's index in `store`
  };
  // The entry of `table`, or null when there is none.
  const Entry* Get(int table) const;
  absl::Status NoTable(int table) const;

  const std::unique_ptr<EmbeddingStore> base_;
  const int num_base_;
  const int capacity_;  // kMaxTables, or more if the base has more
  // Names of the base tables (fixed): found without a lock or an error.
  absl::flat_hash_map<std::string, int> base_names_;
  // capacity_ entries, written once before num_tables_ publishes them
  // (release), so readers need no lock.
  const std::unique_ptr<Entry[]> entries_;
  std::atomic<int> num_tables_;

  mutable absl::Mutex mu_;  // serialises Add; guards the name index
  std::vector<std::unique_ptr<EmbeddingStore>> added_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> added_names_ ABSL_GUARDED_BY(mu_);
  uint64_t last_cut_ ABSL_GUARDED_BY(mu_) = 0;
  // The last MarkGeneration's mark when it is above last_cut_ (else 0).
  uint64_t last_mark_ ABSL_GUARDED_BY(mu_) = 0;
  bool snapshot_open_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_STORE_LAYERED_STORE_H_
