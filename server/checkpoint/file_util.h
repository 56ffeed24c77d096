// Small POSIX file helpers of the checkpoint library: errno and RocksDB
// statuses turned into absl::Status naming the file, durable writes.
#ifndef RECPS_SERVER_CHECKPOINT_FILE_UTIL_H_
#define RECPS_SERVER_CHECKPOINT_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rocksdb {
class Status;
}

namespace recps::server::checkpoint {

// "<what> <path>: <strerror>" with a code by errno: NOT_FOUND (ENOENT),
// PERMISSION_DENIED (EACCES, EPERM, EROFS), RESOURCE_EXHAUSTED (ENOSPC,
// EDQUOT), FAILED_PRECONDITION (ENOTDIR, EEXIST), UNAVAILABLE otherwise.
absl::Status ErrnoStatus(int err, absl::string_view what,
                         absl::string_view path);

// A RocksDB status as absl: RESOURCE_EXHAUSTED for no space, DATA_LOSS for
// corruption, NOT_FOUND, PERMISSION_DENIED or UNAVAILABLE for I/O errors
// (by the text RocksDB copies from strerror), each naming `path`.
absl::Status FromRocksStatus(const rocksdb::Status& s, absl::string_view what,
                             absl::string_view path);

// fsync of the directory `dir`, so that entries created or renamed in it
// survive a crash.
// Marks the calling thread as background work: SCHED_BATCH (its wakeups do
// not preempt other threads, its CPU share stays fair) plus `nice` added
// to its niceness when above 0 (setpriority on the thread's id; Linux
// applies both to that thread only). A failure only loses the hint.
void BackgroundThisThread(int nice);

absl::Status SyncDir(const std::string& dir);

// Writes `bytes` to `path` durably and atomically: `path`.tmp, fdatasync,
// rename over `path`, fsync of the directory. On failure the temp file is
// removed and `path` is untouched.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes);

// The whole file at `path`; refuses files over max_bytes (FAILED_PRECONDITION
// naming the size and the limit).
absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          int64_t max_bytes);

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_FILE_UTIL_H_
