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
                       RunningCrc* crc, size_t buffer_bytes, int nice)
      : FSWritableFileOwnerWrapper(std::move(file)),
        crc_(crc),
        buffer_bytes_(buffer_bytes),
        nice_(nice) {
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
    BackgroundThisThread(nice_);
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
  const int nice_;
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
  CrcFileSystem(RunningCrc* crc, size_t buffer_bytes, int nice)
      : FileSystemWrapper(rocksdb::FileSystem::Default()),
        crc_(crc),
        buffer_bytes_(buffer_bytes),
        nice_(nice) {}
  const char* Name() const override { return "RecpsCrcFileSystem"; }
  rocksdb::IOStatus NewWritableFile(const std::string& name,
                                    const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* out,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewWritableFile(name, options, out, dbg);
    if (s.ok()) {
      *out = std::make_unique<AsyncCrcWritableFile>(std::move(*out), crc_,
                                                    buffer_bytes_, nice_);
    }
    return s;
  }

 private:
  RunningCrc* crc_;
  size_t buffer_bytes_;
  int nice_;
};

}  // namespace

void EncodeSlotPrefix(absl::string_view table, uint32_t slot,
                      std::string* out) {
  out->clear();
  out->append(table.data(), table.size());
  out->push_back('\0');
  PutBigEndian(slot, 4, out);
}

void EncodeRowKey(absl::string_view table, uint32_t slot, int64_t id,
                  std::string* out) {
  EncodeSlotPrefix(table, slot, out);
  PutBigEndian(static_cast<uint64_t>(id) ^ (uint64_t{1} << 63), 8, out);
}

bool DecodeRowKey(absl::string_view key, absl::string_view* table,
                  uint32_t* slot, int64_t* id) {
  if (key.size() < 1 + 1 + 4 + 8) return false;
  const size_t name_end = key.size() - 12 - 1;
  if (key[name_end] != '\0' || name_end == 0) return false;
  if (key.substr(0, name_end).find('\0') != absl::string_view::npos) return false;
  *table = key.substr(0, name_end);
  *slot = static_cast<uint32_t>(GetBigEndian(key.data() + name_end + 1, 4));
  *id = static_cast<int64_t>(GetBigEndian(key.data() + name_end + 5, 8) ^
                             (uint64_t{1} << 63));
  return true;
}

struct RowFileBuilder::Crc : RunningCrc {};

absl::StatusOr<std::unique_ptr<RowFileBuilder>> RowFileBuilder::Create(
    const std::string& path, const v1::RowFileHeader& header,
    const RowFileOptions& options) {
  for (const v1::CheckpointTable& t : header.tables()) {
    if (t.name().empty() || t.name().find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "row file ", path, ": table name '", t.name(),
          "' is empty or contains a 0 byte"));
    }
  }
  std::unique_ptr<RowFileBuilder> b(new RowFileBuilder());
  b->path_ = path;
  b->progress_ = options.rows_written;
  b->crc_ = std::make_unique<Crc>();
  b->env_ = rocksdb::NewCompositeEnv(std::make_shared<CrcFileSystem>(
      b->crc_.get(), std::max<size_t>(options.write_buffer_bytes, 1 << 20),
      options.thread_nice));
  rocksdb::Options sst = SstOptions(options.block_size);
  sst.env = b->env_.get();
  b->writer_ = std::make_unique<rocksdb::SstFileWriter>(
      rocksdb::EnvOptions(), sst, /*column_family=*/nullptr,
      /*invalidate_page_cache=*/false);
  RETURN_IF_ERROR(FromRocksStatus(b->writer_->Open(path),
                                  "cannot create row file", path));
  RETURN_IF_ERROR(FromRocksStatus(
      b->writer_->Put(kHeaderKey, header.SerializeAsString()),
      "cannot write row file", path));
  return b;
}

RowFileBuilder::~RowFileBuilder() {
  if (finished_ || writer_ == nullptr) return;
  writer_.reset();  // abandons the table, closes the file
  unlink(path_.c_str());
}

