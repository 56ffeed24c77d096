#include "server/checkpoint/row_file.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "kernels/embedding_optimizer.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_reader.h"
#include "rocksdb/sst_file_writer.h"
#include "rocksdb/table.h"
#include "server/checkpoint/crc32c.h"
#include "server/checkpoint/file_util.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "row files store floats little-endian; add byte swaps here");

namespace recps::server::checkpoint {
namespace {

const rocksdb::Slice kHeaderKey("\0recps.row_file", 15);

void PutBigEndian(uint64_t v, int bytes, std::string* out) {
  for (int i = bytes - 1; i >= 0; --i) {
    out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

uint64_t GetBigEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// The key prefix of one (table, slot): every key of its rows starts with it.
void EncodeSlotPrefix(absl::string_view table, uint32_t slot,
                      std::string* out) {
  out->clear();
  out->append(table.data(), table.size());
  out->push_back('\0');
  PutBigEndian(slot, 4, out);
}

rocksdb::Options SstOptions(size_t block_size) {
  rocksdb::Options options;
  // Float rows barely compress; compression would cost more than it saves.
  options.compression = rocksdb::kNoCompression;
  rocksdb::BlockBasedTableOptions table;
  table.block_size = block_size;
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return options;
}

// CRC-32C of a file as RocksDB appends to it, so the writer needs no second
// pass over the file. Any write other than a plain Append invalidates it
// (the writer then reads the file back).
#define RETURN_IO_IF_ERROR(expr)          \
  do {                                    \
    rocksdb::IOStatus recps_io_ = (expr); \
    if (!recps_io_.ok()) return recps_io_; \
  } while (0)

struct RunningCrc {
  uint32_t crc = 0;
  uint64_t bytes = 0;
  bool valid = true;
};

// A file RocksDB appends to, written by a thread of its own: Append only
// copies into a buffer (and extends the CRC), so encoding the next rows
// overlaps the kernel's copy into the page cache and the write-back. The
// thread starts write-back (sync_file_range) after every buffer; Sync,
// Fsync, Close and every other call first wait for the buffers to be
// written, so the target file is only ever used by one thread at a time.
class AsyncCrcWritableFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  AsyncCrcWritableFile(std::unique_ptr<rocksdb::FSWritableFile>&& file,
                       RunningCrc* crc, size_t buffer_bytes)
      : FSWritableFileOwnerWrapper(std::move(file)),
        crc_(crc),
        buffer_bytes_(buffer_bytes) {
    fill_.reserve(buffer_bytes_);
    pending_.reserve(buffer_bytes_);
    thread_ = std::thread([this] { Run(); });
  }
  ~AsyncCrcWritableFile() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  rocksdb::IOStatus Append(const rocksdb::Slice& data,
                           const rocksdb::IOOptions&,
                           rocksdb::IODebugContext*) override {
    return Add(data);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data,
                           const rocksdb::IOOptions&,
                           const rocksdb::DataVerificationInfo&,
                           rocksdb::IODebugContext*) override {
    return Add(data);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data,
                                     uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     rocksdb::IODebugContext* dbg) override {
    crc_->valid = false;
    RETURN_IO_IF_ERROR(Drain());
    return target()->PositionedAppend(data, offset, options, dbg);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data,
                                     uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     const rocksdb::DataVerificationInfo& info,
                                     rocksdb::IODebugContext* dbg) override {
    crc_->valid = false;
    RETURN_IO_IF_ERROR(Drain());
    return target()->PositionedAppend(data, offset, options, info, dbg);
  }
  rocksdb::IOStatus Truncate(uint64_t size, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
    if (size != crc_->bytes) crc_->valid = false;
    RETURN_IO_IF_ERROR(Drain());
    return target()->Truncate(size, options, dbg);
  }
  // RocksDB flushes after each of its own buffers; ours is written by the
  // thread, so there is nothing to do but report an earlier failure.
  rocksdb::IOStatus Flush(const rocksdb::IOOptions&,
                          rocksdb::IODebugContext*) override {
    absl::MutexLock lock(&mu_);
    return error_;
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& options,
                         rocksdb::IODebugContext* dbg) override {
    RETURN_IO_IF_ERROR(Drain());
    return target()->Sync(options, dbg);
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    RETURN_IO_IF_ERROR(Drain());
    return target()->Fsync(options, dbg);
  }
  rocksdb::IOStatus Close(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = Drain();
    rocksdb::IOStatus c = target()->Close(options, dbg);
    return s.ok() ? c : s;
  }
  uint64_t GetFileSize(const rocksdb::IOOptions& options,
                       rocksdb::IODebugContext* dbg) override {
    Drain().PermitUncheckedError();
    return target()->GetFileSize(options, dbg);
  }
  rocksdb::IOStatus InvalidateCache(size_t offset, size_t length) override {
    RETURN_IO_IF_ERROR(Drain());
    return target()->InvalidateCache(offset, length);
  }
  // The thread starts write-back itself; preallocation is only a hint.
  rocksdb::IOStatus RangeSync(uint64_t, uint64_t, const rocksdb::IOOptions&,
                              rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::OK();
  }
  void PrepareWrite(size_t, size_t, const rocksdb::IOOptions&,
                    rocksdb::IODebugContext*) override {}
  bool IsSyncThreadSafe() const override { return false; }

 private:
  rocksdb::IOStatus Add(const rocksdb::Slice& data) {
    crc_->crc = Crc32cExtend(crc_->crc, data.data(), data.size());
    crc_->bytes += data.size();
    fill_.append(data.data(), data.size());
    if (fill_.size() >= buffer_bytes_) return Submit();
    absl::MutexLock lock(&mu_);
    return error_;
  }
  // Hands fill_ to the thread once it is done with the previous buffer.
  rocksdb::IOStatus Submit() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](bool* busy) { return !*busy; }, &busy_));
    if (!error_.ok()) return error_;
    std::swap(fill_, pending_);
    fill_.clear();
    busy_ = true;
    return rocksdb::IOStatus::OK();
  }
  // Everything appended so far is written to the target.
  rocksdb::IOStatus Drain() {
    if (!fill_.empty()) {
      rocksdb::IOStatus s = Submit();
      if (!s.ok()) return s;
    }
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](bool* busy) { return !*busy; }, &busy_));
    return error_;
  }
  void Run() {
    uint64_t written = 0;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &AsyncCrcWritableFile::HasWork));
        if (!busy_) return;  // stop_ and nothing left
      }
      rocksdb::IOOptions options;
      rocksdb::IOStatus s = target()->Append(pending_, options, nullptr);
      if (s.ok()) {
        // Start write-back of this buffer; a failure here only loses speed.
        target()->RangeSync(written, pending_.size(), options, nullptr)
            .PermitUncheckedError();
        written += pending_.size();
      }
      absl::MutexLock lock(&mu_);
      if (!s.ok() && error_.ok()) error_ = s;
      busy_ = false;
    }
  }
  bool HasWork() const { return busy_ || stop_; }

  RunningCrc* const crc_;
  const size_t buffer_bytes_;
  std::string fill_;     // being appended to (the caller's thread)
  std::string pending_;  // being written (the thread), while busy_
  absl::Mutex mu_;
  bool busy_ = false;
  bool stop_ = false;
  rocksdb::IOStatus error_;  // the first write failure
  std::thread thread_;
};

