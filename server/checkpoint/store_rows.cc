#include "server/checkpoint/store_rows.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "kernels/embedding_optimizer.h"
#include "server/checkpoint/file_util.h"

namespace recps::server::checkpoint {
namespace {

// Exports the chunks of (table, slot) in key order on a thread of its own,
// a few chunks ahead of the caller, so the export copy overlaps the SST
// encoding. Empty chunks are skipped; an export error ends the sequence.
class ExportAhead {
 public:
  struct Item {
    int table = 0;
    uint32_t slot = 0;
    SlotChunk chunk;
    absl::Status status;
  };

  ExportAhead(const RowFileWriter::ExportChunk& export_chunk,
              const std::vector<int>& tables,
              const std::vector<uint32_t>& slots, int64_t chunk_rows,
              const RowSelection& selection, int nice)
      : export_chunk_(export_chunk),
        tables_(tables),
        slots_(slots),
        chunk_rows_(chunk_rows),
        selection_(selection) {
    thread_ = std::thread([this, nice] {
      BackgroundThisThread(nice);
      Produce();
    });
  }
  ~ExportAhead() {
    {
      absl::MutexLock lock(&mu_);
      cancel_ = true;
    }
    thread_.join();
  }

  // The next chunk, or nullptr after the last; valid until the next call.
  const Item* Next() {
    absl::MutexLock lock(&mu_);
    if (holding_) ++released_;
    mu_.Await(absl::Condition(this, &ExportAhead::ReadyOrDone));
    holding_ = produced_ > released_;
    return holding_ ? &ring_[released_ % kRing] : nullptr;
  }

 private:
  static constexpr int64_t kRing = 4;

  bool ReadyOrDone() const { return produced_ > released_ || finished_; }
  bool HasRoomOrCancel() const {
    return produced_ - released_ < kRing || cancel_;
  }

  void Produce() {
    for (int t : tables_) {
      for (uint32_t slot : slots_) {
        if (selection_.unit && !selection_.unit(t, slot)) continue;
        SlotCursor cursor;
        while (!cursor.done) {
          {
            absl::MutexLock lock(&mu_);
            mu_.Await(absl::Condition(this, &ExportAhead::HasRoomOrCancel));
            if (cancel_) return;
          }
          // ring_[produced_ % kRing] is not in [released_, produced_): ours.
          Item& item = ring_[produced_ % kRing];
          item.table = t;
          item.slot = slot;
          item.status =
              export_chunk_(t, slot, &cursor, chunk_rows_, &item.chunk);
          const bool failed = !item.status.ok();
          if (!failed && item.chunk.ids.empty()) continue;
          absl::MutexLock lock(&mu_);
          ++produced_;
          if (failed) {
            finished_ = true;
            return;
          }
        }
      }
    }
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }

  const RowFileWriter::ExportChunk& export_chunk_;
  const std::vector<int>& tables_;
  const std::vector<uint32_t>& slots_;
  const int64_t chunk_rows_;
  const RowSelection& selection_;
  Item ring_[kRing];
  absl::Mutex mu_;
  int64_t produced_ = 0;  // items filled
  int64_t released_ = 0;  // items the caller is done with
  bool holding_ = false;  // the caller holds ring_[released_ % kRing]
  bool finished_ = false;
  bool cancel_ = false;
  std::thread thread_;
};

std::vector<uint32_t> SortedUnique(absl::Span<const uint32_t> slots) {
  std::vector<uint32_t> out(slots.begin(), slots.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

std::vector<v1::CheckpointTable> StoreLayout(const StoreCatalog& store) {
  std::vector<v1::CheckpointTable> out;
  for (int t = 0; t < store.num_tables(); ++t) {
    const config::TableSpec& spec = store.spec(t);
    v1::CheckpointTable table;
    table.set_name(spec.name);
    table.set_dim(spec.dim);
    table.set_optimizer_kind(static_cast<int32_t>(spec.optimizer.kind));
    table.set_row_stride(FusedRowStride(spec.optimizer.kind, spec.dim));
    table.set_num_rows(spec.num_rows);
    out.push_back(std::move(table));
  }
  return out;
}

absl::Status CheckLayout(
    const google::protobuf::RepeatedPtrField<v1::CheckpointTable>& saved,
    const StoreCatalog& store, absl::string_view source) {
  for (const v1::CheckpointTable& want : StoreLayout(store)) {
    for (const v1::CheckpointTable& got : saved) {
      if (got.name() != want.name()) continue;
      auto mismatch = [&](absl::string_view field, auto saved_value,
                          auto store_value) {
        return absl::FailedPreconditionError(absl::StrCat(
            source, ": table '", want.name(), "' was saved with ", field, " ",
            saved_value, " but the restore target has ", field, " ",
            store_value, "; restore into a job with the same table config"));
      };
      if (got.dim() != want.dim()) return mismatch("dim", got.dim(), want.dim());
      if (got.optimizer_kind() != want.optimizer_kind()) {
        return mismatch(
            "optimizer",
            OptimizerName(
                static_cast<OptimizerKind>(got.optimizer_kind())),
            OptimizerName(
                static_cast<OptimizerKind>(want.optimizer_kind())));
      }
      if (got.row_stride() != want.row_stride()) {
        return mismatch("row_stride", got.row_stride(), want.row_stride());
      }
      if (got.num_rows() != want.num_rows()) {
        return mismatch("num_rows", got.num_rows(), want.num_rows());
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRowFileStore(const RowFileReader& reader,
                               const StoreCatalog& store) {
  const uint32_t num_slots = store.num_slots();
  if (reader.header().num_slots() != num_slots) {
    return absl::FailedPreconditionError(absl::StrCat(
        "row file ", reader.path(), " was written with num_slots ",
        reader.header().num_slots(), " but the restore target has ", num_slots,
        "; rows are keyed by slot, the slot count cannot change on restore"));
  }
  return CheckLayout(reader.header().tables(), store,
                     absl::StrCat("row file ", reader.path()));
}

absl::StatusOr<RowFileInfo> RowFileWriter::Write(
    const SlotTransfer& store, absl::Span<const uint32_t> slots,
    const std::string& path, const RowSelection& selection,
    const RowFileMeta& meta) const {
  const ExportChunk live = [&store](int t, uint32_t slot, SlotCursor* cursor,
                                    int64_t max_rows, SlotChunk* out) {
    return store.ExportSlot(t, slot, cursor, max_rows, out);
  };
  return WriteFrom(store, live, slots, path, selection, meta);
}

absl::StatusOr<RowFileInfo> RowFileWriter::WriteSnapshot(
    const SnapshotSource& store, uint64_t since_generation,
    absl::Span<const uint32_t> slots, const std::string& path,
    const RowSelection& selection, const RowFileMeta& meta) const {
  const ExportChunk at_cut = [&store, since_generation](
                                 int t, uint32_t slot, SlotCursor* cursor,
                                 int64_t max_rows, SlotChunk* out) {
    return store.ExportSnapshotSlot(t, slot, since_generation, cursor,
                                    max_rows, out);
  };
  return WriteFrom(store, at_cut, slots, path, selection, meta);
}

absl::StatusOr<RowFileInfo> RowFileWriter::WriteFrom(
    const StoreCatalog& store, const ExportChunk& export_chunk,
    absl::Span<const uint32_t> slots, const std::string& path,
    const RowSelection& selection, const RowFileMeta& meta) const {
  // The encoding runs on a thread of its own so that only it is marked as
  // background (a thread cannot raise its priority back without
  // privileges).
  absl::StatusOr<RowFileInfo> result;
  std::thread encoder([&] {
    BackgroundThisThread(options_.thread_nice);
    result = WriteHere(store, export_chunk, slots, path, selection, meta);
  });
  encoder.join();
  return result;
}

absl::StatusOr<RowFileInfo> RowFileWriter::WriteHere(
    const StoreCatalog& store, const ExportChunk& export_chunk,
    absl::Span<const uint32_t> slots, const std::string& path,
    const RowSelection& selection, const RowFileMeta& meta) const {
  const uint32_t num_slots = store.num_slots();
  const std::vector<uint32_t> sorted = SortedUnique(slots);
  if (!sorted.empty() && sorted.back() >= num_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("row file ", path, ": slot ", sorted.back(),
                     " is outside the store's ", num_slots, " slots"));
  }
  // Keys go in sorted order: tables by name, then slot, then id.
  std::vector<int> tables = selection.tables;
  if (tables.empty()) {
    for (int t = 0; t < store.num_tables(); ++t) tables.push_back(t);
  }
  std::sort(tables.begin(), tables.end(), [&](int a, int b) {
    return store.spec(a).name < store.spec(b).name;
  });

  v1::RowFileHeader header;
  header.set_format_version(kRowFileFormatVersion);
  header.set_num_slots(num_slots);
  const std::vector<v1::CheckpointTable> layout = StoreLayout(store);
  for (int t : tables) *header.add_tables() = layout[t];
  header.set_job_config_digest(meta.job_config_digest);
  header.set_step(meta.step);
  header.set_kind(meta.kind);
  header.set_base_step(meta.base_step);

  ASSIGN_OR_RETURN(std::unique_ptr<RowFileBuilder> builder,
                   RowFileBuilder::Create(path, header, options_));
  {
    ExportAhead ahead(export_chunk, tables, sorted, options_.chunk_rows,
                      selection, options_.thread_nice);
    while (const ExportAhead::Item* item = ahead.Next()) {
      const std::string& name = store.spec(item->table).name;
      if (!item->status.ok()) {
        return absl::Status(
            item->status.code(),
            absl::StrCat("row file ", path, ": exporting table '", name,
                         "' slot ", item->slot, ": ", item->status.message()));
      }
      RETURN_IF_ERROR(builder->Add(name, item->slot, item->chunk.ids,
                                   item->chunk.rows.data(),
                                   item->chunk.row_stride));
    }
  }
  return builder->Finish();
}

absl::StatusOr<int64_t> ImportRowFile(
    const RowFileReader& reader, SlotTransfer& store,
    absl::Span<const std::vector<uint32_t>> slots_by_table,
    const ImportOptions& options) {
  if (options.batch_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch_rows is ", options.batch_rows, "; it must be at least 1"));
  }
  std::atomic<int64_t> imported{0};
  for (const v1::CheckpointTable& saved : reader.header().tables()) {
    const absl::StatusOr<int> table = store.FindTable(saved.name());
    if (!table.ok()) continue;  // another server's table
    if (*table >= static_cast<int>(slots_by_table.size())) continue;
    const std::vector<uint32_t> sorted = SortedUnique(slots_by_table[*table]);
    auto import_slots = [&](absl::Span<const uint32_t> part) {
      return reader.ReadSlots(
          saved, part, options.batch_rows,
          [&](uint32_t slot, absl::Span<const int64_t> ids,
              const float* rows) -> absl::Status {
            absl::Status s = store.ImportRows(*table, slot, ids, rows);
            if (!s.ok()) {
              return absl::Status(s.code(),
                                  absl::StrCat("importing row file ",
                                               reader.path(), ": ", s.message()));
            }
            imported.fetch_add(static_cast<int64_t>(ids.size()),
                               std::memory_order_relaxed);
            return absl::OkStatus();
          });
    };
    if (options.pool == nullptr || sorted.size() < 2) {
      RETURN_IF_ERROR(import_slots(sorted));
      continue;
    }
    // Slots are independent (each has its own lock in the store): one
    // contiguous run of them per pool thread, each with its own iterator,
    // so every thread reads its part of the file sequentially (many small
    // runs re-read the blocks at their edges and restart readahead).
    absl::Mutex mu;
    absl::Status first_error;
    const int64_t n = static_cast<int64_t>(sorted.size());
    const int64_t threads = std::max(1, options.pool->num_threads());
    options.pool->ParallelFor(
        n, /*grain=*/(n + threads - 1) / threads,
        [&](int64_t begin, int64_t end) {
          absl::Status s = import_slots(
              absl::MakeConstSpan(sorted).subspan(begin, end - begin));
          if (s.ok()) return;
          absl::MutexLock lock(&mu);
          if (first_error.ok()) first_error = std::move(s);
        });
    RETURN_IF_ERROR(first_error);
  }
  return imported.load();
}

absl::StatusOr<int64_t> ImportRowFilesVerified(
    absl::Span<const RowFileReader* const> readers, SlotTransfer& store,
    absl::Span<const std::vector<uint32_t>> slots_by_table,
    const ImportOptions& options) {
  // The check runs beside the import, one file after the other, reading
  // ahead of it: the import then finds the file in the page cache.
  absl::Status verified;
  std::thread verifier([&] {
    for (const RowFileReader* reader : readers) {
      verified = reader->VerifyWhole();
      if (!verified.ok()) return;
    }
  });
  absl::Status imported;
  int64_t rows = 0;
  for (const RowFileReader* reader : readers) {
    absl::StatusOr<int64_t> n = ImportRowFile(*reader, store, slots_by_table, options);
    if (!n.ok()) {
      imported = n.status();
      break;
    }
    rows += *n;
  }
  verifier.join();
  const absl::Status failed = !verified.ok() ? verified : imported;
  if (failed.ok()) return rows;
  // Undone: the restored slots held no row before.
  for (size_t t = 0; t < slots_by_table.size(); ++t) {
    for (uint32_t slot : slots_by_table[t]) {
      if (slot < store.num_slots()) (void)store.DropSlot(static_cast<int>(t), slot);
    }
  }
  return failed;
}

absl::StatusOr<int64_t> ImportRowFile(const RowFileReader& reader,
                                      SlotTransfer& store,
                                      absl::Span<const uint32_t> slots,
                                      const ImportOptions& options) {
  const std::vector<uint32_t> all(slots.begin(), slots.end());
  std::vector<std::vector<uint32_t>> by_table(store.num_tables(), all);
  return ImportRowFile(reader, store, by_table, options);
}

}  // namespace recps::server::checkpoint