absl::Status RowFileBuilder::Add(absl::string_view table, uint32_t slot,
                                 absl::Span<const int64_t> ids,
                                 const float* rows, int64_t stride) {
  const size_t row_bytes = static_cast<size_t>(stride) * sizeof(float);
  for (size_t i = 0; i < ids.size(); ++i) {
    EncodeRowKey(table, slot, ids[i], &key_);
    const rocksdb::Slice value(
        reinterpret_cast<const char*>(rows + i * stride), row_bytes);
    const rocksdb::Status s = writer_->Put(key_, value);
    if (!s.ok()) return FromRocksStatus(s, "cannot write row file", path_);
  }
  rows_ += static_cast<int64_t>(ids.size());
  if (progress_ != nullptr) {
    progress_->fetch_add(static_cast<int64_t>(ids.size()),
                         std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

absl::Status RowFileBuilder::AddEncoded(absl::string_view key,
                                        absl::string_view value) {
  const rocksdb::Status s = writer_->Put(rocksdb::Slice(key.data(), key.size()),
                                         rocksdb::Slice(value.data(), value.size()));
  if (!s.ok()) return FromRocksStatus(s, "cannot write row file", path_);
  ++rows_;
  if (progress_ != nullptr) progress_->fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<RowFileInfo> RowFileBuilder::Finish() {
  // Finish writes the index and footer and syncs the file.
  RETURN_IF_ERROR(
      FromRocksStatus(writer_->Finish(), "cannot finish row file", path_));
  RowFileInfo info;
  info.path = path_;
  info.rows = rows_;
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot stat", path_);
  if (crc_->valid && crc_->bytes == static_cast<uint64_t>(st.st_size)) {
    info.size_bytes = crc_->bytes;
    info.crc32c = crc_->crc;
  } else {
    ASSIGN_OR_RETURN(const FileCrc crc, ChecksumFile(path_));
    info.size_bytes = crc.size_bytes;
    info.crc32c = crc.crc32c;
  }
  finished_ = true;
  return info;
}

RowFileReader::~RowFileReader() = default;

namespace {

// The size and CRC mismatches Open and VerifyWhole report.
absl::Status CheckFileCrc(const std::string& path, const FileCrc& crc,
                          uint64_t expected_size, uint32_t expected_crc32c) {
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
  return absl::OkStatus();
}

}  // namespace

absl::Status RowFileReader::VerifyWhole(ThreadPool* pool) const {
  ASSIGN_OR_RETURN(const FileCrc crc, ChecksumFileParallel(path_, pool));
  return CheckFileCrc(path_, crc, expected_size_, expected_crc32c_);
}

absl::StatusOr<std::unique_ptr<RowFileReader>> RowFileReader::Open(
    const std::string& path, uint64_t expected_size, uint32_t expected_crc32c,
    ThreadPool* pool, Verify verify) {
  if (verify == Verify::kBeforeOpen) {
    ASSIGN_OR_RETURN(const FileCrc crc, ChecksumFileParallel(path, pool));
    RETURN_IF_ERROR(CheckFileCrc(path, crc, expected_size, expected_crc32c));
  } else {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot open", path);
    FileCrc size_only{static_cast<uint64_t>(st.st_size), expected_crc32c};
    RETURN_IF_ERROR(CheckFileCrc(path, size_only, expected_size, expected_crc32c));
  }
  std::unique_ptr<RowFileReader> out(new RowFileReader());
  out->path_ = path;
  out->expected_size_ = expected_size;
  out->expected_crc32c_ = expected_crc32c;
  if (absl::Status s = out->OpenTable(); !s.ok()) {
    // Verify::kLater: a file that does not open may be damaged where the
    // table's index or header lies; the CRC names that best.
    if (verify == Verify::kLater) RETURN_IF_ERROR(out->VerifyWhole(pool));
    return s;
  }
  return out;
}

absl::Status RowFileReader::OpenTable() {
  // Memory-mapped reads: the CRC pass brought (or is bringing) the file
  // into the page cache, and the iterator then hands out rows in place
  // instead of copying every block into a buffer of its own (pread) first.
  // A complete checkpoint's row files are not rewritten (saving a complete
  // step is refused; compaction writes new files; pruning unlinks, which
  // leaves a mapping valid), so the mapping does not lose pages under the
  // reader.
  rocksdb::Options read_sst = SstOptions(64 << 10);
  read_sst.allow_mmap_reads = true;
  reader_ = std::make_unique<rocksdb::SstFileReader>(read_sst);
  RETURN_IF_ERROR(FromRocksStatus(reader_->Open(path_), "cannot open row file", path_));
  std::unique_ptr<rocksdb::Iterator> it(reader_->NewIterator(rocksdb::ReadOptions()));
  it->Seek(kHeaderKey);
  RETURN_IF_ERROR(FromRocksStatus(it->status(), "cannot read row file", path_));
  if (!it->Valid() || it->key() != kHeaderKey ||
      !header_.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
    return absl::DataLossError(
        absl::StrCat("row file ", path_, " has no readable header entry"));
  }
  if (header_.format_version() != kRowFileFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "row file ", path_, " has format version ", header_.format_version(),
        "; this build reads version ", kRowFileFormatVersion));
  }
  return absl::OkStatus();
}

const v1::CheckpointTable* RowFileReader::FindTable(
    absl::string_view table) const {
  for (const v1::CheckpointTable& t : header_.tables()) {
    if (t.name() == table) return &t;
  }
  return nullptr;
}

absl::Status RowFileReader::ReadSlots(const v1::CheckpointTable& table,
                                      absl::Span<const uint32_t> sorted,
                                      int64_t batch_rows,
                                      const RowsFn& fn) const {
  if (batch_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch_rows is ", batch_rows, "; it must be at least 1"));
  }
  // RocksDB's own readahead (growing on sequential reads) is left on: a
  // fixed large one is thrown away at every Seek.
  rocksdb::ReadOptions read_options;
  read_options.verify_checksums = false;  // the whole file's CRC was checked
  std::unique_ptr<rocksdb::Iterator> it(reader_->NewIterator(read_options));
  const int64_t stride = table.row_stride();
  const size_t row_bytes = static_cast<size_t>(stride) * sizeof(float);
  std::vector<int64_t> ids;
  std::vector<float> rows;
  ids.reserve(batch_rows);
  rows.resize(static_cast<size_t>(batch_rows) * stride);
  std::string prefix;
  bool positioned = false;
  for (uint32_t slot : sorted) {
    EncodeSlotPrefix(table.name(), slot, &prefix);
    auto flush = [&]() -> absl::Status {
      if (ids.empty()) return absl::OkStatus();
      absl::Status s = fn(slot, ids, rows.data());
      ids.clear();
      return s;
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
            "row file ", path_, ": table '", table.name(), "' slot ", slot,
            " holds an entry of key size ", key.size(), " and value size ",
            value.size(), " (expected ", prefix.size() + 8, " and ", row_bytes,
            ")"));
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
  return absl::OkStatus();
}

std::unique_ptr<rocksdb::Iterator> RowFileReader::NewRowIterator() const {
  rocksdb::ReadOptions read_options;
  read_options.verify_checksums = false;
  std::unique_ptr<rocksdb::Iterator> it(reader_->NewIterator(read_options));
  it->Seek(kHeaderKey);
  if (it->Valid() && it->key() == kHeaderKey) it->Next();
  return it;
}

}  // namespace recps::server::checkpoint