// The default file system, with the CRC of the (one) file being written.
class CrcFileSystem : public rocksdb::FileSystemWrapper {
 public:
  CrcFileSystem(RunningCrc* crc, size_t buffer_bytes)
      : FileSystemWrapper(rocksdb::FileSystem::Default()),
        crc_(crc),
        buffer_bytes_(buffer_bytes) {}
  const char* Name() const override { return "RecpsCrcFileSystem"; }
  rocksdb::IOStatus NewWritableFile(const std::string& name,
                                    const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* out,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewWritableFile(name, options, out, dbg);
    if (s.ok()) {
      *out = std::make_unique<AsyncCrcWritableFile>(std::move(*out), crc_,
                                                    buffer_bytes_);
    }
    return s;
  }

 private:
  RunningCrc* crc_;
  size_t buffer_bytes_;
};

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

  ExportAhead(const EmbeddingStore& store, const std::vector<int>& tables,
              const std::vector<uint32_t>& slots, int64_t chunk_rows)
      : store_(store), tables_(tables), slots_(slots), chunk_rows_(chunk_rows) {
    thread_ = std::thread([this] { Produce(); });
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
  bool HasRoomOrCancel() const { return produced_ - released_ < kRing || cancel_; }

  void Produce() {
    for (int t : tables_) {
      for (uint32_t slot : slots_) {
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
          item.status = store_.ExportSlot(t, slot, &cursor, chunk_rows_, &item.chunk);
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

  const EmbeddingStore& store_;
  const std::vector<int>& tables_;
  const std::vector<uint32_t>& slots_;
  const int64_t chunk_rows_;
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

void EncodeRowKey(absl::string_view table, uint32_t slot, int64_t id,
                  std::string* out) {
  EncodeSlotPrefix(table, slot, out);
  PutBigEndian(static_cast<uint64_t>(id) ^ (uint64_t{1} << 63), 8, out);
}

std::vector<v1::CheckpointTable> StoreLayout(const EmbeddingStore& store) {
  std::vector<v1::CheckpointTable> out;
  for (int t = 0; t < store.num_tables(); ++t) {
    const config::TableSpec& spec = store.spec(t);
    v1::CheckpointTable table;
    table.set_name(spec.name);
    table.set_dim(spec.dim);
    table.set_optimizer_kind(static_cast<int32_t>(spec.optimizer.kind));
    table.set_row_stride(kernels::FusedRowStride(spec.optimizer.kind, spec.dim));
    table.set_num_rows(spec.num_rows);
    out.push_back(std::move(table));
  }
  return out;
}

absl::Status CheckLayout(
    const google::protobuf::RepeatedPtrField<v1::CheckpointTable>& saved,
                         const EmbeddingStore& store,
                         absl::string_view source) {
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
            kernels::OptimizerName(
                static_cast<kernels::OptimizerKind>(got.optimizer_kind())),
            kernels::OptimizerName(
                static_cast<kernels::OptimizerKind>(want.optimizer_kind())));
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

absl::StatusOr<RowFileInfo> RowFileWriter::Write(
    const EmbeddingStore& store, absl::Span<const uint32_t> slots,
    const std::string& path) const {
  const uint32_t num_slots = static_cast<uint32_t>(store.RowsPerSlot().size());
  const std::vector<uint32_t> sorted = SortedUnique(slots);
  if (!sorted.empty() && sorted.back() >= num_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("row file ", path, ": slot ", sorted.back(),
                     " is outside the store's ", num_slots, " slots"));
  }
  // Keys go in sorted order: tables by name, then slot, then id.
  std::vector<int> tables(store.num_tables());
  for (int t = 0; t < store.num_tables(); ++t) {
    tables[t] = t;
    if (store.spec(t).name.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "row file ", path, ": table name contains a 0 byte"));
    }
  }
  std::sort(tables.begin(), tables.end(), [&](int a, int b) {
    return store.spec(a).name < store.spec(b).name;
  });

  v1::RowFileHeader header;
  header.set_format_version(kRowFileFormatVersion);
  header.set_num_slots(num_slots);
  for (v1::CheckpointTable& t : StoreLayout(store)) {
    *header.add_tables() = std::move(t);
  }

  rocksdb::Options options = SstOptions(options_.block_size);
  RunningCrc running;
  const std::unique_ptr<rocksdb::Env> env =
      rocksdb::NewCompositeEnv(std::make_shared<CrcFileSystem>(
          &running, std::max<size_t>(options_.write_buffer_bytes, 1 << 20)));
  options.env = env.get();
  rocksdb::EnvOptions env_options;
  rocksdb::SstFileWriter writer(env_options, options,
                                /*column_family=*/nullptr,
                                /*invalidate_page_cache=*/false);
  RETURN_IF_ERROR(FromRocksStatus(writer.Open(path), "cannot create row file",
                                  path));
  RowFileInfo info;
  info.path = path;
  auto fail = [&](absl::Status status) {
    // The writer owns the open file; closing it first would need Finish.
    unlink(path.c_str());
    return status;
  };
  absl::Status status = FromRocksStatus(
      writer.Put(kHeaderKey, header.SerializeAsString()),
      "cannot write row file", path);
  if (!status.ok()) return fail(status);

  std::string key;
  {
    ExportAhead ahead(store, tables, sorted, options_.chunk_rows);
    while (const ExportAhead::Item* item = ahead.Next()) {
      const std::string& name = store.spec(item->table).name;
      if (!item->status.ok()) {
        return fail(absl::Status(
            item->status.code(),
            absl::StrCat("row file ", path, ": exporting table '", name,
                         "' slot ", item->slot, ": ", item->status.message())));
      }
      const SlotChunk& chunk = item->chunk;
      const size_t row_bytes = static_cast<size_t>(chunk.row_stride) * sizeof(float);
      for (size_t i = 0; i < chunk.ids.size(); ++i) {
        EncodeRowKey(name, item->slot, chunk.ids[i], &key);
        const rocksdb::Slice value(
            reinterpret_cast<const char*>(chunk.rows.data() + i * chunk.row_stride),
            row_bytes);
        const rocksdb::Status s = writer.Put(key, value);
        if (!s.ok()) return fail(FromRocksStatus(s, "cannot write row file", path));
      }
      info.rows += static_cast<int64_t>(chunk.ids.size());
    }
  }
  // Finish writes the index and footer and syncs the file.
  status = FromRocksStatus(writer.Finish(), "cannot finish row file", path);
  if (!status.ok()) return fail(status);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if (running.valid && running.bytes == static_cast<uint64_t>(st.st_size)) {
    info.size_bytes = running.bytes;
    info.crc32c = running.crc;
  } else {
    ASSIGN_OR_RETURN(const FileCrc crc, ChecksumFile(path));
    info.size_bytes = crc.size_bytes;
    info.crc32c = crc.crc32c;
  }
  return info;
}

RowFileReader::~RowFileReader() = default;

absl::StatusOr<std::unique_ptr<RowFileReader>> RowFileReader::Open(
    const std::string& path, uint64_t expected_size, uint32_t expected_crc32c) {
  ASSIGN_OR_RETURN(const FileCrc crc, ChecksumFile(path));
  if (crc.size_bytes != expected_size) {
    return absl::DataLossError(absl::StrCat(
        "row file ", path, " is ", crc.size_bytes, " bytes but the manifest says ",
        expected_size, ": the file is truncated or was replaced"));
  }
  if (crc.crc32c != expected_crc32c) {
    return absl::DataLossError(absl::StrCat(
        "row file ", path, " has CRC-32C ", absl::Hex(crc.crc32c, absl::kZeroPad8),
        " but the manifest says ", absl::Hex(expected_crc32c, absl::kZeroPad8),
        ": the file is corrupted"));
  }
  std::unique_ptr<RowFileReader> out(new RowFileReader());
  out->path_ = path;
  out->reader_ = std::make_unique<rocksdb::SstFileReader>(SstOptions(64 << 10));
  RETURN_IF_ERROR(FromRocksStatus(out->reader_->Open(path),
                                  "cannot open row file", path));
  std::unique_ptr<rocksdb::Iterator> it(
      out->reader_->NewIterator(rocksdb::ReadOptions()));
  it->Seek(kHeaderKey);
  RETURN_IF_ERROR(FromRocksStatus(it->status(), "cannot read row file", path));
  if (!it->Valid() || it->key() != kHeaderKey ||
      !out->header_.ParseFromArray(it->value().data(),
                                   static_cast<int>(it->value().size()))) {
    return absl::DataLossError(
        absl::StrCat("row file ", path, " has no readable header entry"));
  }
  if (out->header_.format_version() != kRowFileFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "row file ", path, " has format version ", out->header_.format_version(),
        "; this build reads version ", kRowFileFormatVersion));
  }
  return out;
}

