// The file-system seam (as RocksDB's and leveldb's Env): the few file
// operations recps does besides RocksDB's own files (checkpoint manifests,
// listing and pruning, the coordinator's dense state, the worker's file kv
// store, port files, the launcher's work directory), behind an interface,
// so that tests can inject a full disk, a torn write, a slow fsync or a
// failed rename without root or a tmpfs
// (tests/server/checkpoint/faulty_file_system.h).
//
// Every error is an absl::Status naming the operation and the path, coded by
// errno as ErrnoStatus below says. Implementations are thread-safe; the
// calls are blocking system calls, never for a latency-critical thread.
#ifndef RECPS_COMMON_FILE_SYSTEM_H_
#define RECPS_COMMON_FILE_SYSTEM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recps {

// "<what> <path>: <strerror>" with a code by errno, chosen by what the
// caller should do: NOT_FOUND (ENOENT), PERMISSION_DENIED (EACCES, EPERM,
// EROFS), RESOURCE_EXHAUSTED (ENOSPC, EDQUOT), FAILED_PRECONDITION
// (ENOTDIR, EEXIST, EISDIR), UNAVAILABLE otherwise (an I/O error: retry).
absl::Status ErrnoStatus(int err, absl::string_view what,
                         absl::string_view path);

class FileSystem {
 public:
  struct DirEntry {
    std::string name;  // without the directory
    bool is_dir = false;  // a directory, or a link to one
  };

  virtual ~FileSystem() = default;

  // The POSIX file system. Never null, never destroyed, thread-safe.
  static FileSystem* Default();

  // Writes `bytes` to `path` (created or truncated, mode 0644), and with
  // `sync` fdatasyncs it. Not atomic: on failure part of the bytes may be
  // in the file, which is left for the caller to remove. Callers want
  // WriteFileAtomically; this is its first step, apart so that a test
  // file system can fail it.
  virtual absl::Status WriteFile(const std::string& path,
                                 absl::string_view bytes, bool sync) = 0;

  // The whole file at `path`; FAILED_PRECONDITION naming the size and the
  // limit for a file over max_bytes.
  virtual absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                                    int64_t max_bytes) = 0;

  // Creates the directory `path` (mode 0755; its parent must exist). OK
  // when it already is a directory; FAILED_PRECONDITION when something
  // else is there.
  virtual absl::Status CreateDir(const std::string& path) = 0;

  // fsync of the directory `dir`, so that entries created, renamed or
  // removed in it survive a crash.
  virtual absl::Status SyncDir(const std::string& dir) = 0;

  // rename(2): `to` is replaced atomically when it exists.
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;

  // Removes the file `path`; NOT_FOUND when there is none.
  virtual absl::Status RemoveFile(const std::string& path) = 0;

  // Removes `path` and, for a directory, everything under it. OK when
  // nothing is there. Not atomic: a failure may leave part of the tree.
  virtual absl::Status RemoveTree(const std::string& path) = 0;

  // The entries of the directory `dir` ("." and ".." left out), by name.
  // NOT_FOUND when missing, FAILED_PRECONDITION when not a directory.
  virtual absl::StatusOr<std::vector<DirEntry>> ListDir(
      const std::string& dir) = 0;

  // Composed of the calls above, so that their faults reach it:

  // Writes `bytes` to `path` durably and atomically: WriteFile of
  // `path`.tmp with fdatasync, Rename over `path`, SyncDir of its
  // directory. On a failure up to and including the rename, `path` is
  // untouched and the temp file is removed (best effort); a failure of the
  // final SyncDir leaves the new file in place, perhaps not yet durable.
  absl::Status WriteFileAtomically(const std::string& path,
                                   absl::string_view bytes);

  // CreateDir of `path` and of every missing parent (mkdir -p).
  absl::Status CreateDirs(const std::string& path);
};

}  // namespace recps

#endif  // RECPS_COMMON_FILE_SYSTEM_H_
