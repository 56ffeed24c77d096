// Status conversions and thread hints of the checkpoint library. The file
// operations themselves (atomic writes, directories, listing, removal) go
// through recps::FileSystem (common/file_system.h); RocksDB's SST writer and
// reader keep their own rocksdb::Env, so their errors come through
// FromRocksStatus.
#ifndef RECPS_SERVER_CHECKPOINT_FILE_UTIL_H_
#define RECPS_SERVER_CHECKPOINT_FILE_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_system.h"

namespace rocksdb {
class Status;
}

namespace recps::server::checkpoint {

// errno as absl::Status naming the path (common/file_system.h has the codes).
using ::recps::ErrnoStatus;

// A RocksDB status as absl: RESOURCE_EXHAUSTED for no space, DATA_LOSS for
// corruption, NOT_FOUND, PERMISSION_DENIED or UNAVAILABLE for I/O errors
// (by the text RocksDB copies from strerror), each naming `path`.
absl::Status FromRocksStatus(const rocksdb::Status& s, absl::string_view what,
                             absl::string_view path);

// Marks the calling thread as background work: SCHED_BATCH (its wakeups do
// not preempt other threads, its CPU share stays fair) plus `nice` added
// to its niceness when above 0 (setpriority on the thread's id; Linux
// applies both to that thread only). A failure only loses the hint.
void BackgroundThisThread(int nice);

// FileSystem::Default()'s WriteFileAtomically and ReadSmallFile, for the
// callers outside this folder that do not take a FileSystem yet (the
// coordinator's dense-state and contents files). New code takes a
// FileSystem*; these go once those callers do.
inline absl::Status WriteFileAtomically(const std::string& path,
                                        absl::string_view bytes) {
  return FileSystem::Default()->WriteFileAtomically(path, bytes);
}
inline absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                                 int64_t max_bytes) {
  return FileSystem::Default()->ReadSmallFile(path, max_bytes);
}

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_FILE_UTIL_H_
