// The coordinator's durable state: a small RocksDB database in --state_dir.
// Keys are plain strings ("member/<id>", "shard_map", "job", "kv/<key>");
// values are serialized protos or raw bytes. Every write is synced, so a
// crash (even of the machine) loses no acknowledged change.
//
// Thread-safe: RocksDB allows concurrent reads and writes.
#ifndef RECPS_SERVER_COORDINATOR_COORDINATOR_STORE_H_
#define RECPS_SERVER_COORDINATOR_COORDINATOR_STORE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rocksdb {
class DB;
}  // namespace rocksdb

namespace recps::server {

// The key of the current shard map (v1::ShardMap) in the store.
inline constexpr char kShardMapKey[] = "shard_map";

class CoordinatorStore {
 public:
  // Opens (creating if missing) the database in directory `path`.
  // FAILED_PRECONDITION when another process holds it, DATA_LOSS when it is
  // corrupt, UNAVAILABLE/INTERNAL for other I/O errors. Never aborts.
  static absl::StatusOr<std::unique_ptr<CoordinatorStore>> Open(
      const std::string& path);
  ~CoordinatorStore();  // closes the database

  CoordinatorStore(const CoordinatorStore&) = delete;
  CoordinatorStore& operator=(const CoordinatorStore&) = delete;

  absl::Status Put(absl::string_view key, absl::string_view value);
  // NOT_FOUND when the key is absent.
  absl::StatusOr<std::string> Get(absl::string_view key) const;
  // OK when the key is absent too.
  absl::Status Delete(absl::string_view key);
  // Applies all puts atomically (one write batch).
  absl::Status PutAll(
      const std::vector<std::pair<std::string, std::string>>& entries);
  // Every (key, value) whose key starts with `prefix`, in key order.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(
      absl::string_view prefix) const;

  const std::string& path() const { return path_; }

 private:
  CoordinatorStore(std::string path, std::unique_ptr<rocksdb::DB> db);

  std::string path_;
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_COORDINATOR_STORE_H_
