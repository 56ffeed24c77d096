// Status conversions and thread hints of the checkpoint library. The file
// operations themselves (atomic writes, directories, listing, removal) go
// through recps::FileSystem (common/file_system.h); RocksDB's SST writer and
// reader keep their own rocksdb::Env, so their errors come through
// FromRocksStatus.
#ifndef RECPS_SERVER_CHECKPOINT_FILE_UTIL_H_
#define RECPS_SERVER_CHECKPOINT_FILE_UTIL_H_

#include "absl/status/status.h"
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

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_FILE_UTIL_H_
