// The key-value store that workers rendezvous through: Gloo exchanges pair
// addresses in it, NCCL its unique id. The coordinator serves one over gRPC;
// the two implementations here need no coordinator (tests, one machine).
#ifndef RECPS_WORKER_COLLECTIVES_KV_STORE_H_
#define RECPS_WORKER_COLLECTIVES_KV_STORE_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/file_system.h"

namespace recps::worker {

// Keys are written once per run (callers put a run id in the key), values
// are opaque bytes. Implementations are thread-safe.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  // Stores `value` under `key`, replacing any earlier value.
  virtual absl::Status Set(const std::string& key,
                           const std::string& value) = 0;

  // Waits up to `timeout` for `key` to exist and returns its value;
  // DEADLINE_EXCEEDED naming the key when it does not appear in time.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          absl::Duration timeout) = 0;

  // Waits up to `timeout` (in all) until every key exists;
  // DEADLINE_EXCEEDED naming the missing keys otherwise.
  virtual absl::Status Wait(const std::vector<std::string>& keys,
                            absl::Duration timeout) = 0;
};

// A map behind a mutex: ranks that are threads of one process.
class InMemoryKeyValueStore : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override;

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// One file per key in `dir` (created on first Set), written to a temporary
// name and renamed into place so readers never see a partial value; readers
// poll. Works across processes that share a file system on one machine.
// Values are not fsynced: they live as long as the run (a rendezvous).
// A failed Set leaves neither the key nor its temporary file; its error
// keeps the file system's code (RESOURCE_EXHAUSTED for a full disk) and
// names the key's file.
class FileKeyValueStore : public KeyValueStore {
 public:
  // Every file operation goes through `fs` (not owned; must outlive this).
  explicit FileKeyValueStore(
      std::string dir, absl::Duration poll_interval = absl::Milliseconds(5),
      FileSystem* fs = FileSystem::Default());

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override;

  const std::string& dir() const { return dir_; }

 private:
  // NOT_FOUND while the key has no file yet.
  absl::StatusOr<std::string> TryRead(const std::string& key) const;
  // The key's file name in dir_ (escaped); INVALID_ARGUMENT naming the key
  // when it cannot be one.
  static absl::StatusOr<std::string> FileNameFor(const std::string& key);

  const std::string dir_;
  const absl::Duration poll_interval_;
  FileSystem* const fs_;
};

}  // namespace recps::worker

#endif  // RECPS_WORKER_COLLECTIVES_KV_STORE_H_