absl::Status RowFileReader::CheckStore(const EmbeddingStore& store) const {
  const size_t num_slots = store.RowsPerSlot().size();
  if (header_.num_slots() != num_slots) {
    return absl::FailedPreconditionError(absl::StrCat(
        "row file ", path_, " was written with num_slots ", header_.num_slots(),
        " but the restore target has ", num_slots,
        "; rows are keyed by slot, the slot count cannot change on restore"));
  }
  return CheckLayout(header_.tables(), store, absl::StrCat("row file ", path_));
}

absl::StatusOr<int64_t> RowFileReader::ImportSlots(
    EmbeddingStore& store, absl::Span<const uint32_t> sorted,
    int64_t batch_rows) const {
  // RocksDB's own readahead (growing on sequential reads) is left on: a
  // fixed large one is thrown away at every Seek.
  std::unique_ptr<rocksdb::Iterator> it(
      reader_->NewIterator(rocksdb::ReadOptions()));
  std::vector<int64_t> ids;
  std::vector<float> rows;
  std::string prefix;
  int64_t imported = 0;
  for (const v1::CheckpointTable& saved : header_.tables()) {
    const absl::StatusOr<int> table = store.FindTable(saved.name());
    if (!table.ok()) continue;  // another server's table
    const int64_t stride = saved.row_stride();
    const size_t row_bytes = static_cast<size_t>(stride) * sizeof(float);
    ids.reserve(batch_rows);
    rows.resize(static_cast<size_t>(batch_rows) * stride);
    bool positioned = false;  // tables are not in key order: Seek first
    for (uint32_t slot : sorted) {
      EncodeSlotPrefix(saved.name(), slot, &prefix);
      auto flush = [&]() -> absl::Status {
        if (ids.empty()) return absl::OkStatus();
        absl::Status s = store.ImportRows(*table, slot, ids, rows.data());
        if (!s.ok()) {
          return absl::Status(s.code(),
                              absl::StrCat("importing row file ", path_, ": ",
                                           s.message()));
        }
        imported += static_cast<int64_t>(ids.size());
        ids.clear();
        return absl::OkStatus();
      };
      // After the previous slot the iterator stands on the first key past
      // it; when that is not below this slot's prefix it is already where a
      // Seek would go (slots are sorted), and a Seek would re-read blocks.
      if (!positioned || !it->Valid() || it->key().compare(prefix) < 0) {
        it->Seek(prefix);
        positioned = true;
      }
      for (; it->Valid() && it->key().starts_with(prefix); it->Next()) {
        const rocksdb::Slice key = it->key();
        const rocksdb::Slice value = it->value();
        if (key.size() != prefix.size() + 8 || value.size() != row_bytes) {
          return absl::DataLossError(absl::StrCat(
              "row file ", path_, ": table '", saved.name(), "' slot ", slot,
              " holds an entry of key size ", key.size(), " and value size ",
              value.size(), " (expected ", prefix.size() + 8, " and ",
              row_bytes, ")"));
        }
        const int64_t id = static_cast<int64_t>(
            GetBigEndian(key.data() + prefix.size(), 8) ^ (uint64_t{1} << 63));
        std::memcpy(rows.data() + ids.size() * stride, value.data(), row_bytes);
        ids.push_back(id);
        if (static_cast<int64_t>(ids.size()) == batch_rows) RETURN_IF_ERROR(flush());
      }
      RETURN_IF_ERROR(FromRocksStatus(it->status(), "cannot read row file", path_));
      RETURN_IF_ERROR(flush());
    }
  }
  return imported;
}

