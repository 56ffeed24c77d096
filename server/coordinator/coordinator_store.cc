#include "server/coordinator/coordinator_store.h"

#include "absl/strings/str_cat.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace recps::server {
namespace {

// Maps a RocksDB status to the code that tells the caller what to do.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(message);
  if (s.IsNotFound()) return absl::NotFoundError(message);
  if (s.IsInvalidArgument() || s.IsNotSupported()) {
    return absl::InvalidArgumentError(message);
  }
  // A held LOCK file: another coordinator runs on this state dir.
  if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
    return absl::FailedPreconditionError(
        absl::StrCat(message, " (is another coordinator using this state dir?)"));
  }
  if (s.IsIOError() || s.IsBusy() || s.IsTryAgain() || s.IsTimedOut()) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

rocksdb::Slice ToSlice(absl::string_view s) {
  return rocksdb::Slice(s.data(), s.size());
}

rocksdb::WriteOptions SyncedWrite() {
  rocksdb::WriteOptions options;
  options.sync = true;
  return options;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorStore>> CoordinatorStore::Open(
    const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty state dir path");
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  // The state is tiny: keep RocksDB's footprint (threads, memory) small.
  options.max_background_jobs = 1;
  options.write_buffer_size = 4 << 20;
  options.keep_log_file_num = 3;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, path, &db);
  if (!s.ok()) {
    return FromRocks(s, absl::StrCat("opening coordinator state in ", path));
  }
  return std::unique_ptr<CoordinatorStore>(
      new CoordinatorStore(path, std::unique_ptr<rocksdb::DB>(db)));
}

CoordinatorStore::CoordinatorStore(std::string path,
                                   std::unique_ptr<rocksdb::DB> db)
    : path_(std::move(path)), db_(std::move(db)) {}

CoordinatorStore::~CoordinatorStore() {
  if (db_ != nullptr) db_->Close().PermitUncheckedError();
}

absl::Status CoordinatorStore::Put(absl::string_view key,
                                   absl::string_view value) {
  return FromRocks(db_->Put(SyncedWrite(), ToSlice(key), ToSlice(value)),
                   absl::StrCat("writing ", key));
}

absl::StatusOr<std::string> CoordinatorStore::Get(absl::string_view key) const {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ToSlice(key), &value);
  if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat("no ", key));
  if (!s.ok()) return FromRocks(s, absl::StrCat("reading ", key));
  return value;
}

absl::Status CoordinatorStore::Delete(absl::string_view key) {
  return FromRocks(db_->Delete(SyncedWrite(), ToSlice(key)),
                   absl::StrCat("deleting ", key));
}

absl::Status CoordinatorStore::PutAll(
    const std::vector<std::pair<std::string, std::string>>& entries) {
  rocksdb::WriteBatch batch;
  for (const auto& [key, value] : entries) {
    rocksdb::Status s = batch.Put(key, value);
    if (!s.ok()) return FromRocks(s, absl::StrCat("batching ", key));
  }
  return FromRocks(db_->Write(SyncedWrite(), &batch), "writing a batch");
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
CoordinatorStore::Scan(absl::string_view prefix) const {
  std::vector<std::pair<std::string, std::string>> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(ToSlice(prefix)); it->Valid() && it->key().starts_with(ToSlice(prefix));
       it->Next()) {
    out.emplace_back(it->key().ToString(), it->value().ToString());
  }
  if (!it->status().ok()) {
    return FromRocks(it->status(), absl::StrCat("scanning ", prefix));
  }
  return out;
}

}  // namespace recps::server
