// A FileSystem over another that fails chosen operations: a full disk, a
// torn write, a slow fsync, a failed rename (leveldb's fault-injection Env,
// cut to what the checkpoint files need).
//
// Test-only, here and not in common/file_system.h: production binaries then
// carry no fault switches that a stray call could turn on, and the base
// library the kernels link stays small. It sits beside its first users, the
// checkpoint tests; any other test may include it (tests may include every
// module), and it needs no library of its own.
#ifndef RECPS_TESTS_SERVER_CHECKPOINT_FAULTY_FILE_SYSTEM_H_
#define RECPS_TESTS_SERVER_CHECKPOINT_FAULTY_FILE_SYSTEM_H_

#include <errno.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file_system.h"

namespace recps::testing {

// Thread-safe. Faults are armed by the setters and count calls from then
// on; a fault that fires is spent, except the full disk, which stays full.
class FaultyFileSystem : public FileSystem {
 public:
  // `base` does the work (default: the POSIX one) and must outlive this.
  explicit FaultyFileSystem(FileSystem* base = FileSystem::Default())
      : base_(base) {}

  // A full disk: from now, WriteFile calls together write `bytes` more. The
  // one that crosses the limit writes what fits and fails
  // RESOURCE_EXHAUSTED (ENOSPC), as do all later ones. Only file contents
  // count: directories and renames still succeed, as they do on most file
  // systems with a block or two left. A negative value lifts the limit.
  void SetDiskFullAfter(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    bytes_left_ = bytes;
  }

  // A torn write: the nth WriteFile from now (1: the next) writes only its
  // first `keep_bytes` bytes (all when it has fewer) and fails UNAVAILABLE
  // (EIO), as a write that lost its device halfway does.
  void TearWrite(int nth, size_t keep_bytes) {
    absl::MutexLock lock(&mu_);
    tear_in_ = nth;
    torn_keep_ = keep_bytes;
  }

  // Every fsync (WriteFile with sync, SyncDir) first sleeps `delay`.
  void SetFsyncDelay(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    fsync_delay_ = delay;
  }

  // The kth Rename from now (1: the next) fails UNAVAILABLE (EIO) and
  // renames nothing.
  void FailRename(int kth) {
    absl::MutexLock lock(&mu_);
    rename_fail_in_ = kth;
  }

  // What went through, failed calls included.
  int fsyncs() const {
    absl::MutexLock lock(&mu_);
    return fsyncs_;
  }
  int renames() const {
    absl::MutexLock lock(&mu_);
    return renames_;
  }
  int64_t bytes_written() const {
    absl::MutexLock lock(&mu_);
    return bytes_written_;
  }

  absl::Status WriteFile(const std::string& path, absl::string_view bytes,
                         bool sync) override {
    size_t keep = bytes.size();
    int err = 0;
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu_);
      if (tear_in_ > 0 && --tear_in_ == 0) {
        keep = std::min(keep, torn_keep_);
        err = EIO;
      }
      if (bytes_left_ >= 0 && static_cast<int64_t>(keep) > bytes_left_) {
        keep = static_cast<size_t>(bytes_left_);
        err = ENOSPC;
      }
      if (bytes_left_ >= 0) bytes_left_ -= static_cast<int64_t>(keep);
      bytes_written_ += static_cast<int64_t>(keep);
      if (err == 0 && sync) {
        ++fsyncs_;
        delay = fsync_delay_;
      }
    }
    if (err != 0) {
      // What landed before the fault stays in the file, unsynced.
      base_->WriteFile(path, bytes.substr(0, keep), /*sync=*/false)
          .IgnoreError();
      return ErrnoStatus(err, "cannot write (injected fault)", path);
    }
    absl::SleepFor(delay);
    return base_->WriteFile(path, bytes, sync);
  }

  absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                            int64_t max_bytes) override {
    return base_->ReadSmallFile(path, max_bytes);
  }

  absl::Status CreateDir(const std::string& path) override {
    return base_->CreateDir(path);
  }

  absl::Status SyncDir(const std::string& dir) override {
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu_);
      ++fsyncs_;
      delay = fsync_delay_;
    }
    absl::SleepFor(delay);
    return base_->SyncDir(dir);
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    {
      absl::MutexLock lock(&mu_);
      ++renames_;
      if (rename_fail_in_ > 0 && --rename_fail_in_ == 0) {
        return ErrnoStatus(EIO, "cannot rename (injected fault)", from);
      }
    }
    return base_->Rename(from, to);
  }

  absl::Status RemoveFile(const std::string& path) override {
    return base_->RemoveFile(path);
  }

  absl::Status RemoveTree(const std::string& path) override {
    return base_->RemoveTree(path);
  }

  absl::StatusOr<std::vector<DirEntry>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }

 private:
  FileSystem* const base_;
  mutable absl::Mutex mu_;
  int64_t bytes_left_ ABSL_GUARDED_BY(mu_) = -1;
  int tear_in_ ABSL_GUARDED_BY(mu_) = 0;
  size_t torn_keep_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration fsync_delay_ ABSL_GUARDED_BY(mu_);
  int rename_fail_in_ ABSL_GUARDED_BY(mu_) = 0;
  int fsyncs_ ABSL_GUARDED_BY(mu_) = 0;
  int renames_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_written_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace recps::testing

#endif  // RECPS_TESTS_SERVER_CHECKPOINT_FAULTY_FILE_SYSTEM_H_