absl::StatusOr<int64_t> RowFileReader::Import(EmbeddingStore& store,
                                              absl::Span<const uint32_t> slots,
                                              const ImportOptions& options) const {
  if (options.batch_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch_rows is ", options.batch_rows, "; it must be at least 1"));
  }
  const std::vector<uint32_t> sorted = SortedUnique(slots);
  if (options.pool == nullptr || sorted.size() < 2) {
    return ImportSlots(store, sorted, options.batch_rows);
  }
  // Slots are independent (each has its own lock in the store): chunks of
  // them import in parallel, each with its own iterator.
  absl::Mutex mu;
  absl::Status first_error;
  std::atomic<int64_t> imported{0};
  options.pool->ParallelFor(
      static_cast<int64_t>(sorted.size()), /*grain=*/16,
      [&](int64_t begin, int64_t end) {
        absl::StatusOr<int64_t> rows = ImportSlots(
            store, absl::MakeConstSpan(sorted).subspan(begin, end - begin),
            options.batch_rows);
        if (rows.ok()) {
          imported.fetch_add(*rows, std::memory_order_relaxed);
          return;
        }
        absl::MutexLock lock(&mu);
        if (first_error.ok()) first_error = rows.status();
      });
  if (!first_error.ok()) return first_error;
  return imported.load();
}

}  // namespace recps::server::checkpoint
